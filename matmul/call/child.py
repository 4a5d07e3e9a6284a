"""The child process of tuning and building, ``python -m matmul.call.child`` (started by
``tuner.tune_in_child`` or ``building.build_in_child``): reads a request on stdin and reports each
job on stdout, a tuned bucket's entry (``tuner.child_main``) or a built kernel's directory
(``building.child_main``, for a request with ``"build"``).

It is the one place that joins the measurement (``tuner``) to the public call (``api``,
``launch``): a candidate's host time is measured through ``matmul()`` itself (``host_probe``), so
that everything a caller pays is counted, and that is handed to the tuner as a function.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Callable, Optional

import torch

from ..kernels.variant import PLAIN, Variant
from . import api, building, launch, tuner


def host_probe(
    program: Optional[Callable],
    a: torch.Tensor,
    operand: torch.Tensor,
    c: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    variant: Variant = PLAIN,
    calls: int = 200,
):
    """A function that measures the host's time in ms per call of the public call of ``variant``
    when it launches ``program`` (a version's compiled launch function writing rows like ``c``;
    None: cuBLAS and torch's epilogue): ``matmul(a, w.T)`` for the plain variant and ``matmul(a,
    b)`` for b [K, N] (``operand``: B as the kernel reads it, w [N, K] or b [K, N]), ``linear(a, w,
    bias, activation)`` for an epilogue. ``calls`` calls issued back to back (the GPU drained first,
    too few calls to fill the launch queue), through ``api`` itself with a plan table that holds
    only that plan."""
    b = operand.T if variant.b_layout == "nk" else operand  # as the caller hands it to the product
    if program is None:
        plan = launch.VendorPlan(a, b, None, variant)
    else:
        plan = launch.SeriesPlan(program, a, b, operand, variant.b_layout, c, None, variant)
    table = launch.Plans(chooser=None)
    if variant.fused:  # linear's plans and routes, as ``Plans.launch_fused`` keeps them
        table.remember(launch.fused_signature(a, b, None, bias, variant), plan, a, b, bias, variant)
        activation = variant.activation

        def call():
            api.linear(a, operand, bias, activation)

    else:
        table.keep(plan, a, b)

        def call():
            api.matmul(a, b)

    def measure() -> float:
        saved = api.use_plans(table)
        try:
            for _ in range(10):
                call()
            torch.cuda.synchronize()
            begin = time.perf_counter()
            for _ in range(calls):
                call()
            elapsed = time.perf_counter() - begin
            torch.cuda.synchronize()
        finally:
            api.use_plans(saved)
        return elapsed / calls * 1e3

    return measure


def tuning_main(request: dict) -> None:
    """The tuning child: ``tuner.child_main`` with the host probe. The probe's plans have no chooser,
    so the swiglu activation of a cuBLAS plan runs torch's path there, as the tuner's cuBLAS candidate
    does, and never starts a build child from this process."""
    tuner.child_main(request, probe=host_probe)


ORPHAN_CHECK_S = 0.5


def exit_when_orphaned(check_s: float = ORPHAN_CHECK_S) -> threading.Thread:
    """End this process once its parent is gone. A process that exits while its tuning runs (a
    script of a few calls, a benchmark's process) would otherwise leave the child timing kernels
    for no one on a GPU that others use, its caller's quiet gate wide open, until its next report
    meets a closed pipe: minutes of contention for the next process on the machine."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(check_s)
        os._exit(4)

    thread = threading.Thread(target=watch, name="orphan-watch", daemon=True)
    thread.start()
    return thread


def main() -> None:
    # at ``tuner.NICENESS`` already: its parent lowered its priority as it started it (``run_child``)
    exit_when_orphaned()
    request = json.loads(sys.stdin.read())
    if "build" in request:
        building.child_main(request)
    else:
        tuning_main(request)


if __name__ == "__main__":
    # importing the package applies the tilus fixes; this module runs as __main__, so the package's
    # own copy of it does the work
    from matmul.call import child

    child.main()
