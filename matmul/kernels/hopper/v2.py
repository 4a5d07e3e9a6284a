"""Hopper V2: V1 with a ring of shared-memory stages, so that TMA loads run ahead of the wgmma.

Idea: in V1 the tensor core waits for each tile pair to land and the TMA unit waits for each MMA
to finish; the two take turns. V2 gives shared memory ``stages`` slots for (A, B) tile pairs.
Before the main loop one warp issues the loads of the first ``stages`` K blocks. In the main
loop the warpgroup waits only for the slot of the K block it is about to multiply, issues that
block's ``wgmma`` and commits it as a group, then waits with ``wgmma.wait_group 1``: the *previous*
group is done, the current one may still run. The slot the previous group read is then free and
is refilled at once with the K block ``stages`` further on. So while the tensor core works on
block ``k`` (block ``k-1`` possibly still draining), the loads of blocks ``k+1 .. k+stages-1`` are
in flight. The same four warps still issue both the loads and the MMAs (V3 splits the roles).
Shared memory now goes to stages, so the output tile gets none of its own: once the main loop is
done the ring is idle, and the epilogue stages the tile in the A slots (``block_k`` columns a
slot, swizzled exactly as the TMA loads wrote them; ``pipeline.epilogue.SlotTileStore``) and
stores it slot by slot. A 128 x 128 tile with two stages then takes 64 KiB, and three CTAs share
an SM, as many as V1's.

Synchronization (slot ``s`` serves K blocks ``s, s + stages, ...``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | warp 0's elected lane: ``arrive.expect_tx``; the 2 loads | 128 threads, parity ``p`` | CTA |

K block ``k`` uses slot ``s = k % stages`` with parity ``p = (k // stages) & 1``.

Slot reuse needs no barrier of its own: after ``wgmma.wait_group 1`` each warp knows the group of
block ``k-1`` is complete, and ``__syncthreads`` makes that true for all four warps before warp 0
issues the TMA load that overwrites the slot. Epilogue: ``wgmma.wait_group 0`` (every group that
read a slot is done; every load was waited for), then the slots are written, ``fence.proxy.async``
+ ``__syncthreads``, one TMA store per slot.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, float32, int32
from tilus.utils import cdiv

from pipeline.epilogue import SlotTileStore, wgmma_fragment

from ..entry import MatmulKernel

IDEA = "software pipelining: a ring of TMA stages on mbarriers, one wgmma group kept in flight"
PTX_MARKERS = (
    "wgmma.mma_async",
    "wgmma.wait_group.sync.aligned 1",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "mbarrier.try_wait.parity",
)
REPRESENTATIVE = dict(block_m=128, block_n=128, block_k=64, stages=2)


# One warpgroup holds the whole accumulator (block_m * block_n / 128 floats a thread; 128 x 256
# would spill). Shared memory: stages * (block_m + block_n) * block_k * 2 bytes, nothing else
# (stages * block_k >= block_n, for the epilogue): two stages fit three CTAs an SM, three stages
# two. K blocks of 32 would double the barrier round trips per multiply-add. The space keeps only
# configurations that are the fastest somewhere (plots/h100/candidates/ of commit b43a7e1).
@tilus.autotune("block_m, block_n, block_k, stages", [(128, 128, 64, 2), (128, 128, 64, 3)])
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
        offset_m: int32 = self.blockIdx.x * self.block_m
        offset_n: int32 = self.blockIdx.y * self.block_n
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        acc = self.register_tensor(dtype=float32, shape=[self.block_m, self.block_n], init=0.0)
        self.annotate_layout(acc, wgmma_fragment(self.block_m, self.block_n))

        full = self.mbarrier.alloc(counts=[1 for _ in range(self.stages)])
        self.sync()  # the barriers are initialized before anyone uses them

        # prologue: the first `stages` K blocks (fewer if K is short) go in flight at once
        with self.single_warp():
            for kb in range(min(self.stages, num_k_blocks)):
                self.load_k_block(g_a, g_b, s_a[kb], s_b[kb], full[kb], offset_m, offset_n, kb * self.block_k)

        self.wait_and_multiply(full, s_a, s_b, acc, 0)  # K block 0 (every matrix has one)
        for kb in self.range(1, num_k_blocks, 1, unroll=1):  # unrolled, nvcc moves accumulators between wgmma
            self.wait_and_multiply(full, s_a, s_b, acc, kb)
            self.wgmma.wait_group(1)  # block kb-1 is done; block kb may still be running
            self.sync()  # ... for all four warps, before its slot is overwritten
            refill = kb - 1 + self.stages  # the K block that goes into the slot block kb-1 used
            if refill < num_k_blocks:
                prev = (kb - 1) % self.stages
                with self.single_warp():
                    self.load_k_block(
                        g_a, g_b, s_a[prev], s_b[prev], full[prev], offset_m, offset_n, refill * self.block_k
                    )
        self.wgmma.wait_group(0)

        # epilogue: V1's, staged in the ring's A slots (idle now: every load has landed, every
        # wgmma is complete), block_k columns per slot
        SlotTileStore(s_a).store(acc, g_c, offset_m, offset_n, slab=0, epilogue=self.epilogue)

    def wait_and_multiply(
        self, full: RegisterTensor, s_a: SharedTensor, s_b: SharedTensor, acc: RegisterTensor, kb: int32
    ):
        """Wait for K block ``kb``'s tiles, issue its wgmma and commit them as one group."""
        slot = kb % self.stages
        self.mbarrier.wait(full[slot], phase=(kb // self.stages) & 1)
        self.wgmma.fence()
        self.wgmma.mma(s_a[slot], s_b[slot].transpose(), acc)
        self.wgmma.commit_group()
