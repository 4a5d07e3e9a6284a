"""Chosen configurations of the versions timed against cuBLAS, to decide what an autotune space
should hold: ``python -m matmul candidates``.

Each candidate is a version at one fixed configuration (``v5:block_m=128,...,group=16``), or a bare
version name for every configuration of its space. They go through the bench's own loop
(``bench.measure``): checked against the float32 reference on fresh random operands, then timed
in paired windows with cuBLAS, or in sustained windows (``--sustained SECONDS``); ``--profile N``
only launches each checked candidate N times inside an NVTX range "profile", for Nsight Compute
(compare elapsed cycles there, not durations: a power-limited GPU's clock moves under load). The rows are
rough numbers for choosing; ``python -m matmul bench`` is the measurement to report.
"""

from __future__ import annotations

import functools
import statistics
from typing import Callable, Optional

import torch

from ..kernels import versions
from ..measure.correctness import poisoned_output, random_operands, reference
from ..measure.timing import SustainedTimer, interleaved_ms, tflops
from . import bench
from .presets import Shape
from .results import CUBLAS, Row


def parse(text: str, arch: str) -> list[tuple[str, dict]]:
    """``"v5:block_m=128,group=16"`` -> [("v5", {...})]; ``"v5"`` -> every configuration of its space.
    A knob's value is an int, ``True``/``False``, or else a word (``v6:...,pair=n``)."""
    name, _, params = text.partition(":")
    if name not in versions.VERSIONS:
        raise ValueError(f"unknown version {name!r}; the series is {', '.join(versions.VERSIONS)}")
    if not params:
        return [(name, config) for config in versions.space(versions.load(arch, name))]
    try:
        config = {key: _knob_value(value) for key, value in (item.split("=") for item in params.split(","))}
    except ValueError:
        raise ValueError(f"a candidate is VERSION or VERSION:knob=value,knob=value..., got {text!r}") from None
    return [(name, config)]


def _knob_value(text: str):
    if text in ("True", "False"):
        return text == "True"
    return int(text) if text.lstrip("-").isdigit() else text


def label(name: str, config: dict) -> str:
    return f"{name} " + " ".join(f"{k}={v}" for k, v in config.items())


def contenders(
    arch: str, candidates: list[tuple[str, dict]], a: torch.Tensor, b: torch.Tensor, out: torch.Tensor
) -> list[bench.Contender]:
    """cuBLAS and each candidate (a version at a fixed configuration) as the bench's contenders."""
    cublas_out = torch.empty_like(out)
    found = [bench.Contender(CUBLAS, "baseline", functools.partial(torch.matmul, a, b.T, out=cublas_out), cublas_out)]
    for name, config in candidates:
        run = functools.partial(versions.run, versions.load(arch, name), a, b, out, config=config)
        found.append(bench.Contender(label(name, config), "version", run, out))
    return found


def measure(
    arch: str,
    candidates: list[tuple[str, dict]],
    sizes: list[tuple[int, int, int]],
    rounds: int,
    timer: Optional[Callable] = None,
    profile: int = 0,
    print_=print,
) -> list[Row]:
    """Check and time every candidate on every size; print one line per candidate and the best
    configuration of each version; return the bench's rows. ``timer`` as ``bench.measure`` takes it
    (default: paired windows with cuBLAS)."""
    timer = timer or functools.partial(interleaved_ms, warmup_ms=25, repeat_ms=100)
    sustained = isinstance(timer, SustainedTimer)
    all_rows: list[Row] = []
    for m, n, k in sizes:
        shape = Shape(m, n, k, "")
        a, b = random_operands(m, n, k, torch.float16)
        ref = reference(a, b)
        found = contenders(arch, candidates, a, b, poisoned_output(m, n, torch.float16))
        if profile:
            rows, timed = bench.check_contenders(shape, found, ref, torch.float16)
            _report_wrong(shape, rows.values(), print_)
            torch.cuda.synchronize()
            for c in timed:
                for _ in range(profile):
                    torch.cuda.nvtx.range_push("profile")
                    c.run()
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_pop()
                print_(f"profiled {shape.text} {c.name} x{profile}")
            continue
        rows = bench.measure(shape, found, ref, torch.float16, timer, rounds, paired=not sustained)
        _report_wrong(shape, rows, print_)
        best: dict[str, tuple[float, str]] = {}
        for row in rows:
            if not row.get("ok") or (row["kernel"] == CUBLAS and not sustained):
                continue  # wrong (reported); cuBLAS's own row says something only when sustained
            ms = statistics.median(row["ms_rounds"])
            line = f"{shape.text} {row['kernel']}: {tflops(m, n, k, ms):.0f} TFLOPS {row['vs_cublas']:.3f}x cuBLAS"
            if sustained:
                clock = statistics.mean(row.get("clock_mhz_rounds") or [float("nan")])
                line += f" at {clock:.0f} MHz (sustained)"
            else:
                windows = " ".join(f"{c / t:.3f}" for t, c in zip(row["ms_rounds"], row["cublas_ms_rounds"]))
                line += f" (windows {windows})"
            print_(line)
            if row["kernel"] != CUBLAS:
                name = row["kernel"].split()[0]
                best[name] = max(best.get(name, (row["vs_cublas"], row["kernel"])), (row["vs_cublas"], row["kernel"]))
        for _, (ratio, kernel) in sorted(best.items()):
            print_(f"BEST {shape.text} {kernel}: {ratio:.3f}x cuBLAS")
        all_rows += rows
    return all_rows


def _report_wrong(shape: Shape, rows, print_) -> None:
    for row in rows:
        if row["kernel"] != CUBLAS and not row["ok"]:
            why = row.get("message") or f"error {row['error']:.3g}"
            print_(f"{shape.text} {row['kernel']}: WRONG ({why})")
