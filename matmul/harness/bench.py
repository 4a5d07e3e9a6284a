"""The harness: every version of the series, cuBLAS, a Triton baseline and the autotuned ``matmul()``
call, checked and timed on this machine's GPU in one run, into one raw results file (its record
and format: ``results``).

Per shape, every kernel gets the same fresh random operands. Each is first run once on a
NaN-poisoned output and checked against the float32 reference (``measure.correctness``); a kernel that fails is
recorded with its error and not timed. Then ``rounds`` rounds time every kernel against cuBLAS
(``torch.matmul(a, b.T)``, the ``x @ w.T`` of a linear layer): one window per kernel and round in
which the kernel and cuBLAS are launched in turn (``timing.interleaved_ms``: L2 flushed before each
launch, median of each), so the pair compared meets the same clock and thermal state of a
power-limited GPU, launch by launch. The kernels' order is reversed every other round. A kernel's
ratio to cuBLAS is the median of its windows' ratios; cuBLAS's time is its median over all windows,
and a kernel's time (and TFLOPS) is cuBLAS's time over the ratio: the kernel at cuBLAS's median
clock, consistent with the ratio. The raw times of each window are kept (``ms_rounds``,
``cublas_ms_rounds``).

The second mode, ``sustained`` (``bench --sustained SECONDS``), asks what a kernel settles at when
it runs alone: each kernel, cuBLAS too, is launched back to back for SECONDS per window (no L2
flush, same operands) and timed over the window's second half, with the SM clock and board power
sampled meanwhile (``clock_mhz_rounds``, ``power_w_rounds``). On a power-limited GPU the two
modes differ by design: paired windows compare the work per clock at a shared clock; a sustained
window also credits a kernel that moves fewer bytes, draws less power and so runs at a higher
clock. Its ratio is cuBLAS's median time over the kernel's.
"""

from __future__ import annotations

import datetime
import functools
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from tqdm import tqdm

from ..call import tilus_autotune
from ..kernels import versions
from ..measure.correctness import TOLERANCE, random_operands, reference, relative_error
from ..measure.timing import alternating_rounds, tflops
from . import presets
from .presets import Shape
from .results import AUTOTUNED, CUBLAS, FORMAT, TRITON, Results, Row, _dtype_name, machine, software, summary


@dataclass
class Contender:
    name: str  # "v0".."v6", CUBLAS, TRITON or AUTOTUNED
    kind: str  # "version", "baseline" or "autotuned"
    run: Callable[[], object]
    out: torch.Tensor  # where ``run`` writes C
    config: Callable[[], Optional[dict]] = lambda: None  # what it ran with (asked after its first run)


# --- one shape -----------------------------------------------------------------------------------


def check_contenders(
    shape: Shape, contenders: list[Contender], ref: torch.Tensor, dtype: torch.dtype, progress: Optional[tqdm] = None
) -> tuple[dict[str, Row], list[Contender]]:
    """Run each contender once on a NaN-poisoned output and compare it with ``ref``: a row per
    contender (by name), and the contenders to time (the correct ones, and cuBLAS whatever it did)."""
    base = {"m": shape.m, "n": shape.n, "k": shape.k, "label": shape.label, "dtype": _dtype_name(dtype)}
    rows, timed = {}, []
    for c in contenders:
        row = rows[c.name] = {**base, "kernel": c.name, "kind": c.kind}
        try:
            c.out.fill_(float("nan"))
            c.run()  # the first call also builds and autotunes
            row["config"] = c.config()
            row["error"] = relative_error(c.out, ref)
        except Exception as e:  # a kernel that does not build or run is a result, not the end of the run
            row.update(ok=False, error=math.inf, message=f"{type(e).__name__}: {e}"[-2000:])
            continue
        finally:
            if progress is not None:
                progress.update(1)
        row["ok"] = row["error"] <= TOLERANCE[dtype]
        if row["ok"] or c.name == CUBLAS:  # the reference point is timed even if it were off
            timed.append(c)
    return rows, timed


def measure(
    shape: Shape,
    contenders: list[Contender],
    ref: torch.Tensor,
    dtype: torch.dtype,
    timer: Callable[[list[Callable[[], object]]], list[float]],
    rounds: int = 6,
    progress: Optional[tqdm] = None,
    paired: bool = True,
) -> list[Row]:
    """Check, then time, ``contenders`` on one shape; one row per contender (see the module's docstring).
    With ``paired=False`` every kernel, cuBLAS too, is timed in windows of its own (``SustainedTimer``):
    its ratio is cuBLAS's median time over its own, and each window's ``timer.last_window`` (clock,
    power) is kept with its time."""
    rows, timed = check_contenders(shape, contenders, ref, dtype, progress)
    baseline = next((c for c in timed if c.name == CUBLAS), None)
    others = [c for c in timed if c is not baseline]
    paired = paired and baseline is not None and bool(others)

    def time_one(c: Contender) -> tuple[float, float, dict]:
        """The kernel's ms, cuBLAS's ms from the same window (NaN when not paired), what the timer
        says of the window."""
        ms = timer([c.run, baseline.run] if paired else [c.run])
        if progress is not None:
            progress.update(1)
        return ms[0], (ms[1] if paired else math.nan), dict(getattr(timer, "last_window", None) or {})

    subjects = others if paired else timed
    times = dict(zip((c.name for c in subjects), alternating_rounds(subjects, rounds, time_one)))
    if paired:  # cuBLAS's row: its times from every window
        times[CUBLAS] = [(c_ms, c_ms, {}) for windows in times.values() for _, c_ms, _ in windows]
        cublas_ms = statistics.median(c_ms for c_ms, _, _ in times[CUBLAS])
    elif CUBLAS in times:
        cublas_ms = statistics.median(ms for ms, _, _ in times[CUBLAS])
    for name, windows in times.items():
        row = rows[name]
        row["ms_rounds"] = [ms for ms, _, _ in windows]
        row["ms"] = statistics.median(row["ms_rounds"])
        for key in sorted({key for _, _, info in windows for key in info}):
            row[f"{key}_rounds"] = [info.get(key, math.nan) for _, _, info in windows]
        if paired and name != CUBLAS:
            row["vs_cublas"] = statistics.median(c_ms / ms for ms, c_ms, _ in windows)
            row["cublas_ms_rounds"] = [c_ms for _, c_ms, _ in windows]
            # at cuBLAS's median clock: windows ran at different clocks, the ratio within one did not
            row["ms"] = cublas_ms / row["vs_cublas"]
        elif baseline is not None:
            row["vs_cublas"] = cublas_ms / row["ms"]
        row["tflops"] = tflops(shape.m, shape.n, shape.k, row["ms"])
    return list(rows.values())


def contenders(
    arch: str,
    names: list[str],
    a: torch.Tensor,
    b: torch.Tensor,
    dtype: torch.dtype,
    triton: bool = True,
    autotuned: bool = True,
) -> list[Contender]:
    """cuBLAS, the versions ``names``, the Triton baseline (if installed) and ``matmul()`` for C = A @ B^T."""
    from ..call import api
    from ..measure.correctness import poisoned_output
    from . import triton_baseline

    m, n = a.shape[0], b.shape[0]
    out = poisoned_output(m, n, dtype)
    cublas_out = torch.empty(m, n, dtype=dtype, device=a.device)
    found = [Contender(CUBLAS, "baseline", functools.partial(torch.matmul, a, b.T, out=cublas_out), cublas_out)]
    args = versions.launch_args(a, b, out)
    for name in names:
        try:
            script = versions.kernel(versions.load(arch, name), dtype)  # autotuned by tilus on first call
            tilus_autotune.prepare(script, args)
        except Exception as e:  # e.g. no configuration transpiles: the row says so when it runs
            found.append(Contender(name, "version", functools.partial(_raise, e), out))
            continue
        tuned = functools.partial(tilus_autotune.tuned_config, script, args)
        found.append(Contender(name, "version", functools.partial(script, *args), out, tuned))
    if triton and triton_baseline.available():
        launch = functools.partial(triton_baseline.matmul_abt, a, b, out)
        found.append(Contender(TRITON, "baseline", launch, out, triton_baseline.best_config))
    if autotuned:

        def chosen():
            entry = api.choice(a, b.T)
            return {"version": entry["version"], **entry["config"]}

        found.append(Contender(AUTOTUNED, "autotuned", functools.partial(api.matmul, a, b.T, out=out), out, chosen))
    return found


# --- a whole run ---------------------------------------------------------------------------------


def run(
    arch: str,
    names: list[str],
    chosen: dict[str, list[Shape]],
    dtype: torch.dtype = torch.float16,
    rounds: int = 6,
    warmup_ms: float = 50.0,
    repeat_ms: float = 200.0,
    triton: bool = True,
    autotuned: bool = True,
    command: str = "",
    save: Optional[Callable[[dict], None]] = None,
    sustained_s: float = 0.0,
) -> Results:
    """Bench every shape of ``chosen``; ``save(results)`` after each shape keeps what a crash would lose.
    With ``sustained_s``, each kernel (cuBLAS too) is timed alone, launched back to back for that
    many seconds per window (``timing.SustainedTimer``), instead of in turn with cuBLAS."""
    from ..measure.timing import SustainedTimer, interleaved_ms
    from . import triton_baseline

    if sustained_s:
        timer = SustainedTimer(sustained_s)
        method = {
            "mode": "sustained",
            "method": "per round, one window per kernel (cuBLAS too) in which it is "
            "launched back to back, same operands, no L2 flush (timing.SustainedTimer): its time is the "
            "median launch of the window's second half, with the SM clock and board power nvidia-smi "
            "sampled then; ratio to cuBLAS: cuBLAS's median time over the kernel's; rounds in "
            "alternating order",
            "seconds": sustained_s,
            "rounds": rounds,
        }
    else:
        timer = functools.partial(interleaved_ms, warmup_ms=warmup_ms, repeat_ms=repeat_ms)
        method = {
            "mode": "paired",
            "method": "per round, one window per kernel in which it and cuBLAS are "
            "launched in turn (timing.interleaved_ms, L2 flushed, median of each); ratio to cuBLAS: "
            "median of the windows' ratios; rounds in alternating order",
            "warmup_ms": warmup_ms,
            "repeat_ms": repeat_ms,
            "rounds": rounds,
        }
    shapes = presets.unique(chosen)
    results: Results = {
        "format": FORMAT,
        "command": command,
        "arch": arch,
        "dtype": _dtype_name(dtype),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "software": software(),
        "timing": method,
        "presets": {name: [s._asdict() for s in group] for name, group in chosen.items()},
        "rows": [],
    }
    per_shape = 1 + len(names) + (triton and triton_baseline.available()) + autotuned
    # per shape: one check per kernel, then one window per kernel (but cuBLAS, when paired) per round
    windows = per_shape if sustained_s else per_shape - 1
    with tqdm(
        total=len(shapes) * (per_shape + rounds * windows), desc="[bench] checking and timing", unit="run"
    ) as bar:
        for shape in shapes:
            bar.set_postfix_str(shape.text)
            a, b = random_operands(shape.m, shape.n, shape.k, dtype)
            found = contenders(arch, names, a, b, dtype, triton=triton, autotuned=autotuned)
            results["rows"] += measure(shape, found, reference(a, b), dtype, timer, rounds, bar, paired=not sustained_s)
            del a, b, found
            torch.cuda.empty_cache()
            if save:
                save(results)
    results["machine_after"] = machine()  # the clocks drop under sustained load: say how far
    results["summary"] = summary(results)
    return results


def _raise(error: Exception):
    raise error
