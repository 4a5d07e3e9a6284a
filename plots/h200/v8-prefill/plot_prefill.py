"""The figure of plots/h200/v8-prefill/: int4 products past 64 tokens, x cuBLAS on the 16-bit weight
(float16 or bfloat16), per weight: V8 in ONE_PASS and in TWO_SLABS and the weight widened then
cuBLAS (the probe, ``probe2/DTYPE/probe_configs.json``: each timed in one window with cuBLAS), and
the call as it now chooses (``product/bench.json``, a run of ``bench_v8.py`` after the change).

    python plots/h200/v8-prefill/plot_prefill.py [--dtype float16]   # writes prefill-DTYPE.png and .svg here
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
WEIGHTS = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))
LINES = {  # probe row name -> label, style
    "128/2/1/4/64": ("V8 ONE_PASS (no split, slabs by TMA stores)", "-o"),
    "128/2/2/3/64": ("V8 TWO_SLABS (split 2, float32 exchange)", "-s"),
    "widen + cuBLAS": ("widen once, then cuBLAS", "-^"),
}


def probe_rows(dtype: str) -> dict:
    """(n, k) -> name -> [(m, x cuBLAS)] from the probe."""
    rows = json.loads((HERE / "probe2" / dtype / "probe_configs.json").read_text())
    out: dict = {}
    for r in rows:
        c = r["config"]
        name = (
            c
            if isinstance(c, str)
            else "/".join(str(c[k]) for k in ("block_m", "warpgroups", "split", "stages", "chunk"))
        )
        out.setdefault((r["n"], r["k"]), {}).setdefault(name, []).append((r["m"], r["x_cublas"]))
    return out


def call_rows(dtype: str) -> dict:
    """(n, k) -> [(m, x cuBLAS, path)] from the bench of the call, past 64 tokens."""
    rows = json.loads((HERE / "product" / "bench.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    out: dict = {}
    for r in rows:
        if r["dtype"] == dtype and r["m"] > 64 and "x_cublas" in r:
            out.setdefault((r["n"], r["k"]), []).append((r["m"], r["x_cublas"], r["path"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()
    probe, call = probe_rows(args.dtype), call_rows(args.dtype)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey=True)
    for ax, (n, k) in zip(axes.flat, WEIGHTS):
        for name, (label, style) in LINES.items():
            points = sorted(probe.get((n, k), {}).get(name, []))
            if points:
                ax.plot(*zip(*points), style, label=label, alpha=0.8)
        points = sorted(call.get((n, k), []))
        for path, marker in (("V8", "*"), ("widen + cuBLAS", "x")):
            chosen = [(m, x) for m, x, p in points if p == path]
            if chosen:
                ax.plot(*zip(*chosen), marker, color="black", markersize=11, label=f"the call ({path})")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(0.9, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_title(f"N x K = {n} x {k}")
        ax.set_xlabel("tokens (M)")
        ax.set_ylabel(f"x cuBLAS {args.dtype} (16-bit weight)")
    handles = {label: h for ax in axes.flat for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=3, fontsize=9)
    fig.suptitle(
        f"int4 weights past 64 tokens, NVIDIA H200, {args.dtype}, L2 flushed (measured on an H200, not an H100)"
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    for ext in ("png", "svg"):
        fig.savefig(HERE / f"prefill-{args.dtype}.{ext}", dpi=110)


if __name__ == "__main__":
    main()
