"""The token tile's TMA loads of a skinny kernel whose last token tile may hold fewer tokens than rows.

A swapped-operand kernel (V8) reads its tokens in tiles of ``rows`` (8 to 256), and a call with M
tokens leaves the last tile ``M mod rows`` tokens, at M = 1 a tile of 8 or 16 with one. One TMA box
of the whole tile reaches past the tensor's last row there, and TMA fills those rows with zeros at
a cost of its own, larger than the same product with the tokens padded to whole tiles in memory
(``plots/h200/v8-tokens/ of commit b43a7e1``).

``TokenBoxes`` loads only the rows that hold tokens: the whole tile in one box when every row does;
else the whole groups of ``TOKEN_GROUP`` rows as one box per set bit of their count, largest first
(13 groups of a 128-row tile: boxes of 64, 32 and 8 rows), then the rest of the tokens at the start of
the next group: one row in a box of one row (a single token, decode's case, reads nothing past the
tensor), two to seven in a box of the group (under 7 rows past it). Each box goes into its rows of
the same shared tile (a view of it cut into boxes of that size), starting a 128-byte swizzle atom
(8 rows), so it lands in the tile's own swizzled layout. Rows past the last box are not written:
they hold what an earlier stage left there, which only the output rows past M read, and those are
never stored.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, int32

TOKEN_GROUP = 8  # rows of a 128-byte swizzle atom: the smallest box that keeps the tile's layout


class TokenBoxes(tilus.Class):
    """The loads of a token tile ``tile`` ([stages, boxes, rows, cols], one TMA box per ``[slot,
    box]`` when whole) holding ``tokens`` tokens (1 .. rows, known at run time): its ``full`` whole
    groups of ``TOKEN_GROUP`` rows, then ``tail`` rows of the next group."""

    def __init__(self, tile: SharedTensor, tokens: int32):
        self.tile: SharedTensor = tile
        self.rows: int = tile.shape[2]
        self.tokens: int32 = tokens
        self.full: int32 = tokens // TOKEN_GROUP
        tail: int32 = tokens % TOKEN_GROUP
        # the tail's box: none, one row, or the whole group. Boxes of 2 or 4 rows would need the
        # 32- or 64-byte swizzle modes (their rows of a 128-byte-swizzled atom have the same
        # pattern), which take no box wider than their span; a box of one row is unswizzled
        self.tail_rows: int32 = min(tail, 1) + (TOKEN_GROUP - 1) * min(max(tail - 1, 0), 1)

    def stage_bytes(self) -> int32:
        """The bytes the tokens of one stage (every ``box`` of a slot) bring to its barrier."""
        rows = self.full * TOKEN_GROUP + self.tail_rows
        return rows * self.tile.shape[3] * self.tile.shape[1] * self.tile.dtype.nbytes

    def load(self, g_a: GlobalTensor, slot: int32, box: int32, offset_m: int32, column: int32, barrier: RegisterTensor):
        """Box ``box`` of stage ``slot``: the tile's tokens from row ``offset_m`` and ``column`` of
        ``g_a``, completing on ``barrier``."""
        if self.tokens == self.rows:
            self.tma.global_to_shared(src=g_a, dst=self.tile[slot, box], offsets=[offset_m, column], mbarrier=barrier)
        else:
            # the whole groups, a box per bit of their count, the largest first, then the tail at the
            # start of the next group (tilus unrolls no loop over sizes: a call each)
            self.part(g_a, slot, box, offset_m, column, barrier, self.rows // 2, False)
            self.part(g_a, slot, box, offset_m, column, barrier, self.rows // 4, False)
            self.part(g_a, slot, box, offset_m, column, barrier, self.rows // 8, False)
            self.part(g_a, slot, box, offset_m, column, barrier, self.rows // 16, False)
            self.part(g_a, slot, box, offset_m, column, barrier, self.rows // 32, False)
            self.part(g_a, slot, box, offset_m, column, barrier, 1, True)
            self.part(g_a, slot, box, offset_m, column, barrier, TOKEN_GROUP, True)

    def part(
        self,
        g_a: GlobalTensor,
        slot: int32,
        box: int32,
        offset_m: int32,
        column: int32,
        barrier: RegisterTensor,
        size: int,
        tail: bool,
    ):
        """The box of ``size`` rows, if this tile has it: of whole groups (after the larger boxes'
        rows) where the whole groups' count has its bit, or the tail's where it is that size. It goes
        into the tile seen as boxes of that size, each of which starts a swizzle atom or is one, so it
        keeps the tile's layout."""
        if tail or size >= TOKEN_GROUP:
            shape = self.tile.shape
            view = self.reshape_shared(self.tile, [shape[0], shape[1], self.rows // size, size, shape[3]])
            if tail:
                if self.tail_rows == size:
                    index = self.full * TOKEN_GROUP // size
                    dst = view[slot, box, index]
                    self.tma.global_to_shared(
                        src=g_a, dst=dst, offsets=[offset_m + index * size, column], mbarrier=barrier
                    )
            else:
                bit = size // TOKEN_GROUP
                if self.full // bit % 2 == 1:
                    index = self.full // (2 * bit) * 2  # the larger boxes' rows, in boxes of this size
                    dst = view[slot, box, index]
                    self.tma.global_to_shared(
                        src=g_a, dst=dst, offsets=[offset_m + index * size, column], mbarrier=barrier
                    )
