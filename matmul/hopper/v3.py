"""Hopper V3: V2 with warp specialization: a producer warp issues the TMA loads, a consumer
warpgroup issues the wgmma.

Idea: in V2 the four warps that multiply also refill the ring, so every K block they stop, meet at
a ``bar.sync`` and wait for one of them to issue the next loads. V3 gives the two jobs to
different warps that never wait for each other except through the ring: warp 4 (the producer)
only issues TMA loads, as far ahead as free slots allow; warps 0-3 (the consumer warpgroup) only
wait for data, issue wgmma and hand slots back. A slot now needs a second barrier to say it is
free, because the warp that refills it is no longer the warp that read it.

Synchronization (all at CTA scope; slot ``s`` serves K blocks ``s, s + stages, ...``, and each
side's wait names the parity of the use it waits for):
``full[s]`` (arrival count 1): per use of slot ``s``, one ``arrive.expect_tx`` by the producer's
elected lane announcing both tiles' bytes, plus the TMA bytes landing. The consumer waits on it
with parity ``(k // stages) & 1`` before the wgmma of K block ``k``.
``empty[s]`` (arrival count 1): per use, one arrival by one elected thread of the consumer
warpgroup, made after ``wgmma.wait_group 1`` has shown that the group that read the slot is
complete (a wgmma group is issued and waited by the whole warpgroup together, ``.sync.aligned``).
The producer waits on it with parity ``((k // stages) & 1) ^ 1`` before refilling the slot for
K block ``k``: in the first round that parity names the phase before the barrier's first, which
counts as complete, so the ring starts out free.
The consumer keeps one wgmma group in flight, so slot ``k-1`` is released during iteration ``k``;
the last slot is never released (nothing waits for it). Epilogue: V2's (the tile staged in the
idle ring's A slots), among the consumer warpgroup only: its named barrier of 128 threads in place
of ``__syncthreads``. The producer has no part in it: every load it issued has been waited for.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, float32, int32
from tilus.utils import cdiv

from pipeline.epilogue import wgmma_fragment

from ..kernel import MatmulKernel

IDEA = "warp specialization: a TMA producer warp and a wgmma consumer warpgroup, full/empty mbarriers"
# the consumer's release of a slot (a plain arrive) and the named barrier of a 128-thread warpgroup
PTX_MARKERS = ("wgmma.mma_async", "cp.async.bulk.tensor.2d.shared::cta.global", "mbarrier.arrive.expect_tx",
               "mbarrier.arrive.release.cta.shared::cta.b64", "bar.cta.sync 1, 128")
REPRESENTATIVE = dict(block_m=128, block_n=128, block_k=64, stages=3)


# V2's space. A 128-row accumulator is two rows of wgmma instructions: in this warp-specialized
# branch ptxas would serialize every wgmma without pipeline.tilus_fixes' fence_tall_accumulators
# (C7520). The producer warp's registers (as many as a consumer thread's: 154) keep a 128 x 128,
# two-stage CTA to two an SM, where V2 fits three.
@tilus.autotune("block_m, block_n, block_k, stages", [(128, 128, 64, 2), (128, 128, 64, 3), (64, 256, 64, 5)])
class Kernel(MatmulKernel):
    def __init__(self, dtype, block_m: int, block_n: int, block_k: int, stages: int):
        super().__init__(dtype)
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages

    def matmul(self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32,
               k_size: int32):
        self.attrs.blocks = [cdiv(m_size, self.block_m), cdiv(n_size, self.block_n)]
        self.attrs.warps = 5  # warps 0-3: consumer warpgroup; warp 4: producer
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])

        full = self.mbarrier.alloc(counts=[1 for _ in range(self.stages)])
        empty = self.mbarrier.alloc(counts=[1 for _ in range(self.stages)])
        self.sync()  # the barriers are initialized before anyone uses them

        with self.single_warp(4):  # producer
            for kb in range(num_k_blocks):
                slot = kb % self.stages
                self.mbarrier.wait(empty[slot], phase=((kb // self.stages) & 1) ^ 1)
                self.load_k_block(g_a, g_b, s_a[slot], s_b[slot], full[slot], offset_m, offset_n, kb * self.block_k)

        with self.warp_group(warp_begin=0, num_warps=4):  # consumer
            acc = self.register_tensor(dtype=float32, shape=[self.block_m, self.block_n], init=0.0)
            self.annotate_layout(acc, wgmma_fragment(self.block_m, self.block_n))
            self.wait_and_multiply(full, s_a, s_b, acc, 0)  # K block 0 (every matrix has one)
            for kb in self.range(1, num_k_blocks, 1, unroll=1):  # unrolled, nvcc moves accumulators between wgmma
                self.wait_and_multiply(full, s_a, s_b, acc, kb)
                self.wgmma.wait_group(1)  # the group of block kb-1 is complete: its slot is free
                with self.single_thread():
                    self.mbarrier.arrive(empty[(kb - 1) % self.stages])
            self.wgmma.wait_group(0)

            # epilogue (V2's, among the consumer warpgroup): staged in the idle ring's A slots
            self.store_tile_in_slots(s_a, acc, g_c, offset_m, offset_n, slab=0)

    def wait_and_multiply(self, full: RegisterTensor, s_a: SharedTensor, s_b: SharedTensor, acc: RegisterTensor,
                          kb: int32):
        """Wait for K block ``kb``'s tiles, issue its wgmma and commit them as one group."""
        slot = kb % self.stages
        self.mbarrier.wait(full[slot], phase=(kb // self.stages) & 1)
        self.wgmma.fence()
        self.wgmma.mma(s_a[slot], s_b[slot].transpose(), acc)
        self.wgmma.commit_group()
