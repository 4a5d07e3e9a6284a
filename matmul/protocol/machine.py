"""One run of a kernel on the model of the machine: ``Machine`` builds the grid (CTAs in clusters,
the roles of each CTA) from the transpiled function and a ``Problem``, launches clusters as
residency allows, and steps one role or fires one asynchronous operation at a time, as a ``choose``
callback decides (the strategies that explore interleavings are ``explore``'s). It ends roles and
CTAs with the checks on exit (nothing in flight into or out of an exiting CTA, no phase partly arrived),
reports a deadlock when every live role is blocked and a livelock when a run does not end, and
finally checks coverage.

``Machine`` composes the mixins that hold the rest of the model: the barrier rules and the event log
(``events``), the IR interpreter (``interpreter``), the instructions (``data_instructions``,
``sync_instructions``) and the coverage check (``coverage``); the records they share are in
``state``, the faults in ``findings``. Only this module imports the mixins, and they import only
``state`` and ``findings``, so no import runs back up.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Optional

import numpy as np
from tilus.ir.func import Function

from .coverage import CoverageChecks
from .data_instructions import DataInstructions
from .events import SyncEvents
from .findings import Finding
from .interpreter import Interpreter, role_ranges
from .state import BATCH_STRIDE, ROW_STRIDE, AsyncOp, Cta, GlobalRef, GroupBarrier, Role
from .sync_instructions import SyncInstructions


@dataclasses.dataclass
class Problem:
    m: int
    n: int
    k: int
    batches: int = 0  # a batched kernel's products (0: a kernel of one product)


class Machine(Interpreter, SyncInstructions, DataInstructions, CoverageChecks, SyncEvents):
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
        b_units: tuple = (1, 1),
        swiglu: bool = False,
        turn_taking: bool = False,
    ):
        self.function = function
        self.problem = problem
        # swiglu's epilogue makes C's column j of the product's gate-up pair of columns: C is half
        # as wide as B has rows, and C's columns [c0, c1) come from the product's [2 c0, 2 c1)
        self.column_ratio = 2 if swiglu else 1
        self.c_columns = problem.n // self.column_ratio
        # B's rows and K columns per element of its global view (a packed weight's int32 words)
        self.b_units = b_units
        # tcgen05.commit arrivals of one thread land in the order the commits were issued (each
        # commit tracks every MMA issued before it); False lets them land in any order
        self.ordered_commits = ordered_commits
        # the consumer roles that wait on a ring's "full" barriers (those TMA loads complete on) take
        # turns, tile by tile (Hopper V6's ping-pong warpgroups): each phase is seen by one of them,
        # so the rule "a wait returns on the phase after the last one seen" holds for them together
        self.turn_taking = turn_taking
        self.loop_iterations = 0
        self.clc_failed: set[int] = set()  # clusters that were answered "no work left"
        self.trace: collections.deque = collections.deque(maxlen=self.TRACE)
        self.async_ops: list[AsyncOp] = []
        self.events = 0
        self.max_steps = max_steps
        self.params = {}
        args = [problem.m, problem.n, problem.k, "a_ptr", "b_ptr", "c_ptr", ROW_STRIDE, ROW_STRIDE, ROW_STRIDE]
        if function.params and function.params[0].hint == "batches":  # entry.batched_class's launch
            if not problem.batches:
                raise Finding("unsupported", "a batched kernel needs a problem with batches")
            b = problem.batches
            args = [b, *args, 0, b, b, BATCH_STRIDE, BATCH_STRIDE, BATCH_STRIDE]
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
        self.workspaces: dict[int, GlobalRef] = {}  # the kernel's own global allocations
        self.global_memory: dict[tuple, Any] = {}  # what they hold: (allocation, offset) -> tag or flag
        self.stored = np.zeros((max(problem.batches, 1), problem.m, self.c_columns), dtype=np.int32)
        self.k_block: Optional[int] = None

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
                self.fail("exit", f"cta{cta.index} exits while {op.what} is still in flight, into it or out of it")
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
        for (where, offset), value in self.global_memory.items():
            if where.startswith("flags") and value != 0:
                self.fail("flags", f"the kernel ends with {where} at {offset} holding {value}, not 0")

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
