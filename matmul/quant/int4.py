"""The int4 format: signed int4 weights with one scale per group of 128 along K, and the packed
layout Hopper V8 reads (``matmul/kernels/hopper/v8.py`` explains it with the kernel).

Quantization (symmetric, no zero point): per row and group of ``GROUP`` columns, ``scale =
absmax / 7`` rounded to the weight's dtype (1 for an all-zero group) and ``q = round(w / scale)``
clamped to -8..7. The weight it stands for is ``q * scale`` rounded once to that dtype, which is
what the kernel's widening computes, value for value.

Packed layout: tiles of 64 rows x 128 columns (rows padded to 64 with zeros), each 1024 int32 words
``[half h][thread t][word j]``; word j of thread t of half h is the 8 values thread t holds in the
wgmma A fragment of K step 4 h + j: with ``t = 32 w + 4 g + c``, the fragment's value ``v`` of the
word (``v < 8``, its register order) is row ``16 w + g + 8 ((v // 2) % 2)``, column ``16 (4 h + j) +
2 c + v % 2 + 8 (v // 4)`` of the tile, and it lies in nibble ``v // 2 + 4 (v % 2)`` (low first):
values ``2 p`` and ``2 p + 1`` in nibbles ``p`` and ``p + 4``, the two halves of the 32-bit pair the
kernel's magic-number conversion makes of them (``pipeline.widen``). The words form an int32 matrix
[N_pad / 4, K / 2]: tile (i, b) (row tile i, K block b) is rows 16 i ... 16 i + 15, columns 64 b ...
64 b + 63, its word index ``64 r + column``. Scales: [K / 128, N_pad], the activations' dtype (zero
for padding rows). ``int4_channel`` packs its values the same way, with one float32 scale per row
(``row_reference``).
"""

from __future__ import annotations

import torch

GROUP = 128
TILE_ROWS = 64
QMIN, QMAX = -8, 7

# q [N_pad, K] seen as (i, w, rowhalf, g, b, h, j, colhalf, c, pair), in packed order: i, b, then
# the tile's words [h][t = (w, g, c)][j], then a thread's values of the word in the fragment's
# register order (colhalf, rowhalf, pair) ...
FRAGMENT_ORDER = (0, 4, 5, 1, 3, 8, 6, 7, 2, 9)
# ... which int4 stores in the nibble order (pair, colhalf, rowhalf): value 2 p + pair in nibble p + 4 pair
_ORDER = (0, 4, 5, 1, 3, 8, 6, 9, 7, 2)


def reference(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """The format in plain torch: q int8 [N, K] (-8..7) and scales [N, K / group] in w's dtype."""
    n, k = w.shape
    groups = w.float().reshape(n, k // group, group)
    scale = (groups.abs().amax(dim=-1) / QMAX).to(w.dtype)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(groups / scale.float().unsqueeze(-1)).clamp(QMIN, QMAX).to(torch.int8)
    return q.reshape(n, k), scale


def row_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row (``int4_channel``) in plain torch: q int8 [N, K] (-8..7) and float32 scales
    [N], ``absmax / 7`` of the row (1 for a zero row), as fp8's row scales are kept: in float32,
    applied to the float32 sum (``matmul.quant.fp8``)."""
    wf = w.float()
    scale = wf.abs().amax(dim=1) / QMAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(wf / scale.unsqueeze(1)).clamp(QMIN, QMAX).to(torch.int8)
    return q, scale


def padded_rows(n: int) -> int:
    return -(-n // TILE_ROWS) * TILE_ROWS


def pack(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] (K a multiple of 128) -> the packed int32 words [N_pad / 4, K / 2]."""
    n, k = q.shape
    n_pad = padded_rows(n)
    full = q.new_zeros((n_pad, k))
    full[:n] = q
    tiles = full.view(n_pad // 64, 4, 2, 8, k // GROUP, 2, 4, 2, 4, 2).permute(*_ORDER)
    nibbles = (tiles.reshape(n_pad // 64, k // GROUP, 1024, 8).to(torch.int64)) & 0xF
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64)
    words = (nibbles << shifts).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.view(n_pad // 64, k // GROUP, 16, 64).permute(0, 2, 1, 3).reshape(n_pad // 4, k // 2).contiguous()


def unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of ``pack``: q int8 [N, K] (a few byte-wide passes over the weight)."""
    rows, k2 = words.shape
    n_pad, k = rows * 4, k2 * 2
    # the tiles' bytes in order: [i, b, 4096 bytes], byte 4 w + m of a word holds nibbles 8 w + 2 m, + 1
    tiles = words.view(torch.uint8).view(n_pad // 64, 16, k // GROUP, 256).permute(0, 2, 1, 3)
    tiles = tiles.reshape(n_pad // 64, k // GROUP, 4096)
    nibbles = torch.stack([tiles & 0xF, tiles >> 4], dim=-1).view(torch.int8)
    signed = (nibbles ^ 8) - 8  # 0..15 two's complement nibbles -> -8..7
    shape = [n_pad // 64, k // GROUP, 2, 4, 8, 4, 4, 2, 2, 2]  # (i, b, h, w, g, c, j, pair, colhalf, rowhalf)
    inverse = [0] * len(_ORDER)
    for position, dim in enumerate(_ORDER):
        inverse[dim] = position
    q = signed.view(shape).permute(*inverse).reshape(n_pad, k)
    return q[:n]


def pack_scales(scale: torch.Tensor) -> torch.Tensor:
    """scales [N, K / 128] -> [K / 128, N_pad] (padding rows zero)."""
    n, groups = scale.shape
    out = scale.new_zeros((groups, padded_rows(n)))
    out[:, :n] = scale.T
    return out


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group: int = GROUP) -> torch.Tensor:
    """``q * scale`` rounded once to ``dtype``: [N, K]."""
    n, k = q.shape
    return (q.to(dtype).view(n, k // group, group) * scale.to(dtype).unsqueeze(-1)).view(n, k)
