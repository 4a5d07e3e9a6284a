"""The consumer's K loop before and after, as bars: TFLOPS of each 128 x 96 kernel on three shapes,
from the tree before, with the ring's compare-and-select alone, and with the descriptor fix too
(``attribution/*.txt``, written by ``ab_attribution.sh`` on one H200 in one call; float16, paired
windows with cuBLAS, L2 flushed). Writes ``attribution.png`` and ``.svg`` beside this file.

    python plots/h200/issue-path/plot_attribution.py
"""

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
STEPS = {"before": "before", "select": "stage by compare and select", "both": "and descriptors as base + offset"}
LINE = re.compile(r"^(\d+x\d+x\d+) (v\d) .*?group=(\d+)( pair=n)?: (\d+) TFLOPS ([\d.]+)x cuBLAS")
SHAPES = {
    "256x6144x4096": "qkv, 256 tokens",
    "256x28672x4096": "gate-up, 256 tokens",
    "128x6144x4096": "qkv, 128 tokens",
}


def read(step: str) -> dict:
    """(shape, kernel) -> (TFLOPS, x cuBLAS) from one step's candidates output."""
    rows = {}
    for line in (HERE / "attribution" / f"{step}.txt").read_text().splitlines():
        match = LINE.match(line)
        if match:
            shape, version, group, pair_n, tflops, ratio = match.groups()
            kernel = f"{version.upper()} 128 x 96" + (' pair="n"' if pair_n else "")
            rows[shape, kernel] = (float(tflops), float(ratio))
    return rows


def main():
    data = {step: read(step) for step in STEPS}
    kernels = sorted({kernel for _, kernel in data["before"]})
    fig, axes = plt.subplots(1, len(SHAPES), figsize=(13, 4.2), sharey=True)
    width = 0.8 / len(STEPS)
    for ax, (shape, title) in zip(axes, SHAPES.items()):
        for i, (step, label) in enumerate(STEPS.items()):
            values = [data[step].get((shape, kernel), (0.0, 0.0)) for kernel in kernels]
            xs = [k + (i - 1) * width for k in range(len(kernels))]
            bars = ax.bar(xs, [v[0] for v in values], width, label=label)
            for bar, (_, ratio) in zip(bars, values):
                if ratio:
                    ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7)  # fmt: skip
        ax.set_xticks(range(len(kernels)), kernels, fontsize=8)
        ax.set_title(f"{shape.replace('x', ' x ')} ({title})", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("TFLOPS (labels: x cuBLAS)")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("Hopper V5/V6 128 x 96 tiles, K loop before and after (NVIDIA H200, float16, L2 flushed)", fontsize=10)
    fig.tight_layout()
    for suffix in ("png", "svg"):
        fig.savefig(HERE / f"attribution.{suffix}", dpi=130)


if __name__ == "__main__":
    main()
