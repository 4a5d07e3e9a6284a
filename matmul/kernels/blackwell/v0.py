"""Blackwell V0: the smallest kernel that uses the 5th-generation tensor core (tcgen05).

Idea: the accumulator no longer lives in registers. A CTA allocates ``block_n`` columns of tensor
memory (TMEM, 128 lanes x 512 columns of 32-bit cells per SM) and a single thread issues
``tcgen05.mma``, which reads A and B from shared memory and accumulates into TMEM. The MMA is
asynchronous: ``tcgen05.commit`` makes an mbarrier arrive once every MMA issued before it is done.
The threads load the tiles through registers (masked: ragged edges read as zero) and store them
to shared memory; loads and MMAs take turns. The epilogue reads TMEM with ``tcgen05.ld`` (warp
``w`` reads lanes ``32w .. 32w+31``, hence 4 warps for 128 rows) in blocks of 32 columns, each
stored to global memory before the next is read: a whole 128 x 128 fp32 tile at once would go
through local memory.

Synchronization (``mma_done``'s phase flips once per K block):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``mma_done`` | 1 | ``tcgen05.commit`` after a K block's MMA | all 128 threads, before the next copy | CTA |
| ``__syncthreads`` | 128 | all, after storing the tiles + ``fence.proxy.async`` | all; then the MMA reads them | CTA |
| ``__syncthreads`` | 128 | all, after their ``tcgen05.ld`` | all; then TMEM is freed | CTA |

TMEM: the allocating warp relinquishes the allocation permit at once (one allocation per CTA, so
a CTA arriving next on the SM need not wait for it). Every hand-off of TMEM between threads is
fenced (``pipeline.tcgen05_fence``): ``tcgen05.fence::after_thread_sync`` after the last wait on
``mma_done``, before ``tcgen05.ld``; ``before_thread_sync`` / ``after_thread_sync`` around the
barrier after which TMEM is freed.
"""

import tilus
from tilus import GlobalTensor, float32, int32, uint32
from tilus.utils import cdiv

from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync

from ..entry import MatmulKernel

IDEA = "tcgen05.mma into tensor memory, completion on an mbarrier; tiles loaded through registers"
PTX_MARKERS = ("tcgen05.mma.cta_group::1", "tcgen05.commit", "tcgen05.alloc", "tcgen05.ld", "st.shared")
REPRESENTATIVE = dict(block_m=128, block_n=128, block_k=32)
# tiles load through registers at int32 element offsets: no operand may reach past 2^31 - 1 elements
MAX_ELEMENTS = 2**31 - 1

EPILOGUE_COLUMNS = 32  # accumulator columns read from TMEM and stored at a time


# the tiles pass through registers on their way to shared memory: bigger ones spill
@tilus.autotune("block_m, block_n, block_k", [(128, 64, 32), (128, 128, 32)])
class Kernel(MatmulKernel):
    def __init__(self, dtype, block_m: int, block_n: int, block_k: int):
        super().__init__(dtype)
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        self.attrs.blocks = [cdiv(m_size, self.block_m), cdiv(n_size, self.block_n)]
        self.attrs.warps = 4  # 4 warps x 32 lanes = the 128 TMEM lanes of the accumulator
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.block_n, self.block_k])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=1)

        mma_done = self.mbarrier.alloc(counts=[1])
        phase: uint32 = 0
        self.sync()

        for offset_k in range(0, k_size, self.block_k):
            self.store_shared(s_a, self.load_global(g_a, offsets=[offset_m, offset_k], shape=s_a.shape))
            self.store_shared(s_b, self.load_global(g_b, offsets=[offset_n, offset_k], shape=s_b.shape))
            self.fence.proxy_async(space="shared")
            self.sync()

            with self.single_warp():  # tcgen05.mma / commit are issued by one warp (one lane)
                # the first K block overwrites TMEM, later ones accumulate into it
                self.tcgen05.mma(s_a, s_b.transpose(), t_acc, enable_input_d=offset_k != 0)
                self.tcgen05.commit(mbarrier=mma_done[0])
            self.mbarrier.wait(mma_done[0], phase=phase)
            phase ^= 1

        # epilogue: TMEM -> registers -> global, in column blocks (a whole 128 x 128 fp32 tile per
        # thread group would go through local memory)
        fence_after_thread_sync()  # the MMAs that mma_done announced, before tcgen05.ld reads TMEM
        for e in range(self.block_n // EPILOGUE_COLUMNS):
            t_sub = self.tcgen05.slice(
                t_acc, offsets=[0, e * EPILOGUE_COLUMNS], shape=[self.block_m, EPILOGUE_COLUMNS], dims=[0, 1]
            )
            r_sub = self.tcgen05.load(t_sub)
            self.tcgen05.wait_load()
            self.store_global(g_c, r_sub.to(self.dtype), offsets=[offset_m, offset_n + e * EPILOGUE_COLUMNS])

        fence_before_thread_sync()  # every tcgen05.ld, before the barrier after which TMEM is freed
        self.sync()
        fence_after_thread_sync()
        self.tcgen05.dealloc(t_acc)
