"""``matmul(a, b, *, out=None)``: ``a @ b`` with the fastest kernel of the series for this GPU and shape.

Semantics are torch's for 2-D operands: a [M, K] @ b [K, N] -> [M, N], float16 or bfloat16, float32
accumulation, the result in the inputs' dtype. The kernels compute A @ B^T with B [N, K] row-major,
so the layouts of ``b`` are:

* ``b = w.T``, the transposed view of a row-major [N, K] weight (``x @ w.T``, as in a linear
  layer): read in place, no copy.
* ``b`` row-major [K, N] (``b.is_contiguous()``): transposed once into a temporary [N, K] copy per
  call (one extra read and write of ``b``). Keep weights as [N, K] and pass ``w.T`` to avoid it.
* any other strides: ``MatmulInputError``; pass ``b.contiguous()``.

Where no kernel applies, ``MatmulInputError`` names the problem and the fix, and nothing runs:
CPU tensors, dtypes other than float16/bfloat16, shapes that do not match, empty dimensions,
operands whose rows or base are not 16-byte aligned (TMA's rule, see ``contract``), and GPUs that
are neither Hopper (compute capability 9.0, sm_90a) nor Blackwell (10.0, sm_100a)
(``UnsupportedGPUError``): there is no silent fallback; use ``torch.matmul`` for those.
If N is not a multiple of 8 the returned [M, N] tensor is a view of rows padded to 16 bytes.

The choice: on the first call for a shape bucket (each of M, N, K rounded up as tilus buckets its
own tuning, see ``bucket``), every version of ``versions.available(arch)`` is
autotuned by tilus over its own space on fresh random operands of that shape, checked against the
float32 reference, and the winners are timed against each other and against cuBLAS
(``torch.matmul``, candidate ``"cublas"``) in four interleaved rounds (the median of each; after
the first, only those within ``PRUNE`` of the fastest are timed again). A
version replaces cuBLAS only when it is faster by more than ``VENDOR_MARGIN``: within the
timing noise of a power-limited GPU (a few per cent from run to run) the vendor library is the
safer choice. The fastest is stored by ``choice_cache`` (see there for the location, locking and
invalidation) and later calls, in this process or another, launch that one kernel. cuBLAS wins
the skinny shapes (M = 128 with N = 1024, say), whose few output tiles cannot fill the GPU; the
series has no split-K kernel (``notes/SPLIT_K.md`` says why one tried here did not pay).
``choice(a, b)`` and the harness's results name the winner of every shape.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import statistics
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import tilus
from tqdm import tqdm

from . import tilus_autotune
from ..kernels import versions
from ..measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from .choice_cache import ChoiceCache, Entry
from ..contract import DTYPES, MatmulInputError, _check_row_major, check_operands, empty_padded, row_stride
from ..measure.timing import alternating_rounds, interleaved_ms, median_ms



VENDOR = "cublas"  # the candidate that is not a version of the series: torch.matmul
VENDOR_MARGIN = 0.01  # a version must beat cuBLAS by more than this share of its time to be chosen
TUNING_ROUNDS = 4  # even: each candidate is timed as often early as late in a round
PRUNE = 1.25  # after the first round, only candidates within this factor of the fastest are timed again


class UnsupportedGPUError(MatmulInputError):
    """The GPU is not one the series has kernels for."""


# --- operands ------------------------------------------------------------------------------------


def device_arch(device: torch.device) -> str:
    """The series that runs on ``device``: 'sm_90a' (Hopper) or 'sm_100a' (Blackwell)."""
    capability = torch.cuda.get_device_capability(device)
    arch = versions.ARCH_BY_CAPABILITY.get(capability)
    if arch is None:
        raise UnsupportedGPUError(
            f"{torch.cuda.get_device_name(device)} ({device}) has compute capability "
            f"{capability[0]}.{capability[1]}; the kernels of this project need a Hopper GPU (9.0, e.g. "
            "H100/H200) or a Blackwell B200/GB200 (10.0). Use torch.matmul(a, b) on this GPU")
    if not versions.available(arch):
        raise UnsupportedGPUError(f"no version of the series exists yet for {arch}; use torch.matmul(a, b)")
    return arch


def kernel_b(b: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """B [N, K] row-major as the kernels read it, from torch's b [K, N]; and whether it was copied."""
    bt = b.T
    row_major = b.stride(1) == 1 or b.shape[1] == 1
    if bt.stride(1) == 1 or bt.shape[1] == 1:  # b = w.T of a row-major w [N, K]: read w in place
        try:
            _check_row_major("b.T", bt)  # its rows must suit TMA; the message says how to pad them
            return bt, False
        except MatmulInputError:
            if not row_major:  # (with K = 1, b [1, N] is both: then copy it)
                raise
    if row_major:  # row-major [K, N]: one transposed copy, rows padded to 16 bytes
        n, k = bt.shape
        copy = empty_padded(n, k, b.dtype, b.device)
        copy.copy_(bt)
        return copy, True
    raise MatmulInputError(
        f"b [K, N] = {list(b.shape)} has strides {tuple(b.stride())}: neither row-major [K, N] nor the "
        "transposed view w.T of a row-major [N, K] matrix; pass b.contiguous()")


def _check_call(a, b) -> None:
    """What must hold before ``b`` may be copied: tensors, 2-D, matching K, dtype, one GPU."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise MatmulInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise MatmulInputError(f"{name} must be 2-D, got shape {tuple(t.shape)}; reshape it to 2-D "
                                   "(e.g. x.reshape(-1, x.shape[-1]))")
    if a.shape[1] != b.shape[0]:
        raise MatmulInputError(f"a @ b needs a [M, K] and b [K, N]; got a {list(a.shape)} and b {list(b.shape)}")
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        raise MatmulInputError(f"a and b must both be float16 or both bfloat16, got {a.dtype} and {b.dtype}; "
                               "convert with .half() or .bfloat16()")
    if not (a.is_cuda and b.is_cuda):
        raise MatmulInputError(f"a and b must be CUDA tensors, got devices {a.device} and {b.device}; "
                               "move them with .cuda()")
    if a.device != b.device:
        raise MatmulInputError(f"a and b are on different devices ({a.device}, {b.device}); put both on one GPU")


# --- the choice ----------------------------------------------------------------------------------


def bucket(x: int) -> int:
    """``x`` rounded up to a multiple of 2^(bit_length - 2), tilus's tuning-key rule: 4096 -> 4096,
    4097 -> 6144, 14336 -> 16384, 1000 -> 1024."""
    block = 1 << max(x.bit_length() - 2, 0)
    return (x + block - 1) // block * block


def choice_key(arch: str, gpu: str, dtype: torch.dtype, m: int, n: int, k: int) -> str:
    return f"{arch}/{gpu}/{str(dtype).removeprefix('torch.')}/{bucket(m)}x{bucket(n)}x{bucket(k)}"


@functools.cache
def fingerprint(arch: str, version: str) -> str:
    """Changes when the version's source, the shared entry point, the pipeline code, the tilus fixes or tilus change
    (for cuBLAS: when torch or its CUDA change)."""
    import pipeline

    if version == VENDOR:
        return hashlib.sha256(f"{torch.__version__} {torch.version.cuda}".encode()).hexdigest()[:16]
    digest = hashlib.sha256(tilus.__version__.encode())
    from .. import tilus_fixes
    from ..kernels import entry

    files = [Path(versions.load(arch, version).__file__), Path(entry.__file__),
             *sorted(Path(pipeline.__file__).parent.glob("*.py")),
             *sorted(Path(tilus_fixes.__file__).parent.glob("*.py"))]
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def space_config(module, config: Any) -> Optional[dict]:
    """The point of the version's autotune space equal to ``config`` (as stored in JSON), or None."""
    if not isinstance(config, dict):
        return None
    normal = json.loads(json.dumps(config))
    return next((c for c in versions.space(module) if json.loads(json.dumps(c)) == normal), None)


def entry_is_valid(arch: str, entry: Entry) -> bool:
    """A stored choice may be used: its version and configuration exist, and nothing it was timed with changed."""
    version = entry.get("version")
    ms = entry.get("ms")
    if version == VENDOR:
        return entry.get("fingerprint") == fingerprint(arch, VENDOR) and isinstance(ms, (int, float)) and ms > 0
    if version not in versions.VERSIONS:
        return False
    try:
        module = versions.load(arch, version)
    except ModuleNotFoundError:  # the version was removed
        return False
    if space_config(module, entry.get("config")) is None:
        return False
    return entry.get("fingerprint") == fingerprint(arch, version) and isinstance(ms, (int, float)) and ms > 0


@dataclass
class Candidate:
    """One version, autotuned by tilus for the shape and checked: its configuration, error and launcher."""

    version: str
    config: dict
    error: float
    run: Callable[[], object]
    # cuBLAS on the same operands, launched in turn with ``run`` when it is timed, and its time in
    # a window of its own (measured once, when first asked): the scale of the candidate's time
    reference: Optional[Callable[[], object]] = None
    reference_ms: Optional[Callable[[], float]] = None


def tune(arch: str, dtype: torch.dtype, prepare: Callable[[str], Candidate], timer: Callable[[Candidate], float],
         names: Optional[list[str]] = None, rounds: int = TUNING_ROUNDS, label: str = "") -> Entry:
    """Prepare every version (a failure or a wrong result rules it out), time the survivors in
    ``rounds`` interleaved rounds, and describe the fastest as a choice entry (cuBLAS, if it is a
    candidate, unless a version is faster by more than ``VENDOR_MARGIN``)."""
    candidates, rejected = [], {}
    for version in tqdm(names or versions.available(arch), desc=f"[matmul] tuning {label}", leave=False):
        try:
            candidate = prepare(version)
        except Exception as e:  # a version that does not build or run here is not a candidate
            rejected[version] = f"{type(e).__name__}: {e}"[:400]
            continue
        if not candidate.error <= TOLERANCE[dtype]:
            rejected[version] = f"relative error {candidate.error:.3g} over the tolerance {TOLERANCE[dtype]:g}"
            continue
        candidates.append(candidate)
    if not candidates:
        raise RuntimeError(f"no version of the series ran correctly for {label}: {rejected}; "
                           "use torch.matmul meanwhile, and report it")
    # the rounds that decide are spent on the contenders, not on V0 and friends
    times = alternating_rounds(candidates, rounds, timer, prune=PRUNE)
    ms = {c.version: statistics.median(t) for c, t in zip(candidates, times)}
    best = min(candidates, key=lambda c: ms[c.version])
    vendor = next((c for c in candidates if c.version == VENDOR), None)
    if vendor is not None and ms[best.version] >= ms[VENDOR] * (1 - VENDOR_MARGIN):
        best = vendor
    return {
        "version": best.version, "config": best.config, "ms": ms[best.version], "error": best.error,
        "fingerprint": fingerprint(arch, best.version),
        "candidates": {c.version: {"config": c.config, "ms": ms[c.version], "error": c.error} for c in candidates},
        "rejected": rejected,
        "tuned": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


# --- on the GPU ----------------------------------------------------------------------------------


def _gpu_prepare(arch: str, dtype: torch.dtype, m: int, n: int, k: int, device: torch.device):
    # fresh random operands of the shape, never the caller's (zeros would time and check badly)
    a, b = random_operands(m, n, k, dtype, device=device)
    ref = reference(a, b)
    out = poisoned_output(m, n, dtype, device=device)
    args = versions.launch_args(a, b, out)
    vendor = functools.partial(vendor_launch, *args)
    vendor_ms = functools.cache(lambda: median_ms(vendor, warmup_ms=20.0, repeat_ms=100.0))

    def prepare(version: str) -> Candidate:
        if version == VENDOR:
            out.fill_(float("nan"))
            vendor()
            return Candidate(version, {}, relative_error(out, ref), vendor, vendor, vendor_ms)
        module = versions.load(arch, version)
        tuned = versions.kernel(module, dtype)
        tilus_autotune.prepare(tuned, args)
        tuned(*args)  # tilus tunes its space for this shape bucket, or reads its stored choice
        config = tilus_autotune.tuned_config(tuned, args)
        fixed = versions.kernel(module, dtype, config)
        tilus_autotune.prepare(fixed, args)
        out.fill_(float("nan"))
        fixed(*args)
        return Candidate(version, config, relative_error(out, ref), functools.partial(fixed, *args), vendor, vendor_ms)

    return prepare


def vendor_launch(m, n, k, a, bt, out, lda, ldb, ldc) -> None:
    """cuBLAS behind the kernels' launch signature (the operands as ``matmul`` hands them over)."""
    a, bt = a.as_strided((m, k), (lda, 1)), bt.as_strided((n, k), (ldb, 1))
    c = out.as_strided((m, n), (ldc, 1))
    if c.is_contiguous():
        torch.matmul(a, bt.T, out=c)
    else:  # rows padded to 16 bytes: cuBLAS writes a dense result, copied into the padded rows
        c.copy_(torch.matmul(a, bt.T))


def _gpu_timer(candidate: Candidate) -> float:
    """The candidate's time in milliseconds at cuBLAS's clock: it is timed in one window with
    cuBLAS, launched in turn (``timing.interleaved_ms``), and its ratio to cuBLAS there scales
    cuBLAS's time. On a power-limited GPU a kernel timed in a window of its own moves by several
    percent with what ran before it; the ratio in a shared window does not (the harness times the
    same way)."""
    if candidate.reference is None:
        return median_ms(candidate.run, warmup_ms=20.0, repeat_ms=100.0)
    ms, reference_ms = interleaved_ms([candidate.run, candidate.reference], warmup_ms=20.0, repeat_ms=100.0)
    return candidate.reference_ms() * ms / reference_ms


class Chooser:
    """The process's memory of choices, in front of the choice file. The GPU-facing steps are
    parameters so that the tests can run the whole choice on the CPU with stand-ins."""

    def __init__(self, cache: Optional[ChoiceCache] = None, prepare=_gpu_prepare, timer=_gpu_timer,
                 arch_of=None, gpu_name=None):
        self.lock = threading.Lock()
        self.launchers: dict[tuple, tuple[Any, Entry]] = {}
        self.cache = cache
        self.prepare, self.timer = prepare, timer
        self.arch_of = arch_of or device_arch
        self.gpu_name = gpu_name or (lambda device: _gpu_name(device.index))

    def get(self, device: torch.device, dtype: torch.dtype, m: int, n: int, k: int) -> tuple[Any, Entry]:
        """The launchable script for this shape's bucket and the choice entry behind it."""
        memo = (device, dtype, bucket(m), bucket(n), bucket(k))
        found = self.launchers.get(memo)
        if found is not None:
            return found
        with self.lock:
            if memo not in self.launchers:
                self.launchers[memo] = self._load(device, dtype, m, n, k)
            return self.launchers[memo]

    def _load(self, device, dtype, m, n, k):
        if self.cache is None:
            self.cache = ChoiceCache()  # located when first needed: MATMUL_CACHE_DIR may be set late
        arch = self.arch_of(device)
        key = choice_key(arch, self.gpu_name(device), dtype, m, n, k)

        def tune_here() -> Entry:
            return tune(arch, dtype, self.prepare(arch, dtype, m, n, k, device), self.timer,
                        names=[*versions.available(arch), VENDOR], label=key)

        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            entry = self.cache.choose(key, tune_here, lambda e: entry_is_valid(arch, e))
            if entry["version"] == VENDOR:
                return vendor_launch, entry
            module = versions.load(arch, entry["version"])
            script = versions.kernel(module, dtype, space_config(module, entry["config"]))
            tilus_autotune.prepare(script)
        return script, entry


@functools.cache
def _gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


_chooser = Chooser()


def _operands(a, b, out):
    _check_call(a, b)
    bt, _ = kernel_b(b)
    return bt, check_operands(a, bt, out)


def choice(a: torch.Tensor, b: torch.Tensor) -> Entry:
    """The stored choice (version, configuration, timings) ``matmul(a, b)`` uses; tunes if needed."""
    _check_call(a, b)
    return _chooser.get(a.device, a.dtype, a.shape[0], b.shape[1], a.shape[1])[1]


def matmul(a: torch.Tensor, b: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a @ b`` (a [M, K], b [K, N]) into ``out`` [M, N] if given; see the module's docstring."""
    bt, out = _operands(a, b, out)
    (m, k), n = a.shape, bt.shape[0]
    script, _ = _chooser.get(a.device, a.dtype, m, n, k)
    args = (m, n, k, a, bt, out, row_stride(a), row_stride(bt), row_stride(out))
    if a.device.index == torch.cuda.current_device():
        script(*args)
    else:
        with torch.cuda.device(a.device):
            script(*args)
    return out
