"""The shapes the harness times, by name, and the parser for ``--shapes``.

Every shape is C[M, N] = A[M, K] @ B[N, K]^T, the layout of a linear layer ``x @ w.T`` with ``x``
[M, K] activations and ``w`` [N, K] weights.
"""

from __future__ import annotations

from typing import NamedTuple


class Shape(NamedTuple):
    m: int
    n: int
    k: int
    label: str = ""  # e.g. "gate, up" for a projection of the LLM preset

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k

    @property
    def text(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


# The projections of Llama-3-8B (hidden 4096, 32 query heads and 8 key/value heads of 128, MLP
# 14336), as (N, K) = (output features, input features) of each weight. q and o have the same
# shape, as have k and v, and gate and up: each pair is timed once.
LLAMA3_8B_PROJECTIONS = {"q, o": (4096, 4096), "k, v": (1024, 4096), "gate, up": (14336, 4096), "down": (4096, 14336)}
# tokens per call: a small decoding batch, a medium prefill, a large prefill or training step
LLM_TOKENS = (128, 1024, 8192)
# decoding and small batches, where a projection is bound by reading its weight once: the square
# projection, the fused q/k/v and gate/up weights, down, and the lm_head of a 128256-token vocabulary
DECODE_PROJECTIONS = {
    "4096 x 4096": (4096, 4096),
    "qkv": (6144, 4096),
    "down": (4096, 14336),
    "gate-up": (28672, 4096),
    "lm_head": (128256, 4096),
}
DECODE_TOKENS = (1, 16, 64, 128, 256)

PRESETS: dict[str, list[Shape]] = {
    # the square sizes the series is written about
    "series": [Shape(4096, 4096, 4096), Shape(8192, 8192, 8192)],
    # how each version copes with short and long reductions at a fixed output size
    "ksweep": [Shape(8192, 8192, k) for k in (512, 1024, 2048, 4096, 8192, 16384)],
    "llm": [Shape(m, n, k, label) for m in LLM_TOKENS for label, (n, k) in LLAMA3_8B_PROJECTIONS.items()],
    "decode": [Shape(m, n, k, label) for label, (n, k) in DECODE_PROJECTIONS.items() for m in DECODE_TOKENS],
}


def parse(spec: str) -> dict[str, list[Shape]]:
    """``"series,llm,1000x4096x17"`` -> {"series": [...], "llm": [...], "custom": [1000x4096x17]}."""
    chosen: dict[str, list[Shape]] = {}
    for item in (s.strip().lower() for s in spec.split(",")):
        if not item:
            continue
        if item in PRESETS:
            chosen[item] = list(PRESETS[item])
            continue
        try:
            m, n, k = (int(x) for x in item.split("x"))
        except ValueError:
            raise ValueError(
                f"unknown shape {item!r}: use a preset ({', '.join(PRESETS)}) or MxNxK, e.g. 4096x4096x4096"
            ) from None
        if min(m, n, k) < 1:
            raise ValueError(f"shape {item!r}: every dimension must be at least 1")
        chosen.setdefault("custom", []).append(Shape(m, n, k))
    if not chosen:
        raise ValueError("no shapes given: use a preset (" + ", ".join(PRESETS) + ") or MxNxK")
    return chosen


def unique(presets: dict[str, list[Shape]]) -> list[Shape]:
    """Each distinct (M, N, K) once, in order (8192^3 is in both "series" and "ksweep")."""
    seen: dict[tuple[int, int, int], Shape] = {}
    for shapes in presets.values():
        for shape in shapes:
            if shape.mnk not in seen or (shape.label and not seen[shape.mnk].label):
                seen[shape.mnk] = shape
    return list(seen.values())
