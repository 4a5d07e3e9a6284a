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
from tilus import int32, uint32

from .dsmem import async_store_to_rank, load_after_wait


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


# --- persistent kernels -----------------------------------------------------------------------

# The H100 SXM this project is timed on: used where no GPU is present (building for CI).
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

    def __init__(self, num_m_tiles: int32, num_n_tiles: int32, group: int, worker: int32, num_workers: int32):
        self.raster = TileRasterizer(num_m_tiles, num_n_tiles, group)
        self.worker: int32 = worker
        self.num_workers: int32 = num_workers
        self.num_tiles: int32 = num_m_tiles * num_n_tiles

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


class LeaderTileBroadcast(tilus.Class):
    """A 2-CTA cluster's tile sequence, decided by the leader CTA (rank 0) and delivered to both.

    The leader's deciding warp ``send``s each linear tile index (and finally an index past the
    last tile, meaning "stop"); every reader group of both CTAs ``receive``s the same sequence. The
    values travel through a ring of ``depth`` int32 slots present in each CTA:

    ``filled[d]`` (each CTA, arrival count 1, plus 4 bytes): the sender announces the 4 bytes on
    both CTAs' ``filled[d]`` (``arrive.expect_tx``) and writes slot ``d`` of both with ``st.async``,
    which counts its bytes on that barrier as a TMA load does. Readers wait on it at CTA scope.
    ``drained[d]`` (leader only, arrival count ``readers``, the reader groups of both CTAs
    together): each reader group, once all its threads have read the slot (a barrier of the
    group), arrives on the leader's ``drained[d]`` from one elected thread; the sender waits on it
    before writing slot ``d`` again.

    Nothing here needs a cluster-scope fence: the value is ordered by its own byte count on the
    barrier the reader waits on (as TMA bytes are), and the slot is rewritten only by ``st.async``
    after the readers' arrivals, as a ring stage is refilled by TMA after the consumers' release.
    (A first version wrote the slot with a plain ``st.shared::cluster`` published by release/acquire
    at cluster scope: a ``MEMBAR.ALL.GPU`` and an L1 invalidation on every consumer warpgroup at
    every tile start, on the tensor core's critical path.)

    Both barriers start the usual way (``drained`` free, ``filled`` empty), and each side keeps a
    slot index and a phase bit that flips when it wraps around, like ``Pipeline``. The peer's
    ``drained`` barriers exist (every CTA runs the same allocation) but are never used.
    """

    def __init__(self, depth: int, readers: int):
        self.depth: int = depth
        self.slots = self.shared_tensor(dtype=int32, shape=[depth, 1])
        self.filled = self.mbarrier.alloc([1 for _ in range(depth)])
        self.drained = self.mbarrier.alloc([readers for _ in range(depth)])
        self.send_slot: int32 = 0
        self.send_phase: uint32 = self.mbarrier.producer_initial_phase
        self.recv_slot: int32 = 0
        self.recv_phase: uint32 = self.mbarrier.consumer_initial_phase

    def send(self, linear: int32):
        """Deliver ``linear`` to both CTAs. Called by one warp of the leader CTA (one elected
        thread of it announces and writes; every lane keeps the ring position)."""
        self.mbarrier.wait(self.drained[self.send_slot], phase=self.send_phase, scope="cta")
        with self.single_thread():
            for rank in range(2):
                self.mbarrier.arrive_and_expect_tx_remote(self.filled[self.send_slot], transaction_bytes=4,
                                                          target_rank=rank, scope="cta")
                async_store_to_rank(self.slots[self.send_slot], linear, rank, self.filled[self.send_slot])
        self.send_slot = (self.send_slot + 1) % self.depth
        self.send_phase = self.send_phase ^ (self.send_slot == 0)

    def receive(self) -> int32:
        """The next linear tile index (past the last tile: stop). Called by every thread of a
        reader group (a warp or a warpgroup) of either CTA."""
        self.mbarrier.wait(self.filled[self.recv_slot], phase=self.recv_phase, scope="cta")
        linear: int32 = load_after_wait(self.slots[self.recv_slot])
        self.sync()  # every thread of the group has its copy before the slot is handed back
        with self.single_thread():
            self.mbarrier.arrive_and_expect_tx_remote(self.drained[self.recv_slot], transaction_bytes=0,
                                                      target_rank=0, scope="cta")
        self.recv_slot = (self.recv_slot + 1) % self.depth
        self.recv_phase = self.recv_phase ^ (self.recv_slot == 0)
        return linear
