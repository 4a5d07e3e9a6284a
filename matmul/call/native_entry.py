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
function: the same results, with a few microseconds more host time per call (2-3 us on the H100
machine: plots/h100/model/COMMAND.md).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path

import torch

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
    if os.environ.get(SWITCH, "1") == "0":
        return None
    try:
        from torch.utils import cpp_extension

        name = module_name()
        directory = default_dir() / "entry" / name
        directory.mkdir(parents=True, exist_ok=True)
        if not any(directory.glob(f"{name}*.so")):
            log.warning("building matmul()'s native entry in %s (once for this torch; about half a minute)", directory)
        with _ninja_on_path():
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
