"""Hopper split-K: V4's CTA (a producer warp, two consumer warpgroups, the shared ``Pipeline``) for
shapes whose output has too few tiles to fill the GPU.

Not a step of the series but a kernel ``matmul()`` may choose (``versions.EXTRAS``). A decoding
or small-batch layer, 128 x 4096 x 4096 say, has 32 output tiles of 128 x 128: V2-V6 keep at most
32 of 132 SMs busy, and such a layer is bound by reading B (32 MB) anyway. Split-K gives each output
tile ``splits`` CTAs, each multiplying one contiguous range of K blocks, so that tiles x splits
CTAs stream B at once; then the partial products are summed. The tile is 128 rows tall so that,
at M = 128, every byte of B is read from memory once.

The sum happens in the kernel and in a fixed order: every split but the last writes its float32
partial tile to a workspace and raises a flag; the last split (the CTA of the highest split index
of the tile), once its own main loop is done, waits for each flag, adds the partial tiles in split
order to its accumulator and stores the tile in the output dtype, through V5's staged TMA store.
No second kernel, no atomics (tilus 0.2.0 has none on global memory), no rounding of partial sums
to 16 bits, and the same bits whichever CTA finishes first.

Synchronization
---------------
Main loop: V4's, over the split's K blocks only (``full``/``empty`` stages of the ``Pipeline``;
each consumer warpgroup owns half of the tile's rows). Each consumer warpgroup then hands over its
own half, independently of the other, through one int32 flag per (tile, warpgroup, split) in
tilus's *clean* workspace (zero before the kernel, and the kernel must leave it zero):

* split ``s`` < last: stores its partial rows to workspace slice ``s``; the warpgroup's named
  barrier orders all 128 threads' stores before one thread sets the flag to 1 with
  ``st.release.gpu`` (``release_semaphore``);
* the last split: waits until the flag of every other split reads 1 (``lock_semaphore``: one lane
  spins with ``ld.acquire.gpu``; the four warps wait for different splits at once, then the
  named barrier releases the warpgroup), adds the slices in split order,
  and at the end sets every flag back to 0 with plain stores (the end of the kernel orders them
  before the next launch), leaving the workspace clean.

Progress: only the last split waits, and only for CTAs of a lower split index, i.e. lower linear
block indices (the grid is ``[m tiles, n tiles, splits]``, split slowest), which never wait. The
GPU dispatches blocks in linear order, so those are resident or finished: no deadlock. The number
of splits launched leaves no split without K blocks (``matmul`` below).
"""

import tilus
from tilus import GlobalTensor, SharedTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline
from pipeline.epilogue import SUB_COLS, wgmma_fragment, wgmma_fragment_blocks
from pipeline.mainloop import WgmmaMainloop
from pipeline.tma_store import StagedTmaStore

from ..kernel import MatmulKernel

IDEA = "split-K for skinny shapes: each output tile's K range split over CTAs, summed in order in fp32"
PTX_MARKERS = ("wgmma.mma_async", "cp.async.bulk.tensor.2d.shared::cta.global", "ld.acquire.gpu",
               "st.release.gpu")
REPRESENTATIVE = dict(block_n=128, stages=6, splits=4)
BLOCK_M, BLOCK_K = 128, 64  # two consumer warpgroups of 64 rows, as in V4


def applies(m: int, n: int, k: int, sm_count: int) -> bool:
    """Whether split-K is worth trying: the output has fewer 128 x 128 tiles than the GPU has SMs,
    and there are at least two K blocks to split. (It also bounds the float32 workspace by
    ``sm_count * (splits - 1)`` x 64 KiB.)"""
    return cdiv(m, BLOCK_M) * cdiv(n, 128) < sm_count and cdiv(k, BLOCK_K) >= 2


# shared memory: stages * (128 + 128) * 64 * 2 bytes + 2 warpgroups * 2 staging buffers of 64 x 64
# (32 KiB): 6 stages, 224 KiB. 128 x 256 tiles would halve the CTAs per split and spill (the last
# split holds an accumulator block and a partial block at once, in 288 threads' registers).
@tilus.autotune("block_n, stages", [(128, 6)])
@tilus.autotune("splits", [2, 4, 8])
class Kernel(MatmulKernel):
    def __init__(self, dtype, block_n: int, stages: int, splits: int):
        super().__init__(dtype)
        self.block_n = block_n
        self.stages = stages
        self.splits = splits

    def matmul(self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32,
               k_size: int32):
        half_m = BLOCK_M // 2
        m_tiles: int32 = cdiv(m_size, BLOCK_M)
        n_tiles: int32 = cdiv(n_size, self.block_n)
        num_k_blocks: int32 = cdiv(k_size, BLOCK_K)
        per_split: int32 = cdiv(num_k_blocks, self.splits)
        # cdiv(blocks, per_split) <= splits, and every split launched has at least one K block
        self.attrs.blocks = [m_tiles, n_tiles, cdiv(num_k_blocks, per_split)]
        self.attrs.warps = 9  # warps 0-3 and 4-7: consumer warpgroups; warp 8: producer
        offset_m: int32 = self.blockIdx.x * BLOCK_M
        offset_n: int32 = self.blockIdx.y * self.block_n
        first_k_block: int32 = self.blockIdx.z * per_split
        split_k_blocks: int32 = per_split
        if first_k_block + per_split > num_k_blocks:
            split_k_blocks = num_k_blocks - first_k_block

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_m, BLOCK_K])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, BLOCK_K])
        s_c = self.shared_tensor(dtype=self.dtype, shape=[2, 2, half_m, SUB_COLS])  # [warpgroup, buffer]
        ring = Pipeline(self.stages, consumer_arrivals=2, elect_release=True)
        self.sync()  # the barriers are initialized before anyone uses them

        with self.single_warp(8):  # producer: V4's, over this split's K blocks
            for i in range(split_k_blocks):
                ring.producer_acquire()
                slot = ring.producer_stage
                self.load_k_block_halves(g_a, g_b, s_a[slot], s_b[slot], ring.producer_barrier(), offset_m, offset_n,
                                         (first_k_block + i) * BLOCK_K)
                ring.producer_advance()

        # flags: [tile * 2 + warpgroup, split]; partials: slice s (rows s * m_tiles * 128 ...) for split s < last
        flags = self.global_tensor(dtype=int32, shape=[m_tiles * n_tiles * 2, self.splits], requires_clean=True)
        partials = self.global_tensor(dtype=float32, shape=[(self.splits - 1) * m_tiles * BLOCK_M,
                                                            n_tiles * self.block_n], requires_clean=False)
        self.consumer(0, ring, s_a, s_b, s_c, g_c, flags, partials, split_k_blocks, m_tiles, offset_m, offset_n)
        self.consumer(1, ring, s_a, s_b, s_c, g_c, flags, partials, split_k_blocks, m_tiles, offset_m, offset_n)

    def consumer(self, wg: int, ring: Pipeline, s_a: SharedTensor, s_b: SharedTensor, s_c: SharedTensor,
                 g_c: GlobalTensor, flags: GlobalTensor, partials: GlobalTensor, split_k_blocks: int32,
                 m_tiles: int32, offset_m: int32, offset_n: int32):
        """Consumer warpgroup ``wg``: its half of the tile's rows, then the hand-over (module doc)."""
        half_m = BLOCK_M // 2
        split: int32 = self.blockIdx.z
        last: int32 = self.gridDim.z - 1
        rows: int32 = m_tiles * BLOCK_M  # the rows of one workspace slice
        flag_row: int32 = (self.blockIdx.y * m_tiles + self.blockIdx.x) * 2 + wg
        row: int32 = offset_m + wg * half_m
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            acc = self.register_tensor(dtype=float32, shape=[half_m, self.block_n], init=0.0)
            self.annotate_layout(acc, wgmma_fragment(half_m, self.block_n))
            WgmmaMainloop(ring).run(s_a, s_b, wg, acc, split_k_blocks)

            if split < last:  # hand the partial rows over to the last split
                self.store_global(partials, acc, offsets=[split * rows + row, offset_n])
                self.sync()  # all 128 threads' stores precede the flag
                self.release_semaphore(flags[flag_row, split].item_ptr(), 1)
            else:  # the last split: add the others' partial rows in split order, store the tile
                # warp w of the warpgroup waits for splits w, w + 4, ...: the waits overlap
                self.wait_for_splits(flags, flag_row, last, 0)
                self.wait_for_splits(flags, flag_row, last, 1)
                self.wait_for_splits(flags, flag_row, last, 2)
                self.wait_for_splits(flags, flag_row, last, 3)
                self.sync()
                out = StagedTmaStore(s_c[wg])
                blocks = self.view(acc, layout=wgmma_fragment_blocks(half_m, self.block_n))
                for j in self.range(self.block_n // SUB_COLS, unroll="all"):
                    block = blocks[j]
                    # unrolled over every split the configuration may have, without branches (a slice
                    # past the last split is loaded but not added), so that the loads of all partial
                    # blocks are in flight together rather than one L2 round trip each
                    for s in self.range(self.splits - 1, unroll="all"):
                        partial = self.load_global(partials, offsets=[s * rows + row, offset_n + j * SUB_COLS],
                                                   shape=[half_m, SUB_COLS])
                        self.add(block, self.where(s < last, partial, 0.0), out=block)
                    out.put(block, g_c, row, offset_n + j * SUB_COLS)
                out.finish()
                # clean for the next launch: plain stores (no fence each), ordered by the kernel's end
                self.store_global(flags, self.register_tensor(dtype=int32, shape=[1, self.splits], init=0),
                                  offsets=[flag_row, 0])

    def wait_for_splits(self, flags: GlobalTensor, flag_row: int32, last: int32, warp: int):
        """Warp ``warp`` of the calling warpgroup waits for the flags of splits ``warp``, ``warp + 4``, ...
        below ``last`` (``lock_semaphore``: one lane spins with ``ld.acquire.gpu``)."""
        with self.thread_group(thread_begin=32 * warp, num_threads=32):
            for s in range(warp, last, 4):
                self.lock_semaphore(flags[flag_row, s].item_ptr(), 1)
