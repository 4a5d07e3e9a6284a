"""``matmul()``'s native entry (``entry.cpp``): built once per machine and torch, loaded at import.

The public ``matmul`` is a builtin function of this C++ extension when it builds: a call whose
signature was seen runs its route from a hash table without a Python frame (cuBLAS's ``at::mm``
as torch.mm runs it, or the chosen version's launch), and every other call goes to the Python
function ``api.python_matmul``, which checks it, derives its plan and adds the route
(``launch.Plans.keep``).

The extension is built with torch's own builder (``torch.utils.cpp_extension.load``: a C++
compiler and ninja) into ``<choice cache dir>/entry/<name>``, the name a hash of the source, torch's
version and Python's, so a new torch builds its own. The first import on a machine builds it (about
half a minute on two cores; later imports load it). Where it cannot be built (no compiler, no
ninja) or ``MATMUL_NATIVE_ENTRY=0`` is set, ``load`` returns None and ``matmul`` is the Python
function: the same results, with a few microseconds more host time per call (plots/h100/model/).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from .. import knobs
from .choice_cache import default_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("entry.cpp")
SWITCH = "MATMUL_NATIVE_ENTRY"  # "0": use the Python entry


def module_name() -> str:
    """The extension's module name: changes with the source, torch and Python."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"{torch.__version__} {sys.version}".encode())
    return f"tilus_matmul_entry_{digest.hexdigest()[:12]}"


def load():
    """The built extension module, or None (with a warning that says why) where it cannot be had."""
    if not knobs.native_entry():
        return None
    try:
        from torch.utils import cpp_extension

        name = module_name()
        directory = default_dir() / "entry" / name
        directory.mkdir(parents=True, exist_ok=True)
        if not any(directory.glob(f"{name}*.so")):
            log.warning("building matmul()'s native entry in %s (once for this torch; about half a minute)", directory)
        with _ninja_on_path(), builder_lock(directory):
            return cpp_extension.load(
                name, [str(SOURCE)], build_directory=str(directory), extra_cflags=["-O2"], verbose=False
            )
    except Exception as e:  # no compiler, no ninja, a failed build: the Python entry serves
        log.warning(
            "matmul()'s native entry is not available (%s: %s); matmul() runs its Python entry, a few "
            "microseconds slower per call. Set %s=0 to skip the attempt.",
            type(e).__name__,
            str(e).strip().splitlines()[-1] if str(e).strip() else "",
            SWITCH,
        )
        return None


LOCK_WAIT_S = 600.0  # the longest wait for another process building the entry (a build: about 30 s)


@contextlib.contextmanager
def builder_lock(directory: Path, wait_s: Optional[float] = None):
    """Hold the right to build (or load) the entry in ``directory`` against other processes.

    torch's builder marks a build directory with a ``lock`` file while it runs ninja, on every
    load, built or not, and a process that finds the file waits, without a limit, until it is gone.
    A process killed meanwhile (a Ctrl-C during the first import) leaves the file behind, and every
    later import of the package on the machine would wait forever. So each process first takes an
    advisory lock of its own on ``directory/.builder`` (``flock``: the system drops it when its
    holder exits, however it exits); whoever holds it is the only process of this package inside
    torch's builder for the directory, so a ``lock`` file found then was left by a dead process and
    is removed. After ``wait_s`` (``LOCK_WAIT_S``) without the lock: an error, and the Python entry."""
    deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
    with open(directory / ".builder", "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"another process has been building the native entry in {directory} for too long"
                    ) from None
                time.sleep(0.1)
        try:
            stale = directory / "lock"
            if stale.exists():
                log.warning("removing %s, left by a build that did not finish", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _ninja_on_path():
    """torch's builder runs ``ninja`` from PATH; the ninja package's binary serves where none is (a venv
    used without activating it)."""
    saved = os.environ.get("PATH", "")
    if shutil.which("ninja") is None:
        with contextlib.suppress(ImportError):
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + saved
    try:
        yield
    finally:
        os.environ["PATH"] = saved


@functools.cache
def module():
    """The extension, loaded (or built) on first use; None where it cannot be had."""
    return load()


def new_table():
    """An empty table of routes (``DirectTable``), or None without the extension."""
    built = module()
    return None if built is None else built.DirectTable()
