"""Hopper V1: V0 with the Tensor Memory Accelerator (TMA) moving the tiles both ways.

Idea: instead of 128 threads each copying pieces of the tiles through registers, one elected
thread hands the TMA unit a tensor map and a tile coordinate (``cp.async.bulk.tensor``); the unit
fetches the whole tile, zero-fills whatever lies outside the matrix, writes it in the swizzled
layout wgmma reads best, and counts the bytes it delivered on an mbarrier. The epilogue goes the
other way: registers -> shared memory -> one TMA store, which clips the ragged edges itself.

Synchronization (CTA scope):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``loaded`` | 1 + bytes | per K block, an elected lane's ``arrive.expect_tx``; the 2 loads | all 128 threads | CTA |

The phase waited for flips every K block.

``wgmma.wait_group 0`` + ``__syncthreads`` protect the tiles from the next load. In the epilogue,
``fence.proxy.async`` + ``__syncthreads`` order the shared-memory stores before the TMA store
reads them; ``cp.async.bulk.wait_group 0`` keeps the CTA alive until it has.
"""

import tilus
from tilus import GlobalTensor, float32, int32, uint32
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

from ..entry import MatmulKernel

IDEA = "TMA loads into swizzled shared memory; TMA store epilogue"
PTX_MARKERS = (
    "wgmma.mma_async",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "cp.async.bulk.tensor.2d.global.shared::cta",
    "mbarrier.try_wait",
)
REPRESENTATIVE = dict(block_m=128, block_n=128, block_k=64)


# one warpgroup holds the accumulator in registers: 128 x 256 (256 floats a thread) would spill
@tilus.autotune("block_m, block_n", [(64, 128), (128, 128), (64, 256)])
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
        acc = self.register_tensor(dtype=float32, shape=[self.block_m, self.block_n], init=0.0)

        loaded = self.mbarrier.alloc(counts=[1])
        phase: uint32 = 0
        self.sync()  # the barrier is initialized before anyone uses it

        for offset_k in range(0, k_size, self.block_k):
            with self.single_warp():  # a TMA copy is issued by a warp, which elects one lane
                self.load_k_block(g_a, g_b, s_a, s_b, loaded[0], offset_m, offset_n, offset_k)
            self.mbarrier.wait(loaded[0], phase=phase)
            phase ^= 1

            self.wgmma.fence()
            self.wgmma.mma(s_a, s_b.transpose(), acc)
            self.wgmma.commit_group()
            self.wgmma.wait_group(0)
            self.sync()

        # epilogue: registers -> shared -> TMA store (clipped at the matrix edge by the TMA unit)
        s_c = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_n])
        # plain row-major: a swizzled tile may be at most 128 bytes wide for one TMA box
        self.annotate_layout(s_c, shared_row_major(self.block_m, self.block_n))
        self.store_tile(s_c, acc.to(self.dtype), g_c, offset_m, offset_n)
