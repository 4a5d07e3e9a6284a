"""Hopper V4: V3 with grouped tile rasterization, and the ring's bookkeeping in the shared
``Pipeline`` class.

Idea: the launch order. V3's grid is two-dimensional and the hardware launches its CTAs in index
order, x (the tile row) fastest, so the CTAs in flight together cover a few tile columns from
top to bottom: they share their B tiles, but the whole of A streams through L2 again for every
tile column. V4's grid is one-dimensional and ``pipeline.TileRasterizer`` maps a CTA's index to a
tile so that the CTAs in flight together cover a few tile rows column by column (``group`` rows
at a time): their A and B tiles are re-read from L2 rather than DRAM. Second, the ring's stage
and phase bookkeeping, which V3 spelled out by hand (slot = k % stages, parity = (k // stages) &
1), moves into the shared ``pipeline.Pipeline`` class and the consumers' main loop into
``pipeline.mainloop.WgmmaMainloop``, which V5 and V6 reuse. The CTA is V3's: one producer warp,
two consumer warpgroups of 64 x 256.

Synchronization (V3's, through ``Pipeline``; parities from the pipeline's phase bits):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | producer's elected lane; the loads | consumers (``consumer_acquire``) | CTA |
| ``empty[s]`` | 2 | a thread of each consumer (``consumer_release_previous``) | producer (``producer_acquire``) | CTA |
| named barriers 1, 2 | 128 | each consumer warpgroup, in the epilogue | the same threads | CTA |
"""

import tilus
from tilus import GlobalTensor, SharedTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline, TileRasterizer
from pipeline.epilogue import SlotTileStore, wgmma_fragment
from pipeline.mainloop import WgmmaMainloop

from ..entry import MatmulKernel

IDEA = "grouped tile rasterization for L2 reuse; the ring through the shared Pipeline class"
PTX_MARKERS = (
    "wgmma.mma_async.sync.aligned.m64n256k16",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "bar.cta.sync 1, 128",
    "bar.cta.sync 2, 128",
)
REPRESENTATIVE = dict(block_m=128, block_n=256, block_k=64, stages=4, group=16)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)


# V3's tile and ring: 4 stages of 64 K columns, the output staged in the ring. The group (tile
# rows walked together) decides how much of A and B the CTAs in flight share in L2; smaller
# groups are slower (plots/h100/candidates/ of commit b43a7e1).
@tilus.autotune("block_m, block_n, block_k, stages", [(128, 256, 64, 4)])
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
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.group = group

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        half_m = self.block_m // 2  # the rows of one consumer warpgroup
        num_m_tiles = cdiv(m_size, self.block_m)
        num_n_tiles = cdiv(n_size, self.block_n)
        self.attrs.blocks = num_m_tiles * num_n_tiles
        self.attrs.warps = 9  # warps 0-3 and 4-7: consumer warpgroups; warp 8: producer
        m_tile, n_tile = TileRasterizer(num_m_tiles, num_n_tiles, self.group).tile(self.blockIdx.x)
        offset_m: int32 = m_tile * self.block_m
        offset_n: int32 = n_tile * self.block_n
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)

        ring = Pipeline(self.stages, consumer_arrivals=2, elect_release=True)
        self.sync()  # the barriers are initialized before anyone uses them

        with self.single_warp(8):  # producer
            for kb in range(num_k_blocks):
                ring.producer_acquire()
                slot = ring.producer_stage
                # both warpgroups' slabs of A and the B tile, on the stage's full barrier
                self.load_k_block(
                    g_a, g_b, s_a[slot], s_b[slot], ring.producer_barrier(), offset_m, offset_n, kb * self.block_k
                )
                ring.producer_advance()

        self.consumer(0, ring, s_a, s_b, g_c, num_k_blocks, offset_m, offset_n)
        self.consumer(1, ring, s_a, s_b, g_c, num_k_blocks, offset_m, offset_n)

    def consumer(
        self,
        wg: int,
        ring: Pipeline,
        s_a: SharedTensor,
        s_b: SharedTensor,
        g_c: GlobalTensor,
        num_k_blocks: int32,
        offset_m: int32,
        offset_n: int32,
    ):
        """Consumer warpgroup ``wg``: rows ``wg * block_m / 2 ...`` of the tile."""
        half_m = self.block_m // 2
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            acc = self.register_tensor(dtype=float32, shape=[half_m, self.block_n], init=0.0)
            self.annotate_layout(acc, wgmma_fragment(half_m, self.block_n))
            WgmmaMainloop(ring).run(s_a, s_b, wg, acc, num_k_blocks)

            # epilogue: this warpgroup's half of the tile, staged in its own slab of the ring's A
            # slots (the other warpgroup may still be reading its slab and B)
            SlotTileStore(s_a).store(acc, g_c, offset_m + wg * half_m, offset_n, slab=wg, epilogue=self.epilogue)
