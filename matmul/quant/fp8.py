"""The fp8 e4m3 format: weights in float8 e4m3 with one float32 scale per row (per output channel),
and the packed layout Hopper V8's fp8 path reads (``V8 Kernel(weight="fp8_e4m3")``) and the
widening kernel (``matmul.quant.widen``) reads.

Quantization: per row, ``scale = absmax / 448`` (the largest e4m3 value; 1 for a zero row) and
``q = e4m3(w / scale)`` (round to nearest). The weight it stands for is ``q * scale`` rounded to
the activations' dtype; the kernel multiplies the float32 partial sums by the scale instead
(``q`` widens to float16/bfloat16 exactly).

Packed layout: tiles of 64 rows x 128 columns (rows padded to 64), each 2048 int32 words
``[part p < 4][thread t][word j < 4]``: the 16 bytes of thread t in part p are the values it holds in
the wgmma A fragment of K steps 2 p and 2 p + 1 (``int4``'s fragment order, one byte a value). The
words form an int32 matrix [N_pad / 2, K / 2]: tile (i, b) is rows 32 i ... 32 i + 31, columns
64 b ... 64 b + 63. Scales: float32 [N_pad] (zero for padding rows).
"""

from __future__ import annotations

import torch

from .int4 import GROUP, padded_rows

E4M3_MAX = 448.0

# q [N_pad, K] seen as (i, w, rowhalf, g, b, p, ks, colhalf, c, pair), in packed order: i, b, then the
# tile's bytes [p][t = (w, g, c)][ks][e = (colhalf, rowhalf, pair)]
_ORDER = (0, 4, 5, 1, 3, 8, 6, 7, 2, 9)


def reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The format in plain torch: q float8_e4m3fn [N, K] and scales float32 [N]."""
    wf = w.float()
    scale = wf.abs().amax(dim=1) / E4M3_MAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (wf / scale.unsqueeze(1)).to(torch.float8_e4m3fn), scale


def pack(q: torch.Tensor) -> torch.Tensor:
    """q float8_e4m3fn [N, K] (K a multiple of 128) -> the packed int32 words [N_pad / 2, K / 2]."""
    n, k = q.shape
    n_pad = padded_rows(n)
    full = torch.zeros((n_pad, k), dtype=torch.uint8, device=q.device)
    full[:n] = q.view(torch.uint8)
    tiles = full.view(n_pad // 64, 4, 2, 8, k // GROUP, 4, 2, 2, 4, 2).permute(*_ORDER)
    words = tiles.reshape(n_pad // 64, k // GROUP, 8192).contiguous().view(torch.int32)
    return words.view(n_pad // 64, k // GROUP, 32, 64).permute(0, 2, 1, 3).reshape(n_pad // 2, k // 2).contiguous()


def unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of ``pack``: q float8_e4m3fn [N, K]."""
    rows, k2 = words.shape
    n_pad, k = rows * 2, k2 * 2
    tiles = words.view(n_pad // 64, 32, k // GROUP, 64).permute(0, 2, 1, 3).contiguous().view(torch.uint8)
    shape = [n_pad // 64, k // GROUP, 4, 4, 8, 4, 2, 2, 2, 2]  # (i, b, p, w, g, c, ks, colhalf, rowhalf, pair)
    inverse = [0] * len(_ORDER)
    for position, dim in enumerate(_ORDER):
        inverse[dim] = position
    q = tiles.reshape(shape).permute(*inverse).reshape(n_pad, k)
    return q[:n].view(torch.float8_e4m3fn)


def pack_scales(scale: torch.Tensor) -> torch.Tensor:
    """scales [N] -> float32 [N_pad] (padding rows zero)."""
    out = torch.zeros(padded_rows(scale.shape[0]), dtype=torch.float32, device=scale.device)
    out[: scale.shape[0]] = scale
    return out


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q * scale`` rounded once to ``dtype``: [N, K]."""
    return (q.float() * scale.float().unsqueeze(1)).to(dtype)
