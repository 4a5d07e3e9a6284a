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
import sys
import time
from typing import Callable, Optional

import torch

from . import api, building, launch, tuner


def host_probe(program: Optional[Callable], a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, calls: int = 200):
    """A function that measures the host's time in ms per call of ``matmul(a, b.T)`` (b [N, K]) when
    it launches ``program`` (a version's compiled launch function writing rows like ``c``; None:
    cuBLAS): ``calls`` calls issued back to back (the GPU drained first, too few calls to fill the
    launch queue), through ``api.matmul`` itself with a plan table that holds only that plan."""
    bt = b.T
    if program is None:
        plan = launch.VendorPlan(a, bt, None)
    else:
        plan = launch.SeriesPlan(program, a, bt, b, "nk", c, None)
    table = launch.Plans(chooser=None)
    table.keep(plan, a, bt)

    def measure() -> float:
        saved = api.use_plans(table)
        try:
            for _ in range(10):
                api.matmul(a, bt)
            torch.cuda.synchronize()
            begin = time.perf_counter()
            for _ in range(calls):
                api.matmul(a, bt)
            elapsed = time.perf_counter() - begin
            torch.cuda.synchronize()
        finally:
            api.use_plans(saved)
        return elapsed / calls * 1e3

    return measure


def main() -> None:
    request = json.loads(sys.stdin.read())
    if "build" in request:
        building.child_main(request)
    else:
        tuner.child_main(request, probe=host_probe)


if __name__ == "__main__":
    # importing the package applies the tilus fixes; this module runs as __main__, so the package's
    # own copy of it does the work
    from matmul.call import child

    child.main()
