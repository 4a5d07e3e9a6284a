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


class WgmmaMainloop(tilus.Class):
    """``acc += A_rows @ B^T`` over ``num_k_blocks`` stages of ``ring``, for one warpgroup.

    ``s_a``: ``[stages, warpgroups, rows, block_k]``, this warpgroup's rows at index ``wg``.
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
        ring = self.ring
        for kb in self.range(1, num_k_blocks, 1, unroll=1):  # noqa: B007 (unrolled, nvcc moves accumulators)
            ring.consumer_advance()
            self.issue(s_a, s_b, wg, acc)  # K block kb
            self.wgmma.wait_group(1)  # the group of K block kb-1 is complete: its stage is free
            ring.consumer_release_previous()
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
        self.wgmma.mma(s_a[ring.consumer_stage, wg], b_tile.transpose(), acc)
        self.wgmma.commit_group()
