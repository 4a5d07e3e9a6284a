"""The state the model of the machine keeps, as plain records: mbarriers and the named and cluster
barriers, the CTAs (their allocations, the provenance tags of their shared and tensor memory, the
asynchronous accesses still in flight into it), the roles that run in them, the asynchronous
operations not landed yet, and the values the interpreter passes around (register values, views of
shared and tensor memory, the global matrices).

Records only, no rules: what an event does to them, and which fault it is, belongs to ``events``
and the instruction modules. Kept apart so that each of those modules, and a test that builds a CTA
by hand, can use them without importing the machine.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable, Iterator, Optional

# ---------------------------------------------------------------------------------------------------
# barriers and the asynchronous agents


@dataclasses.dataclass(frozen=True)
class BarrierAddr:
    """An mbarrier's shared-memory address: the CTA (global index) that holds it, which
    allocation, which element."""

    cta: int
    alloc: int
    index: int


@dataclasses.dataclass(frozen=True)
class SharedAddr:
    cta: int
    alloc: int
    start: int


class Barrier:
    def __init__(self, addr: BarrierAddr, count: int, name: str):
        self.addr = addr
        self.count = count
        self.name = name
        self.pending = count
        self.tx = 0
        self.completed = 0  # phases completed so far; the current phase has parity completed & 1
        self.observed: dict[Role, int] = {}  # the last completed phase each waiting role saw
        self.loaded = False  # a TMA load completes on it: a ring's "full" barrier

    def team_observed(self):
        """The last phase any of its waiting roles saw (None before the first wait returns): the
        phase a ring's turn-taking consumers have reached together (``Machine.turn_taking``)."""
        return max((seen for seen in self.observed.values() if seen is not None), default=None)

    def state(self) -> str:
        return (
            f"{self.name}: phase {self.completed} (parity {self.completed & 1}), "
            f"{self.count - self.pending}/{self.count} arrived, tx {self.tx}"
        )


class GroupBarrier:
    """A named barrier (``bar.sync`` of a thread group) or ``barrier.cluster``."""

    def __init__(self, expected: int, name: str):
        self.expected = expected
        self.name = name
        self.arrived = 0
        self.generation = 0


@dataclasses.dataclass(frozen=True)
class LoadTag:
    """What a TMA (or register) load brought in: rows ``row0..row0+rows`` and K columns
    ``k0..k0+cols`` of operand ``matrix`` (of product ``batch`` of a batched kernel)."""

    matrix: str
    row0: int
    rows: int
    k0: int
    cols: int
    batch: int = 0


class AccTag:
    """An accumulator: the (A loads, B loads) pairs of every MMA that added into it."""

    def __init__(self):
        self.terms: list[tuple[frozenset, frozenset]] = []


@dataclasses.dataclass(frozen=True)
class PiecedTag:
    """A value read from shared memory that several accumulators wrote, each into whole rows of its
    own (two consumer warpgroups' slabs of one partial tile, read back whole by one thread group):
    which accumulator fills which rows ``[row0, row1)`` of the value as read, so that each is
    checked against the part of C it is stored to. ``transposed``: the value was transposed since,
    and the ranges now count its columns."""

    pieces: tuple[tuple[AccTag, int, int], ...]
    transposed: bool = False


class Reader:
    """An asynchronous read of shared memory in flight (an MMA's operands, a TMA store's source)."""

    def __init__(self, what: str):
        self.what = what
        self.done = False


@dataclasses.dataclass
class AsyncOp:
    what: str
    fire: Callable[[], None]
    targets: tuple[int, ...]  # CTAs whose shared memory / barriers / TMEM it touches
    queue: Optional[tuple] = None  # ops of one queue fire in issue order (tcgen05 commits of a thread)
    byte_barriers: tuple = ()  # the barriers its bytes complete on


# ---------------------------------------------------------------------------------------------------
# values the interpreter handles


@dataclasses.dataclass
class RegVal:
    data: Optional[list] = None  # concrete elements (barrier addresses, CLC responses), row-major
    shape: tuple = ()
    tag: Any = None


@dataclasses.dataclass(frozen=True)
class MemRef:
    """A view of a shared-memory or tensor-memory allocation of one CTA."""

    cta: int
    alloc: int
    start: int
    shape: tuple
    strides: tuple
    elem_bytes: float

    @property
    def end(self) -> int:
        return self.start + sum((s - 1) * st for s, st in zip(self.shape, self.strides)) + 1

    @property
    def nbytes(self) -> int:
        return int(math.prod(self.shape) * self.elem_bytes)

    def at(self, cta: int) -> MemRef:
        return dataclasses.replace(self, cta=cta)


@dataclasses.dataclass(frozen=True)
class GlobalRef:
    matrix: str  # 'A', 'B' or 'C'
    base: int = 0  # element offset of a slice of the matrix


# the row stride the checker passes for A, B and C: an element offset then reads as (row, column)
ROW_STRIDE = 1 << 20
# the matrix stride of a batched kernel's A, B and C: an offset then reads as (batch, row, column)
BATCH_STRIDE = ROW_STRIDE * ROW_STRIDE


def row_major(shape) -> tuple:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


# ---------------------------------------------------------------------------------------------------
# roles


class Role:
    def __init__(self, cta: Cta, lo: int, hi: int):
        self.cta = cta
        self.lo, self.hi = lo, hi
        self.name = f"cta{cta.index}[{lo}:{hi}]"
        self.gen: Optional[Iterator] = None
        self.block: Optional[Callable[[], bool]] = None  # None: ready to run
        self.on_resume: Optional[Callable[[], None]] = None
        self.waiting_on = ""
        self.finished = False
        self.bulk_groups: list[list[Reader]] = []  # the TMA stores of each committed bulk group
        self.uncommitted_stores: list[Reader] = []
        self.wgmma_groups: list[list[Reader]] = []  # committed wgmma groups not yet waited for
        self.wgmma_open: list[Reader] = []
        self.mma_reads: list[Reader] = []  # tcgen05 MMAs issued by this role, until a commit lands
        self.tmem_loads: list[Reader] = []  # tcgen05.ld issued by this role, until tcgen05.wait::ld
        self.tmem_stores: list[Reader] = []  # tcgen05.st issued by this role, until tcgen05.wait::st
        self.wait_barrier: Optional[Barrier] = None  # the mbarrier it waits on, if any
        # the cluster barrier's generation this role arrived in without waiting yet (a split
        # arrive / wait), and whether it has passed a cluster barrier: only then do its peers'
        # mbarriers exist for it (each CTA initializes its own before it first arrives)
        self.cluster_arrival: Optional[int] = None
        self.cluster_synced = False

    def ready(self) -> bool:
        return not self.finished and (self.block is None or self.block())

    def __repr__(self) -> str:
        return self.name


class Cta:
    def __init__(self, index: int, block_idx: tuple, cluster: int, rank: int):
        self.index = index
        self.block_idx = block_idx
        self.cluster = cluster
        self.rank = rank
        self.barriers: dict[tuple[int, int], Barrier] = {}
        self.allocs: dict[int, Any] = {}  # per allocating instruction: its value in this CTA
        self.named: dict[tuple[int, int], GroupBarrier] = {}
        self.tags: dict[int, list] = collections.defaultdict(list)  # alloc -> [(start, end, tag)]
        self.values: dict[SharedAddr, Any] = {}  # words written by st.async / CLC responses
        self.readers: dict[int, list] = collections.defaultdict(list)  # alloc -> [(start, end, Reader)]
        self.tmem_writers: dict[int, list] = collections.defaultdict(list)  # MMAs writing TMEM, until committed
        self.roles: list[Role] = []
        self.exited = False

    def write_tag(self, ref: MemRef, tag) -> None:
        entries = self.tags[ref.alloc]
        entries[:] = [e for e in entries if e[1] <= ref.start or e[0] >= ref.end]
        entries.append((ref.start, ref.end, tag))

    def add_reader(self, ref: MemRef, reader: Reader) -> None:
        entries = self.readers[ref.alloc]
        entries[:] = [e for e in entries if not e[2].done]
        entries.append((ref.start, ref.end, reader))

    def add_tmem_writer(self, ref: MemRef, writer: Reader) -> None:
        entries = self.tmem_writers[ref.alloc]
        entries[:] = [e for e in entries if not e[2].done]
        entries.append((ref.start, ref.end, writer))

    def pending_writer(self, ref: MemRef) -> Optional[Reader]:
        return self.pending_reader(ref.alloc, ref.start, ref.end, self.tmem_writers)

    def pending_reader(self, alloc: int, start: int, end: int, table: Optional[dict] = None) -> Optional[Reader]:
        for s, e, reader in (self.readers if table is None else table)[alloc]:
            if not reader.done and not (e <= start or s >= end):
                return reader
        return None

    def read_tags(self, ref: MemRef) -> list:
        return [t for _, _, t in self.read_spans(ref)]

    def read_spans(self, ref: MemRef) -> list:
        """The tags a view overlaps, each with the element offsets ``[start, end)`` it was written to,
        clipped to the view's span."""
        return [
            (max(s, ref.start), min(e, ref.end), t)
            for s, e, t in self.tags[ref.alloc]
            if not (e <= ref.start or s >= ref.end)
        ]
