"""Many builds at once, before a benchmark touches the GPU: each job in a forked process of its own.

tilus caches every program it builds on disk, where the benchmark's launches then find it; built
one after another inside a timing loop, a fresh machine's builds would outlast its run. The workers
are forked, so the caller must not have touched CUDA yet (a forked child cannot use its parent's CUDA
context), and ``build_one`` must be a module-level function (the job and its result are pickled).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from typing import Callable, Iterable, Optional


def in_forked_processes(
    build_one: Callable[..., str], jobs: Iterable, workers: Optional[int] = None, report_built: bool = False
) -> list[str]:
    """``build_one(*job)`` for every job (a tuple of arguments), ``workers`` at once (default: one a
    core): each returns "" when its job built, else the error. Every failure is printed with its job
    (and, with ``report_built``, every success); the errors come back in order."""
    jobs = list(jobs)
    if not jobs:
        return []
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers or os.cpu_count(), mp_context=context) as pool:
        errors = list(pool.map(build_one, *zip(*jobs)))
    for job, error in zip(jobs, errors):
        if error:
            print(f"build failed: {job}: {error[-400:]}", flush=True)
        elif report_built:
            print(f"built {job}", flush=True)
    return errors
