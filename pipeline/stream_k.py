"""Stream-K: the last, partial wave of a persistent schedule shared out by K blocks.

A persistent kernel (Hopper V5) runs ``tiles`` output tiles on ``workers`` CTAs, one an SM, each
CTA taking every ``workers``-th tile (``schedulers.StaticTileScheduler``). When ``tiles`` is no
multiple of ``workers`` the last wave is partial: ``tiles % workers`` CTAs compute one more tile
while the rest of the GPU idles. 4096^3 in 128 x 256 tiles is 512 tiles on 132 SMs, 3.88 waves that
take the time of 4; 8192^3 is 2048 tiles, 15.5 waves that take the time of 16.

Stream-K keeps the whole waves as they are (the data-parallel part) and deals out the tail by K
blocks instead of by tiles: its ``tail * k_blocks`` K blocks (tail tile after tail tile, each tile's
K blocks in order) are cut into ``workers`` contiguous ranges of nearly equal length, one a CTA,
so that every SM takes the same share of the tail (0.88 of a tile at 4096^3, 0.52 at 8192^3)
instead of one whole tile or nothing. A short tail is dealt to at most ``MOST_CUTS`` workers a
tile (``tail_workers``), the rest getting none: every partial costs a store and a load of a float32
tile, and a tile cut among all 132 CTAs (a tail of one tile) would have its finisher add 131 of them.

The tail has fewer tiles than there are CTAs, so a range is shorter than a tile: it touches at
most two tiles, and falls into at most two *pieces* (a tile and a run of its K blocks):

* a piece that reaches its tile's last K block *finishes* the tile: it adds the partial sums of
  the pieces before it, which lower-numbered CTAs computed, and writes C through the kernel's usual
  epilogue (bias, activation and all);
* a piece that ends inside its tile is a *partial*: its float32 accumulator goes to the CTA's own
  slot of a global workspace, and a flag says it is there. Only the piece at the end of a range can
  be one, so each CTA has at most one partial and one slot.

A CTA computes its partial piece first and its finishing piece second (``StreamKSchedule.piece``):
a CTA that finishes a tile has by then spent as long on its own partial as the CTAs before it
needed for theirs, and publishing a partial waits on nobody, so the waits do not chain. A CTA
waits only on lower-numbered CTAs, which the GPU started no later than itself (the grid is one
CTA an SM, all resident at once): no cycle, no hang.

Synchronization, in global memory at GPU scope; each consumer warpgroup owns its rows of every
tile, so the two publish and collect on their own (slot and flag per CTA and warpgroup):

* ``flags[c, wg]`` is set to 1 by one thread of CTA ``c``'s warpgroup ``wg`` (``st.release.gpu``),
  after the warpgroup's barrier that follows its threads' stores of the slot;
* one thread of the finishing CTA's warpgroup ``wg`` waits until it reads 1 (``ld.acquire.gpu``),
  sets it back to 0, and the warpgroup's barrier follows before its threads read the slot.

The flags live in tilus's *clean* workspace (zero when first allocated; each launch leaves them
zero again, since every flag set is consumed and reset by the tile's finisher), the slots in its
uninitialized one. ``stream_k_pieces`` is the same rule in plain Python, for the tests and the
notebook.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, float32, int32, int64
from tilus.hidet.ir.expr import cast

from .schedulers import TileRasterizer

MOST_CUTS = 2  # the tail is dealt to at most this many workers a tail tile (module doc)


def tail_workers(tail_tiles: int, workers: int) -> int:
    """How many workers share the tail: all of them, or ``MOST_CUTS`` a tail tile if that is fewer
    (at least one, so that a tail of nothing divides by something)."""
    return max(1, min(workers, MOST_CUTS * tail_tiles))


def range_start(worker: int, tail_tiles: int, k_blocks: int, workers: int) -> int:
    """The first K block (numbered tail tile after tail tile) of worker ``worker``'s range; a worker
    past ``tail_workers`` has an empty one."""
    sharing = tail_workers(tail_tiles, workers)
    return min(worker, sharing) * tail_tiles * k_blocks // sharing


def stream_k_pieces(tiles: int, k_blocks: int, workers: int) -> list[list[tuple[int, int, int]]]:
    """Each worker's stream-K pieces, in the order it computes them: ``(tile, k_begin, k_end)``,
    ``tile`` a linear tile index (the last ``tiles % workers`` are the tail), K blocks
    ``k_begin <= kb < k_end``. The data-parallel tiles (``tiles - tiles % workers`` of them, every
    ``workers``-th one) are not listed."""
    tail = tiles % workers
    first_tail_tile = tiles - tail
    pieces = []
    for worker in range(workers):
        begin = range_start(worker, tail, k_blocks, workers)
        end = range_start(worker + 1, tail, k_blocks, workers)
        mine = []
        if begin < end:
            last, first = (end - 1) // k_blocks, begin // k_blocks
            mine.append((first_tail_tile + last, max(begin - last * k_blocks, 0), end - last * k_blocks))
            if first != last:
                mine.append((first_tail_tile + first, begin - first * k_blocks, k_blocks))
        pieces.append(mine)
    return pieces


class StreamKSchedule(tilus.Class):
    """A persistent CTA's work under stream-K (module doc): ``whole_count()`` data-parallel tiles
    (``whole_tile(i)``: this worker's every ``num_workers``-th tile, in grouped order), then
    ``piece_count()`` pieces of the tail (``piece(p)``: its tile and K blocks). The producer and
    the consumers walk the same sequence."""

    def __init__(
        self,
        num_m_tiles: int32,
        num_n_tiles: int32,
        group: int,
        worker: int32,
        num_workers: int32,
        num_k_blocks: int32,
    ):
        self.raster = TileRasterizer(num_m_tiles, num_n_tiles, group)
        self.worker: int32 = worker
        self.num_workers: int32 = num_workers
        self.num_k_blocks: int32 = num_k_blocks
        num_tiles: int32 = num_m_tiles * num_n_tiles
        self.tail_tiles: int32 = num_tiles % num_workers
        self.first_tail_tile: int32 = num_tiles - self.tail_tiles
        self.sharing: int32 = MOST_CUTS * self.tail_tiles  # tail_workers
        if self.sharing > num_workers:
            self.sharing = num_workers
        if self.sharing < 1:
            self.sharing = 1
        self.begin: int32 = self.range_start(worker)
        self.end: int32 = self.range_start(worker + 1)

    def range_start(self, worker: int32) -> int32:
        """The first tail K block of ``worker``'s range (``range_start`` above), in 64 bits: the
        product of three counts outgrows 32."""
        # (a variable annotated int64 is declared int32 when its first value is: cast instead)
        w: int32 = worker
        if w > self.sharing:
            w = self.sharing
        start: int32 = cast(self.tail_tiles, int64) * self.num_k_blocks * w // self.sharing
        return start

    def whole_count(self) -> int32:
        return self.first_tail_tile // self.num_workers

    def whole_tile(self, i: int32):
        """(m_tile, n_tile) of this worker's ``i``-th data-parallel tile."""
        return self.raster.tile(self.worker + i * self.num_workers)

    def piece_count(self) -> int32:
        count: int32 = 0
        if self.begin < self.end:
            count = 1
            if self.begin // self.num_k_blocks != (self.end - 1) // self.num_k_blocks:
                count = 2
        return count

    def piece(self, p: int32):
        """(m_tile, n_tile, k_begin, k_end, tail_tile) of piece ``p``: ``p = 0`` the piece at the end
        of the range (a partial, unless the range ends where its tile does), ``p = 1`` the one at
        its start, which finishes its tile. ``tail_tile`` numbers the tile within the tail."""
        tail_tile: int32 = (self.end - 1) // self.num_k_blocks
        if p == 1:
            tail_tile = self.begin // self.num_k_blocks
        first: int32 = tail_tile * self.num_k_blocks
        k_begin: int32 = self.begin - first
        if k_begin < 0:
            k_begin = 0
        k_end: int32 = self.end - first
        if k_end > self.num_k_blocks:
            k_end = self.num_k_blocks
        m_tile, n_tile = self.raster.tile(self.first_tail_tile + tail_tile)
        return m_tile, n_tile, k_begin, k_end, tail_tile

    def first_contributor(self, tail_tile: int32) -> int32:
        """The lowest worker whose range reaches into tail tile ``tail_tile``: its range ends past
        the tile's first K block x, i.e. (w + 1) * work >= (x + 1) * sharing."""
        work = cast(self.tail_tiles, int64) * self.num_k_blocks
        x = cast(tail_tile, int64) * self.num_k_blocks + 1
        first: int32 = (x * self.sharing + work - 1) // work - 1
        return first


class PartialTiles(tilus.Class):
    """The workspace of stream-K's partial pieces (module doc): a float32 slot of ``rows x cols``
    per worker and consumer warpgroup, and its flag. Call ``publish`` and ``collect`` from the
    consumer warpgroup (128 threads)."""

    def __init__(self, num_workers: int, warpgroups: int, rows: int, cols: int):
        self.warpgroups: int = warpgroups
        self.rows: int = rows
        self.cols: int = cols
        self.slots: GlobalTensor = self.global_tensor(
            dtype=float32, shape=[num_workers * warpgroups * rows, cols], requires_clean=False
        )
        self.flags: GlobalTensor = self.global_tensor(
            dtype=int32, shape=[num_workers * warpgroups, 1], requires_clean=True
        )

    def publish(self, acc: RegisterTensor, worker: int32, wg: int):
        """Store ``acc`` in the slot of (``worker``, ``wg``), then raise its flag."""
        slot: int32 = worker * self.warpgroups + wg
        self.store_global(self.slots, acc, offsets=[slot * self.rows, 0])
        self.sync()  # every thread's stores happen before the flag's release
        with self.single_thread():
            self.release_semaphore(self.flags[slot].item_ptr(), 1)

    def collect(self, acc: RegisterTensor, schedule: StreamKSchedule, tail_tile: int32, wg: int):
        """Add to ``acc`` the partials of tail tile ``tail_tile`` from the workers before this one,
        each once its flag is up; lower the flag again for the next launch."""
        first = schedule.first_contributor(tail_tile)
        # from 0, not from `first`: a loop that starts at a run-time value and feeds a load's offset
        # does not build in tilus 0.2.0; skipping costs a comparison a worker
        for c in range(schedule.worker):
            if c >= first:
                # a worker with an empty range (a tail shorter than the grid) publishes nothing;
                # the test is reached only for the tile's few contributors (two 64-bit divisions)
                if schedule.range_start(c) < schedule.range_start(c + 1):
                    flag = self.flags[c * self.warpgroups + wg]
                    with self.single_thread():
                        self.lock_semaphore(flag.item_ptr(), 1)
                        self.release_semaphore(flag.item_ptr(), 0)
                    self.sync()  # the acquire happens before every thread's loads of the slot
                    row = (c * self.warpgroups + wg) * self.rows
                    self.add(acc, self.load_global(self.slots, offsets=[row, 0], shape=[self.rows, self.cols]), out=acc)
