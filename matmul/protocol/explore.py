"""The exploration of interleavings: ``check_function`` runs a transpiled kernel on
``machine.Machine`` once per seed, each run one interleaving that a strategy chooses
(``STRATEGIES``: starve the asynchronous agents, flood them, let one role run ahead, hold one kind
of role back, or pick at random) on one of the given problems, a CLC kernel with a number of
clusters resident, and stops at the first finding; ``Report`` is what it ran and found.

Apart from the package's face (``matmul.protocol``: which kernels, configurations and problems to
check) and from the machine (one run, whatever the choices): this is how the runs are chosen, and
what the split-K test calls with problems of its own.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Optional

from .findings import Finding
from .machine import Machine, Problem
from .state import AsyncOp, Role

RESIDENT_CLUSTERS = 3  # at most this many clusters on the GPU at once for CLC kernels (the rest are stolen)
STRATEGIES = ("starve-async", "flood-async", "run-ahead", "lag-one-role", "random")


def _chooser(strategy: str, rng: random.Random, turn: int = 0):
    """The scheduling decisions of one interleaving. ``turn`` picks, for "lag-one-role", which kind
    of role (thread range) is held back: every kind in turn over the seeds."""
    last: list[Optional[Role]] = [None]
    lagging: list[Optional[tuple]] = [None]  # the thread range whose roles move only when nothing else can

    def choose(ready: list[Role], ops: list[AsyncOp]):
        if strategy == "lag-one-role":
            if lagging[0] is None:
                ranges = sorted({(r.lo, r.hi) for r in ready})
                lagging[0] = ranges[turn % len(ranges)]
            others = [r for r in ready if (r.lo, r.hi) != lagging[0]] + ops
            return rng.choice(others or ready)
        if strategy == "flood-async" and ops:
            return rng.choice(ops)
        if strategy in ("starve-async", "run-ahead") and ready:
            if strategy == "run-ahead" and last[0] in ready:
                return last[0]
            last[0] = rng.choice(ready)
            return last[0]
        pool = ready + ops
        return rng.choice(pool)

    return choose


@dataclasses.dataclass
class Report:
    label: str
    cluster: int = 1  # CTAs per cluster
    roles: int = 0
    events: int = 0
    interleavings: int = 0
    seconds: float = 0.0
    finding: Optional[Finding] = None
    seed: Optional[int] = None
    strategy: str = ""
    problem: Optional[Problem] = None

    @property
    def ok(self) -> bool:
        return self.finding is None

    @property
    def verdict(self) -> str:
        if self.ok:
            return "pass"
        p = self.problem
        return (
            f"{self.finding.kind} (seed {self.seed}, {self.strategy}, M={p.m} N={p.n} K={p.k}): {self.finding.message}"
        )

    def trace(self, lines: int = 40) -> str:
        """The last events before the finding, those of the CTAs it names first (if it names any)."""
        if not self.finding:
            return ""
        import re

        named = set(re.findall(r"cta\d+", self.finding.message))
        events = [e for e in self.finding.trace if not named or named & set(re.findall(r"cta\d+", e))]
        return "\n".join(events[-lines:])


def check_function(
    function,
    problems: list[Problem],
    seeds: int = 24,
    label: str = "",
    resident_clusters: int = RESIDENT_CLUSTERS,
    clc: Optional[bool] = None,
    ordered_commits: bool = True,
    b_units: tuple = (1, 1),
    swiglu: bool = False,
    turn_taking: bool = False,
) -> Report:
    """Run ``seeds`` interleavings of one transpiled kernel; stop at the first finding. Seed ``s``
    uses strategy ``STRATEGIES[s % 5]``; each run of five seeds takes one problem, the first
    (largest) every other run, so that every problem meets every strategy; a CLC kernel keeps
    ``1 + s % resident_clusters`` clusters resident (the rest are stolen by ``try_cancel`` or
    launched as others exit). ``swiglu``: C has one column per gate-up pair of the product's
    (``machine.Machine``). ``turn_taking``: the consumers take turns at the ring's stages
    (``machine.Machine``)."""
    report = Report(label)
    start = time.time()
    if clc is None:
        clc = "ClusterLaunchControlTryCancel" in str(function)
    for seed in range(seeds):
        strategy = STRATEGIES[seed % len(STRATEGIES)]
        turn = seed // len(STRATEGIES)
        problem = problems[0] if turn % 2 == 0 else problems[1 + turn // 2 % (len(problems) - 1)]
        machine = None
        try:
            resident = 1 + seed % resident_clusters if clc else None
            machine = Machine(
                function,
                problem,
                resident_clusters=resident,
                ordered_commits=ordered_commits,
                b_units=b_units,
                swiglu=swiglu,
                turn_taking=turn_taking,
            )
            report.roles = max(report.roles, len(machine.ranges) * len(machine.ctas))  # largest problem
            report.cluster = machine.cluster_size
            machine.run(_chooser(strategy, random.Random(seed), turn // 2))
        except Finding as finding:
            report.finding, report.seed, report.strategy, report.problem = finding, seed, strategy, problem
            report.events += machine.events if machine is not None else 0
            report.interleavings += 1
            break
        report.events += machine.events
        report.interleavings += 1
    report.seconds = time.time() - start
    return report
