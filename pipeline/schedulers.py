"""Which output tile a CTA computes: grouped ("swizzled") rasterization.

Launch order decides which tiles are in flight together. Row-major order sweeps one row of tiles
of C, so all the CTAs in flight read one tile row of A and *every* column tile of B: B is re-read
from DRAM for each row. Grouped order walks ``group`` tile rows at a time, column by column: the
CTAs in flight share a few A tiles and a few B tiles, which stay in L2.

``grouped_tile`` is the rule in plain Python (the reference the tests and notebooks use);
``TileRasterizer`` is the same rule inside a kernel. Both accept any grid: the last group may have
fewer than ``group`` tile rows.

A batched kernel (torch.bmm's case: ``batches`` products of one shape) numbers the tiles of every
product in one linear sequence, product after product: linear tile ``t`` is tile ``t % tiles`` (in
grouped order) of product ``t // tiles``, where ``tiles`` is one product's tile count.
``batched_tile`` is that rule in plain Python, ``TileRasterizer.batch_tile`` in a kernel; a
persistent schedule (``StaticTileScheduler``) or cluster launch control then hands out the linear
indices of all products alike. Grouping stays within a product: its tiles share operands, tiles of
two products share none.
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


def batched_tile(linear: int, num_m_tiles: int, num_n_tiles: int, group: int) -> tuple[int, int, int]:
    """(batch, m_tile, n_tile) visited at position ``linear`` of a batched kernel's order (module doc)."""
    tiles = num_m_tiles * num_n_tiles
    return (linear // tiles, *grouped_tile(linear % tiles, num_m_tiles, num_n_tiles, group))


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

    def batch_tile(self, linear: int32):
        """(batch, m_tile, n_tile) of linear tile ``linear`` of a batched kernel (module doc)."""
        batch: int32 = linear // self.num_tiles
        m_tile, n_tile = self.tile(linear - batch * self.num_tiles)
        return batch, m_tile, n_tile


# --- persistent kernels -----------------------------------------------------------------------

# The SMs of an NVIDIA H100 SXM: the grid used where no GPU is present (building for CI).
DEFAULT_SM_COUNT = 132


def sm_count() -> int:
    """Streaming multiprocessors of this machine's GPU (the grid of a persistent kernel), or
    ``DEFAULT_SM_COUNT`` on a machine without one. Read when a kernel is built, so a kernel built
    here is sized for the GPU here."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    except Exception:  # no usable GPU: build for the reference machine
        pass
    return DEFAULT_SM_COUNT


def static_tiles(num_tiles: int, worker: int, num_workers: int) -> list[int]:
    """The linear tiles worker ``worker`` of ``num_workers`` takes in a static round-robin schedule
    (the plain-Python rule that ``StaticTileScheduler`` follows in a kernel)."""
    return list(range(worker, num_tiles, num_workers))


class StaticTileScheduler(tilus.Class):
    """Hands a persistent worker (a CTA, or a 2-CTA cluster) its tiles: linear tiles ``worker``,
    ``worker + num_workers``, ... in grouped order (``TileRasterizer``). The schedule is fixed when
    the kernel starts, which needs no atomics; it balances well when the tiles take equal time
    and the grid is no larger than the number of workers that fit on the GPU at once."""

    def __init__(
        self,
        num_m_tiles: int32,
        num_n_tiles: int32,
        group: int,
        worker: int32,
        num_workers: int32,
        batches: int32 = 1,
    ):
        """``batches``: products of a batched kernel, whose tiles are numbered product after product
        (module doc); ``tile`` is then ``batch_tile``'s (m_tile, n_tile) without the batch."""
        self.raster = TileRasterizer(num_m_tiles, num_n_tiles, group)
        self.worker: int32 = worker
        self.num_workers: int32 = num_workers
        self.num_tiles: int32 = num_m_tiles * num_n_tiles * batches

    def count(self) -> int32:
        """How many tiles this worker computes."""
        mine: int32 = 0
        if self.worker < self.num_tiles:
            mine = (self.num_tiles - self.worker + self.num_workers - 1) // self.num_workers
        return mine

    def linear(self, i: int32) -> int32:
        """The linear index of this worker's ``i``-th tile."""
        return self.worker + i * self.num_workers

    def tile(self, i: int32):
        """(m_tile, n_tile) of this worker's ``i``-th tile."""
        return self.raster.tile(self.worker + i * self.num_workers)

    def batch_tile(self, i: int32):
        """(batch, m_tile, n_tile) of this worker's ``i``-th tile (a batched kernel)."""
        return self.raster.batch_tile(self.worker + i * self.num_workers)
