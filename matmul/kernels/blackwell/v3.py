"""Blackwell V3: V2 with warp specialization: a TMA warp, an MMA warp and an epilogue warpgroup.

Idea: in V2 one warp both issues the loads and the MMAs, so each of them waits behind the other's
barrier waits (a slow load holds back the MMA issue of a block that is already resident, and the
refill of a slot waits behind the MMA issue). V3 gives each job its own warp, each running its
own loop over the K blocks and meeting the others only at mbarriers:

* warp 4 (producer): waits for a slot to be free, announces its bytes, issues the two TMA loads;
* warp 5 (MMA issuer): waits for a slot to be full, issues the MMA, commits the slot back;
* warps 0-3 (epilogue warpgroup, the 128 TMEM lanes): wait for the accumulator, then V1's
  epilogue, block by block: TMEM -> registers -> shared -> TMA store.

The producer runs up to ``stages`` K blocks ahead of the MMAs, bounded only by the ring.

Synchronization (K block ``k`` uses slot ``s = k % stages``, parity ``p = (k // stages) & 1``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | TMA warp's ``arrive.expect_tx`` (both tiles); the 2 loads | MMA warp, parity ``p`` | CTA |
| ``empty[s]`` | 1 | MMA warp's ``tcgen05.commit`` after the MMA that read ``s`` | TMA warp, parity ``p ^ 1`` | CTA |
| ``acc_ready`` | 1 | MMA warp's ``tcgen05.commit`` after its last MMA | the 128 epilogue threads, parity 0 | CTA |
| named barrier 1 | 128 | epilogue threads, around each block's staging (V1's ``__syncthreads``) | the same | CTA |
| ``__syncthreads`` | 192 | all 6 warps, when their role is done | all; then TMEM is freed | CTA |

The TMA warp's parity ``p ^ 1`` on a fresh ``empty[s]`` names the phase before the first, which
reads as completed: the first pass over the ring does not wait. TMEM's fences are V1's, the
"after" fence in the epilogue warpgroup after its wait on ``acc_ready``.
"""

import tilus
from tilus import GlobalTensor, float32, int32
from tilus.utils import cdiv

from pipeline.fused_epilogue import output_columns
from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync
from pipeline.tma_store import StagedTmaStore

from ..entry import MatmulKernel

IDEA = "warp specialization: a TMA producer warp, an MMA warp and an epilogue warpgroup"
PTX_MARKERS = (
    "tcgen05.mma.cta_group::1",
    "tcgen05.commit",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "bar.cta.sync 1, 128",
)
REPRESENTATIVE = dict(block_m=128, block_n=256, block_k=64, stages=3)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)

EPILOGUE_COLUMNS = 64  # 128 bytes of a 16-bit dtype: one 128-byte-swizzled staging tile

EPILOGUE_WARPS = (0, 4)  # warps 0-3: one warp per 32 TMEM lanes
TMA_WARP = 4
MMA_WARP = 5


@tilus.autotune("block_m, block_n, stages", [(128, 128, 4), (128, 128, 6), (128, 256, 3)])
@tilus.autotune("block_k", [64])
class Kernel(MatmulKernel):
    def __init__(
        self,
        dtype,
        block_m: int,
        block_n: int,
        block_k: int,
        stages: int,
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        self.attrs.blocks = [cdiv(m_size, self.block_m), cdiv(n_size, self.block_n)]
        self.attrs.warps = 6
        stages = self.stages
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[stages, self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[stages, self.block_n, self.block_k])
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)
        c_cols = output_columns(EPILOGUE_COLUMNS, self.activation)  # swiglu: half as many columns of C
        s_c = self.shared_tensor(dtype=self.dtype, shape=[1, self.block_m, c_cols])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=1)

        full = self.mbarrier.alloc(counts=[1 for _ in range(stages)])
        empty = self.mbarrier.alloc(counts=[1 for _ in range(stages)])
        acc_ready = self.mbarrier.alloc(counts=[1])
        self.sync()

        with self.single_warp(TMA_WARP):  # producer: global -> shared
            for k in range(num_k_blocks):
                stage = k % stages
                self.mbarrier.wait(empty[stage], phase=((k // stages) & 1) ^ 1)
                self.load_k_block(g_a, g_b, s_a[stage], s_b[stage], full[stage], offset_m, offset_n, k * self.block_k)

        with self.single_warp(MMA_WARP):  # consumer of the ring, producer of the accumulator
            for k in range(num_k_blocks):
                stage = k % stages
                self.mbarrier.wait(full[stage], phase=(k // stages) & 1)
                self.tcgen05.mma(s_a[stage], s_b[stage].transpose(), t_acc, enable_input_d=k != 0)
                self.tcgen05.commit(mbarrier=empty[stage])
            self.tcgen05.commit(mbarrier=acc_ready[0])

        with self.warp_group(warp_begin=EPILOGUE_WARPS[0], num_warps=EPILOGUE_WARPS[1]):  # TMEM -> global
            self.mbarrier.wait(acc_ready[0], phase=0)
            fence_after_thread_sync()  # the MMAs that acc_ready announced, before tcgen05.ld reads TMEM
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
