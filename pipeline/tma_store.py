"""An epilogue store in sub-tiles: registers -> shared staging buffers -> TMA stores.

An epilogue warpgroup that writes its output tile in column blocks (sub-tiles) hands each block to
``StagedTmaStore.put``. The block goes into one of ``buffers`` staging buffers; one elected lane
issues the TMA store and commits it as a bulk async-group, and the warpgroup moves on: the store
of block ``j`` overlaps the reading (from TMEM or registers) and conversion of the next blocks.
With one buffer each block waits for the store of the one before to have read it; with several,
up to ``buffers - 1`` stores stay in flight.

A sub-tile of 64 columns of a 16-bit dtype is 128 bytes wide: tilus gives its staging buffer the
128-byte swizzle, and the TMA store reads the same swizzle back. Each ``stmatrix`` writes 8 rows of
16 bytes; in that swizzle the 8 chunks fall in 8 different groups of banks, where a row-major tile
512 bytes wide (a whole 128 x 256 output tile) would put all 8 in the same banks.

Invariants:

* a staging buffer is rewritten only after the TMA unit has finished reading it: before writing
  buffer ``j % buffers`` the storing lane waits until at most ``buffers - 1`` of its bulk groups
  are still reading shared memory (``cp.async.bulk.wait_group.read``), and the warpgroup's named
  barrier passes that on to all of its threads;
* ``fence.proxy.async`` + the named barrier after the shared-memory writes make them visible to
  the TMA unit (async proxy) before the store is issued;
* the same warp (the group's first) issues, commits and waits every store, since bulk async-groups
  belong to the thread that committed them;
* ``finish`` waits for every store before the CTA may exit.

The TMA store clips at the matrix edge, so ragged tiles need nothing special.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, int32

STAGING_BUFFERS_MOST = 4
SHARED_MEMORY_PER_CTA = 227 * 1024  # sm_90a and sm_100a, the opt-in maximum
BARRIER_BYTES = 1024  # a kernel's mbarriers, CLC responses and tilus's workspace, rounded up


def staging_buffers(sub_tile_bytes: int, other_shared_bytes: int, most: int = STAGING_BUFFERS_MOST) -> int:
    """How many staging buffers of ``sub_tile_bytes`` fit in a CTA's shared memory beside
    ``other_shared_bytes`` (the ring) and the barriers: at most ``most``. Decided when the kernel
    is built."""
    fit = (SHARED_MEMORY_PER_CTA - BARRIER_BYTES - other_shared_bytes) // sub_tile_bytes
    if fit < 1:
        raise ValueError(
            f"no {sub_tile_bytes}-byte staging buffer fits beside {other_shared_bytes} bytes of "
            f"shared memory: use fewer stages or narrower sub-tiles"
        )
    return min(most, fit)


class StagedTmaStore(tilus.Class):
    def __init__(self, staging: SharedTensor):
        """``staging``: ``[buffers, rows, cols]`` in the output dtype, private to the calling
        warpgroup."""
        self.staging: SharedTensor = staging
        self.buffers: int = staging.shape[0]
        self.blocks_stored: int32 = 0  # picks the staging buffer; runs on across tiles

    def put(self, block: RegisterTensor, g_out: GlobalTensor, offset_m: int32, offset_n: int32, batch: int32 = 0):
        """Store ``block`` (``rows x cols``, any float dtype) at (offset_m, offset_n) of ``g_out``
        (of its matrix ``batch`` where ``g_out`` is a batched kernel's [batches, M, N]: a box
        [1, rows, cols] of the 3-D tensor map, clipped at that matrix's edge). Called by the whole
        warpgroup."""
        buf = self.staging[self.blocks_stored % self.buffers]
        with self.single_warp():
            self.tma.wait_group(self.buffers - 1, read=True)  # the store that last read `buf` is done with it
        self.sync()
        self.store_shared(buf, block.to(self.staging.dtype))
        self.fence.proxy_async(space="shared")
        self.sync()
        with self.single_warp():
            if len(g_out.shape) == 3:  # decided when the kernel is built
                box = self.reshape_shared(buf, [1, buf.shape[0], buf.shape[1]])
                self.tma.shared_to_global(box, g_out, offsets=[batch, offset_m, offset_n])
            else:
                self.tma.shared_to_global(buf, g_out, offsets=[offset_m, offset_n])
            self.tma.commit_group()
        self.blocks_stored = self.blocks_stored + 1

    def finish(self):
        """Wait until every store has completed (before the CTA exits)."""
        with self.single_warp():
            self.tma.wait_group(0)
