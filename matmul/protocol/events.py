"""The synchronization events of the model, and the check each makes on the spot: an arrival (local,
remote, multicast, or a ``tcgen05.commit``'s) with its ``expect_tx`` bytes on an mbarrier, bytes
landing, a phase completing (never before every waiter saw the previous one), a named barrier or
``barrier.cluster`` reached, and a write into shared memory that an asynchronous read may still be
using. Also the trace every event is logged to, and ``fail``, which turns a fault into a
``Finding`` that carries that trace.

``SyncEvents`` is a mixin of ``machine.Machine`` (it uses the machine's ``ctas``, ``cluster_size``,
``async_ops``, ``trace`` and ``events``): the barriers' rules, in one place, apart from the
instructions that trigger them (``sync_instructions``) and from the scheduler (``machine``).
"""

from __future__ import annotations

from typing import Iterator

from .findings import Finding
from .state import Barrier, BarrierAddr, Cta, GroupBarrier, Role


class SyncEvents:
    """The barrier rules and the event log of ``machine.Machine``."""

    # -- helpers ----------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        self.events += 1
        self.trace.append(text)

    def fail(self, kind: str, message: str):
        raise Finding(kind, message, tuple(self.trace))

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
            if self.turn_taking and b.loaded:  # the consumers see the phases together (Machine.turn_taking)
                seen = b.team_observed()
                if seen is not None and seen < n - 1:
                    self.fail(
                        "overrun",
                        f"{b.name} completes phase {n} while none of the roles that take turns at it has "
                        f"observed phase {n - 1} (they last saw {seen})",
                    )
            else:
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

    def arrive_async(self, addr: BarrierAddr, why: str) -> None:
        target = self.ctas[addr.cta]
        b = self.barrier(addr)
        self.log(f"{why}: 1 arrival on {b.name}")
        if target.exited:
            self.fail("exit", f"{why} arrives on {b.name} of cta{target.index}, which has exited")
        self._arrivals(b, 1)

    def group_sync(self, role, bar: GroupBarrier, threads: int) -> Iterator:
        generation = self.group_arrive(role, bar, threads)
        role.wait_barrier = None
        yield (lambda: bar.generation > generation), None, bar.name

    def group_arrive(self, role, bar: GroupBarrier, threads: int) -> int:
        """``threads`` of ``role`` arrive at ``bar``; the generation they arrived in (the barrier has
        opened for them once its generation is past it)."""
        generation = bar.generation
        bar.arrived += threads
        self.log(f"{role.name}: arrives at {bar.name} ({bar.arrived}/{bar.expected})")
        if bar.arrived > bar.expected:
            self.fail("overrun", f"{bar.name}: {bar.arrived} threads arrived, {bar.expected} expected")
        if bar.arrived == bar.expected:
            bar.arrived = 0
            bar.generation += 1
            self.log(f"{bar.name} opens")
        return generation

    def check_peer_ready(self, role, target, what: str) -> None:
        """A write into the shared memory or barriers of another CTA (``target``) of the cluster is
        safe only once ``role`` has passed a cluster barrier: each CTA initializes its mbarriers
        before it first arrives there, and a peer may not have started before that."""
        if target is not role.cta and not role.cluster_synced:
            self.fail(
                "init",
                f"{role.name}: {what} into cta{target.index} before any cluster barrier: the peer's "
                "mbarriers may not exist yet",
            )

    def check_write(self, cta: Cta, alloc: int, start: int, end: int, what: str) -> None:
        reader = cta.pending_reader(alloc, start, end)
        if reader is not None:
            self.fail("race", f"{what} overwrites shared memory of cta{cta.index} that {reader.what} may still read")
