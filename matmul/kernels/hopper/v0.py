"""Hopper V0: the smallest kernel that uses the Hopper tensor core.

Idea: one warpgroup (4 warps, 128 threads) owns a ``block_m x block_n`` tile of C and keeps its
float32 accumulator in registers. For each K block its threads load a tile of A and a tile of B
into registers (masked loads: rows and columns past the matrix edge read as zero, so any M, N, K
works) and store them to shared memory; then the warpgroup issues ``wgmma.mma_async``, which reads
both operands straight from shared memory. Loads, MMA and the next loads never overlap: that is
what the next versions fix.

Synchronization (no mbarriers yet):

| hand-off | how | who |
| --- | --- | --- |
| tiles stored -> wgmma reads them | ``fence.proxy.async`` + ``__syncthreads`` | all 128 threads |
| wgmma done -> next tiles written | ``wgmma.wait_group 0`` + ``__syncthreads`` | all 128 threads |

The fence is needed because the tensor core reads shared memory through the async proxy; the wait,
so that no wgmma still reads a tile being replaced.
"""

import tilus
from tilus import GlobalTensor, float32, int32
from tilus.utils import cdiv

from ..entry import MatmulKernel

IDEA = "wgmma reads shared-memory tiles that the threads load through registers"
PTX_MARKERS = ("wgmma.mma_async", "st.shared")
REPRESENTATIVE = dict(block_m=128, block_n=128, block_k=32)
# tiles load through registers at int32 element offsets: no operand may reach past 2^31 - 1 elements
MAX_ELEMENTS = 2**31 - 1


# one warpgroup holds the whole accumulator in registers (block_m * block_n / 128 floats a thread),
# and the tiles pass through registers too: bigger tiles than these spill
@tilus.autotune("block_m, block_n, block_k", [(64, 128, 32), (64, 128, 64), (128, 128, 32), (64, 256, 32)])
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
        self.attrs.warps = 4  # one warpgroup: the unit that issues wgmma
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.block_n, self.block_k])
        acc = self.register_tensor(dtype=float32, shape=[self.block_m, self.block_n], init=0.0)

        for offset_k in range(0, k_size, self.block_k):
            # out-of-range rows and columns are filled with zeros, so ragged edges need no masks
            self.store_shared(s_a, self.load_global(g_a, offsets=[offset_m, offset_k], shape=s_a.shape))
            self.store_shared(s_b, self.load_global(g_b, offsets=[offset_n, offset_k], shape=s_b.shape))
            self.fence.proxy_async(space="shared")  # generic-proxy writes -> async-proxy reads
            self.sync()

            self.wgmma.fence()
            self.wgmma.mma(s_a, s_b.transpose(), acc)
            self.wgmma.commit_group()
            self.wgmma.wait_group(0)
            self.sync()

        self.store_global(g_c, acc.to(self.dtype), offsets=[offset_m, offset_n])
