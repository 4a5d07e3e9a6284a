"""The model a kernel's synchronization runs on: CTAs, their mbarriers, named and cluster barriers,
the asynchronous agents (TMA, the tensor core's commits, CLC responses, ``st.async``), and an
interpreter that runs each role of a CTA over the kernel's tilus IR.

A *role* is a set of threads of one CTA that follow the same path through the kernel: the thread
ranges of the ``thread_group`` statements whose bodies block (wait on an mbarrier, a named or a
cluster barrier) cut the CTA's threads into roles before the kernel runs, so every role runs the
whole kernel body and skips the groups it is not in. Statements that do not block (an elected
lane's ``arrive.expect_tx``, a warp's TMA store) run inline with the threads of the role that
execute them: an arrival made by ``k`` threads counts ``k``.

Every instruction that synchronizes becomes an event on the model; the others are no-ops, except
for what feeds control flow (scalars, barrier addresses, CLC responses, values sent with
``st.async``), a small provenance tag that follows the data (which A and B tiles each MMA read,
which accumulator a store writes) so that coverage can be checked, and the asynchronous accesses
still in flight (an MMA's operand reads and TMEM writes until a commit of its thread lands or
``wgmma.wait_group``, a ``tcgen05.ld`` until ``tcgen05.wait::ld``, a TMA store's reads until
its bulk ``wait_group``) so that an overwrite of what they still touch is a race.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable, Iterator, Optional

import numpy as np
from tilus.hidet.ir import expr as hx
from tilus.hidet.ir.primitives.cuda import vars as cuda_vars
from tilus.ir import stmt as ts
from tilus.ir.func import Function


class Finding(Exception):
    """A protocol fault: ``kind`` is one of KINDS, ``message`` says what, ``trace`` the last events."""

    def __init__(self, kind: str, message: str, trace: tuple[str, ...] = ()):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.trace = trace


KINDS = {
    "deadlock": "a wait that can never complete (every live role blocked)",
    "overrun": "a barrier phase completed again before a waiter observed the previous one, or more "
    "arrivals than its count",
    "bytes": "transaction bytes that do not match: more bytes landed than announced, or a phase "
    "held open by bytes that never come",
    "arrivals": "a CTA exited with a barrier phase partly arrived (an arrival count that does not match)",
    "exit": "a CTA exited while a peer could still write into its shared memory, TMEM or barriers, "
    "or with its own TMA stores still reading shared memory",
    "coverage": "an output tile not stored exactly once, or stored from an accumulator that did not "
    "consume every K block of its rows and columns exactly once",
    "clc": "a try_cancel issued after the cluster was answered 'no work left'",
    "race": "shared memory overwritten (TMA load, store, copy) while an MMA or a TMA store issued before "
    "may still read it",
    "livelock": "the run did not end within its step budget",
    "unsupported": "the kernel uses something the checker does not model",
}


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
    ``k0..k0+cols`` of operand ``matrix``."""

    matrix: str
    row0: int
    rows: int
    k0: int
    cols: int


class AccTag:
    """An accumulator: the (A loads, B loads) pairs of every MMA that added into it."""

    def __init__(self):
        self.terms: list[tuple[frozenset, frozenset]] = []


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
        self.wait_barrier: Optional[Barrier] = None  # the mbarrier it waits on, if any

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
        return [t for s, e, t in self.tags[ref.alloc] if not (e <= ref.start or s >= ref.end)]


class _Break(Exception):
    pass


class _Return(Exception):
    pass


# ---------------------------------------------------------------------------------------------------
# the machine


BLOCKING_CALLS = ("this_cluster.sync",)


def _blocks(stmt) -> bool:
    """Whether a statement (tree) contains a blocking synchronization."""
    found = False

    def visit(s):
        nonlocal found
        if found or s is None:
            return
        if isinstance(s, ts.InstStmt):
            if type(s.inst).__name__ in ("WaitBarrierInst", "SyncThreadsInst"):
                found = True
        elif isinstance(s, ts.EvaluateStmt):
            if isinstance(s.expr, hx.Call) and s.expr.func_var.name in BLOCKING_CALLS:
                found = True
        elif isinstance(s, ts.SeqStmt):
            for x in s.seq:
                visit(x)
        elif isinstance(s, ts.IfStmt):
            visit(s.then_body)
            visit(s.else_body)
        elif isinstance(s, (ts.ForStmt, ts.WhileStmt, ts.ThreadGroupStmt, ts.LetStmt)):
            visit(s.body)

    visit(stmt)
    return found


def role_ranges(function: Function) -> list[tuple[int, int]]:
    """Cut a CTA's threads at the bounds of every thread group whose body blocks."""
    num_threads = function.metadata.num_warps * 32
    cuts = {0, num_threads}

    def visit(s, lo, hi):
        if s is None:
            return
        if isinstance(s, ts.ThreadGroupStmt):
            if s.thread_begin < 0:
                if _blocks(s.body):
                    raise Finding("unsupported", "a blocking wait inside an elected thread group")
                return
            g_lo = lo + s.thread_begin
            g_hi = g_lo + s.num_threads
            if _blocks(s.body):
                cuts.update((g_lo, g_hi))
            visit(s.body, g_lo, g_hi)
        elif isinstance(s, ts.SeqStmt):
            for x in s.seq:
                visit(x, lo, hi)
        elif isinstance(s, ts.IfStmt):
            visit(s.then_body, lo, hi)
            visit(s.else_body, lo, hi)
        elif isinstance(s, (ts.ForStmt, ts.WhileStmt, ts.LetStmt)):
            visit(s.body, lo, hi)

    visit(function.body, 0, num_threads)
    points = sorted(cuts)
    return list(zip(points[:-1], points[1:]))


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - _c_div(a, b) * b


@dataclasses.dataclass
class Problem:
    m: int
    n: int
    k: int


class Machine:
    """One run of a kernel: a grid of CTAs in clusters, one interleaving chosen by ``choose``."""

    TRACE = 400  # events kept for a finding's trace
    LOOP_BUDGET = 1_000_000  # loop iterations one role may run between two synchronization events

    def __init__(
        self,
        function: Function,
        problem: Problem,
        resident_clusters: Optional[int] = None,
        max_steps: int = 2_000_000,
        ordered_commits: bool = True,
    ):
        self.function = function
        self.problem = problem
        # tcgen05.commit arrivals of one thread land in the order the commits were issued (each
        # commit tracks every MMA issued before it); False lets them land in any order
        self.ordered_commits = ordered_commits
        self.loop_iterations = 0
        self.clc_failed: set[int] = set()  # clusters that were answered "no work left"
        self.trace: collections.deque = collections.deque(maxlen=self.TRACE)
        self.async_ops: list[AsyncOp] = []
        self.events = 0
        self.max_steps = max_steps
        self.params = {}
        args = [problem.m, problem.n, problem.k, "a_ptr", "b_ptr", "c_ptr", ROW_STRIDE, ROW_STRIDE, ROW_STRIDE]
        for var, value in zip(function.params, args):
            self.params[var] = value
        self.num_threads = function.metadata.num_warps * 32
        self.ranges = role_ranges(function)
        grid = [self._eval_static(e) for e in function.metadata.grid_blocks]
        self.grid = tuple(int(g) for g in grid)
        cluster = tuple(int(c) for c in function.metadata.cluster_blocks)
        if cluster[1] != 1 or cluster[2] != 1:
            raise Finding("unsupported", f"cluster shape {cluster}: only clusters along x are modelled")
        self.cluster_size = cluster[0]
        if self.grid[0] % self.cluster_size:
            raise Finding("unsupported", f"grid {self.grid} is not a whole number of clusters")
        self.ctas: list[Cta] = []
        for z in range(self.grid[2]):
            for y in range(self.grid[1]):
                for x in range(self.grid[0]):
                    index = len(self.ctas)
                    cl = index // self.cluster_size
                    self.ctas.append(Cta(index, (x, y, z), cl, x % self.cluster_size))
        self.num_clusters = len(self.ctas) // self.cluster_size
        self.cluster_bars = [
            GroupBarrier(self.num_threads * self.cluster_size, f"barrier.cluster #{c}")
            for c in range(self.num_clusters)
        ]
        self.pending_clusters = collections.deque(range(self.num_clusters))
        self.resident_limit = resident_clusters or self.num_clusters
        self.resident: set[int] = set()
        self.finished_clusters: set[int] = set()
        self.roles: list[Role] = []
        self.global_names: dict[Any, GlobalRef] = {}
        self.stored = np.zeros((problem.m, problem.n), dtype=np.int32)
        self.k_block: Optional[int] = None

    # -- helpers ----------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        self.events += 1
        self.trace.append(text)

    def fail(self, kind: str, message: str):
        raise Finding(kind, message, tuple(self.trace))

    def _eval_static(self, e):
        """Evaluate a launch expression over the parameters (following the body's declarations)."""
        decls = {}

        def collect(s):
            if isinstance(s, ts.SeqStmt):
                for x in s.seq:
                    collect(x)
            elif isinstance(s, ts.DeclareStmt) and s.init is not None:
                decls[s.var] = s.init

        collect(self.function.body)
        env = dict(self.params)

        def lookup(var):
            if var not in env:
                if var not in decls:
                    raise Finding("unsupported", f"launch expression uses {var}")
                env[var] = self.eval(decls[var], env, None, lookup)
            return env[var]

        return self.eval(e, env, None, lookup)

    def cta_of(self, cta: Cta, rank: int) -> Cta:
        base = cta.index - cta.rank
        if not 0 <= rank < self.cluster_size:
            self.fail("unsupported", f"rank {rank} outside a cluster of {self.cluster_size}")
        return self.ctas[base + rank]

    def barrier(self, addr: BarrierAddr) -> Barrier:
        cta = self.ctas[addr.cta]
        try:
            return cta.barriers[(addr.alloc, addr.index)]
        except KeyError:
            self.fail("unsupported", f"no barrier at {addr}")

    # -- expressions ------------------------------------------------------------------------------
    def eval(self, e, env, role: Optional[Role], lookup=None):
        t = type(e)
        if t is int or t is bool:
            return int(e)
        if t is hx.Var:
            if e in env:
                return env[e]
            if lookup is not None:
                return lookup(e)
            return self._special(e, role)
        if t is hx.Constant:
            v = e.value
            return int(v) if isinstance(v, (bool, np.bool_)) else v
        ev = self.eval
        if isinstance(e, hx.BinaryExpr):
            a = ev(e.a, env, role, lookup)
            b = ev(e.b, env, role, lookup)
            name = t.__name__
            if name == "Add":
                return a + b
            if name == "Sub":
                return a - b
            if name == "Multiply":
                return a * b
            if name == "Div":
                return _c_div(a, b)
            if name == "Mod":
                return _c_mod(a, b)
            if name == "BitwiseAnd":
                return int(a) & int(b)
            if name == "BitwiseOr":
                return int(a) | int(b)
            if name == "BitwiseXor":
                return int(a) ^ int(b)
            if name == "LeftShift":
                return int(a) << int(b)
            if name == "RightShift":
                return int(a) >> int(b)
            if name == "LessThan":
                return int(a < b)
            if name == "LessEqual":
                return int(a <= b)
            if name == "Equal":
                return int(a == b)
            if name == "NotEqual":
                return int(a != b)
            if name == "LogicalAnd":
                return int(bool(a) and bool(b))
            if name == "LogicalOr":
                return int(bool(a) or bool(b))
            self.fail("unsupported", f"expression {name}")
        name = t.__name__
        if name == "LogicalNot":
            return int(not ev(e.a, env, role, lookup))
        if name == "Neg":
            return -ev(e.a, env, role, lookup)
        if name == "BitwiseNot":
            return ~int(ev(e.a, env, role, lookup))
        if name == "Cast":
            v = ev(e.expr, env, role, lookup)
            return v
        if name == "IfThenElse":
            c = ev(e.cond, env, role, lookup)
            return ev(e.then_expr if c else e.else_expr, env, role, lookup)
        if name == "Call":
            return self.call(e, env, role)
        self.fail("unsupported", f"expression {name}: {e}")

    def _special(self, var, role: Optional[Role]):
        name = var.name or var.hint
        if name and name.startswith("gridDim."):
            return self.grid["xyz".index(name[-1])]
        if role is None:
            self.fail("unsupported", f"variable {var} outside a CTA")
        cta = role.cta
        if name and name.startswith("blockIdx."):
            return cta.block_idx["xyz".index(name[-1])]
        if var is cuda_vars.clusterBlockRank:
            return cta.rank
        if var is cuda_vars.clusterBlockIdx.x:
            return cta.rank
        if var in (cuda_vars.clusterBlockIdx.y, cuda_vars.clusterBlockIdx.z):
            return 0
        if var is cuda_vars.clusterSize or var is cuda_vars.clusterDim.x:
            return self.cluster_size
        if name and name.startswith("threadIdx"):
            self.fail("unsupported", "control flow that depends on threadIdx")
        self.fail("unsupported", f"unbound variable {var}")

    def call(self, e, env, role):
        fname = e.func_var.name
        args = [self.eval(a, env, role) for a in e.args]
        if fname in ("generic_min", "generic_max"):
            return min(args) if fname == "generic_min" else max(args)
        if fname.startswith(NO_OP_CALLS):
            return None
        if fname == "cuda_ld_shared_b32_ordered":
            addr = args[0]
            return role.cta.values.get(addr, 0)
        self.fail("unsupported", f"call {fname}")

    # -- barrier events ---------------------------------------------------------------------------
    def arrive(self, role: Role, addr: BarrierAddr, arrivals: int, tx: int, why: str) -> None:
        target = self.ctas[addr.cta]
        b = self.barrier(addr)
        self.log(f"{role.name}: {why} on {b.name}: {arrivals} arrival(s)" + (f", expect {tx} bytes" if tx else ""))
        if target.exited:
            self.fail("exit", f"{role.name} arrives on {b.name} of cta{target.index}, which has exited")
        b.tx += tx
        self._arrivals(b, arrivals)

    def _arrivals(self, b: Barrier, arrivals: int) -> None:
        if arrivals > b.pending:
            self.fail(
                "overrun",
                f"{arrivals} arrival(s) on {b.name} with only {b.pending} outstanding in phase "
                f"{b.completed} ({b.state()})",
            )
        b.pending -= arrivals
        self._maybe_complete(b)

    def complete_tx(self, addr: BarrierAddr, nbytes: int, why: str) -> None:
        target = self.ctas[addr.cta]
        b = self.barrier(addr)
        self.log(f"{why}: {nbytes} bytes land on {b.name}")
        if target.exited:
            self.fail("exit", f"{why}: bytes land on {b.name} of cta{target.index}, which has exited")
        b.tx -= nbytes
        if b.tx < 0 and b.pending == 0:
            self.fail(
                "bytes",
                f"{why}: {-b.tx} more bytes than announced landed on {b.name} after every arrival "
                f"of phase {b.completed}",
            )
        self._maybe_complete(b)

    def _maybe_complete(self, b: Barrier) -> None:
        if b.pending == 0 and b.tx == 0:
            n = b.completed
            for op in self.async_ops:
                if b.addr in op.byte_barriers:
                    self.fail(
                        "bytes",
                        f"{b.name} completes phase {n} with every announced byte landed while "
                        f"{op.what} still has bytes on the way to it (fewer bytes announced than sent)",
                    )
            for role, seen in b.observed.items():
                if not role.finished and seen is not None and seen < n - 1:
                    self.fail(
                        "overrun",
                        f"{b.name} completes phase {n} while {role.name} has not yet observed "
                        f"phase {n - 1} (it last saw {seen})",
                    )
            b.completed += 1
            b.pending = b.count
            self.log(f"{b.name} completes phase {n}")

    # -- the scheduler ----------------------------------------------------------------------------
    def launch_ready_clusters(self) -> None:
        while self.pending_clusters and len(self.resident) < self.resident_limit:
            self.launch(self.pending_clusters.popleft())

    def launch(self, cluster: int) -> None:
        self.resident.add(cluster)
        self.log(f"cluster {cluster} launches")
        for cta in self.ctas[cluster * self.cluster_size : (cluster + 1) * self.cluster_size]:
            for lo, hi in self.ranges:
                role = Role(cta, lo, hi)
                role.gen = self.run_role(role)
                cta.roles.append(role)
                self.roles.append(role)

    def cancel_cluster(self) -> Optional[int]:
        """A CLC ``try_cancel``: the next cluster not launched yet, or None."""
        if self.pending_clusters:
            return self.pending_clusters.popleft()
        return None

    def step_role(self, role: Role) -> None:
        if role.on_resume is not None:
            role.on_resume()
            role.on_resume = None
        role.block = None
        self.loop_iterations = 0
        try:
            request = next(role.gen)
        except StopIteration:
            self.finish(role)
            return
        if request is not None:
            role.block, role.on_resume, role.waiting_on = request

    def count_iteration(self, role: Role) -> None:
        self.loop_iterations += 1
        if self.loop_iterations > self.LOOP_BUDGET:
            self.fail("livelock", f"{role.name} ran {self.LOOP_BUDGET} loop iterations without synchronizing")

    def finish(self, role: Role) -> None:
        role.finished = True
        self.log(f"{role.name} ends")
        cta = role.cta
        if role.bulk_groups or role.uncommitted_stores:
            self.fail(
                "exit",
                f"{role.name} ends with TMA stores that may still read shared memory (no bulk wait_group 0 after them)",
            )
        if all(r.finished for r in cta.roles):
            self.exit_cta(cta)

    def exit_cta(self, cta: Cta) -> None:
        cta.exited = True
        self.log(f"cta{cta.index} exits")
        for op in self.async_ops:
            if cta.index in op.targets:
                self.fail("exit", f"cta{cta.index} exits while {op.what} is still in flight into it")
        for table in (cta.readers, cta.tmem_writers):
            for entries in table.values():
                for *_, access in entries:
                    if not access.done:
                        self.fail("exit", f"cta{cta.index} exits while {access.what} may still access its memory")
        for b in cta.barriers.values():
            if b.pending != b.count:
                self.fail("arrivals", f"cta{cta.index} exits with {b.name} partly arrived ({b.state()})")
            if b.tx != 0:
                self.fail("bytes", f"cta{cta.index} exits with {b.name} holding {b.tx} transaction bytes ({b.state()})")
        base = cta.cluster * self.cluster_size
        if all(c.exited for c in self.ctas[base : base + self.cluster_size]):
            self.resident.discard(cta.cluster)
            self.finished_clusters.add(cta.cluster)
            self.launch_ready_clusters()

    def eligible_async(self) -> list[AsyncOp]:
        heads, seen = [], set()
        for op in self.async_ops:
            if op.queue is None:
                heads.append(op)
            elif op.queue not in seen:
                seen.add(op.queue)
                heads.append(op)
        return heads

    def fire(self, op: AsyncOp) -> None:
        self.async_ops.remove(op)
        op.fire()

    def run(self, choose: Callable[[list[Role], list[AsyncOp]], Any]) -> None:
        self.launch_ready_clusters()
        steps = 0
        while True:
            steps += 1
            if steps > self.max_steps:
                self.fail("livelock", f"more than {self.max_steps} steps")
            ready = [r for r in self.roles if not r.finished and r.ready()]
            ops = self.eligible_async()
            if not ready and not ops:
                live = [r for r in self.roles if not r.finished]
                if not live and not self.pending_clusters:
                    break
                if not live:
                    self.launch_ready_clusters()
                    continue
                self.report_deadlock(live)
            pick = choose(ready, ops)
            if isinstance(pick, AsyncOp):
                self.fire(pick)
            else:
                self.step_role(pick)
        self.check_coverage()

    def report_deadlock(self, live: list[Role]) -> None:
        lines = [f"{r.name} waits on {r.waiting_on() if callable(r.waiting_on) else r.waiting_on}" for r in live]
        kind = "deadlock"
        # bytes that landed before their announcement (tx < 0) mean the stall is elsewhere
        early = any(b.tx < 0 for c in self.ctas for b in c.barriers.values())
        for r in live:
            b = r.wait_barrier
            if not early and b is not None and b.pending == 0 and b.tx > 0:
                kind = "bytes"
                lines.insert(0, f"{b.name} has every arrival but waits for {b.tx} bytes that never come")
                break
        self.fail(kind, "every live role is blocked: " + "; ".join(lines[:12]) + (" ..." if len(lines) > 12 else ""))

    def check_write(self, cta: Cta, alloc: int, start: int, end: int, what: str) -> None:
        reader = cta.pending_reader(alloc, start, end)
        if reader is not None:
            self.fail("race", f"{what} overwrites shared memory of cta{cta.index} that {reader.what} may still read")

    # -- coverage ---------------------------------------------------------------------------------
    def record_store(self, role: Role, tags: list, offsets: list, shape: tuple, why: str) -> None:
        p = self.problem
        r0, c0 = offsets
        r1, c1 = min(r0 + shape[0], p.m), min(c0 + shape[1], p.n)
        r0, c0 = max(r0, 0), max(c0, 0)
        self.log(f"{role.name}: {why} C[{r0}:{r1}, {c0}:{c1}]")
        if r1 <= r0 or c1 <= c0:
            return
        accs = [t for t in tags if isinstance(t, AccTag)]
        if not accs:
            self.fail("coverage", f"{role.name} stores C[{r0}:{r1}, {c0}:{c1}] from data no MMA computed")
        for acc in accs:
            self.check_acc(role, acc, r0, r1, c0, c1)
        self.stored[r0:r1, c0:c1] += 1

    def check_acc(self, role, acc: AccTag, r0, r1, c0, c1) -> None:
        where = f"{role.name} stores C[{r0}:{r1}, {c0}:{c1}]"
        ks = []
        for first, second in acc.terms:
            if all(t.k0 >= self.problem.k for t in first | second):
                continue  # a K block wholly past K (a split that got none): TMA fills it with zeros
            # which operand holds A's rows is the MMA's business (swap-AB kernels compute C^T)
            loads = first | second
            a_loads = frozenset(t for t in loads if t.matrix == "A")
            b_loads = frozenset(t for t in loads if t.matrix == "B")
            k_offsets = {t.k0 for t in loads}
            if len(k_offsets) != 1 or not a_loads or not b_loads:
                self.fail(
                    "coverage",
                    f"{where}: one MMA read A and B of different K blocks, or not both ({sorted(k_offsets)})",
                )
            if ({t.matrix for t in first} == {t.matrix for t in second}) or len(a_loads | b_loads) != len(loads):
                self.fail("coverage", f"{where}: an MMA read the wrong operand")
            if not _covers(a_loads, r0, r1) or not _covers(b_loads, c0, c1):
                self.fail(
                    "coverage",
                    f"{where}: an MMA at K offset {k_offsets.pop()} read A or B tiles that do "
                    f"not hold these rows/columns",
                )
            ks.append(next(iter(k_offsets)))
        block = self.k_block
        want = list(range(0, self.problem.k, block)) if block else []
        if sorted(ks) != want:
            missing = sorted(set(want) - set(ks))
            extra = sorted(k for k in set(ks) if ks.count(k) > 1 or k not in want)
            self.fail(
                "coverage",
                f"{where}: accumulated K offsets {sorted(ks)}; missing {missing}, repeated or foreign {extra}",
            )

    def check_coverage(self) -> None:
        bad = np.argwhere(self.stored != 1)
        if len(bad):
            r, c = bad[0]
            count = self.stored[r, c]
            never = int((self.stored == 0).sum())
            twice = int((self.stored > 1).sum())
            self.fail(
                "coverage",
                f"C[{r}, {c}] stored {count} times ({never} elements never stored, {twice} stored more than once)",
            )

    # -- the interpreter --------------------------------------------------------------------------
    def run_role(self, role: Role) -> Iterator:
        env: dict = dict(self.params)
        try:
            yield from self.exec(self.function.body, env, role, (0, self.num_threads), (role.lo, role.hi))
        except _Return:
            pass

    def exec(self, s, env, role, group, active) -> Iterator:
        t = type(s)
        if t is ts.SeqStmt:
            for x in s.seq:
                yield from self.exec(x, env, role, group, active)
        elif t is ts.InstStmt:
            result = self.inst(s.inst, env, role, group, active)
            if result is not None:
                yield from result
        elif t is ts.DeclareStmt:
            env[s.var] = self.eval(s.init, env, role) if s.init is not None else 0
        elif t is ts.AssignStmt:
            env[s.var] = self.eval(s.value, env, role)
        elif t is ts.ForStmt:
            extent = self.eval(s.extent, env, role)
            try:
                for i in range(extent):
                    self.count_iteration(role)
                    env[s.iter_var] = i
                    yield from self.exec(s.body, env, role, group, active)
            except _Break:
                pass
        elif t is ts.WhileStmt:
            try:
                while self.eval(s.cond, env, role):
                    self.count_iteration(role)
                    yield from self.exec(s.body, env, role, group, active)
            except _Break:
                pass
        elif t is ts.IfStmt:
            if self.eval(s.cond, env, role):
                yield from self.exec(s.then_body, env, role, group, active)
            elif s.else_body is not None:
                yield from self.exec(s.else_body, env, role, group, active)
        elif t is ts.BreakStmt:
            raise _Break()
        elif t is ts.ReturnStmt:
            raise _Return()
        elif t is ts.LetStmt:
            for var, value in zip(s.bind_vars, s.bind_values):
                env[var] = self.eval(value, env, role)
            yield from self.exec(s.body, env, role, group, active)
        elif t is ts.ThreadGroupStmt:
            if s.thread_begin < 0:  # elect-any: the lowest threads of the parent group
                sub = (group[0], group[0] + s.num_threads)
            else:
                sub = (group[0] + s.thread_begin, group[0] + s.thread_begin + s.num_threads)
            inner = (max(sub[0], active[0]), min(sub[1], active[1]))
            if inner[0] < inner[1]:
                yield from self.exec(s.body, env, role, sub, inner)
        elif t is ts.EvaluateStmt:
            if s.pred is not None and not self.eval(s.pred, env, role):
                return
            yield from self.evaluate(s.expr, env, role, group, active)
        elif t is ts.TensorItemValueStmt:
            value = env[s.tensor]
            if value.data is None or len(value.data) != 1:
                self.fail("unsupported", f"item() of a tensor the checker holds no value for ({s.tensor})")
            env[s.var] = value.data[0]
        elif t is ts.TensorItemPtrStmt:
            ref = env[s.tensor]
            env[s.ptr_var] = ref if isinstance(ref, GlobalRef) else SharedAddr(ref.cta, ref.alloc, ref.start)
        else:
            self.fail("unsupported", f"statement {t.__name__}")

    def evaluate(self, e, env, role, group, active) -> Iterator:
        if not isinstance(e, hx.Call):
            self.eval(e, env, role)
            return
        fname = e.func_var.name
        if fname == "this_cluster.sync":
            bar = self.cluster_bars[role.cta.cluster]
            yield from self.group_sync(role, bar, active[1] - active[0])
        elif fname == "cuda_st_async_cluster_b32":
            local_addr, local_bar, rank, value = [self.eval(a, env, role) for a in e.args]
            target = self.cta_of(role.cta, rank)
            slot = SharedAddr(target.index, local_addr.alloc, local_addr.start)
            bar = BarrierAddr(target.index, local_bar.alloc, local_bar.index)

            def land(slot=slot, bar=bar, value=value, who=role.name):
                self.ctas[slot.cta].values[slot] = value
                self.complete_tx(bar, 4, f"st.async from {who} (value {value})")

            self.log(f"{role.name}: st.async {value} to cta{target.index}")
            self.async_ops.append(AsyncOp(f"st.async from {role.name}", land, (target.index,), byte_barriers=(bar,)))
            yield None
        elif fname == "cuda_bulk_copy_to_rank":
            local_dst, src, size, local_bar, rank = [self.eval(a, env, role) for a in e.args]
            target = self.cta_of(role.cta, rank)
            bar = BarrierAddr(target.index, local_bar.alloc, local_bar.index)
            # the source's tags travel with the bytes, over the elements the copy covers
            length = int(size / role.cta.allocs[src.alloc].elem_bytes)
            tags = [
                (max(st, src.start) - src.start, min(en, src.start + length) - src.start, tag)
                for st, en, tag in role.cta.tags[src.alloc]
                if st < src.start + length and en > src.start
            ]

            def land(target=target, bar=bar, tags=tags, size=size, who=role.name):
                entries = target.tags[local_dst.alloc]
                lo, hi = local_dst.start, local_dst.start + length
                self.check_write(target, local_dst.alloc, lo, hi, f"a bulk copy from {who}")
                entries[:] = [e for e in entries if e[1] <= lo or e[0] >= hi]
                entries.extend((lo + st, lo + en, tag) for st, en, tag in tags)
                self.complete_tx(bar, size, f"bulk copy from {who} into cta{target.index}")

            self.log(f"{role.name}: bulk copy of {size} bytes to cta{target.index}")
            self.async_ops.append(AsyncOp(f"a bulk copy from {role.name}", land, (target.index,), byte_barriers=(bar,)))
            yield None
        else:
            self.eval(e, env, role)

    def group_sync(self, role, bar: GroupBarrier, threads: int) -> Iterator:
        generation = bar.generation
        bar.arrived += threads
        self.log(f"{role.name}: arrives at {bar.name} ({bar.arrived}/{bar.expected})")
        if bar.arrived > bar.expected:
            self.fail("overrun", f"{bar.name}: {bar.arrived} threads arrived, {bar.expected} expected")
        if bar.arrived == bar.expected:
            bar.arrived = 0
            bar.generation += 1
            self.log(f"{bar.name} opens")
        role.wait_barrier = None
        yield (lambda: bar.generation > generation), None, bar.name

    # -- instructions -----------------------------------------------------------------------------
    def inst(self, inst, env, role: Role, group, active):
        name = type(inst).__name__
        handler = getattr(self, "i_" + name, None)
        if handler is None:
            if name in NO_OPS:
                return None
            self.fail("unsupported", f"instruction {name}")
        return handler(inst, env, role, group, active)

    def _alloc(self, inst, role, make):
        cta = role.cta
        key = id(inst)
        if key not in cta.allocs:
            cta.allocs[key] = make()
        return cta.allocs[key]

    def i_GlobalViewInst(self, inst, env, role, group, active):
        out = inst.global_output
        if out not in self.global_names:
            names = "ABC"
            if len(self.global_names) >= 3:
                self.fail("unsupported", "more than three global views")
            self.global_names[out] = GlobalRef(names[len(self.global_names)])
        env[out] = self.global_names[out]

    def i_AllocBarrierInst(self, inst, env, role, group, active):
        cta = role.cta
        key = id(inst)

        def make():
            counts = [self.eval(c, env, role) if c is not None else group[1] - group[0] for c in inst.counts]
            alloc = len(cta.allocs)
            for i, c in enumerate(counts):
                addr = BarrierAddr(cta.index, key, i)
                cta.barriers[(key, i)] = Barrier(addr, c, f"cta{cta.index}.mbar{alloc}[{i}]")
            return RegVal([BarrierAddr(cta.index, key, i) for i in range(len(counts))], (len(counts),))

        env[inst.register_output] = self._alloc(inst, role, make)

    def _mem(self, inst, role, tensor):
        shape = tuple(int(s) for s in tensor.shape)
        return MemRef(role.cta.index, id(inst), 0, shape, row_major(shape), tensor.dtype.nbits / 8)

    def i_AllocateSharedInst(self, inst, env, role, group, active):
        env[inst.shared_output] = self._alloc(inst, role, lambda: self._mem(inst, role, inst.shared_output))

    def i_Tcgen05AllocInst(self, inst, env, role, group, active):
        env[inst.output] = self._alloc(inst, role, lambda: self._mem(inst, role, inst.output))

    def i_AllocateRegisterInst(self, inst, env, role, group, active):
        env[inst.register_output] = RegVal(None, tuple(inst.register_output.shape), AccTag())

    def _slice(self, ref: MemRef, offsets, dims, out_shape) -> MemRef:
        start = ref.start + sum(o * st for o, st in zip(offsets, ref.strides))
        keep = range(len(ref.shape)) if dims is None else dims
        strides = tuple(ref.strides[d] for d in keep)
        shape = tuple(int(s) for s in out_shape)
        if len(strides) != len(shape):
            strides = row_major(shape)
        return dataclasses.replace(ref, start=start, shape=shape, strides=strides)

    def i_SliceSharedInst(self, inst, env, role, group, active):
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        env[inst.shared_output] = self._slice(env[inst.inputs[0]], offsets, inst.dims, inst.shared_output.shape)

    def i_Tcgen05SliceInst(self, inst, env, role, group, active):
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        env[inst.output] = self._slice(env[inst.inputs[0]], offsets, inst.slice_dims, inst.output.shape)

    def i_PermuteSharedInst(self, inst, env, role, group, active):
        ref = env[inst.inputs[0]]
        dims = inst.dims
        env[inst.shared_output] = dataclasses.replace(
            ref, shape=tuple(ref.shape[d] for d in dims), strides=tuple(ref.strides[d] for d in dims)
        )

    def i_ReshapeSharedInst(self, inst, env, role, group, active):
        ref = env[inst.inputs[0]]
        shape = tuple(int(s) for s in inst.shared_output.shape)
        env[inst.shared_output] = dataclasses.replace(ref, shape=shape, strides=row_major(shape))

    def i_SliceRegisterInst(self, inst, env, role, group, active):
        value = env[inst.inputs[0]]
        out = inst.register_output
        if value.data is not None:
            offsets = [self.eval(o, env, role) for o in inst.offsets]
            strides = row_major(value.shape)
            start = sum(o * s for o, s in zip(offsets, strides))
            size = math.prod(int(s) for s in out.shape)
            if size != 1:
                self.fail("unsupported", "a slice of more than one element of a tensor of addresses")
            env[out] = RegVal([value.data[start]], (), None)
        else:
            env[out] = RegVal(None, tuple(out.shape), value.tag)

    def _same_tag(self, inst, env, role, group, active):
        value = env[inst.inputs[0]]
        env[inst.register_output] = RegVal(value.data, tuple(inst.register_output.shape), value.tag)

    i_CastInst = _same_tag
    i_ViewInst = _same_tag
    i_TransposeInst = _same_tag

    def i_AddInst(self, inst, env, role, group, active):
        tags = [env[x].tag for x in inst.inputs if isinstance(env[x].tag, AccTag)]
        if len(tags) > 1:
            merged = AccTag()
            for t in tags:
                merged.terms.extend(t.terms)
            tags = [merged]
        env[inst.register_output] = RegVal(None, tuple(inst.register_output.shape), tags[0] if tags else None)

    def i_LoadSharedInst(self, inst, env, role, group, active):
        tags = role.cta.read_tags(env[inst.inputs[0]])
        accs = [t for t in tags if isinstance(t, AccTag)]
        env[inst.register_output] = RegVal(
            None, tuple(inst.register_output.shape), accs[0] if accs else (tags[0] if tags else None)
        )

    def i_MapSharedAddrInst(self, inst, env, role, group, active):
        value = env[inst.inputs[0]]
        rank = self.eval(inst.target_rank, env, role)
        target = self.cta_of(role.cta, rank).index
        data = [dataclasses.replace(a, cta=target) for a in value.data]
        env[inst.register_output] = RegVal(data, value.shape, None)

    def _threads(self, active) -> int:
        return active[1] - active[0]

    def i_ArriveBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        count = self.eval(inst.count, env, role)
        self.arrive(role, addr, self._threads(active) * count, 0, "arrive")
        yield None

    def i_ArriveExpectTxBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        nbytes = self.eval(inst.transaction_bytes, env, role)
        k = self._threads(active)
        self.arrive(role, addr, k, k * nbytes, "arrive.expect_tx")
        yield None

    def i_ArriveExpectTxRemoteBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        nbytes = self.eval(inst.transaction_bytes, env, role)
        rank = self.eval(inst.target_rank, env, role)
        target = self.cta_of(role.cta, rank)
        k = self._threads(active)
        self.arrive(role, dataclasses.replace(addr, cta=target.index), k, k * nbytes, "remote arrive")
        yield None

    def i_ArriveExpectTxMulticastBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        nbytes = self.eval(inst.transaction_bytes, env, role)
        # thread i of the group arrives on the barrier of CTA rank i, for each bit i of the mask
        for lane in range(active[0] - group[0], active[1] - group[0]):
            if (inst.multicast >> lane) & 1:
                target = self.cta_of(role.cta, lane)
                self.arrive(role, dataclasses.replace(addr, cta=target.index), 1, nbytes, "multicast arrive")
        yield None

    def i_WaitBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        parity = self.eval(inst.phase, env, role)
        if addr.cta != role.cta.index:
            self.fail("unsupported", f"{role.name} waits on a barrier of another CTA")
        b = self.barrier(addr)
        b.observed.setdefault(role, None)

        def ready():
            return (b.completed & 1) != (parity & 1)

        def resume():
            seen = b.completed - 1
            last = b.observed.get(role)
            if last is None:
                if seen not in (-1, 0):
                    self.fail(
                        "overrun",
                        f"{role.name}'s first wait on {b.name} (parity {parity}) returns on phase "
                        f"{seen}: earlier phases were never observed",
                    )
            elif seen != last + 1:
                self.fail(
                    "overrun",
                    f"{role.name}'s wait on {b.name} (parity {parity}) returns on phase {seen}; "
                    f"it last saw phase {last}",
                )
            b.observed[role] = seen
            self.log(f"{role.name}: wait on {b.name} parity {parity} returns (phase {seen})")

        role.wait_barrier = b
        yield ready, resume, lambda: f"{b.name} parity {parity} ({b.state()})"

    def i_SyncThreadsInst(self, inst, env, role, group, active):
        cta = role.cta
        key = group
        if key not in cta.named:
            cta.named[key] = GroupBarrier(group[1] - group[0], f"cta{cta.index}.bar.sync[{group[0]}:{group[1]}]")
        return self.group_sync(role, cta.named[key], self._threads(active))

    # -- TMA --------------------------------------------------------------------------------------
    def i_CopyAsyncTensorGlobalToSharedInst(self, inst, env, role, group, active):
        dst: MemRef = env[inst.inputs[0]]
        src: GlobalRef = env[inst.inputs[1]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        bar: BarrierAddr = self.eval(inst.mbarrier, env, role)
        mask = self.eval(inst.multicast_mask, env, role) if inst.multicast_mask is not None else None
        cta = role.cta
        if src.matrix not in "AB":
            self.fail("unsupported", f"a TMA load from {src.matrix}")
        rows, cols = dst.shape[-2], dst.shape[-1]
        tag = LoadTag(src.matrix, offsets[0], rows, offsets[1], cols)
        if src.matrix == "A" and self.k_block is None:
            self.k_block = cols
        if mask is None:
            dests = [(cta, bar)]
        else:
            dests = []
            bar_rank = self.ctas[bar.cta].rank
            for rank in range(self.cluster_size):
                if (mask >> rank) & 1:
                    d = self.cta_of(cta, rank)
                    if inst.cta_group == 2:  # the barrier of the same member (leader/peer) of d's pair
                        b_cta = self.cta_of(cta, (rank & ~1) + (bar_rank & 1))
                    else:
                        b_cta = d
                    dests.append((d, dataclasses.replace(bar, cta=b_cta.index)))
        nbytes = dst.nbytes
        for d, b in dests:
            if d.exited:
                self.fail("exit", f"{role.name} TMA-loads into cta{d.index}, which has exited")
            self.check_write(d, dst.alloc, dst.start, dst.end, f"{role.name}'s TMA load")
            d.write_tag(dst.at(d.index), tag)

            def land(b=b, d=d):
                self.complete_tx(
                    b, nbytes, f"TMA load {src.matrix}[{offsets[0]}+{rows}, {offsets[1]}+{cols}] into cta{d.index}"
                )

            self.async_ops.append(
                AsyncOp(
                    f"a TMA load from {role.name}",
                    land,
                    (d.index, b.cta) if b.cta != d.index else (d.index,),
                    byte_barriers=(b,),
                )
            )
        self.log(
            f"{role.name}: TMA load {src.matrix}[{offsets[0]}:+{rows}, {offsets[1]}:+{cols}] "
            f"{nbytes} bytes to {[d.index for d, _ in dests]}"
        )
        yield None

    def i_CopyAsyncTensorSharedToGlobalInst(self, inst, env, role, group, active):
        dst: GlobalRef = env[inst.inputs[0]]
        src: MemRef = env[inst.inputs[1]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        if dst.matrix != "C":
            self.fail("unsupported", f"a TMA store into {dst.matrix}")
        self.record_store(role, role.cta.read_tags(src), offsets, src.shape[-2:], "TMA store")
        reader = Reader(f"a TMA store by {role.name}")
        role.cta.add_reader(src, reader)
        role.uncommitted_stores.append(reader)

    def i_CopyAsyncTensorCommitGroupInst(self, inst, env, role, group, active):
        if role.uncommitted_stores:
            role.bulk_groups.append(role.uncommitted_stores)
            role.uncommitted_stores = []

    def i_CopyAsyncTensorWaitGroupInst(self, inst, env, role, group, active):
        _complete_all_but(role.bulk_groups, int(self.eval(inst.n, env, role)))

    def i_LoadGlobalInst(self, inst, env, role, group, active):
        src: GlobalRef = env[inst.inputs[0]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        shape = tuple(int(s) for s in inst.register_output.shape)
        if src.matrix == "A" and self.k_block is None:
            self.k_block = shape[-1]
        env[inst.register_output] = RegVal(None, shape, LoadTag(src.matrix, offsets[0], shape[0], offsets[1], shape[1]))

    def i_SliceGlobalInst(self, inst, env, role, group, active):
        ref: GlobalRef = env[inst.inputs[0]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        row, col = offsets[-2:] if len(offsets) >= 2 else (0, offsets[0] if offsets else 0)
        env[inst.global_output] = dataclasses.replace(ref, base=ref.base + row * ROW_STRIDE + col)

    def _generic_origin(self, inst, env, role) -> tuple[GlobalRef, int, int]:
        """The matrix and (row, column) a lowered load/store starts at: its offset at axes 0."""
        ref: GlobalRef = env[inst.ptr]
        local = dict(env)
        for axis in inst.axes:
            local[axis] = 0
        offset = ref.base + self.eval(inst.offset, local, role)
        return ref, offset // ROW_STRIDE, offset % ROW_STRIDE

    def i_LoadGlobalGenericInst(self, inst, env, role, group, active):
        ref, row, col = self._generic_origin(inst, env, role)
        shape = tuple(int(s) for s in inst.register_output.shape)
        if ref.matrix == "A" and self.k_block is None:
            self.k_block = shape[-1]
        env[inst.register_output] = RegVal(None, shape, LoadTag(ref.matrix, row, shape[0], col, shape[1]))

    def i_StoreGlobalGenericInst(self, inst, env, role, group, active):
        ref, row, col = self._generic_origin(inst, env, role)
        if ref.matrix != "C":
            self.fail("unsupported", f"a store into {ref.matrix}")
        value: RegVal = env[inst.inputs[0]]
        self.record_store(role, [value.tag], [row, col], value.shape[-2:], "store")

    def i_StoreGlobalInst(self, inst, env, role, group, active):
        # the destination is C (the only global view stored to)
        value: RegVal = env[inst.inputs[1]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        self.record_store(role, [value.tag], offsets, value.shape[-2:], "store")

    def i_StoreSharedInst(self, inst, env, role, group, active):
        dst: MemRef = env[inst.inputs[0]]
        value: RegVal = env[inst.inputs[1]]
        self.check_write(role.cta, dst.alloc, dst.start, dst.end, f"{role.name}'s store")
        role.cta.write_tag(dst, value.tag)

    # -- MMA --------------------------------------------------------------------------------------
    def _reads(self, cta: Cta, ref: MemRef) -> frozenset:
        return frozenset(t for t in cta.read_tags(ref.at(cta.index)) if isinstance(t, LoadTag))

    def i_WgmmaMmaSSInst(self, inst, env, role, group, active):
        a, b, d = (env[x] for x in inst.inputs)
        d.tag.terms.append((self._reads(role.cta, a), self._reads(role.cta, b)))
        reader = Reader(f"a wgmma of {role.name}")
        role.cta.add_reader(a, reader)
        role.cta.add_reader(b, reader)
        role.wgmma_open.append(reader)

    def i_WgmmaCommitGroupInst(self, inst, env, role, group, active):
        role.wgmma_groups.append(role.wgmma_open)
        role.wgmma_open = []

    def i_WgmmaWaitGroupInst(self, inst, env, role, group, active):
        _complete_all_but(role.wgmma_groups, int(self.eval(inst.n, env, role)))

    def i_Tcgen05MmaSSInst(self, inst, env, role, group, active):
        a, b, d = (env[x] for x in inst.inputs)
        enable = self.eval(inst.enable_input_d, env, role)
        cta = role.cta
        if inst.cta_group == 2:
            if cta.rank % 2:
                self.fail("unsupported", "a cta_group::2 MMA issued by an odd CTA")
            members = [cta, self.cta_of(cta, cta.rank + 1)]
        else:
            members = [cta]
        b_reads = frozenset().union(*(self._reads(c, b) for c in members))
        reader = Reader(f"an MMA of {role.name}")
        role.mma_reads.append(reader)
        for c in members:
            c.add_reader(a.at(c.index), reader)
            c.add_reader(b.at(c.index), reader)
            if c.exited:
                self.fail("exit", f"{role.name}'s MMA writes the TMEM of cta{c.index}, which has exited")
            tmem = d.at(c.index)
            loading = c.pending_reader(tmem.alloc, tmem.start, tmem.end)
            if loading is not None:
                self.fail(
                    "race",
                    f"{role.name}'s MMA overwrites TMEM of cta{c.index} that {loading.what} may still "
                    f"read (no tcgen05.wait::ld before the buffer was handed back)",
                )
            c.add_tmem_writer(tmem, reader)
            acc = None if not enable else next((t for t in c.read_tags(tmem) if isinstance(t, AccTag)), None)
            if acc is None:
                acc = AccTag()
                c.write_tag(tmem, acc)
            acc.terms.append((self._reads(c, a), b_reads))

    def i_Tcgen05CommitInst(self, inst, env, role, group, active):
        bar: BarrierAddr = self.eval(inst.mbarrier, env, role)
        if inst.multicast_mask is not None:
            targets = [
                dataclasses.replace(bar, cta=self.cta_of(role.cta, r).index)
                for r in range(self.cluster_size)
                if (inst.multicast_mask >> r) & 1
            ]
        else:
            targets = [bar]

        tracked = [r for r in role.mma_reads if not r.done]  # a commit tracks every MMA issued before it
        role.mma_reads = tracked

        def land(targets=targets, who=role.name, tracked=tracked):
            for reader in tracked:
                reader.done = True
            for t in targets:
                self.arrive_async(t, f"tcgen05.commit from {who}")

        self.log(f"{role.name}: tcgen05.commit to {[self.barrier(t).name for t in targets]}")
        self.async_ops.append(
            AsyncOp(
                f"a tcgen05.commit from {role.name}",
                land,
                tuple(t.cta for t in targets),
                queue=("commit", role) if self.ordered_commits else None,
            )
        )
        yield None

    def arrive_async(self, addr: BarrierAddr, why: str) -> None:
        target = self.ctas[addr.cta]
        b = self.barrier(addr)
        self.log(f"{why}: 1 arrival on {b.name}")
        if target.exited:
            self.fail("exit", f"{why} arrives on {b.name} of cta{target.index}, which has exited")
        self._arrivals(b, 1)

    def i_Tcgen05LoadInst(self, inst, env, role, group, active):
        ref: MemRef = env[inst.inputs[0]]
        writer = role.cta.pending_writer(ref)
        if writer is not None:
            self.fail(
                "race",
                f"{role.name}'s tcgen05.ld reads TMEM that {writer.what} may still write (no commit of it has landed)",
            )
        load = Reader(f"a tcgen05.ld of {role.name}")
        role.cta.add_reader(ref, load)
        role.tmem_loads.append(load)
        accs = [t for t in role.cta.read_tags(ref) if isinstance(t, AccTag)]
        env[inst.register_output] = RegVal(None, tuple(inst.register_output.shape), accs[0] if accs else None)

    def i_Tcgen05WaitInst(self, inst, env, role, group, active):
        if inst.wait_load:
            for load in role.tmem_loads:
                load.done = True
            role.tmem_loads = []

    # -- cluster launch control -------------------------------------------------------------------
    def i_ClusterLaunchControlTryCancelInst(self, inst, env, role, group, active):
        slot: MemRef = env[inst.inputs[0]]
        bar: BarrierAddr = self.eval(inst.mbarrier, env, role)
        multicast = self.eval(inst.multicast, env, role)
        cta = role.cta
        members = [self.cta_of(cta, r) for r in range(self.cluster_size)] if multicast else [cta]
        if cta.cluster in self.clc_failed:
            self.fail(
                "clc",
                f"{role.name} issues clusterlaunchcontrol.try_cancel after its cluster was answered "
                f"'no work left' (undefined behaviour)",
            )

        def answer(slot=slot, bar=bar, members=members, who=role.name):
            cancelled = self.cancel_cluster()
            if cancelled is None:
                response = [0, 0, 0, 0]
                self.clc_failed.add(self.ctas[members[0].index].cluster)
            else:
                first = self.ctas[cancelled * self.cluster_size]
                response = [1, *first.block_idx]
            self.log(f"CLC response to {who}: {'cluster %d' % cancelled if cancelled is not None else 'no work left'}")
            for c in members:
                c.values[SharedAddr(c.index, slot.alloc, slot.start)] = response
                self.complete_tx(dataclasses.replace(bar, cta=c.index), 16, f"CLC response into cta{c.index}")

        self.log(f"{role.name}: clusterlaunchcontrol.try_cancel")
        self.async_ops.append(
            AsyncOp(
                f"a CLC response for {role.name}",
                answer,
                tuple(c.index for c in members),
                byte_barriers=tuple(dataclasses.replace(bar, cta=c.index) for c in members),
            )
        )
        yield None

    def i_ClusterLaunchControlQueryResponseInst(self, inst, env, role, group, active):
        slot: MemRef = env[inst.inputs[0]]
        response = role.cta.values.get(SharedAddr(role.cta.index, slot.alloc, slot.start))
        if response is None:
            self.fail("unsupported", f"{role.name} reads a CLC response that never arrived")
        env[inst.register_output] = RegVal(list(response), (4,), None)


# calls that order memory or hand over TMEM: no counting effect (see the package doc)
NO_OP_CALLS = ("cuda_tcgen05_fence", "cuda_fence")

NO_OPS = {
    "AnnotateLayoutInst",
    "FenceProxyAsync",
    "FenceProxyAsyncInst",
    "WgmmaFenceInst",
    "Tcgen05DeallocInst",
    "Tcgen05RelinquishAllocPermitInst",
    "FenceProxyAsyncReleaseInst",
}


def _complete_all_but(groups: list[list[Reader]], newest: int) -> None:
    """A wait_group(n): every group but the ``newest`` n has completed its reads."""
    done = groups[:-newest] if newest else groups[:]
    for group in done:
        for reader in group:
            reader.done = True
    del groups[: len(done)]


def _covers(loads, lo: int, hi: int) -> bool:
    spans = sorted((t.row0, t.row0 + t.rows) for t in loads)
    at = lo
    for s, e in spans:
        if s > at:
            break
        at = max(at, e)
    return at >= hi
