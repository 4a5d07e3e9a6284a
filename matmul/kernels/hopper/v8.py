"""Hopper V8: V7 with int4 weights: the weight is stored in 4 bits with one scale per group of 128
along K and widened to 16 bits on chip, so the skinny GEMM streams a quarter of the bytes.

Idea: at small M a projection is bound by reading its weight once (V7 runs close to that fp16
floor: plots/h100/skinny/), so only fewer bytes go faster. V8 is V7 (swap-AB, split-K over a
cluster reduced through DSMEM, a TMA ring fed by a producer warp) whose ring carries, per K block of 128
columns (one scale group), a packed int4 tile of 64 weight rows per warpgroup (4 KiB instead of
V7's 16 KiB for the same columns), those rows' 64 scales (128 bytes) and the token tile. Each
consumer warpgroup widens its tile in registers and issues the wgmma with A in registers: the
weight rows are still the MMA's M side, the tokens its N side.

Weights: signed int4 (two's complement, -8..7), symmetric, ``w ~ q * scale[row, k // 128]``,
scale = absmax / 7 of the group (``matmul.quant``). Signed, no zero point: LLM weight groups are
nearly centred on 0, a zero point would add a tensor to stream and a subtraction per value, and
the magic-number conversion absorbs the sign for free (the xor of ``0x88888888``).

Packed layout (``matmul.quant.int4``, made once when the weight is quantized): the weight [N, K] is
cut into tiles of 64 rows x 128 columns (N padded to 64 with zero rows). A tile is 4 KiB: ``[half h
< 2][thread t < 128][word j < 4]`` int32, word ``j`` of thread ``t`` of half ``h`` being the 8
values thread ``t`` holds in the wgmma A fragment of K step ``4 h + j`` (rows ``16 w + g``, ``16 w +
g + 8`` and columns ``2c, 2c + 1, 2c + 8, 2c + 9`` of the step, ``t = 32 w + 4 g + c``), its
fragment values ``2 p`` and ``2 p + 1`` in nibbles ``p`` and ``p + 4``. In memory the packed weight
is an int32 matrix ``[N_pad / 4, K / 2]`` (the size of an int4 [N_pad, K]): rows ``16 i .. 16 i +
15`` hold the tiles of row tile ``i``, the tile of K block ``b`` in columns ``64 b .. 64 b + 63``,
so one TMA box [16, 64] (no swizzle) lands a tile in shared memory in that order, and each thread
reads its 16 bytes of a half with one ``ld.shared.v4`` (consecutive threads, consecutive 16 bytes:
no bank conflict). A K block past K is zero-filled by TMA, as V7's are. The scales are a [K / 128,
N_pad] matrix of the activations' dtype, so the 64 scales of a tile are one TMA box [1, 64].
``pipeline.widen.Int4Widen`` widens a thread's words two values at a time: nibbles ``p`` and ``p +
4`` of a word are the halves of one 32-bit register, made by one ``lop3`` (the mask, the sign's
offset and the magic number 1024 or, for bfloat16, 128) and one ``sub.f16x2`` or ``fma``
(``pipeline.widen.int4_pairs``); the nibble order above is the one that puts each pair in the
register the fragment wants it in, so nothing reorders them (tilus's own cast of an int4 tensor
keeps the values' order, at four ``prmt`` a word, a share of V8's time at decode:
``plots/h200/v8-pairs/ of commit b43a7e1``). At tiles of 64 tokens and more it multiplies by the row's scale: the
widened value is the one ``QuantizedWeight.dequantize()`` gives, exactly (one rounding of ``q *
scale`` in the 16-bit dtype). At tiles of 8 and 16 tokens (decode) the integers -8..7 go into the
wgmma unscaled, each K block's products into a float32 tile of their own, which the block's 64
scales multiply into the accumulator once the block's wgmma is waited for: a thread's 4 or 8 float32
multiply-adds a block instead of 32 16-bit multiplies of its widened values (the faster of the
two there: ``plots/h200/v8-scale-after/ of commit b43a7e1``). The sum is then of ``q * x`` scaled in
float32, not of ``x`` times ``q * scale`` rounded to 16 bits: it differs from the dequantized
weight's product by that rounding, as the tests' float32 reference allows.

Other widths (checked on the GPU as int4 is, ``tests/test_v8_gpu.py``): int6 (``Kernel(weight="int6")``,
``matmul.quant.int6``), int4's group scales with 6-bit values, a 6 KiB tile
``[half][thread][word j < 6]`` (one TMA box [32, 48]) whose words hold their values in pairs
16 bits apart, so that a pair is widened as int4's are (``pipeline.widen.int6_pairs``: a mask
and a magic number, then one 16-bit-pair instruction that also takes off the zero point 32); and
fp8 e4m3 (``Kernel(weight="fp8_e4m3")``, ``matmul.quant.fp8``): an 8 KiB tile
(``[part p < 4][thread t][word j < 4]``, one byte a value, in the fragment order)
widened by tilus's fp8 casts in parts of 32 K columns, and one float32 scale per row applied to
the float32 partial tile after the last K block instead of a group scale per value (no scales
come through the ring). int4 with one scale per row (``Kernel(weight="int4_channel")``, the
group a whole row: ``matmul.quantize(w, format="int4_channel")``) packs its values as int4's and
takes fp8's scales: its integers go into the wgmma unscaled, and the row's float32 scale multiplies
the partial tile once, after the last K block (a row scale factors out of the sum over K), so
neither scales nor a multiply per value come through the ring.

The last token tile of a call usually holds fewer tokens than rows (one token in a tile of 8, 17
in a tile of 32). TMA fills the rows of a box that lie past the tensor with zeros, at a cost that
can exceed V8's own time (``plots/h200/v8-tokens/ of commit b43a7e1``), so such a tile comes in boxes of the rows
that hold tokens (``pipeline.token_boxes``: at most six boxes, a single token in a box of one row);
the rows past them keep an earlier stage's tokens, which reach only the output columns past M, never
stored. Configurations with ``interleave`` > 1 keep one box a tile: their producer thread issues that
many times the boxes a stage and is what their CTAs wait for.

Without a split of K (``split`` = 1, one consumer a slab; int4) each consumer warpgroup writes its slab of
C as V7's do (``pipeline.epilogue.SwappedSlabStore``: transposed into a 16-bit staging buffer,
then a TMA store) and no float32 partial tile is exchanged; the room it would take goes to the ring.
That makes V8 a prefill kernel too: a CTA of two slabs and 128 tokens (128 x 128 of C, 4 stages)
beats widening the weight once for cuBLAS at 1024-1536 tokens (``plots/h200/v8-configs/int4-prefill/``; the
call's rule: ``matmul.call.quantized``). ``v8_prefill.py``, V5 whose B tiles arrive packed and are
widened into shared memory by a warpgroup of their own, is slower than both
(``plots/h100/v8/prefill/ of commit b43a7e1``), so it is not the call's.

Why A in registers and not a widened tile in shared memory: the widened tile is used by exactly
one wgmma, in exactly the fragment the thread that widened it holds; writing it to shared memory
would add 16 KiB of stores and a warpgroup barrier per K block, where the register path adds
nothing (the tokens, B, still come from shared memory, as in V7). The price: A's registers must
not be rewritten while the wgmma reads them, so each K block's wgmma groups are waited for before
the next block is widened (``wgmma.wait_group 0``). Within a block, the tile is widened in parts
of ``chunk`` K columns (64 or 32, a knob), each part issued as its own committed wgmma group
before the next part is widened, so ptxas interleaves that conversion with the part's wgmma and
serializes nothing (each part has registers of its own; the token tile comes in TMA boxes of
``chunk`` columns); across blocks the tensor core's latency is hidden by the other warpgroups and
CTAs of the SM, which is why V8's rings are shallow (more CTAs fit in an SM) and its splits large.

Synchronization (this CTA's K block ``i`` uses stage ``s = i % stages``, parity ``p = (i // stages) & 1``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | producer's ``expect_tx`` (weight, scales, tokens); its TMA loads | consumers, ``p`` | CTA |
| ``empty[s]`` | consumers | one thread of each consumer warpgroup, after its wgmma wait | producer, ``p ^ 1`` | CTA |
| ``__syncthreads`` | all threads | every warp, once the partials are stored (in ``exchange``) | all | CTA |
| ``arrived`` | 1 + bytes | this CTA's ``expect_tx`` (split - 1 slices); peers' bulk copies | warps 0-3, 0 | CTA |
| ``barrier.cluster`` | the cluster | all: once the mbarriers exist; before exit (relaxed) | all | cluster |

Without a split (``writes_slabs``) the last three rows are not there: nothing is exchanged, and each
warpgroup orders its staging buffer's writes before its own TMA store and waits for that store
before it leaves (``pipeline.tma_store.StagedTmaStore``), sharing no buffer and no barrier with
the other warpgroup (V7's write-out).

Consumer warpgroups are ``warpgroups x interleave``: with ``interleave`` > 1 (a tuning knob, see
``Kernel``) a stage holds that many K blocks and each consumer of a slab takes one of them, its
partial a layer of its own in the split-K reduction. A stage is released only after the wgmma
that read its token tile completed and its packed words and scales were loaded into registers
(``wait_group 0`` precedes the release). The rest is V7's:
every mbarrier is initialized before the first cluster barrier (whose arrival is relaxed and made
at the start, and which is waited for only before the exchange, the first copy into a peer:
``ClusterSplitKReduce.arrive_after_init``), no CTA exits before the last one
(whose arrival is relaxed: ``ClusterSplitKReduce.exit_barrier`` says why no memory needs ordering there),
``arrived`` is used once, a fresh ``empty[s]`` read with parity ``p ^ 1`` counts as complete.
"""

from fractions import Fraction

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, float32, int32, void_p
from tilus.ir.layout.ops import shared_row_major
from tilus.utils import cdiv

from pipeline import Pipeline
from pipeline.cluster_reduce import ClusterSplitKReduce, SplitKRange
from pipeline.epilogue import SwappedSlabStore, wgmma_fragment
from pipeline.token_boxes import TokenBoxes
from pipeline.widen import HALF_K, WORDS, Fp8Widen, Int4Widen, Int6Widen, reduce_layout, scale_view

from ..entry import PackedWeightKernel

IDEA = "int4 weights (a scale per 128 along K) widened in registers into the wgmma's A operand: a quarter of V7's bytes"
PTX_MARKERS = (
    "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {",  # A from registers: a register list, not a descriptor
    "lop3.b32",  # the magic-number int4 -> float16 conversion (pipeline.widen.int4_pairs)
    "ld.shared.v4",  # a thread's 16 packed bytes of a half tile at once
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
    "mapa.shared::cluster",
    "barrier.cluster",
    "barrier.cluster.arrive.relaxed.aligned",  # the exit barrier orders no memory (ClusterSplitKReduce.exit_barrier)
)
REPRESENTATIVE = {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 32}
# int4 with row scales (``weight="int4_channel"``), as the call runs it at decode and at prefill
# (``matmul.call.quantized``, rules in ``call/shipped/rules/v8.json``): built and protocol-checked, not
# tuned (the format is the weight's, not a choice)
EXTRA_CONFIGS = (
    {**REPRESENTATIVE, "weight": "int4_channel"},
    {"block_m": 128, "warpgroups": 2, "split": 1, "stages": 4, "chunk": 64, "weight": "int4_channel"},
    # int6 and fp8 past 64 tokens: two consumer warpgroups a CTA, with a split of two or
    # none (matmul.call.quantized's rules)
    {"block_m": 128, "warpgroups": 2, "split": 2, "stages": 2, "chunk": 64, "weight": "int6"},
    {"block_m": 128, "warpgroups": 2, "split": 1, "stages": 3, "chunk": 64, "weight": "int6"},
    {"block_m": 128, "warpgroups": 2, "split": 2, "stages": 2, "chunk": 32, "weight": "fp8_e4m3"},
    {"block_m": 128, "warpgroups": 2, "split": 1, "stages": 3, "chunk": 32, "weight": "fp8_e4m3"},
    # and their decode tiles (matmul.call.quantized.config_for): int6's of 8 tokens, both formats' of 32
    {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "weight": "int6"},
    {"block_m": 32, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "weight": "int6"},
    {"block_m": 32, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 32, "weight": "fp8_e4m3"},
    # at 33-64 tokens: fp8 on a weight wider than deep two consumer warpgroups a CTA, int6 on a long K
    # two a slab
    {"block_m": 64, "warpgroups": 2, "split": 2, "stages": 4, "chunk": 32, "weight": "fp8_e4m3"},
    {"block_m": 64, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 2, "weight": "int6"},
    # each format's consumers taking a slab's K blocks in turn, as the call runs them at decode sizes
    # on a weight as deep as wide (the space's interleaved configurations are int4's)
    {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 2, "weight": "int6"},
    {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 32, "interleave": 2, "weight": "fp8_e4m3"},
    {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 2, "weight": "int4_channel"},
    {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 4, "weight": "int4_channel"},
    # and the rest of the call's that no entry above has the protocol shape of, in its format
    # (tests/test_protocol.py checks that none is left): int4_channel without a split (its slabs
    # written by TMA) and two slabs with one, fp8 on a wide weight at 16 tokens (the K range cut in 4)
    {"block_m": 8, "warpgroups": 1, "split": 1, "stages": 4, "chunk": 64, "weight": "int4_channel"},
    {"block_m": 128, "warpgroups": 2, "split": 2, "stages": 3, "chunk": 64, "weight": "int4_channel"},
    {"block_m": 16, "warpgroups": 1, "split": 4, "stages": 4, "chunk": 32, "weight": "fp8_e4m3"},
)
B_LAYOUTS = ("nk",)  # the packed weight has one layout (matmul.quant)
FUSED_EPILOGUE = False
# C is written by store_global (ClusterSplitKReduce.write, with a split) at int32 element offsets: no
# operand may reach past 2^31 - 1 elements (A and B, read by TMA, could; the limit keeps to one rule per version)
MAX_ELEMENTS = 2**31 - 1

BLOCK_K = 128  # one scale group: a 4 KiB packed tile of 64 rows per warpgroup and K block
GROUP = 128  # K columns that share a scale (matmul.quant's only group size for this kernel)
TILE_ROWS = 64  # weight rows of a packed tile (one warpgroup's wgmma M)
PACKED_TILE_WORDS = TILE_ROWS * BLOCK_K // 8  # int32 words of a packed tile: 1024
# a packed 64 x 128 tile as a box of int32 [rows, columns], per weight format (matmul.quant)
WEIGHT_ROWS = {"int4": (16, 64), "int4_channel": (16, 64), "int6": (32, 48), "fp8_e4m3": (32, 64)}
# weight rows and K columns per int32 word of a packed tile, per format (matmul.protocol): int4's
# 4 and 2, int6's 2 and 8/3 (48 words a row cover a tile's 128 K columns), fp8's 2 and 2
B_UNITS = {fmt: (Fraction(TILE_ROWS, rows), Fraction(BLOCK_K, cols)) for fmt, (rows, cols) in WEIGHT_ROWS.items()}
ROW_SCALED = ("fp8_e4m3", "int4_channel")  # one float32 scale a row, applied after the last K block
INT4_PACKED = ("int4", "int4_channel")  # int4's packed tiles, widened by ``Int4Widen``
MAX_M = 256  # the widest wgmma (n = 256): beyond it a CTA would need a second accumulator
SCALE_AFTER_MAX_M = 16  # token tiles up to which int4's group scales multiply products, not values


def supports(m: int, n: int, k: int) -> bool:
    """The shapes V8 computes: K a multiple of the group (128), no operand past ``MAX_ELEMENTS``
    (token tiles of at most ``MAX_M``, as many as M needs: ``matmul.call.quantized`` says up to how
    many tokens the call runs it)."""
    return m >= 1 and n >= 1 and k >= 1 and k % GROUP == 0 and m * max(n, k) <= MAX_ELEMENTS


def stage_scale_bytes(weight: str, s_s) -> int:
    """Bytes of scales a stage brings: a tile's 64 group scales (int4, int6); none for row scales."""
    return s_s.nbytes // s_s.shape[0] if weight not in ROW_SCALED else 0


def writes_slabs(split: int, interleave: int, weight: str = "int4") -> bool:
    """Whether each consumer warpgroup writes its own slab of C by a TMA store, as V7's do: without a
    split (and one consumer a slab), for int4's packed tiles, whose consumers ran so on a GPU (fp8's
    and int6's keep the exchange of one part they were checked with)."""
    return split == 1 and interleave == 1 and weight in INT4_PACKED


def shared_bytes(block_m: int, warpgroups: int, split: int, stages: int, chunk: int = 64, interleave: int = 1) -> int:
    """Shared memory of an int4 configuration: the ring plus the split-K exchange tiles, or the
    staging buffers of 16-bit C where it writes its slabs (``writes_slabs``)."""
    tiles = warpgroups * interleave  # weight tiles a stage brings, one a consumer warpgroup
    ring = stages * (tiles * (PACKED_TILE_WORDS * 4 + TILE_ROWS * 2) + interleave * block_m * BLOCK_K * 2)
    if writes_slabs(split, interleave):
        return ring + warpgroups * block_m * TILE_ROWS * 2
    exchange = interleave * (2 * split - 1) * (64 * warpgroups // split) * block_m * 4  # partial + received
    return ring + exchange


# Token tiles of 8 (the narrowest wgmma: a decode step of a few sequences brings half the
# zero-filled token rows of a 16-column tile), 16, 64, 128 and 256 columns. A stage of V8 holds
# 128 K columns of weight in 4 KiB (V7: 64 in 8 KiB). Shallow rings (4-6 stages: more CTAs fit in
# an SM) and larger splits (more CTAs per weight tile) are faster than V7's deep rings
# (plots/h100/v8/). The widening does not set the pace: the ring alone, moving the same bytes with
# no work on them, already takes most of the floor's time (plots/h100/v8/bound/ of commit b43a7e1).
#
# ``interleave`` (2 or 4) gives each 64-row weight slab that many consumer warpgroups, which take
# the K blocks of a stage in turn (a stage brings ``interleave`` consecutive K blocks) and add
# their partials in the split-K reduction: more widening warps per SM without more CTAs, hence
# without more clusters to exchange partials between.
#
# Without a split (each slab written by a TMA store): a tile of 8 tokens, the call's at decode on a
# weight four times wider than deep; two slabs and a 4-stage ring (128 x 128 of C a CTA), the call's
# from 128 tokens on a wide weight up to prefill sizes (matmul.call.quantized).
@tilus.autotune("chunk", [64, 32])
@tilus.autotune(
    "block_m, warpgroups, split, stages, interleave",
    [
        (8, 1, 2, 4, 1),
        (8, 1, 1, 4, 1),
        (8, 2, 2, 4, 1),
        (8, 1, 8, 4, 1),
        (8, 1, 2, 4, 2),
        (8, 1, 1, 4, 4),
        (8, 1, 2, 2, 4),
        (16, 1, 2, 4, 1),
        (16, 1, 2, 6, 1),
        (16, 1, 2, 8, 1),
        (16, 1, 4, 4, 1),
        (16, 1, 4, 6, 1),
        (16, 1, 8, 4, 1),
        (16, 2, 2, 4, 1),
        (16, 2, 4, 4, 1),
        (16, 1, 1, 4, 2),
        (16, 1, 2, 4, 2),
        (16, 1, 4, 4, 2),
        (16, 1, 1, 4, 4),
        (16, 1, 2, 2, 4),
        (16, 1, 2, 4, 4),
        (32, 1, 2, 4, 1),
        (64, 1, 2, 4, 1),
        (64, 1, 2, 8, 1),
        (64, 1, 4, 4, 1),
        (64, 2, 2, 4, 1),
        (64, 1, 2, 4, 2),
        (128, 1, 2, 2, 1),
        (128, 1, 2, 4, 1),
        (128, 2, 2, 3, 1),
        (128, 2, 1, 4, 1),
        (128, 1, 1, 4, 1),
        (256, 1, 1, 2, 1),
    ],
)
class Kernel(PackedWeightKernel):
    def __init__(
        self,
        dtype,
        block_m: int,
        warpgroups: int,
        split: int,
        stages: int,
        chunk: int = 64,
        interleave: int = 1,
        weight: str = "int4",
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m
        self.warpgroups = warpgroups
        self.split = split
        self.stages = stages
        self.chunk = chunk  # K columns widened and issued as one wgmma group: 64 or 32
        if chunk not in (32, 64):
            raise ValueError(f"a wgmma group takes 64 or 32 K columns, not {chunk}")
        if warpgroups not in (1, 2):
            raise ValueError(f"one or two consumer warpgroups, not {warpgroups}")
        self.interleave = interleave  # consumer warpgroups a weight slab, taking its K blocks in turn
        self.consumers = warpgroups * interleave  # consumer warpgroup c: slab c // interleave, turn c % interleave
        if interleave not in (1, 2, 4) or self.consumers > 4:
            raise ValueError(f"{warpgroups} x {interleave} consumer warpgroups: at most 4, interleave 1, 2 or 4")
        if (64 * warpgroups) % split or (64 * warpgroups // split) % 8:
            raise ValueError(f"{64 * warpgroups} weight rows do not cut into {split} slices of a multiple of 8")
        if b_layout != "nk" or bias or activation:
            raise ValueError("V8 reads its packed weight in one layout, with a plain epilogue")
        # the format: "int4" or "int6" (group scales), "fp8_e4m3" or "int4_channel" (row scales)
        self.weight = weight
        if weight not in WEIGHT_ROWS:
            raise ValueError(f"weight format {weight!r}: one of {', '.join(WEIGHT_ROWS)}")
        self.word_rows, self.word_cols = WEIGHT_ROWS[weight]  # a packed 64 x 128 tile: one TMA box
        if weight == "fp8_e4m3":
            self.chunk = 32  # a thread's 16 bytes of fp8 are 32 K columns of the fragment
        if weight == "int6":
            self.chunk = 64  # a half tile's 24 bytes of a thread, widened at once
        # int4 at tiles of up to 16 tokens: each K block's products are scaled once, in float32,
        # instead of every widened value in 16 bits (module doc); above that the second float32
        # tile would cost block_m / 2 registers a thread
        self.scale_after = weight == "int4" and block_m <= SCALE_AFTER_MAX_M
        self.writes_slabs = writes_slabs(split, interleave, weight)  # each warpgroup writes its slab of C
        # (the format's cases as Python bools: kernel code turns a membership test into device code)
        self.row_scales = weight in ROW_SCALED
        self.int4_packed = weight in INT4_PACKED
        self.unscaled_values = weight == "int4_channel" or self.scale_after  # integers into the wgmma

    def matmul(
        self,
        g_a: GlobalTensor,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        g_c: GlobalTensor,
        m_size: int32,
        n_size: int32,
        k_size: int32,
    ):
        rows = 64 * self.warpgroups  # weight rows of a CTA (the output tile's N side)
        consumers = self.consumers
        num_n_tiles = cdiv(n_size, rows)
        num_m_tiles = cdiv(m_size, self.block_m)
        self.attrs.blocks = self.split * num_n_tiles * num_m_tiles
        self.attrs.cluster_blocks = self.split
        self.attrs.warps = 4 * consumers + 1  # consumer warpgroups, then the producer warp
        rank: int32 = self.cluster.blockRank  # which K range of the tile this CTA sums
        tile: int32 = self.blockIdx.x // self.split
        # the token tiles of one weight tile are neighbours in launch order: they run at the same
        # time, so the weight comes from HBM once and from L2 for the others, in every wave
        offset_m: int32 = (tile % num_m_tiles) * self.block_m
        offset_n: int32 = (tile // num_m_tiles) * rows

        # this CTA's share of K, taken ``interleave`` blocks a stage
        k_blocks = SplitKRange(cdiv(k_size, BLOCK_K), self.split, rank, self.interleave)
        turns: int32 = cdiv(k_blocks.count, self.interleave)  # stages this CTA's consumers go through

        # a packed tile [16, 64] int32 = [half][thread][word] (module doc), and its 64 scales, one
        # for each consumer warpgroup
        s_w = self.shared_tensor(dtype=int32, shape=[self.stages, consumers, self.word_rows, self.word_cols])
        self.annotate_layout(s_w, shared_row_major(self.stages, consumers, self.word_rows, self.word_cols))
        s_s = self.shared_tensor(dtype=self.dtype, shape=[self.stages, consumers, 1, TILE_ROWS])
        self.annotate_layout(s_s, shared_row_major(self.stages, consumers, 1, TILE_ROWS))
        # each K block's tokens: one TMA box per part of ``chunk`` columns (128 or 64 bytes wide)
        parts = BLOCK_K // self.chunk
        s_x = self.shared_tensor(
            dtype=self.dtype, shape=[self.stages, self.interleave * parts, self.block_m, self.chunk]
        )
        # the rows of the tile that hold tokens, loaded as boxes of those rows (pipeline.token_boxes:
        # a box's rows past the tensor are costly to TMA). With interleave > 1 a stage has that
        # many times the boxes and its one producer thread is what the CTA waits for: there the
        # extra boxes cost more than the rows past the tensor, and the tile is one box whatever M
        # (plots/h200/v8-tokens/ of commit b43a7e1)
        tokens = min(m_size - offset_m, self.block_m) if self.interleave == 1 else self.block_m
        token_boxes = TokenBoxes(s_x, tokens)
        ring = Pipeline(self.stages, consumer_arrivals=consumers, elect_release=True)
        if self.writes_slabs:  # each warpgroup writes its slab of C (V7's SwappedSlabStore)
            staging = self.shared_tensor(dtype=self.dtype, shape=[self.warpgroups, 1, self.block_m, TILE_ROWS])
            reduce = SwappedSlabStore(staging, g_c, offset_m, offset_n, self.epilogue)
        else:
            reduce = ClusterSplitKReduce(self.split, rows, self.block_m, layers=self.interleave)
            # every barrier of the cluster exists before a peer's copy lands on it: announced now,
            # waited for before the exchange (nothing before it reaches a peer: the main loop starts at once)
            reduce.arrive_after_init()

        with self.single_warp(4 * consumers):  # producer
            for i in range(turns):
                ring.producer_acquire()
                slot = ring.producer_stage
                with self.single_thread():
                    self.mbarrier.arrive_and_expect_tx(
                        ring.producer_barrier(),
                        transaction_bytes=s_w[slot].nbytes
                        + stage_scale_bytes(self.weight, s_s)
                        + token_boxes.stage_bytes(),
                    )
                # past this CTA's range (the last range's tail) lies past K: TMA fills zeros
                self.load_stage(
                    g_w,
                    g_s,
                    g_a,
                    s_w,
                    s_s,
                    token_boxes,
                    slot,
                    k_blocks.first + i * self.interleave,
                    offset_m,
                    offset_n,
                    ring,
                )
                ring.producer_advance()

        # consumer warpgroup c (up to 4, written out: a kernel's loops run on the device, and a
        # consumer's slab and turn shape its code) takes slab c // interleave, turn c % interleave
        self.consumer_group(0, ring, s_w, s_s, g_s, offset_n, s_x, reduce, turns)
        if consumers > 1:
            self.consumer_group(1, ring, s_w, s_s, g_s, offset_n, s_x, reduce, turns)
        if consumers > 2:
            self.consumer_group(2, ring, s_w, s_s, g_s, offset_n, s_x, reduce, turns)
            self.consumer_group(3, ring, s_w, s_s, g_s, offset_n, s_x, reduce, turns)

        if not self.writes_slabs:  # (each warpgroup wrote its slab already)
            reduce.wait_for_peers()
            reduce.exchange(rank)
            with self.warp_group(warp_begin=0, num_warps=4):
                reduce.write(rank, g_c, offset_m, offset_n, self.epilogue)
            reduce.exit_barrier()  # no CTA leaves while a peer's copy may still read its partial tile

    def store_tile(self, tile_out: tilus.Class, acc: RegisterTensor, wg: int, turn: int):
        """Consumer warpgroup of slab ``wg`` and turn ``turn``, its K range done: its accumulator into C
        (``SwappedSlabStore``) or into its layer of the partial tile (``ClusterSplitKReduce``)."""
        if self.writes_slabs:
            tile_out.store(acc, wg)
        else:
            tile_out.store(acc, wg, turn)

    def weight_view(self, b_ptr: void_p, ldb: int32, n_pad: int32, k_size: int32) -> GlobalTensor:
        """The packed weight as the int32 matrix whose [word_rows, word_cols] boxes are its tiles (module
        doc): int4's [N_pad / 4, K / 2]; fp8: [N_pad / 2, K / 2] (``ldb`` its row stride in words)."""
        return self.global_view(
            b_ptr,
            dtype=int32,
            shape=[n_pad // TILE_ROWS * self.word_rows, k_size // BLOCK_K * self.word_cols],
            strides=[ldb, 1],
        )

    def scale_view(self, scales_ptr: void_p, n_pad: int32, k_size: int32) -> GlobalTensor:
        """The scales: [K / 128, N_pad] in the activations' dtype (int4, int6); row scales: float32 [N_pad]."""
        return scale_view(self, scales_ptr, n_pad, k_size, self.row_scales, GROUP)

    def load_stage(
        self,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        g_a: GlobalTensor,
        s_w: SharedTensor,
        s_s: SharedTensor,
        token_boxes: TokenBoxes,
        slot: int32,
        first: int32,
        offset_m: int32,
        offset_n: int32,
        ring: Pipeline,
    ):
        """Stage ``slot``'s TMA loads: K blocks ``first .. first + interleave - 1``, for each one every
        slab's packed tile and scales and the tokens' ``chunk``-column boxes (``TokenBoxes``)."""
        parts = BLOCK_K // self.chunk
        for turn in range(self.interleave):
            block = first + turn
            for wg in range(self.warpgroups):
                c = wg * self.interleave + turn  # the consumer warpgroup that takes this block
                self.load_weight_tile(g_w, s_w[slot, c], (offset_n + 64 * wg) // TILE_ROWS, block, ring)
                if not self.row_scales:
                    self.tma.global_to_shared(
                        src=g_s, dst=s_s[slot, c], offsets=[block, offset_n + 64 * wg], mbarrier=ring.producer_barrier()
                    )
            for part in range(parts):
                token_boxes.load(
                    g_a,
                    slot,
                    turn * parts + part,
                    offset_m,
                    block * BLOCK_K + part * self.chunk,
                    ring.producer_barrier(),
                )

    def load_weight_tile(self, g_w: GlobalTensor, dst: SharedTensor, row_tile: int32, block: int32, ring: Pipeline):
        """The packed tile of weight row tile ``row_tile`` and K block ``block``: one TMA box (module doc)."""
        self.tma.global_to_shared(
            src=g_w,
            dst=dst,
            offsets=[row_tile * self.word_rows, block * self.word_cols],
            mbarrier=ring.producer_barrier(),
        )

    def consumer_group(
        self,
        c: int,
        ring: Pipeline,
        s_w: SharedTensor,
        s_s: SharedTensor,
        g_s: GlobalTensor,
        offset_n: int32,
        s_x: SharedTensor,
        reduce: tilus.Class,
        turns: int32,
    ):
        """Consumer warpgroup ``c``, in the weight's format."""
        if self.int4_packed:
            self.consumer(c, ring, s_w, s_s, g_s, offset_n, s_x, reduce, turns)
        elif self.weight == "int6":
            self.int6_consumer(c, ring, s_w, s_s, s_x, reduce, turns)
        else:
            self.fp8_consumer(c, ring, s_w, g_s, offset_n, s_x, reduce, turns)

    def consumer(
        self,
        c: int,
        ring: Pipeline,
        s_w: SharedTensor,
        s_s: SharedTensor,
        g_s: GlobalTensor,
        offset_n: int32,
        s_x: SharedTensor,
        reduce: tilus.Class,
        count: int32,
    ):
        """Consumer warpgroup ``c`` (slab ``wg``, turn ``turn``): weight rows ``64 * wg ...`` of the tile times
        every token, over K block ``turn`` of each stage (every block of the CTA's K range when
        ``interleave`` is 1), into layer ``turn`` of the partial tile: per K block, each ``chunk``
        columns of its packed tile widened into an A operand and multiplied by the tokens (a
        committed wgmma group each, the next part widened while it runs), all waited for before the
        next block. Row scales (int4_channel): the integers straight into acc, scaled once at the end."""
        wg, turn = divmod(c, self.interleave)  # its slab, and its K block of each stage
        with self.warp_group(warp_begin=4 * c, num_warps=4):
            fragment = wgmma_fragment(64, self.block_m)
            acc = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
            self.annotate_layout(acc, fragment)
            widen = Int4Widen(self.chunk)
            s_words = self.reshape_shared(s_w, [self.stages, self.consumers, 2, 128, WORDS])
            s_scale = self.reshape_shared(s_s, [self.stages, self.consumers, TILE_ROWS, 1])
            for kb in self.range(count, unroll=1):  # noqa: B007
                ring.consumer_acquire()
                slot = ring.consumer_stage
                first = turn * (BLOCK_K // self.chunk)  # this turn's token boxes in the stage
                if self.weight == "int4_channel":
                    # the integers into acc, the row's scale after the last block: no group scale,
                    # and tilus takes no None for a tensor parameter, so acc stands in for it, unread
                    scale = acc
                    products = acc
                elif self.scale_after:
                    # the block's products of unscaled integers, in a tile of their own, which its 64
                    # scales (read before the stage is released) multiply into acc after the wait
                    scale = self.load_shared(s_scale[slot, c])
                    self.annotate_layout(scale, reduce_layout(fragment))
                    products = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
                    self.annotate_layout(products, fragment)
                else:
                    scale = widen.scales(s_scale[slot, c])
                    products = acc
                self.half(widen, s_words[slot, c, 0], scale, s_x, slot, first, products)
                self.half(widen, s_words[slot, c, 1], scale, s_x, slot, first + HALF_K // self.chunk, products)
                self.wgmma.wait_group(0)  # A's registers are rewritten by the next block
                ring.consumer_release()
                ring.consumer_advance()
                if self.scale_after:
                    scaled = products * self.cast(scale, float32)
                    self.annotate_layout(scaled, fragment)
                    self.add(acc, scaled, out=acc)
            if self.weight == "int4_channel":
                self.store_tile(reduce, self.row_scaled(acc, g_s, offset_n, wg), wg, turn)
            else:
                self.store_tile(reduce, acc, wg, turn)

    def half(
        self,
        widen: Int4Widen,
        s_words: SharedTensor,
        scale: RegisterTensor,
        s_x: SharedTensor,
        slot: int32,
        first: int,
        acc: RegisterTensor,
    ):
        """A half of a K block (64 columns; its tokens in boxes ``first, ...`` of the stage): its
        packed words loaded once, each part of ``chunk`` columns widened and issued (straight-line
        code: each part has registers of its own)."""
        words = widen.words(s_words)
        self.part(widen, words, scale, 0, s_x[slot, first], acc)
        if HALF_K // self.chunk == 2:
            self.part(widen, words, scale, 1, s_x[slot, first + 1], acc)

    def part(
        self,
        widen: Int4Widen,
        words: RegisterTensor,
        scale: RegisterTensor,
        index: int,
        s_tokens: SharedTensor,
        acc: RegisterTensor,
    ):
        """One wgmma group: part ``index`` of a half's words widened (times ``scale``, the group's,
        or not where the consumer scales each block's products or the row's scale the sum), times
        its token columns."""
        if self.unscaled_values:
            operand = widen.values(words, self.dtype.name, index)
        else:
            operand = widen.operand(words, scale, index)
        self.wgmma.fence()
        self.wgmma.mma(operand, s_tokens.transpose(), acc)
        self.wgmma.commit_group()

    def fp8_consumer(
        self,
        c: int,
        ring: Pipeline,
        s_w: SharedTensor,
        g_s: GlobalTensor,
        offset_n: int32,
        s_x: SharedTensor,
        reduce: tilus.Class,
        count: int32,
    ):
        """``consumer`` for fp8 e4m3 weights: a packed tile is
        ``[part p < 4][thread t][word j < 4]`` (the fragment values of K steps 2 p, 2 p + 1, one byte
        each), each part widened by tilus's fp8 cast and issued as a wgmma group; the per-row scale
        multiplies the float32 partial tile once, after the last K block."""
        wg, turn = divmod(c, self.interleave)  # its slab, and its K block of each stage
        with self.warp_group(warp_begin=4 * c, num_warps=4):
            acc = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
            self.annotate_layout(acc, wgmma_fragment(64, self.block_m))
            widen = Fp8Widen()
            s_words = self.reshape_shared(s_w, [self.stages, self.consumers, 4, 128, WORDS])
            for kb in self.range(count, unroll=1):  # noqa: B007
                ring.consumer_acquire()
                slot = ring.consumer_stage
                first = 4 * turn  # this turn's token boxes in the stage, one a 32-column part
                self.fp8_part(widen, s_words[slot, c, 0], s_x[slot, first], acc)
                self.fp8_part(widen, s_words[slot, c, 1], s_x[slot, first + 1], acc)
                self.fp8_part(widen, s_words[slot, c, 2], s_x[slot, first + 2], acc)
                self.fp8_part(widen, s_words[slot, c, 3], s_x[slot, first + 3], acc)
                self.wgmma.wait_group(0)
                ring.consumer_release()
                ring.consumer_advance()
            self.store_tile(reduce, self.row_scaled(acc, g_s, offset_n, wg), wg, turn)

    def row_scaled(self, acc: RegisterTensor, g_s: GlobalTensor, offset_n: int32, wg: int) -> RegisterTensor:
        """A consumer's float32 partial tile of slab ``wg`` times its 64 rows' scales (row-scaled formats)."""
        scale = self.load_global(g_s, offsets=[offset_n + 64 * wg, 0], shape=[64, 1])
        self.annotate_layout(scale, reduce_layout(wgmma_fragment(64, self.block_m)))
        scaled = acc * scale
        self.annotate_layout(scaled, wgmma_fragment(64, self.block_m))
        return scaled

    def fp8_part(self, widen: Fp8Widen, s_words: SharedTensor, s_tokens: SharedTensor, acc: RegisterTensor):
        operand = widen.values(widen.words(s_words)).to(self.dtype)
        self.annotate_layout(operand, widen.fragment)
        self.wgmma.fence()
        self.wgmma.mma(operand, s_tokens.transpose(), acc)
        self.wgmma.commit_group()

    def int6_consumer(
        self,
        c: int,
        ring: Pipeline,
        s_w: SharedTensor,
        s_s: SharedTensor,
        s_x: SharedTensor,
        reduce: tilus.Class,
        count: int32,
    ):
        """``consumer`` for 6-bit weights: a packed tile is
        ``[half h][thread t][word j < 6]`` (``matmul.quant.int6``), each half widened and issued as a
        wgmma group, the group scales as int4's."""
        wg, turn = divmod(c, self.interleave)  # its slab, and its K block of each stage
        with self.warp_group(warp_begin=4 * c, num_warps=4):
            acc = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
            self.annotate_layout(acc, wgmma_fragment(64, self.block_m))
            widen = Int6Widen()
            s_words = self.reshape_shared(s_w, [self.stages, self.consumers, 2, 128, 6])
            s_scale = self.reshape_shared(s_s, [self.stages, self.consumers, TILE_ROWS, 1])
            for kb in self.range(count, unroll=1):  # noqa: B007
                ring.consumer_acquire()
                slot = ring.consumer_stage
                scale = widen.scales(s_scale[slot, c])
                self.int6_half(widen, s_words[slot, c, 0], scale, s_x[slot, 2 * turn], acc)
                self.int6_half(widen, s_words[slot, c, 1], scale, s_x[slot, 2 * turn + 1], acc)
                self.wgmma.wait_group(0)
                ring.consumer_release()
                ring.consumer_advance()
            self.store_tile(reduce, acc, wg, turn)

    def int6_half(
        self, widen: Int6Widen, s_words: SharedTensor, scale: RegisterTensor, s_x: SharedTensor, acc: RegisterTensor
    ):
        operand = widen.operand(widen.words(s_words), scale)
        self.wgmma.fence()
        self.wgmma.mma(operand, s_x.transpose(), acc)
        self.wgmma.commit_group()
