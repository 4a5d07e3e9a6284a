"""tilus 0.2.0 fault ``serial_transpile``: autotune spaces transpiled in-process.

A script's autotune space is transpiled in forked worker processes and the programs come back
to the parent pickled. Built from such a copy, some kernels (Hopper V2) trip an assertion in
tilus's loop-invariant hoisting pass (``assert len(bind_vars) > 0``), so every configuration
of the space fails to build, while the same program transpiled in-process builds. Transpiling
takes milliseconds: it is done in-process; building (nvcc) still runs in parallel.
"""

from __future__ import annotations

import functools

from .fix import Fix


def _transpile_in_process(original):
    from tilus.lang.instantiated_script import JitInstance

    @functools.wraps(original)
    def parallel_imap(func, jobs, num_workers=None):
        if func is JitInstance._instantiate_schedule:
            return map(func, jobs)
        return original(func, jobs, num_workers)

    return parallel_imap


def make() -> Fix:
    from tilus.lang import instantiated_script

    return Fix(
        name="serial_transpile",
        fault="programs transpiled in forked workers fail tilus's loop-invariant hoisting when built",
        patches=[(instantiated_script, "parallel_imap", _transpile_in_process)],
    )
