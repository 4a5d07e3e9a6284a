"""Which kernel runs a shape bucket now: the process's memory of choices, in front of the choice
file (``choice_cache``), the shipped table and the tuner, such that no call waits on tuning
(``matmul/call/README.md``, "Choosing").

``Chooser.get`` answers at once, per (architecture, GPU, dtype, shape bucket, variant), from the
first of: what this process holds; a choice measured here or shipped whose fingerprint matches the
kernel sources here (final); the same, stale (used, and measured again in the background among the
candidates that came close there: ``hint``, ``narrowed``); the nearest measured relative of the same
N x K in log(M), this or the other 16-bit dtype, this or the plain variant (``nearest``: the N x K
of another projection says nothing); cuBLAS ("fallback"). A measured choice overrides the shipped
one and a background tuning's result overrides every instant choice, so an instant choice cannot
stay slower than cuBLAS for longer than the bucket takes to tune.

A kernel is never built in this process (tilus's transpiler would hold the caller's GIL for
seconds): the tuning child or a build child builds it, a background thread here only opens the
library, and cuBLAS runs until then. Each change of the kernel a bucket runs is announced to the
listeners with the buckets it concerns (``on_change``: ``launch.Plans.forget``); nothing else is,
so a kernel built only to be timed, or a result that keeps the running kernel, changes no plan.

A shipped entry is checked by existence (version, configuration in the space, variant supported,
shape within limits), not by fingerprint: the fingerprint changes with every kernel edit, so a
table checked by it would be worthless on every developer's tree, while a stale entry is still a
correct kernel and, being measured again at once, cannot stay slower than cuBLAS.

Modes (``MATMUL_TUNE``, or ``Chooser.mode``): ``background`` (default); ``off``: the instant choice
is final (kernels still built in the background); ``blocking``: the caller waits for the tuning and
the build (benchmarks, tests). Inside a CUDA graph capture nothing is started: the instant choice
runs if it is cuBLAS or a kernel built here, else cuBLAS, marked ``transient`` so the first call
after the capture starts the tuning; ``blocking`` raises ``NotTunedError`` there.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import threading
import time
from typing import Callable, Optional

import torch

from .. import knobs
from ..kernels import versions
from ..kernels.variant import PLAIN, Variant
from . import building, tilus_autotune
from .background import Worker
from .choice_cache import ChoiceCache, Entry, ShippedTable
from .tuner import (
    PROGRAM_DIR,
    PRUNE,
    VENDOR,
    bucket,
    candidates,
    choice_key,
    entry_is_usable,
    entry_is_valid,
    tune_in_child,
)

log = logging.getLogger(__name__)

SWITCH = "MATMUL_TUNE"
MODES = knobs.TUNE_MODES
SOURCES = ("measured", "shipped", "nearest", "fallback")
# the fields that say where a choice came from and what becomes of it (``Chooser.get``)
PROVENANCE = ("source", "key", "nearest", "stale", "pending", "transient", "tuning_failed")


class NotTunedError(RuntimeError):
    """A shape with no stored choice was called where tuning is impossible (CUDA graph capture, in
    ``MATMUL_TUNE=blocking``)."""


BUILD_GROUP = "build"  # the builder's jobs queued together go to one build child
# build children run at once before a narrowed tuning up front: each transpiles in Python (one core)
PARALLEL_BUILDS = max(1, (os.cpu_count() or 2) - 1)


def _checked(check, *args) -> bool:
    try:
        return bool(check(*args))
    except Exception:  # a malformed entry must not take the call down
        return False


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is being captured into a CUDA graph: then nothing
    may start (a tuning, a build) and nothing be kept."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@functools.cache
def _gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _arch_by_capability(device: torch.device) -> str:
    return versions.ARCH_BY_CAPABILITY[torch.cuda.get_device_capability(device)]


class Chooser:
    """The choice of each (device, dtype, shape bucket, variant) this process has used. The
    GPU-facing parts are parameters, so that the tests run the whole choice with CPU stand-ins:
    ``arch_of(device)`` (the public call's ``device_arch``, with its errors), ``gpu_name(device)``,
    ``tune_jobs`` (``tuner.tune_in_child``), ``build_jobs`` (``building.build_in_child``: builds
    kernels outside this process), ``load`` (``tilus_autotune.load``: opens a built kernel's
    library), ``shipped`` (a ``ShippedTable``), ``mode`` (default: ``MATMUL_TUNE`` at each use)."""

    def __init__(
        self,
        cache: Optional[ChoiceCache] = None,
        tune_jobs=None,
        arch_of=None,
        gpu_name=None,
        shipped: Optional[ShippedTable] = None,
        mode: Optional[str] = None,
        build_jobs=None,
        load=None,
    ):
        self.lock = threading.RLock()
        self.entries: dict[tuple, tuple[str, Entry]] = {}
        self.cache = cache
        self.shipped = shipped if shipped is not None else ShippedTable()
        self.tune_jobs = tune_jobs or tune_in_child
        self.arch_of = arch_of or _arch_by_capability
        self.gpu_name = gpu_name or (lambda device: _gpu_name(device.index))
        self._mode = mode
        self.build_jobs = build_jobs or building.build_in_child
        self.load = load or tilus_autotune.load
        self.programs: dict[tuple, Callable] = {}  # kernels loaded here, by ``program_key``: their launch functions
        self.failed: dict[tuple, str] = {}  # kernels whose build or load failed: cuBLAS runs instead
        self.building: set[tuple] = set()  # kernels a build child is building now
        self.listeners: list[Callable[[], None]] = []
        self.tuner = Worker("matmul-tuner", self._tune_batch)
        self.builder = Worker("matmul-builder", self._build_batch)
        self._relatives_index: Optional[Relatives] = None  # ``nearest``'s index of the stored choices

    # --- the mode and the listeners ---------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode or knobs.tune_mode()

    @mode.setter
    def mode(self, value: Optional[str]) -> None:
        if value is not None and value not in MODES:
            raise ValueError(f"the tuning mode must be one of {', '.join(MODES)}, got {value!r}")
        self._mode = value

    def on_change(self, listener: Callable[[set], None]) -> None:
        """Call ``listener(memos)`` whenever the kernel a bucket runs changes (module doc): ``memos``
        the set of the buckets whose kernel changed (``bucket_memo``)."""
        self.listeners.append(listener)

    def _choosing(self, program: tuple) -> set:
        """The buckets whose choice is ``program``'s kernel: only their plans wait for it (``_now``:
        cuBLAS runs meanwhile)."""
        with self.lock:
            return {
                memo
                for memo, (arch, entry) in self.entries.items()
                if program_key(arch, memo[1], entry, memo[5]) == program
            }

    def _changed(self, memos: set) -> None:
        for listener in list(self.listeners):
            try:
                listener(memos)
            except Exception:
                log.exception("matmul(): a listener of the choices failed")

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until no tuning and no build is queued or under way (tests, benchmarks); False on timeout."""
        while True:
            if not (self.tuner.wait(timeout) and self.builder.wait(timeout)):
                return False
            if not (self.tuner.busy() or self.builder.busy()):
                return True

    # --- the choice ------------------------------------------------------------------------------

    def get(
        self, device: torch.device, dtype: torch.dtype, m: int, n: int, k: int, variant: Variant = PLAIN
    ) -> tuple[str, Entry]:
        """The architecture and the choice entry a call of this shape runs now (see the module's
        docstring), with where it came from: ``source`` (one of ``SOURCES``), ``key`` (the bucket's),
        ``nearest`` (the bucket it was taken from), ``stale``, ``pending`` (a background tuning of
        the bucket is queued or under way), ``building`` (the version whose kernel is being built
        while cuBLAS runs), ``transient`` (chosen inside a CUDA graph capture: not to be kept),
        ``below`` (the bucket's version won only from that M up, ``from_m``: cuBLAS runs this M;
        ``chosen`` is the bucket's entry). A version's kernel is loaded by then (``program``), except
        in ``blocking`` mode, where the caller may build it itself."""
        memo = bucket_memo(device, dtype, (m, n, k), variant)
        found = self.entries.get(memo)
        if found is None:
            found = self._choose(device, dtype, m, n, k, variant, memo)
        arch, entry = found
        return arch, self._now(arch, dtype, variant, device, entry, m)

    def _locate_cache(self) -> None:
        """The choice cache, located when first needed (``MATMUL_CACHE_DIR`` may be set late)."""
        if self.cache is None:
            self.cache = ChoiceCache()

    def _choose(self, device, dtype, m, n, k, variant, memo) -> tuple[str, Entry]:
        self._locate_cache()
        arch = self.arch_of(device)
        key = choice_key(arch, self.gpu_name(device), dtype, m, n, k, variant)
        in_capture = capturing(device)
        mode = self.mode
        with self.lock:
            if memo in self.entries:
                return self.entries[memo]
            known = self.known(arch, key, variant)
            if known is not None and not known.get("stale"):
                self.entries[memo] = (arch, {**known, "key": key})
                return self.entries[memo]
            if mode != "blocking":
                # its own stale times, else its nearest relative: without the former, the instant choice too
                hint = self.hint(arch, key, m, n, k, variant, known)
                instant = known or hint or {"version": VENDOR, "config": {}}
                instant = {**instant, "source": instant.get("source", "fallback"), "key": key}
                if in_capture:  # nothing may start: this call's choice only
                    return arch, {**instant, "transient": True}
                self.entries[memo] = (arch, instant)
                if mode == "background":  # narrowed as ``tune(narrow=True)`` narrows
                    near = hint if hint is not None and not from_another_gpu(key, hint) else None
                    job = narrowed_job(key, arch, m, n, k, variant, near)
                    self.tuner.submit(key, (memo, job), group=(arch, device, dtype))
                return self.entries[memo]
        if in_capture:
            raise NotTunedError(
                f"matmul() has no choice for {key} and cannot tune while a CUDA graph is being captured "
                f"({SWITCH}=blocking); call matmul() on these shapes once before capturing (or matmul.tune(...))"
            )
        self.ensure(device, dtype, [(m, n, k)], variant)  # blocking: outside the lock, as a background tuning stores
        return self.entries[memo]

    def program(self, arch: str, dtype, entry: Entry, variant: Variant) -> Optional[Callable]:
        """The launch function of ``entry``'s kernel, loaded in this process (built outside it), or None."""
        return self.programs.get(program_key(arch, dtype, entry, variant))

    def _now(self, arch: str, dtype, variant: Variant, device, entry: Entry, m: int) -> Entry:
        """``entry`` as a call of M = ``m`` runs it now: cuBLAS below the M its version won from
        (``from_m``, tuner.held_across_the_bucket), and while its version's kernel is being built."""
        now = {**entry, "pending": self.tuner.pending(entry.get("key"))}
        if m < entry.get("from_m", 0):
            return self._instead(now, entry, below=entry["from_m"])
        if entry["version"] == VENDOR or self.mode == "blocking":
            return now
        program = program_key(arch, dtype, entry, variant)
        if program in self.programs:
            return now
        if program not in self.failed and not now.get("transient"):
            if not capturing(device):
                self.builder.submit(program, (arch, dtype, entry, variant), group=BUILD_GROUP)
        if program in self.failed:
            return self._instead(now, entry, build_failed=self.failed[program])
        return self._instead(now, entry, building=entry["version"])

    @staticmethod
    def _instead(now: Entry, entry: Entry, **why) -> Entry:
        """cuBLAS run in place of ``entry``'s version, with ``now``'s provenance, ``why`` (one field
        that says why) and the bucket's choice (``chosen``)."""
        return {"version": VENDOR, "config": {}, **{k: now[k] for k in PROVENANCE if k in now}, **why, "chosen": entry}

    # --- what is known: measured, shipped, nearest ---------------------------------------------------

    def known(self, arch: str, key: str, variant: Variant = PLAIN) -> Optional[Entry]:
        """The bucket's own choice: ``fresh`` if there is one, else a usable one made with other
        kernel sources (``stale``: an instant choice only), measured here before shipped; or None."""
        fresh = self.fresh(arch, key)
        if fresh is not None:
            return fresh
        stored = (("measured", self.cache.read()[1].get(key)), ("shipped", self.shipped.entries().get(key)))
        for source, entry in stored:
            if isinstance(entry, dict) and _checked(entry_is_usable, arch, entry, variant):
                return {**entry, "source": source, "key": key, "stale": True}
        return None

    def tune(
        self,
        device: torch.device,
        dtype: torch.dtype,
        shapes,
        variant: Variant = PLAIN,
        use_shipped: bool = True,
        progress: Optional[bool] = None,
        on_entry: Optional[Callable[[str, Entry], None]] = None,
        narrow: bool = False,
    ) -> dict[tuple, Entry]:
        """``ensure`` with a progress bar over the buckets to tune, then the chosen kernels that no
        tuning child built, built in a build child while this thread waits: afterwards the shapes
        run their final choice at once. The entries by shape."""
        from tqdm import tqdm

        arch, gpu = self.arch_of(device), self.gpu_name(device)
        self._locate_cache()
        keys = {choice_key(arch, gpu, dtype, *shape, variant) for shape in shapes}
        todo = [key for key in keys if self.fresh(arch, key, use_shipped) is None]
        bar = tqdm(total=len(todo), desc="[tune]", unit="bucket", disable=None if progress is None else not progress)

        def arrived(key, entry):
            bar.set_postfix_str(f"{key}: {entry['version']}")
            bar.update(1)
            if on_entry is not None:
                on_entry(key, entry)

        try:
            self.ensure(device, dtype, shapes, variant, use_shipped=use_shipped, on_entry=arrived, narrow=narrow)
        finally:
            bar.close()
        unbuilt = {}
        for shape in shapes:
            arch, entry = self.entries[bucket_memo(device, dtype, shape, variant)]
            program = program_key(arch, dtype, entry, variant)
            if entry["version"] != VENDOR and program not in self.programs and program not in self.failed:
                unbuilt[program] = (arch, dtype, entry, variant)
        if unbuilt:
            self._build_batch(BUILD_GROUP, list(unbuilt.values()))
        return {tuple(shape): self.get(device, dtype, *shape, variant=variant)[1] for shape in shapes}

    def fresh(self, arch: str, key: str, use_shipped: bool = True) -> Optional[Entry]:
        """The bucket's choice measured here, else shipped (if ``use_shipped``), whose fingerprint
        matches the kernel sources here (``tuner.entry_is_valid``); None if neither."""
        sources = [("measured", self.cache.read()[1].get(key))]  # a lookup: the parsed dict, not a copy
        if use_shipped:
            sources.append(("shipped", self.shipped.entries().get(key)))
        for source, entry in sources:
            if isinstance(entry, dict) and _checked(entry_is_valid, arch, entry):
                return {**entry, "source": source, "key": key}
        return None

    def hint(
        self, arch: str, key: str, m: int, n: int, k: int, variant: Variant = PLAIN, known: Optional[Entry] = ...
    ) -> Optional[Entry]:
        """What narrows the bucket's tuning: its own choice made with other kernel sources (its
        candidates' times), else its nearest relative's; None if neither. ``known``: the bucket's
        ``known`` entry where the caller has just looked it up."""
        if known is ...:
            known = self.known(arch, key, variant)
        if known is not None and known.get("candidates"):
            return {**known, "nearest": key}
        return self.nearest(arch, key, m, n, k, variant)

    def nearest(self, arch: str, key: str, m: int, n: int, k: int, variant: Variant = PLAIN) -> Optional[Entry]:
        """The choice of the nearest relative of this bucket whose kernel takes this shape and this
        variant: a bucket of the same architecture and N x K bucket (measured here over shipped for
        one key), of this dtype or the other 16-bit one (``RELATED_DTYPES``), of this variant or the
        plain one. This GPU's buckets first, another GPU's of the same architecture only where this
        GPU has none; then nearest in log(M); at the same distance this variant before the plain one,
        this dtype before the other, the larger M first. None if none.

        Why: float16 and bfloat16 run the same instructions at the same rate, and a variant changes
        how a kernel reads one operand or finishes its tile, not which tile shape suits the shape
        (though it can cost one version more than another: hence the variant first). Another GPU of
        the same architecture runs the same tiles, so its choice beats cuBLAS as a first guess, but
        its shortlist need not hold this GPU's winner (other SM counts): such a bucket's background
        tuning searches every space (``from_another_gpu``), where a relative of this GPU's narrows it
        (``narrowed``)."""
        head, dtype, _, bn, bk, suffix = key_parts(key)
        dtypes = [dtype, *(d for d in RELATED_DTYPES.get(dtype, ()) if d != dtype)]
        suffixes = [suffix, *([""] if suffix else [])]
        relatives = self._relatives()
        best, best_rank = None, None
        for other_head, other, other_dtype, other_m, other_suffix, entry in relatives.of(head, bn, bk):
            if other == key or other_dtype not in dtypes or other_suffix not in suffixes:
                continue
            usable = relatives.usable(arch, other, entry, variant)
            if not (usable and _checked(_takes, arch, entry, m, n, k, variant)):
                continue
            distance = round(abs(math.log(other_m) - math.log(bucket(m))), 9)
            rank = (other_head != head, distance, other_suffix != suffix, other_dtype != dtype, -other_m)
            if best_rank is None or rank < best_rank:
                # where in its own bucket a version started to win says nothing of this bucket
                relative = {key: value for key, value in entry.items() if key != "from_m"}
                best, best_rank = {**relative, "source": "nearest", "nearest": other}, rank
        return best

    def _relatives(self) -> "Relatives":
        """The stored choices (shipped, then measured here, which wins for one key) by architecture,
        GPU and N x K bucket: made again only when either table is read anew (its file changed).
        An unseen bucket's choice is made on a thread beside the caller's calls, holding the GIL:
        scanning every stored key with a pattern took about a third of a millisecond a bucket."""
        shipped, (digest, measured) = self.shipped.entries(), self.cache.read()
        index = self._relatives_index
        if index is None or index.shipped is not shipped or index.digest != digest:
            index = self._relatives_index = Relatives(shipped, measured, digest)
        return index

    # --- tuning ----------------------------------------------------------------------------------

    def ensure(
        self,
        device: torch.device,
        dtype: torch.dtype,
        shapes,
        variant: Variant = PLAIN,
        use_shipped: bool = True,
        on_entry: Optional[Callable[[str, Entry], None]] = None,
        narrow: bool = False,
    ) -> list[str]:
        """Make sure every shape's bucket has a fresh choice (measured here, or shipped where
        ``use_shipped``), tuning the others now, all in one child process; the keys tuned.
        ``on_entry(key, entry)`` as each arrives (a progress bar). ``narrow``: each bucket is timed
        among the candidates that came close in its own stale measurement, else in its nearest
        relative (``hint``), as a background tuning is; a full tuning where there is neither."""
        self._locate_cache()
        arch = self.arch_of(device)
        gpu = self.gpu_name(device)
        changed = set()
        with self.lock:
            jobs, memos = {}, {}
            for m, n, k in shapes:
                memo = bucket_memo(device, dtype, (m, n, k), variant)
                key = choice_key(arch, gpu, dtype, m, n, k, variant)
                entry = self.fresh(arch, key, use_shipped)
                if entry is not None:
                    if self.entries.get(memo) != (arch, entry):  # an instant choice gives way
                        changed.add(memo)
                    self.entries[memo] = (arch, entry)
                elif key not in jobs:
                    hint = self.hint(arch, key, m, n, k, variant) if narrow else None
                    jobs[key] = narrowed_job(key, arch, m, n, k, variant, hint)
                    memos[key] = memo
            if jobs and capturing(device):
                raise NotTunedError(
                    f"matmul() has no choice for {', '.join(jobs)} and cannot tune while a CUDA graph is being "
                    "captured; call matmul() on these shapes once before capturing (or matmul.tune(...))"
                )
        if changed:
            self._changed(changed)
        if jobs:
            if narrow:
                self._prebuild(arch, dtype, [(job, variant) for job in jobs.values()])
            self._tune(arch, dtype, device, jobs, memos, use_shipped, on_entry)
        return list(jobs)

    def planned_builds(
        self, arch: str, gpu: str, dtype, shapes, variant: Variant = PLAIN, use_shipped: bool = True
    ) -> list[tuple[str, dict]]:
        """The kernels (version, configuration) that ``tune(narrow=True)`` of ``shapes`` on a GPU named
        ``gpu`` would build first (``_prebuild``), from the tables here and without that GPU: built
        on another machine (``python -m matmul tune --list-kernels``, then ``compile --kernels``) and
        carried in tilus's cache, they leave the GPU's time to the measuring. Buckets with a fresh
        choice are left out, as ``tune`` leaves them; so are those with nothing to narrow from (a
        full tuning, whose kernels tilus's search picks as it goes)."""
        self._locate_cache()
        jobs = []
        for m, n, k in shapes:
            key = choice_key(arch, gpu, dtype, m, n, k, variant)
            if self.fresh(arch, key, use_shipped) is None:
                hint = self.hint(arch, key, m, n, k, variant)
                jobs.append((narrowed_job(key, arch, m, n, k, variant, hint), variant))
        return [(entry["version"], entry["config"]) for _, _, entry, _ in self._unbuilt(arch, dtype, jobs)]

    def _unbuilt(self, arch: str, dtype, jobs: list[tuple[dict, Variant]]) -> list[tuple]:
        """The kernels that narrowed ``jobs`` (each with its variant) will time and this process has
        not opened (or seen fail), each once: (arch, dtype, entry, variant)."""
        wanted = {}
        for job, variant in jobs:
            for version, config in (job.get("configs") or {}).items():
                entry = {"version": version, "config": config}
                program = program_key(arch, dtype, entry, variant)
                if program not in self.programs and program not in self.failed:
                    wanted[program] = (arch, dtype, entry, variant)
        return list(wanted.values())

    def _prebuild(self, arch: str, dtype, jobs: list[tuple[dict, Variant]]) -> None:
        """Build the kernels that narrowed ``jobs`` (each with its variant) will time (``_unbuilt``), in
        parallel build children (``build_now``), and open them here: the tuning child then finds each
        in tilus's disk cache. On a fresh machine building, not timing, is most of a narrowed tuning,
        and the tuning child builds one kernel at a time."""
        self.build_now(self._unbuilt(arch, dtype, jobs), progress=False)

    def _tune(self, arch, dtype, device, jobs: dict, memos: dict, use_shipped=True, on_entry=None) -> None:
        """Tune ``jobs`` in a child process (one per process and key at a time: the file locks),
        storing each entry as it arrives and announcing the change."""

        def store(key, entry):
            entry = dict(entry)
            built = entry.pop(PROGRAM_DIR, None)  # where the tuning child built the winner: not stored
            self.cache.store(key, entry)
            variant = memos[key][5]
            program = program_key(arch, dtype, entry, variant)
            loaded = entry["version"] != VENDOR and built is not None and program not in self.programs
            if loaded:
                self._load(program, entry, built)  # before the entry: no call asks for a build meanwhile
            with self.lock:
                replaced = self.entries.get(memos[key])  # an instant choice that plans may run
                self.entries[memos[key]] = (arch, {**entry, "source": "measured", "key": key})
            if entry["version"] != VENDOR and self.mode != "blocking" and program not in self.programs:
                # the tuning child did not say where it built it: a build child does, and it takes over when ready
                self.builder.submit(program, (arch, dtype, entry, variant), group=BUILD_GROUP)
            # the plans change if the kernel does, or if the same kernel is now loaded (they ran cuBLAS)
            if replaced is not None and (loaded or _kernel(replaced[1]) != _kernel(entry)):
                self._changed({memos[key]})
            knobs.decisions.info("tuned %s: %s %s", key, entry["version"], json.dumps(entry.get("config") or {}))
            if on_entry is not None:
                on_entry(key, entry)

        with self.cache.tuning(list(jobs)):
            for key in list(jobs):  # another process may have tuned some keys while this one waited
                entry = self.fresh(arch, key, use_shipped)
                if entry is not None:
                    with self.lock:
                        replaced = self.entries.get(memos[key])
                        self.entries[memos[key]] = (arch, entry)
                    jobs.pop(key)
                    if replaced is not None and _kernel(replaced[1]) != _kernel(entry):
                        self._changed({memos[key]})
                    if on_entry is not None:
                        on_entry(key, entry)
            if jobs:
                self.tune_jobs(arch, dtype, device, list(jobs.values()), on_entry=store)

    def _tune_batch(self, group, payloads: list) -> None:
        """The background tuner's job: the buckets of one (arch, device, dtype) queued together."""
        arch, device, dtype = group
        memos = {job["key"]: memo for memo, job in payloads}
        jobs = {job["key"]: job for _, job in payloads}
        try:
            self._prebuild(arch, dtype, [(job, memos[key][5]) for key, job in jobs.items()])
            self._tune(arch, dtype, device, dict(jobs), memos)
        except Exception as e:
            for memo in memos.values():
                with self.lock:
                    found = self.entries.get(memo)
                    if found is not None and found[1].get("source") != "measured":
                        self.entries[memo] = (arch, {**found[1], "tuning_failed": f"{type(e).__name__}: {e}"[:400]})
            log.warning(
                "matmul(): tuning %s in the background failed (%s: %s); the instant choice stays",
                ", ".join(memos),
                type(e).__name__,
                str(e)[-400:],
            )
            self._changed(set(memos.values()))

    # --- building ----------------------------------------------------------------------------------

    def kernel(self, arch: str, dtype, entry: Entry, variant: Variant = PLAIN, device: Optional[torch.device] = None):
        """The launch function of ``entry``'s kernel (a version of the series, or a kernel the call runs
        beside it: ``building.OUTSIDE``) where this process has opened it; else None, and its build
        queued for the build child unless a CUDA graph capture is under way on ``device``, the call's
        GPU (nothing may start inside one), or it failed (a warning said so; the caller's fallback
        runs for good)."""
        program = program_key(arch, dtype, entry, variant)
        found = self.programs.get(program)
        if found is None and program not in self.failed and not (device is not None and capturing(device)):
            self.builder.submit(program, (arch, dtype, entry, variant), group=BUILD_GROUP)
        return found

    def build_now(
        self, kernels, progress: Optional[bool] = None, desc: str = "[build]", timeout_s: float = 600.0
    ) -> list[bool]:
        """Build ``kernels`` ((arch, dtype, entry, variant) each) that this process has not opened, in
        ``PARALLEL_BUILDS`` build children at once, and wait for them (and for those another path is
        building already), ``timeout_s`` at most: whether each is open here, in order. ``progress``: a
        tqdm bar over the kernels (None: where stderr is a terminal)."""
        from tqdm import tqdm

        kernels = list(kernels)
        keys = [program_key(*kernel) for kernel in kernels]
        wanted = {
            key: kernel for key, kernel in zip(keys, kernels) if key not in self.programs and key not in self.failed
        }
        bar = tqdm(total=len(wanted), desc=desc, unit="kernel", disable=None if progress is None else not progress)
        todo = list(wanted.values())
        threads = [
            threading.Thread(target=self._build_batch, args=(BUILD_GROUP, todo[i::PARALLEL_BUILDS]), daemon=True)
            for i in range(min(PARALLEL_BUILDS, len(todo)))
        ]
        deadline = time.monotonic() + timeout_s
        try:
            for thread in threads:
                thread.start()
            done = 0
            while True:  # the children's kernels, and those another path was building already
                finished = sum(key in self.programs or key in self.failed for key in wanted)
                bar.update(finished - done)
                done = finished
                if finished == len(wanted) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            bar.close()
        return [key in self.programs for key in keys]

    def _build_batch(self, group, payloads: list) -> None:
        """The builder's job: the kernels queued together, built in one build child (``build_jobs``);
        each is loaded here as soon as the child reports it, and takes over at once."""
        waiting = {}
        with self.lock:  # each kernel built once, whichever path asks for it (``kernel``, ``build_now``)
            for arch, dtype, entry, variant in payloads:
                program = program_key(arch, dtype, entry, variant)
                if program not in self.programs and program not in self.failed and program not in self.building:
                    self.building.add(program)
                    waiting[str(len(waiting))] = (program, arch, dtype, entry, variant)
        if not waiting:
            return

        def built(job_id, program_dir, failure):
            program, _, _, entry, _ = waiting.pop(job_id)
            if failure is None:
                self._load(program, entry, program_dir)
                knobs.decisions.info("built %s %s for %s", entry["version"], entry.get("config"), program[3:])
            else:
                self._failed(program, entry, failure)
            with self.lock:
                self.building.discard(program)
            choosing = self._choosing(program)
            if choosing:  # a kernel built only to be timed changes no call's plan
                self._changed(choosing)

        jobs = [building.job(i, arch, dtype, entry, variant) for i, (_, arch, dtype, entry, variant) in waiting.items()]
        try:
            self.build_jobs(jobs, built)
        except Exception as e:  # the kernels not reported stay on cuBLAS
            for job_id in list(waiting):
                built(job_id, None, f"{type(e).__name__}: {e}")

    def _load(self, program: tuple, entry: Entry, program_dir: str) -> None:
        """Open the library of a kernel built outside this process (nothing transpiled or launched here)."""
        try:
            self.programs[program] = self.load(program_dir)
        except Exception as e:
            self._failed(program, entry, f"{type(e).__name__}: {e}")

    def _failed(self, program: tuple, entry: Entry, failure: str) -> None:
        self.failed[program] = failure[:400]
        log.warning(
            "matmul(): building %s %s for %s failed (%s); %s runs instead",
            entry["version"],
            entry.get("config"),
            entry.get("key") or str(program[3]).removeprefix("torch."),
            self.failed[program],
            building.fallback_of(entry["version"]),
        )


BATCHED_WORKER = "matmul.call.batched:gpu_worker"  # measures a batch of products (the tuning child imports it)


def tuning_job(key: str, arch: str, m: int, n: int, k: int, variant: Variant) -> dict:
    """What the tuning child is asked for one bucket: the shape, the candidates, the variant's key
    (other than the plain one), and for a batch of products the worker that measures one."""
    job = {"key": key, "m": m, "n": n, "k": k, "names": candidates(arch, m, n, k, variant)}
    if variant != PLAIN:
        job["variant"] = variant.key()
    if variant.batched:
        job["worker"] = BATCHED_WORKER
    return job


def narrowed_job(key: str, arch: str, m: int, n: int, k: int, variant: Variant, hint: Optional[Entry]) -> dict:
    """``tuning_job`` for the bucket, narrowed by ``hint`` (``narrowed``) where there is one."""
    job = tuning_job(key, arch, m, n, k, variant)
    if hint is not None:
        job.update(narrowed(job["names"], hint, arch, m))
    return job


def narrowed(names: list[str], neighbour: Entry, arch: Optional[str] = None, m: Optional[int] = None) -> dict:
    """The candidates worth timing on a bucket whose neighbour of the same N x K was measured: those
    of ``names`` that ran within ``tuner.PRUNE`` of the fastest there, each with the configuration
    it had there (tilus's search over its space is skipped), and cuBLAS always. A version that
    lost by more at M = 1024 is not expected to win at M = 1500; timing the few that came close
    takes a second where searching every space takes several. Where the neighbour is another M
    bucket, a version whose tile depends on M (one that defines ``refit``: Hopper V7's token tile)
    is timed at what its configuration there stands for at this bucket's ``m`` (given ``arch``):
    else a 32-token bucket narrowed from the 16-token one would only ever time two 16-token
    tiles. Nothing to narrow (the neighbour names no candidates): ``{}``, a full tuning."""
    timed = neighbour.get("candidates")
    if not isinstance(timed, dict) or not timed:
        return {}
    costs = {v: c.get("call_ms") or c.get("ms") for v, c in timed.items() if isinstance(c, dict)}
    costs = {v: ms for v, ms in costs.items() if isinstance(ms, (int, float)) and ms > 0}
    if not costs:
        return {}
    best = min(costs.values())
    close = [v for v in names if v != VENDOR and v in costs and costs[v] <= best * PRUNE]
    configs = {v: timed[v].get("config") for v in close}
    nearest = neighbour.get("nearest")
    if arch is not None and m is not None and nearest and int(key_parts(nearest)[2]) != bucket(m):
        configs = {v: _refit(arch, v, config, m) for v, config in configs.items()}
    return {"names": [*close, VENDOR], "configs": configs, "narrowed_from": nearest}


def _refit(arch: str, version: str, config, m: int):
    """``config`` of ``version`` as its module's ``refit`` carries it to ``m`` tokens (``narrowed``)."""
    module = versions.load(arch, version)
    refit = getattr(module, "refit", None)
    return config if refit is None or not isinstance(config, dict) else refit(versions.space(module), config, m)


def bucket_memo(device, dtype, shape, variant: Variant) -> tuple:
    """The bucket a call of ``shape`` falls in, as the chooser keeps its choice and names its changes."""
    m, n, k = shape
    return device, dtype, bucket(m), bucket(n), bucket(k), variant


def _kernel(entry: Entry) -> tuple:
    """What of a choice a plan runs: its version and configuration (not where it came from)."""
    return entry["version"], json.dumps(entry.get("config"), sort_keys=True)


def program_key(arch: str, dtype, entry: Entry, variant: Variant) -> tuple:
    """What names a built kernel: the version, its configuration, the dtype and the variant."""
    return (arch, *_kernel(entry), dtype, variant)


RELATED_DTYPES = {"float16": ("bfloat16",), "bfloat16": ("float16",)}


class Relatives:
    """The entries of the stored tables grouped by (architecture, N bucket, K bucket), each as
    (architecture and GPU, key, dtype, M bucket, variant suffix, entry), and which are usable for
    an architecture and variant, asked once per key. Made from ``shipped`` (the table's own dict)
    and ``measured`` (the choice cache's, of the file bytes of ``digest``): both kept to tell when
    either is replaced."""

    def __init__(self, shipped: dict, measured: dict, digest: Optional[bytes]):
        self.shipped, self.digest = shipped, digest
        self.groups: dict[tuple[str, str, str], list[tuple[str, str, str, int, str, Entry]]] = {}
        for key, entry in {**shipped, **measured}.items():
            try:
                head, dtype, m, bn, bk, suffix = key_parts(key)
                row = (head, key, dtype, int(m), suffix, entry)
            except (ValueError, AttributeError):  # not a key of this format: no one's relative
                continue
            if isinstance(entry, dict) and re.fullmatch(r"\d+", bn + bk):
                self.groups.setdefault((_arch_of_head(head), bn, bk), []).append(row)
        self._usable: dict[tuple, bool] = {}

    def of(self, head: str, bn: str, bk: str) -> list[tuple[str, str, str, int, str, Entry]]:
        """The entries of ``head``'s architecture (every GPU's) in this N x K bucket."""
        return self.groups.get((_arch_of_head(head), bn, bk), [])

    def usable(self, arch: str, key: str, entry: Entry, variant: Variant) -> bool:
        memo = (arch, key, variant)
        if memo not in self._usable:
            self._usable[memo] = _checked(entry_is_usable, arch, entry, variant)
        return self._usable[memo]


def from_another_gpu(key: str, relative: Entry) -> bool:
    """Whether ``relative`` (a ``nearest`` entry) was measured on another GPU than ``key``'s bucket."""
    nearest = relative.get("nearest")
    return bool(nearest) and key_parts(nearest)[0] != key_parts(key)[0]


def _arch_of_head(head: str) -> str:
    """'arch/gpu' -> 'arch'."""
    return head.partition("/")[0]


def _split_key(key: str) -> tuple[str, str, str]:
    """'arch/gpu/dtype/MxNxK[/variant]' -> ('arch/gpu/dtype/', 'MxNxK', '' or '/variant')."""
    head, _, tail = key.rpartition("/")
    if re.fullmatch(r"\d+x\d+x\d+", tail):
        return head + "/", tail, ""
    head2, _, shape = head.rpartition("/")
    return head2 + "/", shape, "/" + tail


def key_parts(key: str) -> tuple[str, str, str, str, str, str]:
    """'arch/gpu/dtype/MxNxK[/variant]' -> ('arch/gpu', 'dtype', 'M', 'N', 'K', '' or '/variant')."""
    prefix, shape, suffix = _split_key(key)
    m, bn, bk = shape.split("x")
    head, _, dtype = prefix.rstrip("/").rpartition("/")
    return head, dtype, m, bn, bk, suffix


def _takes(arch: str, entry: Entry, m: int, n: int, k: int, variant: Variant) -> bool:
    """Whether the entry's kernel takes this shape (its ``supports`` and limits)."""
    if entry["version"] == VENDOR:
        return True
    return versions.fits(versions.load(arch, entry["version"]), m, n, k, variant=variant)
