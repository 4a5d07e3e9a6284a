"""tilus 0.2.0 fault ``atomic_library``: another process may load a kernel's library half written.

``tilus.drivers.build_program`` takes its cache folder's lock only to build; before that it asks
whether the program is built already, without the lock, by whether ``module/lib.so``,
``program.txt`` and ``options.txt`` exist. The last two are written before the build starts, and
nvcc writes ``lib.so`` in place, so while one process compiles a kernel another that asks for the
same kernel (the call's build child and the background tuning's, both building a bucket's choice on
a fresh machine) finds all three, returns the folder, and its caller's ``dlopen`` fails ("file too
short"): the kernel is marked failed in that process and cuBLAS runs in its place.

The work-around: the library is compiled under a name of its own in the same folder
(``lib.<pid>.<random>.so``) and renamed to ``lib.so`` once complete (``os.replace``, atomic within
one file system), so ``lib.so`` exists only whole. The compiled code does not change.
"""

from __future__ import annotations

import functools
import os
import secrets

from .fix import Fix

CHANGES_GENERATED_CODE = False  # how the file arrives, not what it holds (choice_cache.tilus_fix_sources)


def _compile_then_rename(original):
    @functools.wraps(original)
    def compile_source(source_file, output_library_file, *args, **kwargs):
        folder, name = os.path.split(os.path.abspath(output_library_file))
        stem, dot, suffix = name.rpartition(".")  # nvcc is told to link a shared library by the ".so"
        partial = os.path.join(folder, f"{stem}.{os.getpid()}.{secrets.token_hex(4)}{dot}{suffix}")
        try:
            original(source_file, partial, *args, **kwargs)
            os.replace(partial, output_library_file)
        finally:
            if os.path.exists(partial):  # the compile failed: nothing half written stays behind
                os.remove(partial)

    return compile_source


def make() -> Fix:
    import tilus.drivers as drivers

    return Fix(
        name="atomic_library",
        fault="a kernel's lib.so is visible to other processes while nvcc is still writing it",
        patches=[(drivers, "compile_source", _compile_then_rename)],
    )
