"""Blackwell V1: V0 with TMA loads and a TMA epilogue.

Idea: the Tensor Memory Accelerator fetches each tile from a tensor map and a coordinate, issued
by one elected lane instead of 128 threads; it zero-fills out-of-range elements, writes the
swizzled layout the tensor core reads, and counts the delivered bytes on an mbarrier. The
epilogue goes the other way: it reads TMEM in blocks of 64 columns (128 bytes of the 16-bit
output), stages each block in a 128-byte-swizzled shared tile (``pipeline.tma_store.StagedTmaStore``
with one staging buffer; the swizzle keeps the row-per-thread stores free of bank conflicts) and
writes it with one TMA store, which clips the ragged matrix edge.

Synchronization (both phases flip once per K block):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``loaded`` | 1 + bytes | warp 0's ``arrive.expect_tx`` (both tiles); the 2 TMA loads | warp 0, before the MMA | CTA |
| ``mma_done`` | 1 | ``tcgen05.commit`` after a K block's MMA | warp 0, before the next load | CTA |
| ``__syncthreads`` | 128 | all, once warp 0 saw the last MMA complete | all; then TMEM is read | CTA |
| ``__syncthreads`` | 128 | all, after warp 0 saw the last store read the staging tile | all; then staging | CTA |
| ``__syncthreads`` | 128 | all, after staging a block + ``fence.proxy.async`` | all; then its TMA store | CTA |
| ``__syncthreads`` | 128 | all, after warp 0 saw every store complete | all; then TMEM is freed | CTA |

Only warp 0 waits on the two mbarriers: it issues the loads and the MMAs. The other warps wait
for the accumulator at a ``__syncthreads`` after the loop: were they to wait on ``mma_done`` too,
warp 0 could complete its next phase before a slower warp saw the previous one, and a parity wait
would then miss it. Before the staging tile is rewritten, warp 0 (which issued the stores) waits
until the previous store has read it (``cp.async.bulk.wait_group.read 0``).

TMEM, as in V0: the allocating warp relinquishes the allocation permit; ``before_thread_sync`` /
``after_thread_sync`` around the ``__syncthreads`` after which the accumulator is read and around
the one after which TMEM is freed.
"""

import tilus
from tilus import GlobalTensor, float32, int32, uint32
from tilus.utils import cdiv

from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync
from pipeline.tma_store import StagedTmaStore

from ..entry import MatmulKernel

IDEA = "TMA loads, completion counted in bytes on an mbarrier; TMA store epilogue"
PTX_MARKERS = (
    "tcgen05.mma.cta_group::1",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "cp.async.bulk.tensor.2d.global.shared::cta",
    "mbarrier.arrive.expect_tx",
)
REPRESENTATIVE = dict(block_m=128, block_n=128, block_k=64)

EPILOGUE_COLUMNS = 64  # 128 bytes of a 16-bit dtype: one 128-byte-swizzled staging tile


@tilus.autotune("block_m, block_n", [(128, 64), (128, 128), (128, 256)])
@tilus.autotune("block_k", [32, 64])
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
        self.attrs.warps = 4
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.block_n, self.block_k])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=1)

        barriers = self.mbarrier.alloc(counts=[1, 1])
        loaded = barriers[0]
        mma_done = barriers[1]
        phase: uint32 = 0
        self.sync()

        with self.single_warp():  # one warp loads and multiplies; the others wait for the result
            for offset_k in range(0, k_size, self.block_k):
                self.load_k_block(g_a, g_b, s_a, s_b, loaded, offset_m, offset_n, offset_k)
                self.mbarrier.wait(loaded, phase=phase)
                self.tcgen05.mma(s_a, s_b.transpose(), t_acc, enable_input_d=offset_k != 0)
                self.tcgen05.commit(mbarrier=mma_done)
                self.mbarrier.wait(mma_done, phase=phase)  # before the next load overwrites the tiles
                phase ^= 1
        fence_before_thread_sync()  # warp 0's MMAs, complete, before the barrier...
        self.sync()
        fence_after_thread_sync()  # ...after which every warp reads the accumulator

        # epilogue: TMEM -> registers -> shared -> TMA store
        s_c = self.shared_tensor(dtype=self.dtype, shape=[1, self.block_m, EPILOGUE_COLUMNS])
        out = StagedTmaStore(s_c)
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
