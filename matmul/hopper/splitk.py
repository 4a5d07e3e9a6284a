"""Hopper split-K: V3's warp-specialized CTA for shapes whose output has too few tiles to fill the GPU.

Not a step of the series but a kernel ``matmul()`` may choose (``versions.EXTRAS``). A decoding
or small-batch layer, 128 x 4096 x 4096 say, has 2 x 16 output tiles of 64 x 256: V2-V6 keep 32
of 132 SMs busy and the rest idle, and the layer is bound by reading B (32 MB) anyway. Split-K
gives each output tile ``splits`` CTAs, each multiplying one contiguous range of K blocks, so
that tiles x splits CTAs stream B at once; the partial products are then summed.

The sum happens in the kernel, in a fixed order: split ``s`` of a tile waits until splits
``0 .. s-1`` have added theirs to a float32 workspace tile, adds its own, and hands on; the last
split adds the workspace to its accumulator and stores the tile in the output dtype, once,
with V1's TMA store. No second kernel, no atomics (tilus 0.2.0 has none on global memory), no
rounding of partial sums to 16 bits, and the result does not depend on which CTA finished first.

Synchronization
---------------
Main loop: V3's (a producer warp and a consumer warpgroup on ``full``/``empty`` mbarriers), over
the split's K blocks only. Hand-over between the CTAs of one tile: an int32 semaphore per tile in
tilus's *clean* workspace (zero before the kernel, and the kernel must leave it zero):

* split ``s`` acquires the tile when the semaphore reads ``s`` (``lock_semaphore``: one thread
  spins with ``ld.acquire.gpu``, then the warpgroup's named barrier lets the others go on);
* it reads the workspace tile (if ``s > 0``), and writes it back with its own sum added, or, if
  it is the last split, writes the output;
* a named barrier makes every thread's stores precede the release, then one thread stores
  ``s + 1`` with ``st.release.gpu`` (``release_semaphore``); the last split stores 0, which
  leaves the workspace clean for the next launch.

Progress: a CTA waits only for a CTA of a lower split index of its own tile, i.e. a lower linear
block index (the grid is ``[m tiles, n tiles, splits]``, split slowest). The GPU dispatches blocks
in linear order, so the CTA waited for is resident or finished: the spin cannot deadlock.
The number of splits launched never leaves a split without K blocks (``matmul`` below).
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, float32, int32
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

from ..kernel import MatmulKernel
from . import v3

IDEA = "split-K for skinny shapes: each output tile's K range split over CTAs, summed in order in fp32"
PTX_MARKERS = ("wgmma.mma_async", "cp.async.bulk.tensor.2d.shared::cta.global", "ld.acquire.gpu",
               "st.release.gpu")
REPRESENTATIVE = dict(block_n=256, stages=4, splits=4)
BLOCK_M, BLOCK_K = 64, 64  # one row of m64nN wgmma per consumer warpgroup, as in V3


def applies(m: int, n: int, k: int, sm_count: int) -> bool:
    """Whether split-K is worth trying: the output has fewer 64 x 256 tiles than the GPU has SMs, and
    there are at least two K blocks to split. (It also bounds the float32 workspace by
    ``sm_count`` x 64 KB.)"""
    return cdiv(m, BLOCK_M) * cdiv(n, 256) < sm_count and cdiv(k, BLOCK_K) >= 2


# Narrow tiles give more CTAs for the same split, and fit two CTAs on an SM (smem: stages *
# (64 + block_n) * 64 * 2 bytes + the 64 x block_n output tile: 112 KiB for 128, 192 KiB for 256).
@tilus.autotune("block_n, stages", [(128, 4), (256, 4)])
@tilus.autotune("splits", [2, 4, 8, 16])
class Kernel(MatmulKernel):
    def __init__(self, dtype, block_n: int, stages: int, splits: int):
        super().__init__(dtype)
        self.block_n = block_n
        self.stages = stages
        self.splits = splits

    def matmul(self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32,
               k_size: int32):
        m_tiles: int32 = cdiv(m_size, BLOCK_M)
        n_tiles: int32 = cdiv(n_size, self.block_n)
        num_k_blocks: int32 = cdiv(k_size, BLOCK_K)
        per_split: int32 = cdiv(num_k_blocks, self.splits)
        # cdiv(blocks, per_split) <= splits, and every split launched has at least one K block
        self.attrs.blocks = [m_tiles, n_tiles, cdiv(num_k_blocks, per_split)]
        self.attrs.warps = 5  # warps 0-3: consumer warpgroup; warp 4: producer
        offset_m: int32 = self.blockIdx.x * BLOCK_M
        offset_n: int32 = self.blockIdx.y * self.block_n
        split: int32 = self.blockIdx.z
        first_k_block: int32 = split * per_split
        split_k_blocks: int32 = per_split
        if first_k_block + per_split > num_k_blocks:
            split_k_blocks = num_k_blocks - first_k_block

        semaphores = self.global_tensor(dtype=int32, shape=[m_tiles * n_tiles], requires_clean=True)
        partials = self.global_tensor(dtype=float32, shape=[m_tiles * BLOCK_M, n_tiles * self.block_n],
                                      requires_clean=False)
        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, BLOCK_M, BLOCK_K])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, BLOCK_K])
        s_c = self.shared_tensor(dtype=self.dtype, shape=[BLOCK_M, self.block_n])
        self.annotate_layout(s_c, shared_row_major(BLOCK_M, self.block_n))

        full = self.mbarrier.alloc(counts=[1 for _ in range(self.stages)])
        empty = self.mbarrier.alloc(counts=[1 for _ in range(self.stages)])
        self.sync()  # the barriers are initialized before anyone uses them

        with self.single_warp(4):  # producer: V3's, over this split's K blocks
            for i in range(split_k_blocks):
                slot = i % self.stages
                self.mbarrier.wait(empty[slot], phase=((i // self.stages) & 1) ^ 1)
                self.load_k_block(g_a, g_b, s_a[slot], s_b[slot], full[slot], offset_m, offset_n,
                                  (first_k_block + i) * BLOCK_K)

        with self.warp_group(warp_begin=0, num_warps=4):  # consumer: V3's main loop, then the hand-over
            acc = self.register_tensor(dtype=float32, shape=[BLOCK_M, self.block_n], init=0.0)
            self.wait_and_multiply(full, s_a, s_b, acc, 0)
            for i in self.range(1, split_k_blocks, 1, unroll=1):
                self.wait_and_multiply(full, s_a, s_b, acc, i)
                self.wgmma.wait_group(1)
                with self.single_thread():
                    self.mbarrier.arrive(empty[(i - 1) % self.stages])
            self.wgmma.wait_group(0)

            semaphore = semaphores[self.blockIdx.y * m_tiles + self.blockIdx.x].item_ptr()
            last: int32 = self.gridDim.z - 1
            self.lock_semaphore(semaphore, split)  # splits 0 .. split-1 are in the workspace
            if split > 0:
                self.add(acc, self.load_global(partials, offsets=[offset_m, offset_n], shape=[BLOCK_M, self.block_n]),
                         out=acc)
            if split == last:
                self.store_tile(s_c, acc.to(self.dtype), g_c, offset_m, offset_n)
                self.release_semaphore(semaphore, 0)  # clean for the next launch
            else:
                self.store_global(partials, acc, offsets=[offset_m, offset_n])
                self.sync()  # every thread's partial sums are stored before the release
                self.release_semaphore(semaphore, split + 1)

    wait_and_multiply = v3.Kernel.wait_and_multiply  # V3's: wait for a stage, one committed wgmma group
