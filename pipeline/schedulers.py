"""Which output tile a CTA computes: grouped ("swizzled") rasterization.

Launch order decides which tiles are in flight together. Row-major order sweeps one row of tiles
of C, so all the CTAs in flight read one tile row of A and *every* column tile of B: B is re-read
from DRAM for each row. Grouped order walks ``group`` tile rows at a time, column by column: the
CTAs in flight share a few A tiles and a few B tiles, which stay in L2.

``grouped_tile`` is the rule in plain Python (the reference the tests and notebooks use);
``TileRasterizer`` is the same rule inside a kernel. Both accept any grid: the last group may have
fewer than ``group`` tile rows.
"""

import tilus
from tilus import int32


def grouped_tile(linear: int, num_m_tiles: int, num_n_tiles: int, group: int) -> tuple[int, int]:
    """(m_tile, n_tile) visited at position ``linear`` of the grouped order."""
    tiles_per_group = group * num_n_tiles
    first_m = linear // tiles_per_group * group
    rows_in_group = min(num_m_tiles - first_m, group)
    in_group = linear % tiles_per_group
    return first_m + in_group % rows_in_group, in_group // rows_in_group


def grouped_tile_order(num_m_tiles: int, num_n_tiles: int, group: int) -> list[tuple[int, int]]:
    return [grouped_tile(i, num_m_tiles, num_n_tiles, group) for i in range(num_m_tiles * num_n_tiles)]


class TileRasterizer(tilus.Class):
    """Maps a linear tile index to an (m_tile, n_tile) pair in grouped order (see module doc)."""

    def __init__(self, num_m_tiles: int32, num_n_tiles: int32, group: int):
        self.num_m_tiles: int32 = num_m_tiles
        self.num_n_tiles: int32 = num_n_tiles
        self.group: int = group
        self.num_tiles: int32 = num_m_tiles * num_n_tiles

    def tile(self, linear: int32):
        tiles_per_group = self.group * self.num_n_tiles
        first_m = linear // tiles_per_group * self.group
        rows_in_group: int32 = self.num_m_tiles - first_m
        if rows_in_group > self.group:
            rows_in_group = self.group
        in_group = linear % tiles_per_group
        m_tile: int32 = first_m + in_group % rows_in_group
        n_tile: int32 = in_group // rows_in_group
        return m_tile, n_tile
