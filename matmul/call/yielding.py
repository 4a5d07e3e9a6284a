"""Tuning that yields the GPU to the caller: the tuning child times nothing while the process it
tunes for is calling ``matmul()``.

Two processes on one GPU are time-sliced: a caller's call that takes microseconds can wait
milliseconds for the child's slice. Instant choices are never slower than cuBLAS, so holding the
tuning back costs the caller only the later speed-up (``plots/h100/first-calls/``).

The caller keeps the time of its last call in one word of memory shared with the child
(``LastCall``, an anonymous memfd the child inherits, created with the first tuning child so that a
process that never tunes never stamps): the native entry (``entry.cpp``: one relaxed atomic store
of CLOCK_MONOTONIC, no GIL) and the Python paths (``stamp_call``) stamp it. CLOCK_MONOTONIC is one
clock for every process of a machine, so the child compares the stamp with its own clock. Before
each step that puts the GPU to work (``tuner.child_main``: its CUDA context, a job's operands, each
candidate's build and check, each autotuned configuration, each timing) the child waits until the
caller has made no call for ``MATMUL_TUNE_QUIET_MS`` (``CallerGate.wait``), never longer than
``MATMUL_TUNE_MAX_HOLD_S`` at a time, so that a process never quiet still gets its buckets tuned.

* quiet gap, 50 ms: a model's host issues calls in bursts (a forward pass, a decoding step) with
  gaps of a few milliseconds inside; ten times that marks the end of a burst, and a shorter gap
  would let a timing window start inside one.
* longest hold, 5 s: a step let through while the caller is busy shares the GPU for about one
  timing window, so a busy caller loses a small share while a bucket (up to some 80 steps) is tuned
  within minutes instead of never; a burst of first calls is usually over before a held step goes.

``0`` for either: never hold back; ``MATMUL_TUNE_MAX_HOLD_S=inf``: no tuning while the caller is
busy. The same word holds back the planner thread (``planner_gate``, ``MATMUL_PLAN_QUIET_MS``),
which shares the caller's GIL, not the GPU. Without a word (the tests' children) every step goes at
once.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import tempfile
import threading
import time
from typing import Callable, Optional

from .. import knobs

log = logging.getLogger(__name__)

# the knobs (``matmul.knobs``: their defaults and meaning)
QUIET_ENV = "MATMUL_TUNE_QUIET_MS"
MAX_HOLD_ENV = "MATMUL_TUNE_MAX_HOLD_S"
PLAN_QUIET_ENV = "MATMUL_PLAN_QUIET_MS"
PLAN_MAX_HOLD_ENV = "MATMUL_PLAN_MAX_HOLD_MS"
REQUEST_FIELD = "last_call_fd"  # the tuning request's field naming the inherited descriptor
WORD_BYTES = 8  # one int64: the caller's last call in CLOCK_MONOTONIC nanoseconds


# --- the caller's side -----------------------------------------------------------------------------


class LastCall:
    """The shared word: the CLOCK_MONOTONIC nanoseconds of the caller's last call. The caller writes
    it (``stamp``, or the native entry through ``address``); the child maps it read-only (``attach``)."""

    def __init__(self, fd: int, writable: bool, keep=None):
        self.fd = fd
        self._keep = keep  # what owns the descriptor (a temporary file), kept open with the word
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.map = mmap.mmap(fd, WORD_BYTES, mmap.MAP_SHARED, prot)
        self.word = memoryview(self.map).cast("q")
        # an exported buffer: the map is never closed or moved while the native entry writes it
        self._anchor = ctypes.c_char.from_buffer(self.map) if writable else None

    @classmethod
    def create(cls) -> "LastCall":
        """A new word in memory of its own, holding now (the call that started the tuning)."""
        if hasattr(os, "memfd_create"):
            fd, keep = os.memfd_create("matmul-last-call"), None
        else:  # no memfd: an unlinked temporary file serves as well
            keep = tempfile.TemporaryFile()
            fd = keep.fileno()
        os.ftruncate(fd, WORD_BYTES)
        word = cls(fd, writable=True, keep=keep)
        word.stamp()
        return word

    @classmethod
    def attach(cls, fd: int) -> "LastCall":
        """The caller's word, read-only, from the descriptor the child inherited."""
        return cls(fd, writable=False)

    @property
    def address(self) -> int:
        """Where the word is in this process's memory (for the native entry's atomic store)."""
        return ctypes.addressof(self._anchor)

    def stamp(self) -> None:
        self.word[0] = time.monotonic_ns()

    def read_ns(self) -> int:
        return self.word[0]


_last_call: Optional[LastCall] = None
_creating = threading.Lock()


def stamp_call() -> None:
    """Mark a call of the Python paths (the native entry marks its own); nothing before any tuning."""
    if _last_call is not None:
        _last_call.stamp()


def shared_fd() -> Optional[int]:
    """The descriptor of this process's word, for a tuning child to inherit; created on first use,
    and from then on every call stamps it. None where no word can be had (the child then never waits)."""
    global _last_call
    with _creating:
        if _last_call is None:
            try:
                word = LastCall.create()
            except OSError as e:
                log.warning("matmul(): no shared word for the tuner to yield to calls (%s); it times at once", e)
                return None
            from . import native_entry

            native = native_entry.module()
            if native is not None:
                native.stamp_calls_into(word.address)
            _last_call = word
        return _last_call.fd


def planner_gate() -> Optional["CallerGate"]:
    """The wait of the planner's thread (``launch.Plans``) before each plan it derives for an unseen
    call, or None where it derives at once (``MATMUL_PLAN_QUIET_MS=0``).

    The thread shares the caller's GIL: a derivation beside the caller's first calls takes several
    times as long as alone, as the two threads hand the GIL back and forth, and slows those calls
    (plots/h100/first-calls/). So a derivation waits until the caller has made
    no call for ``MATMUL_PLAN_QUIET_MS`` (default 20: a pause between a model's bursts of calls, not
    the gaps inside one), or for ``MATMUL_PLAN_MAX_HOLD_MS`` (default 1000) however busy it is;
    meanwhile the calls of its signature run cuBLAS through the native entry's miss path, as the
    first did."""
    if plans_at_once() or shared_fd() is None:
        return None
    quiet, hold = _plan_settings()
    return CallerGate(_last_call.read_ns, quiet, hold)


def _plan_settings() -> tuple[float, float]:
    """The planner's quiet gap and longest hold, in seconds (``planner_gate``)."""
    return (
        _setting(PLAN_QUIET_ENV) / 1e3,
        _setting(PLAN_MAX_HOLD_ENV) / 1e3,
    )


def plans_at_once() -> bool:
    """Whether the planner derives each plan as soon as it is deferred (no ``planner_gate``): only
    then is its thread woken for a deferred call (``background.Worker.submit``)."""
    quiet, hold = _plan_settings()
    return quiet <= 0 or hold <= 0


# --- the child's side ------------------------------------------------------------------------------


def _setting(name: str) -> float:
    return knobs.get(name)


def quiet_s() -> float:
    """How long the caller must have made no call before the child puts the GPU to work (seconds)."""
    return _setting(QUIET_ENV) / 1e3


def max_hold_s() -> float:
    """The longest one step of the child waits for a quiet caller (seconds; inf: no limit)."""
    return _setting(MAX_HOLD_ENV)


class CallerGate:
    """The child's wait for a quiet caller. ``last_call_ns``: reads the caller's word (None: no word,
    no wait); ``now_ns`` and ``sleep`` are the clock and the sleep (the tests pass stand-ins)."""

    def __init__(
        self,
        last_call_ns: Optional[Callable[[], int]],
        quiet_s: float = float(knobs.KNOBS[QUIET_ENV].default) / 1e3,
        max_hold_s: float = float(knobs.KNOBS[MAX_HOLD_ENV].default),
        now_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.last_call_ns = last_call_ns
        self.quiet_ns = quiet_s * 1e9
        self.max_hold_ns = max_hold_s * 1e9
        self.now_ns, self.sleep = now_ns, sleep
        self.held_s = 0.0  # in all, for the child's report
        self.cut_short = 0  # steps let through by the longest hold, the caller still busy

    @classmethod
    def for_request(cls, request: dict) -> "CallerGate":
        """The gate of a tuning request: the caller's word if it sent one, the settings from the environment."""
        fd = request.get(REQUEST_FIELD)
        reader = None if fd is None else LastCall.attach(fd).read_ns
        return cls(reader, quiet_s(), max_hold_s())

    def wait(self) -> float:
        """Return once the caller has made no call for the quiet gap, or after the longest hold; the
        seconds waited."""
        if self.last_call_ns is None or self.quiet_ns <= 0 or self.max_hold_ns <= 0:
            return 0.0
        start = self.now_ns()
        while True:
            now = self.now_ns()
            quiet_for = now - self.last_call_ns()
            if quiet_for >= self.quiet_ns:
                break
            held = now - start
            if held >= self.max_hold_ns:
                self.cut_short += 1
                break
            # until the gap would end if no call came meanwhile, then look again
            self.sleep(min(self.quiet_ns - quiet_for, self.max_hold_ns - held) / 1e9)
        waited = (self.now_ns() - start) / 1e9
        self.held_s += waited
        return waited

    def before(self, step: Callable) -> Callable:
        """``step``, run once the caller is quiet (``wait`` first)."""

        def gated(*args, **kwargs):
            self.wait()
            return step(*args, **kwargs)

        return gated

    def hold_tilus_benchmarks(self) -> None:
        """Wait before each configuration tilus's autotuner benchmarks (it times them one by one with
        ``tilus.utils.benchmark_func``, looked up in its module at each use)."""
        try:
            from tilus.lang import instantiated_script
        except ImportError:
            return
        benchmark = getattr(instantiated_script, "benchmark_func", None)
        if benchmark is None:
            return
        benchmark = getattr(benchmark, "ungated", benchmark)  # an earlier gate's wrapper: replaced
        gated = self.before(benchmark)
        gated.ungated = benchmark
        instantiated_script.benchmark_func = gated
