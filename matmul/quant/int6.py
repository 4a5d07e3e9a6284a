"""The int6 format (an odd width): signed 6-bit weights with one scale per group of 128 along K, and
the packed layout Hopper V8's int6 path (``Kernel(weight="int6")``) and the widening kernel
(``matmul.quant.widen``) read.

Quantization as ``int4``'s with 6 bits: ``scale = absmax / 31`` (rounded to the weight's dtype, 1
for a zero group), ``q = round(w / scale)`` clamped to -32..31, stored as ``u = q + 32`` (0..63),
so that tilus's unsigned 6-bit cast widens it and the kernel subtracts 32 (exact) before the scale.

Packed layout: tiles of 64 rows x 128 columns (rows padded to 64), each 1536 int32 words
``[half h][thread t][word j < 6]``: the 192 bits of thread t in half h hold the 32 values it has in
the wgmma A fragment of K steps 4 h ... 4 h + 3 (``int4``'s fragment order), value l at bits
6 l ... 6 l + 5 (words little-endian, value l = 8 * step + e). The words form an int32 matrix
[N_pad / 2, K * 3 / 8]: tile (i, b) is rows 32 i ... 32 i + 31, columns 48 b ... 48 b + 47, its
word index ``48 r + column`` (one TMA box [32, 48]). Scales: [K / 128, N_pad], as ``int4``'s.
"""

from __future__ import annotations

import torch

from .int4 import FRAGMENT_ORDER, GROUP, padded_rows

QMIN, QMAX = -32, 31
BITS = 6


def reference(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """The format in plain torch: q int8 [N, K] (-32..31) and scales [N, K / group] in w's dtype."""
    n, k = w.shape
    groups = w.float().reshape(n, k // group, group)
    scale = (groups.abs().amax(dim=-1) / QMAX).to(w.dtype)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(groups / scale.float().unsqueeze(-1)).clamp(QMIN, QMAX).to(torch.int8)
    return q.reshape(n, k), scale


def pack(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] (K a multiple of 128) -> the packed int32 words [N_pad / 2, K * 3 / 8]."""
    n, k = q.shape
    n_pad = padded_rows(n)
    full = torch.full((n_pad, k), -QMIN, dtype=torch.int64, device=q.device)  # padding rows: q = 0
    full[:n] = q.to(torch.int64) - QMIN
    values = full.view(n_pad // 64, 4, 2, 8, k // GROUP, 2, 4, 2, 4, 2).permute(*FRAGMENT_ORDER)
    values = values.reshape(n_pad // 64, k // GROUP, 256, 32)  # [i, b, (h, t), value l]
    bits = (values.unsqueeze(-1) >> torch.arange(BITS, device=q.device)) & 1  # bit 6 l + m
    bits = bits.reshape(n_pad // 64, k // GROUP, 256, 6, 32)  # [.., word j, bit of the word]
    words = (bits << torch.arange(32, device=q.device)).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    words = words.view(n_pad // 64, k // GROUP, 32, 48).permute(0, 2, 1, 3)
    return words.reshape(n_pad // 2, k // GROUP * 48).contiguous()


def unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of ``pack``: q int8 [N, K]."""
    rows, cols = words.shape
    n_pad, k = rows * 2, cols // 48 * GROUP
    tiles = words.view(n_pad // 64, 32, k // GROUP, 48).permute(0, 2, 1, 3).reshape(n_pad // 64, k // GROUP, 256, 6)
    bits = (tiles.to(torch.int64).unsqueeze(-1) >> torch.arange(32, device=words.device)) & 1
    bits = bits.reshape(n_pad // 64, k // GROUP, 256, 32, BITS)
    values = (bits << torch.arange(BITS, device=words.device)).sum(dim=-1)
    shape = [n_pad // 64, k // GROUP, 2, 4, 8, 4, 4, 2, 2, 2]  # (i, b, h, w, g, c, j, colhalf, rowhalf, pair)
    inverse = [0] * len(FRAGMENT_ORDER)
    for position, dim in enumerate(FRAGMENT_ORDER):
        inverse[dim] = position
    q = (values.view(shape).permute(*inverse).reshape(n_pad, k) + QMIN).to(torch.int8)
    return q[:n]
