"""Blackwell V4: V3 with grouped tile rasterization, every hand-off written with ``pipeline.Pipeline``.

Idea: which output tile a CTA computes decides what the L2 cache holds. V1-V3 map the 2-D grid
straight onto the tiles with ``blockIdx.x`` (the M tile) varying fastest, so the CTAs running
together walk down one column of C tiles: they share one B tile but read every row band of A,
and A comes from DRAM again for each column. V4 launches a 1-D grid and maps each
linear block index through ``pipeline.TileRasterizer``: the CTAs in flight cover ``group`` tile
rows column by column, so they share a few A and B tiles, which stay in L2.

The second half of the step is code, not speed: the barrier bookkeeping of V3 (a slot index, a
phase bit that flips on wrap-around, "wait for parity ^ 1 on a fresh barrier") is the shared
``Pipeline`` ring, used for both hand-offs of the kernel, so V5 and V6 add pipelines rather than
barrier arithmetic.

Synchronization (phase rules: ``pipeline/pipeline.py``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``ring.full[s]`` | 1 + bytes | a TMA-warp lane's ``arrive.expect_tx`` (both tiles); the 2 TMA loads | MMA warp | CTA |
| ``ring.empty[s]`` | 1 | MMA warp's ``tcgen05.commit`` after the MMA that read ``s`` | TMA warp | CTA |
| ``acc_ring.full[0]`` | 1 | MMA warp's ``tcgen05.commit`` after its last MMA | the 128 epilogue threads | CTA |
| ``acc_ring.empty[0]`` | 128 | nobody (one tile per CTA) | MMA warp, once, on the fresh barrier | CTA |
| named barrier 1 | 128 | epilogue threads, around each block's staging (V1's ``__syncthreads``) | the same | CTA |
| ``__syncthreads`` | 192 | all 6 warps, when their role is done | all; then TMEM is freed | CTA |

``acc_ring`` has one slot and the CTA one tile: the MMA warp's ``producer_acquire`` waits on
``empty[0]`` for the phase before the first, which a fresh barrier reports complete, so it returns
at once, and the epilogue never releases the slot. V5 makes the accumulator a ring that turns.
``acc_ring`` is a ``Pipeline(tcgen05_fences=True)``: its waits are followed by
``tcgen05.fence::after_thread_sync`` (V3's fence in the epilogue, now inside ``consumer_acquire``).
"""

import tilus
from tilus import GlobalTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline, TileRasterizer
from pipeline.fused_epilogue import output_columns
from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync
from pipeline.tma_store import StagedTmaStore

from ..entry import MatmulKernel

IDEA = "grouped tile rasterization for L2 reuse; every hand-off through the shared Pipeline class"
PTX_MARKERS = (
    "tcgen05.mma.cta_group::1",
    "tcgen05.commit",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "bar.cta.sync 1, 128",
)
REPRESENTATIVE = dict(block_m=128, block_n=256, block_k=64, stages=3, group=8)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)

EPILOGUE_COLUMNS = 64  # 128 bytes of a 16-bit dtype: one 128-byte-swizzled staging tile

TMA_WARP = 4
MMA_WARP = 5


@tilus.autotune("block_m, block_n, stages", [(128, 128, 4), (128, 128, 6), (128, 256, 3)])
@tilus.autotune("block_k", [64])
@tilus.autotune("group", [8, 16])
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
        num_m_tiles = cdiv(m_size, self.block_m)
        num_n_tiles = cdiv(n_size, self.block_n)
        self.attrs.blocks = num_m_tiles * num_n_tiles
        self.attrs.warps = 6
        raster = TileRasterizer(num_m_tiles, num_n_tiles, self.group)
        m_tile, n_tile = raster.tile(self.blockIdx.x)
        offset_m: int32 = m_tile * self.block_m
        offset_n: int32 = n_tile * self.block_n
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)
        c_cols = output_columns(EPILOGUE_COLUMNS, self.activation)  # swiglu: half as many columns of C
        s_c = self.shared_tensor(dtype=self.dtype, shape=[1, self.block_m, c_cols])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=1)

        ring = Pipeline(self.stages)
        acc_ring = Pipeline(1, consumer_arrivals=128, tcgen05_fences=True)
        self.sync()

        with self.single_warp(TMA_WARP):  # producer of ring
            for k in range(num_k_blocks):
                ring.producer_acquire()
                self.load_k_block(
                    g_a,
                    g_b,
                    s_a[ring.producer_stage],
                    s_b[ring.producer_stage],
                    ring.producer_barrier(),
                    offset_m,
                    offset_n,
                    k * self.block_k,
                )
                ring.producer_advance()

        with self.single_warp(MMA_WARP):  # consumer of ring, producer of acc_ring
            acc_ring.producer_acquire()
            for k in range(num_k_blocks):
                ring.consumer_acquire()
                self.tcgen05.mma(
                    s_a[ring.consumer_stage], s_b[ring.consumer_stage].transpose(), t_acc, enable_input_d=k != 0
                )
                self.tcgen05.commit(mbarrier=ring.consumer_barrier())
                ring.consumer_advance()
            self.tcgen05.commit(mbarrier=acc_ring.producer_barrier())
            acc_ring.producer_advance()

        with self.warp_group(warp_begin=0, num_warps=4):  # consumer of acc_ring: TMEM -> global
            acc_ring.consumer_acquire()
            out = StagedTmaStore(s_c)
            for e in range(self.block_n // EPILOGUE_COLUMNS):
                t_sub = self.tcgen05.slice(
                    t_acc, offsets=[0, e * EPILOGUE_COLUMNS], shape=[self.block_m, EPILOGUE_COLUMNS], dims=[0, 1]
                )
                r_sub = self.tcgen05.load(t_sub)
                self.tcgen05.wait_load()
                # converted first: half as many registers stay live while put() waits for the staging tile
                block, column = self.epilogue.apply(r_sub, offset_n + e * EPILOGUE_COLUMNS, "tcgen05")  # bias, act.
                out.put(block.to(self.dtype), g_c, offset_m, column)
            out.finish()

        fence_before_thread_sync()  # every tcgen05.ld, before the barrier after which TMEM is freed
        self.sync()
        fence_after_thread_sync()
        self.tcgen05.dealloc(t_acc)
