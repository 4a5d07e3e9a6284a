"""Figures of a results file (``bench``), as PNG and SVG.

* ``progression``: one bar per version (V0..V6), the Triton baseline and cuBLAS, in TFLOPS with
  each bar's share of cuBLAS, per shape of the ``series`` preset (or the custom shapes);
* ``ksweep``: TFLOPS against K at M = N = 8192, one line per kernel;
* ``llm``: the autotuned ``matmul()`` call and the Triton baseline as multiples of cuBLAS over the
  projections of the ``llm`` preset, with the issue's bars (parity with cuBLAS in geometric mean,
  0.8 of it at worst).

Built on ``matplotlib.figure.Figure`` without pyplot: no GUI backend, no global state. Saved files
carry no date, so redrawing unchanged results leaves the files unchanged.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

import matplotlib
from matplotlib.figure import Figure

from ..kernels import versions
from .results import AUTOTUNED, CUBLAS, TRITON, Results, is_sustained

VERSION_COLORS = matplotlib.colormaps["viridis"]
STYLE = {CUBLAS: dict(color="0.25"), TRITON: dict(color="tab:orange"), AUTOTUNED: dict(color="tab:red")}


def _color(kernel: str, n_versions: int = 7):
    if kernel in STYLE:
        return STYLE[kernel]["color"]
    return VERSION_COLORS(0.15 + 0.7 * int(kernel[1:]) / max(n_versions - 1, 1))


def _label(kernel: str) -> str:
    return kernel.upper() if kernel in versions.VERSIONS else kernel


def _title(results: Results, what: str) -> str:
    arch = results["arch"]
    how = (
        f"; sustained: each kernel alone, back to back, {results['timing'].get('seconds', 0):g} s a window"
        if is_sustained(results)
        else "; each kernel timed in turn with cuBLAS"
    )
    return (
        f"{what}\n{results['machine']['gpu']}, {versions.ARCH_NAMES.get(arch, arch)} series ({arch})\n"
        f"{results['dtype']} in and out, fp32 accumulate, C = A @ B^T{how}"
    )


def _rows(results: Results, m: int, n: int, k: int) -> dict[str, dict]:
    return {r["kernel"]: r for r in results["rows"] if (r["m"], r["n"], r["k"]) == (m, n, k)}


def _preset(results: Results, name: str) -> list[dict]:
    """The preset's shapes that have rows in the results."""
    measured = {(r["m"], r["n"], r["k"]) for r in results["rows"]}
    return [s for s in results["presets"].get(name, []) if (s["m"], s["n"], s["k"]) in measured]


def _shape_title(s: dict) -> str:
    if s["m"] == s["n"] == s["k"]:
        return f"M = N = K = {s['m']}"
    return f"M x N x K = {s['m']} x {s['n']} x {s['k']}"


def _version_kernels(results: Results) -> list[str]:
    return [v for v in versions.VERSIONS if any(r["kernel"] == v for r in results["rows"])]


# --- figures -------------------------------------------------------------------------------------


def progression(results: Results) -> Optional[Figure]:
    shapes = _preset(results, "series") or _preset(results, "custom")
    if not shapes:
        return None
    kernels = _version_kernels(results) + [TRITON, CUBLAS]
    fig = Figure(figsize=(max(7.5, 1.2 + 1.0 * len(kernels) * len(shapes)), 5.4), layout="constrained")
    axes = fig.subplots(1, len(shapes), squeeze=False)[0]
    for ax, shape in zip(axes, shapes):
        rows = _rows(results, shape["m"], shape["n"], shape["k"])
        names = [kname for kname in kernels if kname in rows]
        heights = [rows[kname].get("tflops", 0.0) if rows[kname].get("ok") else 0.0 for kname in names]
        bars = ax.bar([_label(kname) for kname in names], heights, color=[_color(kname) for kname in names])
        cublas = rows.get(CUBLAS, {}).get("tflops")
        for bar, kname in zip(bars, names):
            row = rows[kname]
            text = "failed" if not row.get("ok") else (f"{row['vs_cublas']:.1%}" if "vs_cublas" in row else "")
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                xytext=(0, 2),
                textcoords="offset points",
                fontsize=8,
            )
        ax.set_title(_shape_title(shape))
        ax.set_ylabel("TFLOPS (bar labels: share of cuBLAS)")
        ax.set_ylim(0, max(heights, default=1) * 1.15 or 1)
        if cublas:
            share = ax.secondary_yaxis(
                "right", functions=(lambda t, c=cublas: t / c * 100, lambda p, c=cublas: p * c / 100)
            )
            share.set_ylabel("% of cuBLAS")
        ax.tick_params(axis="x", labelrotation=0)
    fig.suptitle(_title(results, "One idea at a time: each version against cuBLAS"))
    return fig


def ksweep(results: Results) -> Optional[Figure]:
    shapes = sorted(_preset(results, "ksweep"), key=lambda s: s["k"])
    if len(shapes) < 2:
        return None
    fig = Figure(figsize=(8.5, 5.6), layout="constrained")
    ax = fig.subplots()
    for kname in _version_kernels(results) + [TRITON, AUTOTUNED, CUBLAS]:
        points = [
            (s["k"], r["tflops"])
            for s in shapes
            if (r := _rows(results, s["m"], s["n"], s["k"]).get(kname)) and r.get("ok") and "tflops" in r
        ]
        if points:
            ks, tflops = zip(*points)
            ax.plot(
                ks,
                tflops,
                marker="o",
                label=_label(kname),
                color=_color(kname),
                linestyle="--" if kname == CUBLAS else "-",
                linewidth=2.2 if kname in STYLE else 1.5,
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks([s["k"] for s in shapes], [str(s["k"]) for s in shapes])
    ax.minorticks_off()
    ax.set_xlabel("K (reduction length)")
    ax.set_ylabel("TFLOPS")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(ncols=2, fontsize=8)
    m, n = shapes[0]["m"], shapes[0]["n"]
    fig.suptitle(_title(results, f"TFLOPS against K at M = {m}, N = {n}"))
    return fig


def llm(results: Results) -> Optional[Figure]:
    shapes = _preset(results, "llm")
    if not shapes:
        return None
    shown = [
        kname
        for kname in (AUTOTUNED, TRITON)
        if any(_rows(results, s["m"], s["n"], s["k"]).get(kname, {}).get("vs_cublas") for s in shapes)
    ]
    fig = Figure(figsize=(max(9.0, 0.9 * len(shapes) + 5), 5.6), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(len(shown), 1)
    for i, kname in enumerate(shown):
        ratios = [_rows(results, s["m"], s["n"], s["k"]).get(kname, {}).get("vs_cublas") or 0.0 for s in shapes]
        measured = [x for x in ratios if x > 0]
        label = (
            f"{_label(kname)}: geomean {statistics.geometric_mean(measured):.2f}x, worst {min(measured):.2f}x"
            if measured
            else kname
        )
        bars = ax.bar(
            [j + (i - (len(shown) - 1) / 2) * width for j in range(len(shapes))],
            ratios,
            width,
            label=label,
            color=_color(kname),
        )
        # matmul() may pick cuBLAS itself where no version of the series is faster: say so on the bar
        picked = [
            (_rows(results, s["m"], s["n"], s["k"]).get(kname, {}).get("config") or {}).get("version") for s in shapes
        ]
        for bar, version in zip(bars, picked):
            if kname == AUTOTUNED and version == CUBLAS:
                bar.set_hatch("//")
        ax.bar_label(
            bars,
            [
                (f"{x:.2f}" + (f"\n{_label(v)}" if v and kname == AUTOTUNED else "")) if x else "failed"
                for x, v in zip(ratios, picked)
            ],
            fontsize=7,
            padding=1,
        )
    ax.axhline(1.0, color=_color(CUBLAS), linestyle="--", linewidth=1, label="cuBLAS (1.0x)")
    ax.axhline(0.8, color="0.5", linestyle=":", linewidth=1, label="0.8x floor")
    ax.set_xticks(
        range(len(shapes)), [f"{s['label'] or s['n']}\nM={s['m']}\nN={s['n']}\nK={s['k']}" for s in shapes], fontsize=7
    )
    ax.set_ylabel("speed relative to cuBLAS (x)")
    ax.set_ylim(0, max([1.2] + [p.get_height() * 1.1 for p in ax.patches]))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(
        _title(
            results,
            "Llama-3-8B projections (x @ w.T): multiple of cuBLAS, M = tokens "
            "(on each bar: what matmul() ran; hatched: cuBLAS)",
        )
    )
    return fig


FIGURES = {"progression": progression, "ksweep": ksweep, "llm": llm}


def save(fig: Figure, stem: Path) -> list[Path]:
    """``stem``.png and ``stem``.svg, without dates (and SVG ids from a fixed salt) so they are reproducible."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    with matplotlib.rc_context({"svg.hashsalt": "tilus-matmul"}):
        fig.savefig(paths[0], dpi=150, metadata={"Software": None})
        fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    return paths


def draw_all(results: Results, out_dir: Path) -> list[Path]:
    """Every figure the results have data for, into ``out_dir``; the paths written."""
    written = []
    for name, make in FIGURES.items():
        fig = make(results)
        if fig is not None:
            suffix = "-sustained" if is_sustained(results) else ""
            written += save(fig, Path(out_dir) / f"{name}-{results['arch']}-{results['dtype']}{suffix}")
    return written
