"""Hopper V5: V4 made persistent, with an epilogue that overlaps the next tile's main loop.

Idea: V4 launches one CTA per tile. Each CTA pays for its start (barrier setup, the ring filling
from empty) and, at its end, the tensor core idles while the warpgroups write the tile out, until
the next CTA gets the SM. V5 launches one CTA per SM (``pipeline.schedulers.sm_count()``) and
each CTA loops over tiles: ``pipeline.schedulers.StaticTileScheduler`` hands CTA ``b`` the tiles
``b, b + grid, ...`` (in V4's grouped order). The producer warp walks the same tile sequence as
the consumers but runs ahead: while the consumer warpgroups are writing tile ``i`` out, the ring
is already filling with tile ``i + 1``'s operands. The epilogue itself is asynchronous
(``pipeline.epilogue.WgmmaTileStore``): each warpgroup casts its accumulator 64 columns at a time
into one of two swizzled staging buffers and hands each block to a TMA store it does not wait
for, so the stores drain while the next tile's wgmma run. The accumulator is zeroed at the start
of each tile.

Batched (``Variant.batches``, the entry of ``entry.batched_class``): the static schedule runs over
the tiles of every product, numbered product after product (``StaticTileScheduler.batch_tile``),
and each load and store addresses its product's matrix. A plain build has no batch arithmetic.

Synchronization (V4's ring, now continuous across tiles: the stage and phase carry over from one
tile to the next on both sides; at the end of each tile the last slot is released after
``wgmma.wait_group 0``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | the producer's elected lane; the loads | both consumer warpgroups | CTA |
| ``empty[s]`` | 2 | an elected thread of each consumer warpgroup, after ``wgmma.wait_group`` | the producer | CTA |
| named barriers 1, 2 | 128 | each consumer warpgroup, around its staging buffers | the same threads | CTA |

Staging buffers (two per warpgroup): before a buffer is rewritten, the issuing lane's
``cp.async.bulk.wait_group.read 1`` (the store that last read it is done) then the warpgroup's
named barrier; after writing, ``fence.proxy.async`` + the named barrier before the TMA store;
``cp.async.bulk.wait_group 0`` before the CTA exits.

Option ``stream_k`` (``STREAM_K``, in ``EXTRA_CONFIGS``: built and checked, not tuned, being
slower than V5 without it, ``plots/h100/stream-k/``): the last, partial
wave dealt out by K blocks (``pipeline.stream_k``, whose doc gives the rule and its global flags).
The whole waves run as above (``StreamKSchedule.whole_tile``); then each CTA computes its one or
two pieces of the tail, publishes a piece that ends inside its tile (``PartialTiles.publish``) and
finishes a tile by adding the partials of the CTAs before it (``PartialTiles.collect``) and storing
it through the usual epilogue. Grid: one CTA an SM whatever the tile count. Plain products only.
"""

import tilus
from tilus import GlobalTensor, SharedTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline
from pipeline.epilogue import SUB_COLS, WgmmaTileStore, wgmma_fragment
from pipeline.fused_epilogue import product_columns
from pipeline.mainloop import WgmmaMainloop
from pipeline.schedulers import StaticTileScheduler, sm_count
from pipeline.stream_k import PartialTiles, StreamKSchedule

from ..entry import MatmulKernel

IDEA = "persistent CTAs over a static tile schedule; asynchronous sub-tiled TMA-store epilogue"
PTX_MARKERS = (
    "wgmma.mma_async.sync.aligned.m64n256k16",
    "cp.async.bulk.tensor.2d.global.shared::cta",
    "cp.async.bulk.wait_group.read 1",
    "stmatrix",
)
REPRESENTATIVE = dict(block_m=128, block_n=256, block_k=64, stages=4, group=16)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)
BATCHED = True  # a batch index in the tile schedule (entry.batched_class)


def staging_columns(block_n: int, activation: str) -> int:
    """The columns of C a staging buffer holds: ``SUB_COLS``, or for a tile that is no multiple of the
    product columns they take (96, 224; swiglu: twice as many) the widest of 32, 16 and 8 that is."""
    return next(c for c in (SUB_COLS, 32, 16, 8) if block_n % product_columns(c, activation) == 0)


def takes(config: dict, variant) -> bool:
    """Whether a point of the space builds for ``variant`` (``versions.space``): a narrow tile (a width
    that is no multiple of 64) reads only B [N, K], since torch's b [K, N] comes in MN-major boxes of
    64 columns, and computes one product (the batched entry was not checked with it)."""
    if config.get("stream_k") and variant.batched:
        return False
    return config["block_n"] % 64 == 0 or (variant.b_layout == "nk" and not variant.batched)


# The stream-K option (module doc): the last, partial wave dealt out by K blocks. Built and checked,
# not tuned: its partials cost more than the idle SMs of the last wave (plots/h100/stream-k/).
# Select it on purpose with versions.kernel(module, dtype, STREAM_K).
STREAM_K = dict(block_m=128, block_n=256, block_k=64, stages=4, group=16, stream_k=True)
EXTRA_CONFIGS = (STREAM_K,)


# shared memory: stages * (block_m + block_n) * block_k * 2 bytes + 2 warpgroups * 2 staging
# buffers * 64 x 64 * 2 bytes (32 KiB): 4 stages of 64 K columns for 128 x 256. Groups as V4's.
# Narrow tiles for 128-256 tokens, where 128 x 256 tiles leave most SMs idle (qkv, 6144 columns at
# 256 tokens: 48 tiles on 132 SMs): 96 columns give qkv 128 tiles, 224 the gate-up weight (28672)
# 128 a token tile, each ring as deep as shared memory allows: the fastest kernel of the series on
# those two at 256 tokens (plots/h100/skinny/). A width that is no multiple of 64 goes out
# in narrower blocks (``staging_columns``) and is left out for torch's b [K, N] (``takes``).
@tilus.autotune("block_m, block_n, block_k, stages", [(128, 256, 64, 4), (128, 96, 64, 7), (128, 224, 64, 4)])
@tilus.autotune("group", [16, 32])
class Kernel(MatmulKernel):
    def __init__(
        self,
        dtype,
        block_m: int,
        block_n: int,
        block_k: int,
        stages: int,
        group: int,
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
        stream_k: bool = False,
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        if stream_k and self.batched:
            raise ValueError("stream-K computes one product: build the batched kernel without stream_k")
        self.stream_k = stream_k
        self.block_m = block_m
        self.require_whole_b_boxes(block_n)
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.group = group
        self.num_sms = sm_count()

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        half_m = self.block_m // 2
        num_m_tiles = cdiv(m_size, self.block_m)
        num_n_tiles = cdiv(n_size, self.block_n)
        num_tiles = num_m_tiles * num_n_tiles * self.batches  # batches: 1 in a plain build
        self.attrs.blocks = num_tiles if num_tiles < self.num_sms else self.num_sms
        self.attrs.warps = 9  # warps 0-3 and 4-7: consumer warpgroups; warp 8: producer
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)
        s_c = self.shared_tensor(dtype=self.dtype, shape=[2, 2, half_m, staging_columns(self.block_n, self.activation)])

        ring = Pipeline(self.stages, consumer_arrivals=2, elect_release=True)
        if self.stream_k:  # decided when the kernel is built
            self.attrs.blocks = self.num_sms  # the tail is shared by every SM, however few tiles there are
            partials = PartialTiles(self.num_sms, 2, half_m, self.block_n)
            schedule = StreamKSchedule(
                num_m_tiles, num_n_tiles, self.group, self.blockIdx.x, self.gridDim.x, num_k_blocks
            )
            self.sync()  # the barriers are initialized before anyone uses them
            self.stream_k_producer(ring, schedule, g_a, g_b, s_a, s_b)
            self.stream_k_consumer(0, ring, schedule, partials, s_a, s_b, s_c, g_c, num_k_blocks)
            self.stream_k_consumer(1, ring, schedule, partials, s_a, s_b, s_c, g_c, num_k_blocks)
            return
        tiles = StaticTileScheduler(num_m_tiles, num_n_tiles, self.group, self.blockIdx.x, self.gridDim.x, self.batches)
        self.sync()  # the barriers are initialized before anyone uses them

        with self.single_warp(8):  # producer: the same tiles as the consumers, running ahead
            for i in range(tiles.count()):
                if self.batched:  # decided when the kernel is built
                    batch, m_tile, n_tile = tiles.batch_tile(i)
                else:
                    m_tile, n_tile = tiles.tile(i)
                    batch = 0
                self.load_k_blocks(ring, g_a, g_b, s_a, s_b, m_tile, n_tile, 0, num_k_blocks, batch)

        self.consumer(0, ring, tiles, s_a, s_b, s_c, g_c, num_k_blocks)
        self.consumer(1, ring, tiles, s_a, s_b, s_c, g_c, num_k_blocks)

    def consumer(
        self,
        wg: int,
        ring: Pipeline,
        tiles: StaticTileScheduler,
        s_a: SharedTensor,
        s_b: SharedTensor,
        s_c: SharedTensor,
        g_c: GlobalTensor,
        num_k_blocks: int32,
    ):
        """Consumer warpgroup ``wg``: rows ``wg * block_m / 2 ...`` of every tile of this CTA."""
        half_m = self.block_m // 2
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            mainloop = WgmmaMainloop(ring)
            out = WgmmaTileStore(s_c[wg], half_m, self.block_n)
            for i in range(tiles.count()):
                if self.batched:
                    batch, m_tile, n_tile = tiles.batch_tile(i)
                else:
                    m_tile, n_tile = tiles.tile(i)
                    batch = 0
                acc = self.register_tensor(dtype=float32, shape=[half_m, self.block_n], init=0.0)
                self.annotate_layout(acc, wgmma_fragment(half_m, self.block_n))
                mainloop.run(s_a, s_b, wg, acc, num_k_blocks)
                offset_m = m_tile * self.block_m + wg * half_m
                out.store(acc, g_c, offset_m, n_tile * self.block_n, self.epilogue, batch)
            out.finish()

    def load_k_blocks(
        self,
        ring: Pipeline,
        g_a: GlobalTensor,
        g_b: GlobalTensor,
        s_a: SharedTensor,
        s_b: SharedTensor,
        m_tile: int32,
        n_tile: int32,
        k_begin: int32,
        k_end: int32,
        batch: int32 = 0,
    ):
        """The producer's loads of K blocks ``k_begin ... k_end - 1`` of tile (m_tile, n_tile) (of
        product ``batch`` in a batched kernel)."""
        for kb in range(k_begin, k_end, 1):
            ring.producer_acquire()
            slot = ring.producer_stage
            self.load_k_block(
                g_a,
                g_b,
                s_a[slot],
                s_b[slot],
                ring.producer_barrier(),
                m_tile * self.block_m,
                n_tile * self.block_n,
                kb * self.block_k,
                batch,
            )
            ring.producer_advance()

    def stream_k_producer(
        self,
        ring: Pipeline,
        schedule: StreamKSchedule,
        g_a: GlobalTensor,
        g_b: GlobalTensor,
        s_a: SharedTensor,
        s_b: SharedTensor,
    ):
        """The stream-K option's producer warp: the data-parallel tiles, then the tail's pieces
        (``pipeline.stream_k``), in the consumers' order."""
        with self.single_warp(8):
            for i in range(schedule.whole_count()):
                m_tile, n_tile = schedule.whole_tile(i)
                self.load_k_blocks(ring, g_a, g_b, s_a, s_b, m_tile, n_tile, 0, schedule.num_k_blocks)
            for p in range(schedule.piece_count()):
                m_tile, n_tile, k_begin, k_end, tail_tile = schedule.piece(p)
                self.load_k_blocks(ring, g_a, g_b, s_a, s_b, m_tile, n_tile, k_begin, k_end)

    def stream_k_consumer(
        self,
        wg: int,
        ring: Pipeline,
        schedule: StreamKSchedule,
        partials: PartialTiles,
        s_a: SharedTensor,
        s_b: SharedTensor,
        s_c: SharedTensor,
        g_c: GlobalTensor,
        num_k_blocks: int32,
    ):
        """Consumer warpgroup ``wg`` of the stream-K option: the data-parallel tiles as ``consumer``
        computes them; then each piece of the tail, whose accumulator is either published for the
        tile's finisher or, where the piece finishes its tile, summed with the partials before it
        and written out."""
        half_m = self.block_m // 2
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            mainloop = WgmmaMainloop(ring)
            out = WgmmaTileStore(s_c[wg], half_m, self.block_n)
            for i in range(schedule.whole_count()):
                m_tile, n_tile = schedule.whole_tile(i)
                acc = self.register_tensor(dtype=float32, shape=[half_m, self.block_n], init=0.0)
                self.annotate_layout(acc, wgmma_fragment(half_m, self.block_n))
                mainloop.run(s_a, s_b, wg, acc, num_k_blocks)
                out.store(acc, g_c, m_tile * self.block_m + wg * half_m, n_tile * self.block_n, self.epilogue)
            for p in range(schedule.piece_count()):
                m_tile, n_tile, k_begin, k_end, tail_tile = schedule.piece(p)
                acc = self.register_tensor(dtype=float32, shape=[half_m, self.block_n], init=0.0)
                self.annotate_layout(acc, wgmma_fragment(half_m, self.block_n))
                mainloop.run(s_a, s_b, wg, acc, k_end - k_begin)
                if k_end < num_k_blocks:  # a partial: the tile's finisher adds it
                    partials.publish(acc, schedule.worker, wg)
                else:
                    if k_begin > 0:
                        partials.collect(acc, schedule, tail_tile, wg)
                    out.store(acc, g_c, m_tile * self.block_m + wg * half_m, n_tile * self.block_n, self.epilogue)
            out.finish()
