"""The consumer side of a Hopper ring: one warpgroup's wgmma main loop over a ``Pipeline``.

Per K block the warpgroup waits for the stage (``consumer_acquire``), issues its wgmma and
commits them as one group, then ``wgmma.wait_group 1``: the group of the *previous* K block is
complete, so that stage is released (``consumer_release_previous``) while the current group may
still run. One wgmma group is always in flight and the tensor core never waits for the issuing
warps. After the loop, ``wgmma.wait_group 0`` and the last stage is released.

The first K block is issued before the loop (every matrix has at least one). This is not only
tidier than an ``if k > 0`` inside the loop: with a loop that may run zero times around the first
wgmma, ptxas sees the accumulator's zero-fill on a path into the wgmma pipeline and serializes
every wgmma (warning C7515); peeled, it does not.
"""

import tilus
from tilus import RegisterTensor, SharedTensor, int32

from .pipeline import Pipeline

WHOLE_TILE = -1  # ``wg`` of a warpgroup that multiplies every slab of A (it owns the whole tile)


class WgmmaMainloop(tilus.Class):
    """``acc += A_rows @ B^T`` over ``num_k_blocks`` stages of ``ring``, for one warpgroup.

    ``s_a``: ``[stages, warpgroups, rows, block_k]``, this warpgroup's rows at index ``wg``; with
    ``wg = WHOLE_TILE`` every slab, read as one ``warpgroups * rows x block_k`` tile (Hopper V6's
    ping-pong warpgroups each own a whole tile).
    ``s_b``: ``[stages, block_n, block_k]``, or ``[stages, parts, block_n / parts, block_k]``
    when the B tile arrives in parts (2-CTA multicast); read as one ``block_n x block_k`` tile.
    """

    def __init__(self, ring: Pipeline):
        self.ring: Pipeline = ring

    def run(self, s_a: SharedTensor, s_b: SharedTensor, wg: int, acc: RegisterTensor, num_k_blocks: int32):
        self.start(s_a, s_b, wg, acc)
        self.finish(s_a, s_b, wg, acc, num_k_blocks)

    def start(self, s_a: SharedTensor, s_b: SharedTensor, wg: int, acc: RegisterTensor):
        """Issue K block 0. Until ``finish``, the tensor core is busy with it: a warpgroup may do
        other short work in between (V6 receives its next tile there)."""
        self.issue(s_a, s_b, wg, acc)

    def finish(self, s_a: SharedTensor, s_b: SharedTensor, wg: int, acc: RegisterTensor, num_k_blocks: int32):
        """K blocks 1 ... ``num_k_blocks - 1``, then the last wait and release."""
        self.issue_rest(s_a, s_b, wg, acc, num_k_blocks)
        self.drain()

    def issue_rest(self, s_a: SharedTensor, s_b: SharedTensor, wg: int, acc: RegisterTensor, num_k_blocks: int32):
        """K blocks 1 ... ``num_k_blocks - 1``: on return every stage of the tile has been waited for
        and every wgmma issued; the last group may still run (``drain`` waits for it). A ping-pong
        warpgroup hands the tensor core on in between."""
        ring = self.ring
        for kb in self.range(1, num_k_blocks, 1, unroll=1):  # noqa: B007 (unrolled, nvcc moves accumulators)
            ring.consumer_advance()
            self.issue(s_a, s_b, wg, acc)  # K block kb
            self.wgmma.wait_group(1)  # the group of K block kb-1 is complete: its stage is free
            ring.consumer_release_previous()

    def drain(self):
        """Wait for the last wgmma group and release its stage; the position moves to the next tile."""
        ring = self.ring
        self.wgmma.wait_group(0)
        ring.consumer_release()  # the last K block's stage
        ring.consumer_advance()  # where the next tile starts

    def issue(self, s_a: SharedTensor, s_b: SharedTensor, wg: int, acc: RegisterTensor):
        """Wait for the current stage and issue its wgmma as one committed group."""
        ring = self.ring
        ring.consumer_acquire()
        if len(s_b.shape) == 4:  # [stages, parts, rows, block_k]: the parts are contiguous rows
            b_tile = self.reshape_shared(s_b[ring.consumer_stage], [s_b.shape[1] * s_b.shape[2], s_b.shape[3]])
        else:
            b_tile = s_b[ring.consumer_stage]
        self.wgmma.fence()
        if wg == WHOLE_TILE:  # every slab of A, contiguous rows: one [slabs * rows, block_k] tile
            a_tile = self.reshape_shared(s_a[ring.consumer_stage], [s_a.shape[1] * s_a.shape[2], s_a.shape[3]])
        else:
            a_tile = s_a[ring.consumer_stage, wg]
        self.wgmma.mma(a_tile, b_tile.transpose(), acc)
        self.wgmma.commit_group()
