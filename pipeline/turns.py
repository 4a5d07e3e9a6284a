"""Two warpgroups taking turns at the tensor core: the ordering of Hopper V6's ping-pong consumers.

Each warpgroup of a ping-pong pair owns whole output tiles, the tiles of its CTA alternating
between the two (warpgroup 0 the first). A warpgroup's *turn* lasts from its first wgmma of a tile
to its last: while one warpgroup issues its main loop, the other runs its epilogue (or waits). The
turns are handed over on two mbarriers, ``turn[w]`` = "warpgroup ``w`` may start its main loop":

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``turn[w]`` | 1 | warpgroup ``1 - w``'s elected thread, its last wgmma issued | warpgroup ``w`` | CTA |

Warpgroup 0 waits on ``turn[0]`` with parity 1, 0, 1, ...: its first wait is for "the phase before
the first", which has completed, so it starts at once; warpgroup 1 waits on ``turn[1]`` with parity
0, 1, 0, ...: for warpgroup 0's first hand-over. Each side arrives once per turn and waits for the
other's arrival before it arrives again, so no phase of either barrier completes twice before its
waiter has seen it.

The turns are more than a schedule: both warpgroups read one ring of stages (``Pipeline``), each
tile's K blocks in order, and a warpgroup jumps over the other's stages (``consumer_skip``). A
parity wait only tells one phase from the next, so a warpgroup may wait on a stage only once the
fill before it has landed: the other warpgroup's hand-over comes after it has waited for every
stage of its tile, so every earlier fill of the stages this warpgroup will wait for has landed.
Without the turns a warpgroup could run a whole ring ahead and take an old fill for its own.
"""

import tilus
from tilus import uint32


class OrderedTurns(tilus.Class):
    """The turn barriers of two ping-pong warpgroups (module doc). Each warpgroup calls ``wait(wg)``
    before a tile's main loop and ``hand_over(wg)`` once its last wgmma of the tile is issued, with
    ``wg`` its own index (0 or 1), known when the kernel is built."""

    def __init__(self):
        self.turn = self.mbarrier.alloc([1, 1])
        self.turns_taken: uint32 = 0  # parity of the turns this thread's warpgroup has taken

    def wait(self, wg: int):
        first_free = 1 if wg == 0 else 0  # warpgroup 0's first turn needs no hand-over
        self.mbarrier.wait(self.turn[wg], phase=self.turns_taken ^ first_free, scope="cta")
        self.turns_taken = self.turns_taken ^ 1

    def hand_over(self, wg: int):
        with self.single_thread():
            self.mbarrier.arrive(self.turn[1 - wg], scope="cta")
