"""Blackwell V2: V1 with a ring of shared-memory stages, so that TMA loads run ahead of the MMAs.

Idea: in V1 the tensor core waits for every tile to arrive and the TMA engine waits for every MMA
to finish: the two take turns. V2 gives shared memory ``stages`` slots for (A, B) tile pairs. The
prologue issues loads for the first ``stages`` K blocks at once; in the main loop the issuing warp
waits only for the tiles of the K block it is about to multiply, queues the MMA, and then refills
the slot the *previous* MMA read, as soon as that MMA is done. So while the tensor core works on
block ``k`` (with block ``k-1`` possibly still draining), the loads for blocks ``k+1 .. k+stages-1``
are already in flight. One warp still does all of the issuing; the other warps only wait for the
result (V3 splits the roles).

Synchronization (K block ``k`` uses slot ``s = k % stages``, parity ``(k // stages) & 1``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | warp 0's ``arrive.expect_tx`` (both tiles); the 2 TMA loads | warp 0, before the MMA | CTA |
| ``empty[s]`` | 1 | ``tcgen05.commit`` after the MMA that read slot ``s`` | warp 0, before refilling ``s`` | CTA |
| ``acc_ready`` | 1 | ``tcgen05.commit`` after the last MMA | all 128 threads (parity 0), then TMEM is read | CTA |

The epilogue and TMEM's fences are V1's (after the wait on ``acc_ready``). The output blocks are
staged in their own buffer, not in the ring: tilus 0.2.0 places the mbarriers in whatever shared
memory is free when the kernel is finalized, so a ``free_shared`` ring would put the barriers on
top of live tiles.
"""

import tilus
from tilus import GlobalTensor, float32, int32
from tilus.utils import cdiv

from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync
from pipeline.tma_store import StagedTmaStore

from ..entry import MatmulKernel

IDEA = "software pipelining: a ring of shared-memory stages, TMA loads run ahead of the MMAs"
PTX_MARKERS = (
    "tcgen05.mma.cta_group::1",
    "tcgen05.commit",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "mbarrier.try_wait.parity",
)
REPRESENTATIVE = dict(block_m=128, block_n=256, block_k=64, stages=3)

EPILOGUE_COLUMNS = 64  # 128 bytes of a 16-bit dtype: one 128-byte-swizzled staging tile


# shared memory: stages * (block_m + block_n) * block_k * 2 bytes of ring + the staged output tile
@tilus.autotune("block_m, block_n, stages", [(128, 128, 4), (128, 128, 6), (128, 256, 3)])
@tilus.autotune("block_k", [64])
class Kernel(MatmulKernel):
    def __init__(self, dtype, block_m: int, block_n: int, block_k: int, stages: int):
        super().__init__(dtype)
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        self.attrs.blocks = [cdiv(m_size, self.block_m), cdiv(n_size, self.block_n)]
        self.attrs.warps = 4
        stages = self.stages
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[stages, self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[stages, self.block_n, self.block_k])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=1)

        full = self.mbarrier.alloc(counts=[1 for _ in range(stages)])
        empty = self.mbarrier.alloc(counts=[1 for _ in range(stages)])
        acc_ready = self.mbarrier.alloc(counts=[1])
        self.sync()

        with self.single_warp():
            # prologue: one load per slot, all in flight together
            for s in self.range(stages, unroll="all"):
                if s < num_k_blocks:
                    self.load_k_block(g_a, g_b, s_a[s], s_b[s], full[s], offset_m, offset_n, s * self.block_k)

            for k in range(num_k_blocks):
                stage = k % stages
                self.mbarrier.wait(full[stage], phase=(k // stages) & 1)
                self.tcgen05.mma(s_a[stage], s_b[stage].transpose(), t_acc, enable_input_d=k != 0)
                self.tcgen05.commit(mbarrier=empty[stage])
                # MMA k is queued behind MMA k-1: refill the slot MMA k-1 read once it has finished
                refill = k - 1 + stages
                if k >= 1 and refill < num_k_blocks:
                    prev = (k - 1) % stages
                    self.mbarrier.wait(empty[prev], phase=((k - 1) // stages) & 1)
                    self.load_k_block(
                        g_a, g_b, s_a[prev], s_b[prev], full[prev], offset_m, offset_n, refill * self.block_k
                    )
            self.tcgen05.commit(mbarrier=acc_ready[0])
        self.mbarrier.wait(acc_ready[0], phase=0)

        # epilogue (as in V1)
        s_c = self.shared_tensor(dtype=self.dtype, shape=[1, self.block_m, EPILOGUE_COLUMNS])
        out = StagedTmaStore(s_c)
        fence_after_thread_sync()  # the MMAs that acc_ready announced, before tcgen05.ld reads TMEM
        for e in range(self.block_n // EPILOGUE_COLUMNS):
            t_sub = self.tcgen05.slice(
                t_acc, offsets=[0, e * EPILOGUE_COLUMNS], shape=[self.block_m, EPILOGUE_COLUMNS], dims=[0, 1]
            )
            r_sub = self.tcgen05.load(t_sub)
            self.tcgen05.wait_load()
            # converted first: half as many registers stay live while put() waits for the staging tile
            out.put(r_sub.to(self.dtype), g_c, offset_m, offset_n + e * EPILOGUE_COLUMNS)
        out.finish()

        fence_before_thread_sync()  # every tcgen05.ld, before the barrier after which TMEM is freed
        self.sync()
        fence_after_thread_sync()
        self.tcgen05.dealloc(t_acc)
