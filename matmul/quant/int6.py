"""The int6 format (an odd width): signed 6-bit weights with one scale per group of 128 along K, and
the packed layout Hopper V8's int6 path (``Kernel(weight="int6")``) and the widening kernel
(``matmul.quant.widen``) read.

Quantization as ``int4``'s with 6 bits: ``scale = absmax / 31`` (rounded to the weight's dtype, 1
for a zero group), ``q = round(w / scale)`` clamped to -32..31, stored as ``u = q + 32`` (0..63),
so that the kernel's magic-number conversion (``pipeline.widen.int6_pairs``) never meets a sign.

Packed layout: tiles of 64 rows x 128 columns (rows padded to 64), each 1536 int32 words
``[half h][thread t][word j < 6]``: thread t's 6 words of half h hold the 32 values it has in the
wgmma A fragment of K steps 4 h ... 4 h + 3 (``int4``'s fragment order), as 16 pairs: pair m is
values 2 m and 2 m + 1, the two 16-bit halves of the fragment's register m. A 32-bit word holds
two whole pairs with each pair's values 16 bits apart, so that one mask takes a pair out of a word
already in the shape of the register it becomes; the 8 bits left over in each word (bits 12-15 and
28-31) hold the other 4 pairs. Pair ``m = 8 g + 4 k + s`` (g, k < 2; s < 4):

- ``s = 0``: its values at bits 0-5 and 16-21 of word ``2 g + k``;
- ``s = 1``: at bits 6-11 and 22-27 of word ``2 g + k``;
- ``s = 2``: their low 4 bits at bits 12-15 and 28-31 of word ``2 g + k``, their high 2 bits at
  bits ``12 + 2 k``, ``13 + 2 k`` and ``28 + 2 k``, ``29 + 2 k`` of word ``4 + g``;
- ``s = 3``: at bits ``6 k ... 6 k + 5`` and ``16 + 6 k ...`` of word ``4 + g``.

The words form an int32 matrix [N_pad / 2, K * 3 / 8]: tile (i, b) is rows 32 i ... 32 i + 31,
columns 48 b ... 48 b + 47, its word index ``48 r + column`` (one TMA box [32, 48]). Scales:
[K / 128, N_pad], as ``int4``'s.
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


def _pieces():
    """Where each of a thread's 32 values of a half lies in its 6 words (module doc), as
    (value, word, bit, width, the value's bit): the value's bits ``bit of the value ...`` are the
    word's bits ``bit ... bit + width - 1``. Pair m = 8 g + 4 k + s is values 2 m and 2 m + 1, the
    second 16 bits above the first."""
    pieces = []
    for g in range(2):
        for k in range(2):
            for s in range(4):
                m, own, shared = 8 * g + 4 * k + s, 2 * g + k, 4 + g
                if s < 2:
                    halves = [(own, 6 * s, BITS, 0)]
                elif s == 2:
                    halves = [(own, 12, 4, 0), (shared, 12 + 2 * k, 2, 4)]
                else:
                    halves = [(shared, 6 * k, BITS, 0)]
                for value in range(2):
                    pieces += [(2 * m + value, word, 16 * value + bit, width, at) for word, bit, width, at in halves]
    return pieces


def pack_values(u: torch.Tensor) -> torch.Tensor:
    """A thread's 32 values of a half, u [..., 32] int64 (0..63, its fragment order), -> its 6 words
    [..., 6] int64 (each 0 .. 2^32 - 1)."""
    words = [torch.zeros_like(u[..., 0]) for _ in range(6)]
    for value, word, bit, width, at in _pieces():
        words[word] |= ((u[..., value] >> at) & ((1 << width) - 1)) << bit
    return torch.stack(words, dim=-1)


def unpack_values(words: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_values``: words [..., 6] int64 -> u [..., 32] int64."""
    u = torch.zeros(*words.shape[:-1], 32, dtype=words.dtype, device=words.device)
    for value, word, bit, width, at in _pieces():
        u[..., value] |= ((words[..., word] >> bit) & ((1 << width) - 1)) << at
    return u


def pack(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] (K a multiple of 128) -> the packed int32 words [N_pad / 2, K * 3 / 8]."""
    n, k = q.shape
    n_pad = padded_rows(n)
    full = torch.full((n_pad, k), -QMIN, dtype=torch.int64, device=q.device)  # padding rows: q = 0
    full[:n] = q.to(torch.int64) - QMIN
    values = full.view(n_pad // 64, 4, 2, 8, k // GROUP, 2, 4, 2, 4, 2).permute(*FRAGMENT_ORDER)
    values = values.reshape(n_pad // 64, k // GROUP, 256, 32)  # [i, b, (h, t), value l]
    words = pack_values(values)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    words = words.view(n_pad // 64, k // GROUP, 32, 48).permute(0, 2, 1, 3)
    return words.reshape(n_pad // 2, k // GROUP * 48).contiguous()


def unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of ``pack``: q int8 [N, K]."""
    rows, cols = words.shape
    n_pad, k = rows * 2, cols // 48 * GROUP
    tiles = words.view(n_pad // 64, 32, k // GROUP, 48).permute(0, 2, 1, 3).reshape(n_pad // 64, k // GROUP, 256, 6)
    values = unpack_values(tiles.to(torch.int64) & 0xFFFFFFFF)
    shape = [n_pad // 64, k // GROUP, 2, 4, 8, 4, 4, 2, 2, 2]  # (i, b, h, w, g, c, j, colhalf, rowhalf, pair)
    inverse = [0] * len(FRAGMENT_ORDER)
    for position, dim in enumerate(FRAGMENT_ORDER):
        inverse[dim] = position
    q = (values.view(shape).permute(*inverse).reshape(n_pad, k) + QMIN).to(torch.int8)
    return q[:n]
