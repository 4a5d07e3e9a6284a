"""tilus 0.2.0 fault ``serial_instantiation``: a script instantiated by two threads at once fails.

The transpiler emits each instruction into the builder held in a module-level global
(``tilus.lang.instructions.base._current_builder``), set on entering a function's body and cleared
on leaving it. Two threads transpiling at once (a serving loop's threads meeting a kernel for the
first time together) share that global: one clears it while the other is mid-body, whose next
instruction fails (``assert _current_builder is not None``), and tilus reports "No valid schedule
found". Instantiation is the slow path of a first call (milliseconds to transpile, a load from the
cache or a build): it is made serial in the process with one re-entrant lock around a JIT
instance's construction (the transpile), its choice of program (which may build and writes the
dispatch table) and each schedule's transpile (which the builders call directly). Launches of an
instantiated kernel take no lock.
"""

from __future__ import annotations

import functools
import threading

from .fix import Fix

CHANGES_GENERATED_CODE = False  # when kernels are instantiated, not what they are built to

_lock = threading.RLock()


def _serial(original):
    """``original`` (a function, or a staticmethod as the class holds it) under the process's lock."""
    function = original.__func__ if isinstance(original, staticmethod) else original

    @functools.wraps(function)
    def serial(*args, **kwargs):
        with _lock:
            return function(*args, **kwargs)

    return staticmethod(serial) if isinstance(original, staticmethod) else serial


def make() -> Fix:
    from tilus.lang.instantiated_script import JitInstance

    return Fix(
        name="serial_instantiation",
        fault="two threads transpiling at once share the transpiler's global builder",
        patches=[(JitInstance, attr, _serial) for attr in ("__init__", "_pick_best_program", "_instantiate_schedule")],
    )
