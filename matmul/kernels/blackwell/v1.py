"""Blackwell V1: V0 with TMA loads and a TMA epilogue.

Idea: the Tensor Memory Accelerator fetches each tile from a tensor map and a coordinate, issued
by one elected lane instead of 128 threads; it zero-fills out-of-range elements, writes the
swizzled layout the tensor core reads, and counts the delivered bytes on an mbarrier. The
epilogue reads TMEM into registers, stages the tile in shared memory and writes it back with one
TMA store, which clips the ragged matrix edge.

Synchronization (both phases flip once per K block):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``loaded`` | 1 + bytes | warp 0's ``arrive.expect_tx`` of both tiles' bytes; the 2 TMA loads | warp 0, before the MMA | CTA |
| ``mma_done`` | 1 | ``tcgen05.commit`` after a K block's MMA | all 128 threads, before the next load | CTA |
| ``__syncthreads`` | 128 | all, after staging the tile + ``fence.proxy.async`` | all; then the TMA store | CTA |
| ``__syncthreads`` | 128 | all, after the TMA store has read the staged tile | all; then TMEM is freed | CTA |

Only warp 0 waits on ``loaded``: it issues the MMA; the other warps need only ``mma_done``, which
completes after that MMA, so no load overwrites a tile the MMA still reads.
"""

import tilus
from tilus import GlobalTensor, float32, int32, uint32
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

from ..entry import MatmulKernel

IDEA = "TMA loads, completion counted in bytes on an mbarrier; TMA store epilogue"
PTX_MARKERS = ("tcgen05.mma.cta_group::1", "cp.async.bulk.tensor.2d.shared::cta.global",
               "cp.async.bulk.tensor.2d.global.shared::cta", "mbarrier.arrive.expect_tx")
REPRESENTATIVE = dict(block_m=128, block_n=128, block_k=64)


@tilus.autotune("block_m, block_n", [(128, 64), (128, 128), (128, 256)])
@tilus.autotune("block_k", [32, 64])
class Kernel(MatmulKernel):
    def __init__(self, dtype, block_m: int, block_n: int, block_k: int):
        super().__init__(dtype)
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k

    def matmul(self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32,
               k_size: int32):
        self.attrs.blocks = [cdiv(m_size, self.block_m), cdiv(n_size, self.block_n)]
        self.attrs.warps = 4
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.block_n, self.block_k])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])

        barriers = self.mbarrier.alloc(counts=[1, 1])
        loaded = barriers[0]
        mma_done = barriers[1]
        phase: uint32 = 0
        self.sync()

        for offset_k in range(0, k_size, self.block_k):
            with self.single_warp():
                self.load_k_block(g_a, g_b, s_a, s_b, loaded, offset_m, offset_n, offset_k)
                self.mbarrier.wait(loaded, phase=phase)
                self.tcgen05.mma(s_a, s_b.transpose(), t_acc, enable_input_d=offset_k != 0)
                self.tcgen05.commit(mbarrier=mma_done)
            self.mbarrier.wait(mma_done, phase=phase)
            phase ^= 1

        # epilogue: TMEM -> registers -> shared -> TMA store
        s_c = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_n])
        # plain row-major: a swizzled tile may be at most 128 bytes wide for one TMA box
        self.annotate_layout(s_c, shared_row_major(self.block_m, self.block_n))
        r_acc = self.tcgen05.load(t_acc)
        self.tcgen05.wait_load()
        self.store_tile(s_c, r_acc.to(self.dtype), g_c, offset_m, offset_n)

        self.sync()
        self.tcgen05.dealloc(t_acc)
