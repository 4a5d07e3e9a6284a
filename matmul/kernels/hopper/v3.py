"""Hopper V3: V2 with warp specialization: a producer warp issues the TMA loads, two consumer
warpgroups issue the wgmma.

Idea: in V2 the four warps that multiply also refill the ring, so every K block they stop, meet at
a ``bar.sync`` and wait for one of them to issue the next loads. V3 gives the two jobs to
different warps that never wait for each other except through the ring: warp 8 (the producer)
only issues TMA loads, as far ahead as free slots allow; the consumers only wait for data, issue
wgmma and hand slots back. A slot now needs a second barrier to say it is free, because the warp
that refills it is no longer a warp that read it.
Once one warp feeds the ring, it can feed more than one consumer: the CTA gets two consumer
warpgroups (warps 0-3 and 4-7), each owning half of the tile's rows (its own slab of A) and both
reading the same B tile. The tile grows to 128 x 256 (one warpgroup could not hold its float32
accumulator: 256 registers a thread), which reads fewer operand bytes per multiply-add than V2's
128 x 128 (384 rows of A and B for 32768 outputs instead of 256 for 16384). With a single consumer
warpgroup the split would not pay: the producer warp holds as many registers as a consumer
thread, so a 128 x 128 CTA would fit two an SM where V2 fits three.

Synchronization (slot ``s`` serves K blocks ``s, s + stages, ...``; each side's wait names the
parity of the use it waits for):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | producer's elected lane: ``arrive.expect_tx``; the loads | consumers, parity ``p`` | CTA |
| ``empty[s]`` | 2 | a thread of each consumer, after ``wgmma.wait_group 1`` | producer, parity ``p ^ 1`` | CTA |
| named barriers 1, 2 | 128 | consumer warpgroup 0 (id 1) or 1 (id 2), in the epilogue | the same threads | CTA |

K block ``k`` uses slot ``s = k % stages`` with parity ``p = (k // stages) & 1``; a consumer releases
a slot once ``wgmma.wait_group 1`` shows its group that read the slot complete, and the producer
waits before refilling it.

In the first round the producer's parity names the phase before the barrier's first, which counts
as complete, so the ring starts out free. A wgmma group is issued and waited by the whole
warpgroup together (``.sync.aligned``), so one elected thread may release for all 128. Each
consumer keeps one wgmma group in flight, so slot ``k-1`` is released during iteration ``k``; the
last slot is never released (nothing waits for it). Epilogue: V2's, per warpgroup: each stages
its half of the tile in its own slab of the ring's A slots (which the other warpgroup, perhaps
still multiplying, never reads; every load has landed) and issues its own TMA stores after
``fence.proxy.async`` + its named barrier in place of ``__syncthreads``. The producer has no part
in it: every load it issued has been waited for.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, float32, int32
from tilus.utils import cdiv

from pipeline.epilogue import SlotTileStore, wgmma_fragment

from ..entry import MatmulKernel

IDEA = "warp specialization: a TMA producer warp feeding two wgmma consumer warpgroups, full/empty mbarriers"
# the consumers' release of a slot (a plain arrive) and the named barriers of the two warpgroups
PTX_MARKERS = (
    "wgmma.mma_async",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "mbarrier.arrive.expect_tx",
    "mbarrier.arrive.release.cta.shared::cta.b64",
    "bar.cta.sync 1, 128",
    "bar.cta.sync 2, 128",
)
REPRESENTATIVE = dict(block_m=128, block_n=256, block_k=64, stages=4)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)


# block_m is two warpgroups' rows; each accumulator is one row of m64n256 wgmma. Shared memory:
# stages * (block_m + block_n) * block_k * 2 bytes, the output staged in the ring (stages * block_k
# >= block_n): 192 KiB, one CTA an SM. Smaller tiles and deeper rings of 32 K columns are slower
# (plots/h100/candidates/ of commit b43a7e1, here and for V4-V6).
@tilus.autotune("block_m, block_n, block_k, stages", [(128, 256, 64, 4)])
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
        half_m = self.block_m // 2  # the rows of one consumer warpgroup
        self.attrs.blocks = [cdiv(m_size, self.block_m), cdiv(n_size, self.block_n)]
        self.attrs.warps = 9  # warps 0-3 and 4-7: consumer warpgroups; warp 8: producer
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)

        full = self.mbarrier.alloc(counts=[1 for _ in range(self.stages)])
        empty = self.mbarrier.alloc(counts=[2 for _ in range(self.stages)])  # one arrival per consumer
        self.sync()  # the barriers are initialized before anyone uses them

        with self.single_warp(8):  # producer
            for kb in range(num_k_blocks):
                slot = kb % self.stages
                self.mbarrier.wait(empty[slot], phase=((kb // self.stages) & 1) ^ 1)
                # both warpgroups' slabs of A and the B tile, on the slot's full barrier
                self.load_k_block(g_a, g_b, s_a[slot], s_b[slot], full[slot], offset_m, offset_n, kb * self.block_k)

        self.consumer(0, full, empty, s_a, s_b, g_c, num_k_blocks, offset_m, offset_n)
        self.consumer(1, full, empty, s_a, s_b, g_c, num_k_blocks, offset_m, offset_n)

    def consumer(
        self,
        wg: int,
        full: RegisterTensor,
        empty: RegisterTensor,
        s_a: SharedTensor,
        s_b: SharedTensor,
        g_c: GlobalTensor,
        num_k_blocks: int32,
        offset_m: int32,
        offset_n: int32,
    ):
        """Consumer warpgroup ``wg``: rows ``wg * block_m / 2 ...`` of the tile."""
        half_m = self.block_m // 2
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            acc = self.register_tensor(dtype=float32, shape=[half_m, self.block_n], init=0.0)
            self.annotate_layout(acc, wgmma_fragment(half_m, self.block_n))
            self.wait_and_multiply(full, s_a, s_b, wg, acc, 0)  # K block 0 (every matrix has one)
            for kb in self.range(1, num_k_blocks, 1, unroll=1):  # unrolled, nvcc moves accumulators between wgmma
                self.wait_and_multiply(full, s_a, s_b, wg, acc, kb)
                self.wgmma.wait_group(1)  # the group of block kb-1 is complete: its slot is free
                with self.single_thread():
                    self.mbarrier.arrive(empty[(kb - 1) % self.stages])
            self.wgmma.wait_group(0)

            # epilogue (V2's, per warpgroup): this half of the tile, staged in its own slab of the
            # ring's A slots (the other warpgroup may still be reading its slab and B)
            SlotTileStore(s_a).store(acc, g_c, offset_m + wg * half_m, offset_n, slab=wg, epilogue=self.epilogue)

    def wait_and_multiply(
        self, full: RegisterTensor, s_a: SharedTensor, s_b: SharedTensor, wg: int, acc: RegisterTensor, kb: int32
    ):
        """Wait for K block ``kb``'s tiles, issue this warpgroup's wgmma and commit them as one group."""
        slot = kb % self.stages
        self.mbarrier.wait(full[slot], phase=(kb // self.stages) & 1)
        self.wgmma.fence()
        self.wgmma.mma(s_a[slot, wg], s_b[slot].transpose(), acc)
        self.wgmma.commit_group()
