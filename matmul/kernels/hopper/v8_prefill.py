"""Hopper V8 for many tokens: V5 whose B tiles (the weight) arrive packed in int4 and are widened
on chip, into shared memory, by a warpgroup of their own.

Idea: V8's decode kernel (``v8.py``) widens a weight tile in registers for each 128-token tile, and
widening the whole weight once per call for cuBLAS (``matmul.quant.widen``) writes and reads a
16-bit weight, a large share of a prefill product's time. Here the tensor core's loop is V5's (two
consumer warpgroups, 128 tokens x ``block_n`` weight rows a CTA, a persistent static tile schedule,
the TMA-store epilogue), and only its B side changes: the producer warp loads the packed tiles
(``matmul.quant.int4``'s layout: 64 rows x 128 columns, 4 KiB, one scale per row) instead of 16-bit
ones, and a widening warpgroup turns each into two 64-column halves of the 16-bit B tile in shared
memory (``pipeline.widen.Int4Widen``: the magic-number conversion and the group scale, the same
values as ``QuantizedWeight.dequantize()``), where the wgmma reads it as it reads V5's. The weight
comes from HBM in a quarter of the bytes, and the widening overlaps the tensor core's work on the
stage before.

Roles: warps 0-7 the consumer warpgroups (V5's), warps 8-11 the widening warpgroup, warp 12 the
producer. Rings (this CTA's 64-column K block ``i`` uses main stage ``s = i % stages``; its
128-column group ``g = i // 2`` packed stage ``g % packed_stages``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``packed.full[t]`` | 1 + bytes | producer's ``expect_tx``; its packed-tile and scale loads | widening WG | CTA |
| ``packed.empty[t]`` | 128 | each widening thread, its words and scales loaded | producer | CTA |
| ``main.full[s]`` | 129 + bytes | producer's ``expect_tx``, token loads; each widening thread | consumer WGs | CTA |
| ``main.empty[s]`` | 2 | one thread of each consumer WG, after ``wgmma.wait_group`` | producer, widening WG | CTA |

Two producers fill a main stage: the producer warp (tokens, by TMA) and the widening warpgroup
(WG: the weight, by plain stores, made visible to the wgmma's async proxy by ``fence.proxy.async``
before each widening thread's arrival). Both wait on the stage's ``empty`` barrier before refilling it, each
keeping its own position in the ring; ``full`` completes only when both have arrived and the token
bytes have landed. K must be a multiple of 128 (one scale group), as for V8.

This kernel is correct and slower than what the call runs above 256 tokens (the weight widened
once, then cuBLAS; ``plots/h100/v8/prefill/ of commit b43a7e1`` says why), so it is not the call's. It stays as the
series' worked example of widening into shared memory.
"""

import tilus
from tilus import GlobalTensor, SharedTensor, int32
from tilus.ir.layout.ops import shared_row_major
from tilus.utils import cdiv

from pipeline import Pipeline
from pipeline.epilogue import SUB_COLS
from pipeline.schedulers import StaticTileScheduler
from pipeline.widen import HALF_K, WORDS, Int4Widen

from ..entry import PackedWeightKernel
from . import v5

IDEA = "int4 weights widened by a warpgroup of their own into V5's shared B tiles: V8 for many tokens"
PTX_MARKERS = (
    "wgmma.mma_async.sync.aligned.m64n128k16",
    "lop3.b32",  # the magic-number int4 -> float16 conversion
    "fence.proxy.async",  # the widened tile's stores, before the wgmma reads them
    "cp.async.bulk.tensor.2d.global.shared::cta",
)
REPRESENTATIVE = dict(block_n=128, stages=4, packed_stages=2, group=16)
B_LAYOUTS = ("nk",)  # the packed weight has one layout (matmul.quant)
FUSED_EPILOGUE = False
MAX_ELEMENTS = 2**31 - 1

BLOCK_M = 128  # tokens a CTA: two consumer warpgroups of 64
GROUP = 128  # K columns of a packed tile, one scale group
TILE_ROWS = 64  # weight rows of a packed tile
WEIGHT_BOX = (16, 64)  # a packed tile as a TMA box of int32 [rows, columns] (matmul.quant.int4)
B_UNITS = (4, 2)  # weight rows and K columns per int32 word of the packed weight (matmul.protocol)


def supports(m: int, n: int, k: int) -> bool:
    """K a multiple of the group; any M and N (TMA clips the edges)."""
    return m >= 1 and n >= 1 and k >= 1 and k % GROUP == 0


def shared_bytes(block_n: int, stages: int, packed_stages: int, group: int = 16) -> int:
    """The main ring, the packed ring and V5's staging buffers."""
    main = stages * (BLOCK_M + block_n) * HALF_K * 2
    packed = packed_stages * (block_n // TILE_ROWS) * (WEIGHT_BOX[0] * WEIGHT_BOX[1] * 4 + TILE_ROWS * 2)
    return main + packed + 2 * 2 * 64 * SUB_COLS * 2


# V5's kernel, its consumer warpgroups (``v5.Kernel.consumer``) unchanged; a space of its own
@tilus.autotune("block_n, stages, packed_stages", [(128, 4, 2)])
@tilus.autotune("group", [16])
class Kernel(PackedWeightKernel, v5.Kernel):
    _autotune_space = {}  # (tilus's decorators would otherwise add to V5's)

    def __init__(
        self,
        dtype,
        block_n: int,
        stages: int,
        packed_stages: int,
        group: int,
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
    ):
        super().__init__(dtype, BLOCK_M, block_n, HALF_K, stages, group, b_layout, bias, activation)
        if b_layout != "nk" or bias or activation:
            raise ValueError("V8 reads its packed weight in one layout, with a plain epilogue")
        if block_n not in (64, 128, 256):
            raise ValueError(f"block_n is 64, 128 or 256 weight rows (one, two or four packed tiles), not {block_n}")
        self.tiles = block_n // TILE_ROWS  # packed tiles a K group of the CTA's weight rows
        self.packed_stages = packed_stages

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
        half_m = BLOCK_M // 2
        num_m_tiles = cdiv(m_size, BLOCK_M)
        num_n_tiles = cdiv(n_size, self.block_n)
        num_tiles = num_m_tiles * num_n_tiles
        self.attrs.blocks = num_tiles if num_tiles < self.num_sms else self.num_sms
        self.attrs.warps = 13  # consumer warpgroups (warps 0-7), the widening warpgroup (8-11), the producer (12)
        num_groups: int32 = k_size // GROUP  # packed stages a tile: one a scale group
        num_k_blocks: int32 = num_groups * 2  # main stages a tile: 64 K columns each

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_m, HALF_K])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, HALF_K])
        s_w = self.shared_tensor(dtype=int32, shape=[self.packed_stages, self.tiles, WEIGHT_BOX[0], WEIGHT_BOX[1]])
        self.annotate_layout(s_w, shared_row_major(self.packed_stages, self.tiles, WEIGHT_BOX[0], WEIGHT_BOX[1]))
        s_s = self.shared_tensor(dtype=self.dtype, shape=[self.packed_stages, self.tiles, 1, TILE_ROWS])
        self.annotate_layout(s_s, shared_row_major(self.packed_stages, self.tiles, 1, TILE_ROWS))
        s_c = self.shared_tensor(dtype=self.dtype, shape=[2, 2, half_m, SUB_COLS])  # [warpgroup, buffer]

        main = Pipeline(self.stages, producer_arrivals=1 + 128, consumer_arrivals=2, elect_release=True)
        packed = Pipeline(self.packed_stages, consumer_arrivals=128)
        tiles = StaticTileScheduler(num_m_tiles, num_n_tiles, self.group, self.blockIdx.x, self.gridDim.x, 1)
        self.sync()  # the barriers are initialized before anyone uses them

        with self.single_warp(12):  # producer: per scale group its packed tiles, then two token tiles
            for i in range(tiles.count()):
                m_tile, n_tile = tiles.tile(i)
                offset_m = m_tile * BLOCK_M
                offset_n = n_tile * self.block_n
                for g in range(num_groups):
                    packed.producer_acquire()
                    slot = packed.producer_stage
                    with self.single_thread():
                        self.mbarrier.arrive_and_expect_tx(
                            packed.producer_barrier(), transaction_bytes=s_w[slot].nbytes + s_s[slot].nbytes
                        )
                    for t in range(self.tiles):
                        self.tma.global_to_shared(
                            src=g_w,
                            dst=s_w[slot, t],
                            offsets=[(offset_n // TILE_ROWS + t) * WEIGHT_BOX[0], g * WEIGHT_BOX[1]],
                            mbarrier=packed.producer_barrier(),
                        )
                        self.tma.global_to_shared(
                            src=g_s,
                            dst=s_s[slot, t],
                            offsets=[g, offset_n + t * TILE_ROWS],
                            mbarrier=packed.producer_barrier(),
                        )
                    packed.producer_advance()
                    for h in range(2):
                        main.producer_acquire()
                        stage = main.producer_stage
                        with self.single_thread():
                            self.mbarrier.arrive_and_expect_tx(
                                main.producer_barrier(), transaction_bytes=s_a[stage].nbytes
                            )
                        offset_k = g * GROUP + h * HALF_K
                        self.load_a(g_a, s_a[stage, 0], main.producer_barrier(), offset_m, offset_k)
                        self.load_a(g_a, s_a[stage, 1], main.producer_barrier(), offset_m + half_m, offset_k)
                        main.producer_advance()

        self.widener(main, packed, tiles, s_w, s_s, s_b, num_groups)
        self.consumer(0, main, tiles, s_a, s_b, s_c, g_c, num_k_blocks)
        self.consumer(1, main, tiles, s_a, s_b, s_c, g_c, num_k_blocks)

    def widener(
        self,
        main: Pipeline,
        packed: Pipeline,
        tiles: StaticTileScheduler,
        s_w: SharedTensor,
        s_s: SharedTensor,
        s_b: SharedTensor,
        num_groups: int32,
    ):
        """The widening warpgroup: each packed stage's tiles, half by half, into two main stages'
        B tiles (64 weight rows of a packed tile at a time)."""
        with self.warp_group(warp_begin=8, num_warps=4):
            widen = Int4Widen(HALF_K)
            s_words = self.reshape_shared(s_w, [self.packed_stages, self.tiles, 2, 128, WORDS])
            s_scale = self.reshape_shared(s_s, [self.packed_stages, self.tiles, TILE_ROWS, 1])
            s_rows = self.reshape_shared(s_b, [self.stages, self.tiles, TILE_ROWS, HALF_K])
            for i in range(tiles.count()):  # noqa: B007 (every tile: the same number of groups)
                for g in range(num_groups):  # noqa: B007
                    packed.consumer_acquire()
                    slot = packed.consumer_stage
                    self.widen_half(widen, main, s_words, s_scale, s_rows, slot, 0)
                    self.widen_half(widen, main, s_words, s_scale, s_rows, slot, 1)
                    packed.consumer_release()  # every word and scale of the stage is in registers or stored
                    packed.consumer_advance()

    def widen_half(
        self,
        widen: Int4Widen,
        main: Pipeline,
        s_words: SharedTensor,
        s_scale: SharedTensor,
        s_rows: SharedTensor,
        slot: int32,
        half: int,
    ):
        """Half ``half`` (64 K columns) of the packed stage ``slot``: every packed tile's rows widened,
        scaled and stored into the next main stage's B tile, which is then handed to the consumers."""
        main.producer_acquire()
        stage = main.producer_stage
        # the packed tiles written out (a store into a tile indexed by a device loop's variable does
        # not build in tilus 0.2.0); block_n is at most 256: four tiles
        self.widen_tile(widen, s_words, s_scale, s_rows, slot, half, stage, 0)
        if self.tiles > 1:
            self.widen_tile(widen, s_words, s_scale, s_rows, slot, half, stage, 1)
        if self.tiles > 2:
            self.widen_tile(widen, s_words, s_scale, s_rows, slot, half, stage, 2)
            self.widen_tile(widen, s_words, s_scale, s_rows, slot, half, stage, 3)
        self.fence.proxy_async(space="shared")  # the generic-proxy stores, before the wgmma reads them
        main.producer_release()  # each of the 128 threads
        main.producer_advance()

    def widen_tile(
        self,
        widen: Int4Widen,
        s_words: SharedTensor,
        s_scale: SharedTensor,
        s_rows: SharedTensor,
        slot: int32,
        half: int,
        stage: int32,
        tile: int,
    ):
        """Packed tile ``tile`` of stage ``slot``, half ``half``: its 64 rows x 64 K columns widened,
        scaled and stored as rows ``64 * tile ...`` of the main stage's B tile."""
        scale = widen.scales(s_scale[slot, tile])
        wide = widen.operand(widen.words(s_words[slot, tile, half]), scale, 0)
        self.store_shared(s_rows[stage, tile], wide)
