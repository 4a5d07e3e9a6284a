"""tilus's per-version autotuning, used safely: the configuration it chose, and a check of its
on-disk dispatch table.

tilus 0.2.0 tunes a script on the first call for a shape bucket, on clones of the tensor
arguments, and stores the winner's index in ``<cache>/scripts/kernel/<key>/dispatch_table.pickle``.
Two things about that need care here:

* ``Tensor.clone()`` of a row-padded view (``buf[:, :17]``) is a *contiguous* copy, so the
  kernel, still told the padded row stride, would read past the clone while tuning:
  ``versions.launch_args`` hands tilus the whole padded rows.
* tilus trusts the pickle: a truncated one raises on load, and a table pointing past the built
  programs raises an IndexError. ``check_dispatch_table`` removes such a table (and the tuning
  reports tilus would otherwise refuse to overwrite) so that tilus tunes again.

A one-point script can also be built in one process and loaded in another: ``build`` transpiles
and compiles it (or finds it in tilus's cache) and names its program's directory, and ``load``
opens that directory's library without transpiling anything (``matmul.call.building``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Callable

import filelock

log = logging.getLogger(__name__)


def jit_instance(script, args):
    """tilus's JitInstance of ``script`` for these arguments (transpiled, maybe not built yet)."""
    return script._jit_instance_for(*args)


def tuned_config(script, args) -> dict[str, Any]:
    """The configuration tilus's autotuner picked for ``args`` (after a call with them): the point of
    the script's autotune space, as ``versions.space`` names it. tilus's schedule also names every
    other parameter of the kernel (its dtype, its variant, a default such as V6's ``pingpong``), which
    is no part of the configuration: a choice recorded with them matches no point of the space."""
    from tilus.lang.instantiated_script import extract_keys

    jit_key, tuning_key = extract_keys(args, script.const_params, script.tuning_params)
    instance = script.jit_instances[jit_key]
    schedule = instance.schedules[instance.valid_schedules[instance.dispatch_table[tuning_key]]]
    tuned = {name.strip() for names in script.space for name in names.split(",")}
    return {name: value for name, value in schedule.items() if name in tuned}


def check_dispatch_table(cache_dir: Path, programs: int) -> bool:
    """Remove tilus's dispatch table in ``cache_dir`` if it does not load or names a program index
    outside ``range(programs)``; True if it was removed. Holds tilus's own lock for that directory."""
    table_path = Path(cache_dir) / "dispatch_table.pickle"
    if not table_path.exists():
        return False
    with filelock.FileLock(str(Path(cache_dir) / ".lock")):
        try:
            with open(table_path, "rb") as f:
                table = pickle.load(f)
            valid = isinstance(table, dict) and all(
                isinstance(key, tuple)
                and all(isinstance(x, int) for x in key)
                and isinstance(index, int)
                and 0 <= index < programs
                for key, index in table.items()
            )
            problem = "names a program that was not built"
        except Exception as e:  # truncated or garbage: any unpickling error
            valid, problem = False, f"does not load ({type(e).__name__})"
        if valid:
            return False
        log.warning("tilus's dispatch table %s %s; removing it so that tilus tunes again", table_path, problem)
        table_path.unlink(missing_ok=True)
        (table_path.parent / "dispatch_table.txt").unlink(missing_ok=True)
        # tilus links each tuned key's winner under latency/ and fails if the link exists already
        shutil.rmtree(table_path.parent / "latency", ignore_errors=True)
        return True


def prepare(script, args=None) -> None:
    """Make sure tilus's stored autotuning result for ``script`` can be trusted before its first call.

    Without ``args``, placeholder sizes: the JIT key of the series' kernels depends on no argument
    (every size is a run-time int32, and tilus 0.2.0 records each one's divisibility as 1)."""
    instance = jit_instance(script, args or (1,) * len(script.params.param_names))
    if not instance.valid_programs:  # not built in this process yet: the table is read from disk
        check_dispatch_table(instance.cache_dir, len(instance.transpiled_programs))


def launch_function(script):
    """The compiled launch function of a script with a one-point space (``versions.kernel(module,
    dtype, config)``): called with the kernel's arguments, it launches on torch's current stream of
    its tensor argument, without ``Script.__call__``'s per-call key derivation. The one program
    serves every shape, so placeholder sizes select it."""
    args = (1,) * len(script.params.param_names)
    prepare(script, args)
    instance = jit_instance(script, args)
    if len(instance.schedules) != 1:
        raise ValueError(f"{type(script).__name__} has {len(instance.schedules)} configurations; fix one first")
    return instance._pick_best_program(args).get_launch_func()


def build(script) -> str:
    """Build a script with a one-point space (tilus transpiles it, nvcc compiles it; or tilus finds it
    in its cache) and return the directory of its program, which ``load`` loads."""
    args = (1,) * len(script.params.param_names)
    prepare(script, args)
    instance = jit_instance(script, args)
    if len(instance.schedules) != 1:
        raise ValueError(f"{type(script).__name__} has {len(instance.schedules)} configurations; fix one first")
    return str(instance._pick_best_program(args).program_dir)


def load(program_dir) -> Callable:
    """The launch function of a program ``build`` built (in this process or another): its library
    opened, nothing transpiled or compiled. The kernel itself is loaded into the CUDA context at its
    first launch (lazy module loading, torch's default), on the launching thread and its stream."""
    from tilus.runtime import compiled_program_exists, load_compiled_program

    if not compiled_program_exists(program_dir):
        raise FileNotFoundError(f"no built tilus program in {program_dir}")
    open_without_the_gil(Path(program_dir) / "module" / "lib.so")
    return load_compiled_program(program_dir).get_launch_func()


@functools.cache
def _libdl():
    libdl = ctypes.CDLL(None)  # the process's own symbols, dlopen among them
    libdl.dlopen.restype = ctypes.c_void_p
    libdl.dlopen.argtypes = (ctypes.c_char_p, ctypes.c_int)
    return libdl


def open_without_the_gil(library: Path) -> bool:
    """dlopen ``library`` through a ctypes call, which releases the GIL while it runs: the dynamic
    linker's work and the library's constructors (the CUDA runtime registering its kernels). The
    library then stays loaded (the handle is never closed), and tvm_ffi's ``load_module``, which
    holds the GIL through its own dlopen, finds it open. A kernel is loaded on the chooser's
    thread while the caller's thread makes calls: every millisecond that thread holds the GIL is
    one the caller waits. Whether it opened (where it did not, ``load_module`` says why)."""
    return bool(_libdl().dlopen(str(library).encode(), os.RTLD_NOW | os.RTLD_LOCAL))
