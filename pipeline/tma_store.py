"""A pipelined epilogue store: register sub-tiles -> two shared staging buffers -> TMA stores.

An epilogue warpgroup that writes its output tile in column blocks (sub-tiles) hands each block to
``StagedTmaStore.put``. The block goes into one of two staging buffers; one elected lane issues
the TMA store and commits it as a bulk async-group, and the warpgroup moves on: the store of
block ``j`` overlaps the reading (from TMEM or registers) and conversion of block ``j + 1``.

Invariants:

* a staging buffer is rewritten only after the TMA unit has finished reading it: before writing
  buffer ``j % 2`` the storing lane waits until at most one of its bulk groups is still reading
  shared memory (``cp.async.bulk.wait_group.read 1``), and the warpgroup's named barrier passes
  that on to all of its threads;
* ``fence.proxy.async`` + the named barrier after the shared-memory writes make them visible to
  the TMA unit (async proxy) before the store is issued;
* the same warp (the group's first) issues, commits and waits every store, since bulk async-groups
  belong to the thread that committed them;
* ``finish`` waits for every store before the CTA may exit.

The TMA store clips at the matrix edge, so ragged tiles need nothing special.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, int32


class StagedTmaStore(tilus.Class):
    def __init__(self, staging: SharedTensor):
        """``staging``: ``[2, rows, cols]`` in the output dtype, private to the calling warpgroup."""
        self.staging: SharedTensor = staging
        self.blocks_stored: int32 = 0  # picks the staging buffer; runs on across tiles

    def put(self, block: RegisterTensor, g_out: GlobalTensor, offset_m: int32, offset_n: int32):
        """Store ``block`` (``rows x cols``, any float dtype) at (offset_m, offset_n) of ``g_out``.
        Called by the whole warpgroup."""
        buf = self.staging[self.blocks_stored % 2]
        with self.single_warp():
            self.tma.wait_group(1, read=True)  # the store that last read `buf` is done with it
        self.sync()
        self.store_shared(buf, block.to(self.staging.dtype))
        self.fence.proxy_async(space="shared")
        self.sync()
        with self.single_warp():
            self.tma.shared_to_global(buf, g_out, offsets=[offset_m, offset_n])
            self.tma.commit_group()
        self.blocks_stored = self.blocks_stored + 1

    def finish(self):
        """Wait until every store has completed (before the CTA exits)."""
        with self.single_warp():
            self.tma.wait_group(0)
