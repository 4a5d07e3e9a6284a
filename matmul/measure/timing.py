"""Timing on the GPU: median of many runs after warm-up, with CUDA events, L2 flushed by reading;
and one call as its caller waits for it (``waited_ms``)."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional, Sequence, TypeVar

import torch

T = TypeVar("T")


def median_ms(fn: Callable[[], object], warmup_ms: float = 100.0, repeat_ms: float = 500.0) -> float:
    """Median time of one call of ``fn`` in milliseconds, L2 flushed before each (``interleaved_ms``
    with one function; not ``triton.testing.do_bench``, whose flush writes: see ``L2Flush``)."""
    return interleaved_ms([fn], warmup_ms, repeat_ms)[0]


def waited_ms(fn: Callable[[], object]) -> float:
    """One call of ``fn`` as its caller waits for it: the host's wall time in milliseconds from the
    call to the end of its GPU work, the GPU drained before (a first call's time, which a median
    would hide)."""
    torch.cuda.synchronize()
    begin = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - begin) * 1e3


FLUSH_METHODS = ("read", "write")


class L2Flush:
    """Evicts what the last kernels left in the 50 MiB L2 by streaming a 256 MiB buffer through it.

    * ``"read"`` (the default): a reduction reads the buffer; L2 is left holding clean lines, and the
      next kernel finds its operands in HBM and nothing else to pay for, as a layer of a model finds
      its weight after the other layers ran.
    * ``"write"``: ``zero_()`` writes the buffer (as ``triton.testing.do_bench`` flushes); L2 is
      left full of dirty lines, which the next kernel writes back to HBM while it reads: up to
      ~50 MB of writes it did not cause. Compute-bound kernels do not notice; a kernel that only
      streams its weight measures slower by those writes (plots/h100/skinny/).
    """

    def __init__(self, method: str = "read", nbytes: int = 256 << 20):
        if method not in FLUSH_METHODS:
            raise ValueError(f"flush method {method!r}: one of {', '.join(FLUSH_METHODS)}")
        self.method = method
        self.buffer = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
        self.sink = torch.empty((), dtype=torch.int64, device="cuda")

    def __call__(self) -> None:
        if self.method == "read":
            torch.sum(self.buffer, dim=0, out=self.sink)
        else:
            self.buffer.zero_()


def interleaved_ms(
    fns: Sequence[Callable[[], object]], warmup_ms: float = 100.0, repeat_ms: float = 500.0, flush: str = "read"
) -> list[float]:
    """Median time of one call of each of ``fns`` in milliseconds, the calls taken in turn
    (f0, f1, ..., f0, f1, ...), L2 flushed before each (``L2Flush(flush)``), each call timed by its
    own CUDA events.

    On a power-limited GPU the clock drifts with what ran before; kernels timed in one window,
    launch by launch, meet the same clock and thermal state, so their ratio does not depend on
    where in a run the window falls. ``warmup_ms`` of turns first (untimed), then turns for about
    ``repeat_ms`` (at least 10).
    """
    flush_l2 = L2Flush(flush)
    for fn in fns:  # first calls (and any lazy setup) before anything is timed
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        for fn in fns:
            flush_l2()
            fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 3, 1e-3)  # one turn, flushes included
    for _ in range(int(warmup_ms / estimate)):
        for fn in fns:
            flush_l2()
            fn()
    turns = max(10, int(repeat_ms / estimate))
    events = [
        [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
        for _ in range(turns)
    ]
    for turn in events:
        for fn, (begin, finish) in zip(fns, turn):
            flush_l2()
            begin.record()
            fn()
            finish.record()
    torch.cuda.synchronize()
    return [statistics.median(turn[i][0].elapsed_time(turn[i][1]) for turn in events) for i in range(len(fns))]


class SustainedTimer:
    """Times one function launched back to back for ``seconds``, as a loop of training or inference
    steps runs it (same operands, no L2 flush between launches): the median time of one launch over
    the second half of the window (batches of 10 launches, each batch timed by CUDA events). On a
    power-limited GPU that is the rate it settles at, at the clock its own power draw allows, where
    ``interleaved_ms`` compares kernels at a shared clock. After each call, ``last_window`` holds the
    mean SM clock (MHz) and board power (W) that nvidia-smi sampled in the timed half (empty where
    nvidia-smi does not run)."""

    def __init__(self, seconds: float, sample_ms: int = 50):
        self.seconds = seconds
        self.sample_ms = sample_ms
        self.last_window: dict[str, float] = {}

    def __call__(self, fns: Sequence[Callable[[], object]]) -> list[float]:
        import time

        if len(fns) != 1:
            raise ValueError("a sustained window times one function (it runs alone, at its own clock)")
        fn = fns[0]
        smi = _ClockSampler(self.sample_ms)
        batches, start = [], time.time()
        while time.time() - start < self.seconds:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(10):
                fn()
            end.record()
            end.synchronize()
            batches.append((time.time(), begin.elapsed_time(end) / 10))
        half = start + self.seconds / 2
        self.last_window = smi.stop(half, time.time())
        return [statistics.median(ms for t, ms in batches if t >= half)]


class _ClockSampler:
    """nvidia-smi sampling the SM clock and board power every ``sample_ms`` until ``stop``."""

    def __init__(self, sample_ms: int):
        import subprocess
        import tempfile

        self.log = tempfile.NamedTemporaryFile("r", suffix=".csv")
        try:
            self.process = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,clocks.sm,power.draw",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    str(sample_ms),
                    "-i",
                    str(torch.cuda.current_device()),
                ],
                stdout=open(self.log.name, "w"),
                stderr=subprocess.DEVNULL,
            )
        except OSError:  # no nvidia-smi here: times only
            self.process = None

    def stop(self, begin: float, end: float) -> dict[str, float]:
        """Mean clock and power of the samples taken between ``begin`` and ``end`` (time.time())."""
        from datetime import datetime

        if self.process is None:
            return {}
        self.process.terminate()
        self.process.wait()
        samples = []
        for line in open(self.log.name):
            try:
                stamp, clock, power = (field.strip() for field in line.split(","))
                t = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                samples.append((t, float(clock), float(power)))
            except ValueError:  # a partial last line, or "[N/A]"
                continue
        inside = [(c, w) for t, c, w in samples if begin <= t <= end]
        if not inside:
            return {}
        return {"clock_mhz": statistics.mean(c for c, _ in inside), "power_w": statistics.mean(w for _, w in inside)}


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def alternating_rounds(
    items: Sequence[T], rounds: int, time_one: Callable[[T], float], prune: Optional[float] = None
) -> list[list[float]]:
    """Time every item once per round, the order reversed every other round, so that no item always
    runs on a cooler or warmer GPU (an even ``rounds`` gives each as many early as late places).
    With ``prune``, only items within ``prune`` times the fastest first-round time are timed after
    the first round. The times of each item, in the order of ``items``."""
    times: list[list[float]] = [[] for _ in items]
    timed = list(range(len(items)))
    for r in range(rounds):
        for i in timed if r % 2 == 0 else timed[::-1]:
            times[i].append(time_one(items[i]))
        if r == 0 and prune is not None and items:
            fastest = min(t[0] for t in times)
            timed = [i for i in timed if times[i][0] <= prune * fastest]
    return times
