"""Blackwell V5: V4 made persistent with cluster launch control, with a pipelined epilogue.

Idea: in V4 every CTA pays the prologue (barrier init, TMEM allocation) for one tile, and while
its epilogue drains TMEM the tensor core has nothing to do. V5 keeps each CTA alive across tiles:
a scheduler warp asks the hardware to cancel a cluster that has not launched yet
(``clusterlaunchcontrol.try_cancel``) and hands the stolen tile index to every warp
(``pipeline.ClcScheduler``); the grid still has one CTA per tile, so the hardware knows the work
and balances it. Because the CTA lives on, the accumulator becomes a ring of ``acc_stages`` TMEM
buffers: the MMA warp fills buffer ``i + 1`` while the epilogue warpgroup drains buffer ``i``. The
epilogue drains in ``e_block_n``-column sub-tiles, TMEM -> registers -> one of up to four shared
staging buffers (as many as fit beside the ring) -> TMA store, so stores stay in flight while the
next sub-tiles are read, and it hands a buffer back to the MMA warp as soon as its last sub-tile
is in registers, before that sub-tile is staged and stored.

Batched (``Variant.batches``, the entry of ``entry.batched_class``): the grid has one CTA per tile
of every product, numbered product after product, so a CLC response names a tile of any product
(``TileRasterizer.batch_tile``), and each load and store addresses its product's matrix. A plain
build has no batch arithmetic.

Warps: 0-3 epilogue (the 128 TMEM lanes), 4 TMA, 5 MMA, 6 scheduler (224 threads).

Synchronization (phase rules: ``pipeline/pipeline.py``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``ring.full[s]`` | 1 + bytes | a TMA-warp lane's ``arrive.expect_tx`` (both tiles); the 2 TMA loads | MMA warp | CTA |
| ``ring.empty[s]`` | 1 | MMA warp's ``tcgen05.commit`` after the MMA that read ``s`` | TMA warp | CTA |
| ``acc_ring.full[a]`` | 1 | MMA warp's ``tcgen05.commit`` after a tile's last MMA | the 128 epilogue threads | CTA |
| ``acc_ring.empty[a]`` | 128 | each epilogue thread, its last ``tcgen05.ld`` of ``a`` complete | MMA warp | CTA |
| ``clc.full[r]`` | 1 + 16 bytes | scheduler's ``arrive.expect_tx``; the ``try_cancel`` response | all 224 | CTA |
| ``clc.empty[r]`` | 224 | every thread of the four roles, once it decoded response ``r`` | scheduler warp | CTA |
| named barrier 1 | 128 | epilogue threads, around each sub-tile's staging (``StagedTmaStore``) | the same | CTA |
| ``__syncthreads`` | 224 | all 7 warps, when their role is done | all; then TMEM is freed | CTA |

The MMA warp waits on ``acc_ring.empty[a]`` before it overwrites buffer ``a`` (``enable_input_d``
false on a tile's first K block); ``acc_ring``'s ``tcgen05_fences`` put
``tcgen05.fence::after_thread_sync`` after both its waits and ``before_thread_sync`` before the
epilogue's release. Before refilling staging buffer ``j % buffers`` the storing lane waits until
at most ``buffers - 1`` TMA store groups still read (``cp.async.bulk.wait_group.read``).
"""

import tilus
from tilus import GlobalTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline, TileRasterizer
from pipeline.clc import ClcScheduler
from pipeline.fused_epilogue import output_columns
from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync
from pipeline.tma_store import StagedTmaStore, staging_buffers

from ..entry import MatmulKernel

IDEA = "persistent kernel scheduled by cluster launch control; TMEM accumulator ring and sub-tiled TMA epilogue"
PTX_MARKERS = (
    "tcgen05.mma.cta_group::1",
    "clusterlaunchcontrol.try_cancel",
    "clusterlaunchcontrol.query_cancel",
    "cp.async.bulk.wait_group.read",
)
REPRESENTATIVE = dict(block_m=128, block_n=256, block_k=64, stages=4, acc_stages=2, e_block_n=32, group=8)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)
BATCHED = True  # a batch index in the tile numbering (entry.batched_class)

TMA_WARP = 4
MMA_WARP = 5
SCHEDULER_WARP = 6
CONSUMER_THREADS = 7 * 32  # every warp reads every CLC response
CLC_STAGES = 2  # lets the TMA and MMA warps learn their next tile while the epilogue finishes one


# TMEM: acc_stages * block_n <= 512 columns; shared memory: the ring + up to 4 epilogue sub-tiles
@tilus.autotune("block_m, block_n, stages, acc_stages", [(128, 128, 6, 2), (128, 128, 6, 4), (128, 256, 4, 2)])
@tilus.autotune("block_k", [64])
@tilus.autotune("e_block_n", [32, 64])
@tilus.autotune("group", [8, 16])
class Kernel(MatmulKernel):
    def __init__(
        self,
        dtype,
        block_m: int,
        block_n: int,
        block_k: int,
        stages: int,
        acc_stages: int,
        e_block_n: int,
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
        self.acc_stages = acc_stages
        self.e_block_n = e_block_n
        self.group = group
        # as many epilogue staging buffers (up to 4) as fit beside the ring
        ring_bytes = stages * (block_m + block_n) * block_k * dtype.nbytes
        self.epilogue_buffers = staging_buffers(block_m * e_block_n * dtype.nbytes, ring_bytes)

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        num_m_tiles = cdiv(m_size, self.block_m)
        num_n_tiles = cdiv(n_size, self.block_n)
        self.attrs.blocks = num_m_tiles * num_n_tiles * self.batches  # batches: 1 in a plain build
        self.attrs.warps = 7
        raster = TileRasterizer(num_m_tiles, num_n_tiles, self.group)
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)
        c_cols = output_columns(self.e_block_n, self.activation)  # swiglu: half as many columns of C
        s_c = self.shared_tensor(dtype=self.dtype, shape=[self.epilogue_buffers, self.block_m, c_cols])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.acc_stages, self.block_m, self.block_n])
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=1)

        ring = Pipeline(self.stages)
        acc_ring = Pipeline(self.acc_stages, consumer_arrivals=128, tcgen05_fences=True)
        clc = ClcScheduler(CLC_STAGES, consumer_arrivals=CONSUMER_THREADS)
        self.sync()

        with self.single_warp(TMA_WARP):  # producer of ring
            tile: int32 = clc.first_tile()
            while True:
                if self.batched:  # decided when the kernel is built
                    batch, m_tile, n_tile = raster.batch_tile(tile)
                else:
                    m_tile, n_tile = raster.tile(tile)
                    batch = 0
                for k in range(num_k_blocks):
                    ring.producer_acquire()
                    self.load_k_block(
                        g_a,
                        g_b,
                        s_a[ring.producer_stage],
                        s_b[ring.producer_stage],
                        ring.producer_barrier(),
                        m_tile * self.block_m,
                        n_tile * self.block_n,
                        k * self.block_k,
                        batch,
                    )
                    ring.producer_advance()
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break

        with self.single_warp(MMA_WARP):  # consumer of ring, producer of acc_ring
            while True:
                acc_ring.producer_acquire()
                for k in range(num_k_blocks):
                    ring.consumer_acquire()
                    self.tcgen05.mma(
                        s_a[ring.consumer_stage],
                        s_b[ring.consumer_stage].transpose(),
                        t_acc[acc_ring.producer_stage],
                        enable_input_d=k != 0,
                    )
                    self.tcgen05.commit(mbarrier=ring.consumer_barrier())
                    ring.consumer_advance()
                self.tcgen05.commit(mbarrier=acc_ring.producer_barrier())
                acc_ring.producer_advance()
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break

        with self.single_warp(SCHEDULER_WARP):  # producer of clc (and one of its consumers)
            while True:
                clc.request()
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break

        with self.warp_group(warp_begin=0, num_warps=4):  # consumer of acc_ring: TMEM -> global
            out = StagedTmaStore(s_c)
            tile: int32 = clc.first_tile()
            while True:
                if self.batched:
                    batch, m_tile, n_tile = raster.batch_tile(tile)
                else:
                    m_tile, n_tile = raster.tile(tile)
                    batch = 0
                acc_ring.consumer_acquire()
                for e in range(self.block_n // self.e_block_n):
                    t_sub = self.tcgen05.slice(
                        t_acc[acc_ring.consumer_stage],
                        offsets=[0, e * self.e_block_n],
                        shape=[self.block_m, self.e_block_n],
                        dims=[0, 1],
                    )
                    r_sub = self.tcgen05.load(t_sub)
                    self.tcgen05.wait_load()
                    if e == self.block_n // self.e_block_n - 1:  # the buffer's last tcgen05.ld has completed:
                        acc_ring.consumer_release()  # the MMA warp may refill it while this sub-tile is stored
                        acc_ring.consumer_advance()
                    block, column = self.epilogue.apply(r_sub, n_tile * self.block_n + e * self.e_block_n, "tcgen05")
                    out.put(block, g_c, m_tile * self.block_m, column, batch)  # with the variant's bias and activation
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break
            out.finish()

        fence_before_thread_sync()  # every tcgen05.ld, before the barrier after which TMEM is freed
        self.sync()
        fence_after_thread_sync()
        self.tcgen05.dealloc(t_acc)
