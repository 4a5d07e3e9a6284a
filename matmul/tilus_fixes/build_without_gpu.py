"""tilus 0.2.0 fault ``build_without_gpu``: building without a GPU or driver.

Building calls ``torch.cuda.is_available()`` and stops without a GPU, even with the target set
explicitly, and links every kernel library with ``-lcuda``, which needs a driver library. The
device code (nvcc + ptxas) does not need either. The check is skipped and, where no
``libcuda.so`` exists, the link goes against a stand-in built once with the host compiler: it
has the driver's soname, so the kernel library still loads against the real driver when it is
carried to a GPU machine; on the machine without a driver, the stand-in is loaded first
whenever tilus loads a kernel library (to read its autotuning result, say).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .fix import Fix

CHANGES_GENERATED_CODE = False  # where the compiler finds libcuda, not what it compiles

# The one driver function tilus's host code calls. The stand-in defines it (failing, as a machine
# without a GPU would) and carries the driver's soname, so that a library linked against it still
# records "needs libcuda.so.1" and loads against the real driver on a GPU machine.
_STAND_IN_SOURCE = "int cuTensorMapEncodeTiled(void) { return 100; /* CUDA_ERROR_NO_DEVICE */ }\n"


@functools.cache
def stand_in_libcuda_dir() -> str | None:
    """A folder holding a stand-in ``libcuda.so`` when the machine has no driver library, else None."""
    if ctypes.util.find_library("cuda") is not None:
        return None
    folder = Path(tempfile.gettempdir()) / f"matmul-libcuda-stand-in-{os.getuid()}-v2"
    lib = folder / "libcuda.so"
    if not lib.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"libcuda.so.{os.getpid()}"
        host_cc = shutil.which("cc") or shutil.which("gcc") or "cc"
        subprocess.run(
            [host_cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-x", "c", "-", "-o", str(tmp)],
            input=_STAND_IN_SOURCE,
            text=True,
            check=True,
        )
        os.replace(tmp, lib)  # atomic: parallel builders never see a half-written library
    return str(folder)


@functools.cache
def _preload_stand_in() -> None:
    """Without a driver, load the stand-in under the driver's soname first, so that a kernel library
    (which needs libcuda.so.1) can still be loaded here, e.g. for tilus to read its autotuning."""
    folder = stand_in_libcuda_dir()
    if folder:
        ctypes.CDLL(str(Path(folder) / "libcuda.so"), mode=ctypes.RTLD_GLOBAL)


def _load_with_stand_in(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        _preload_stand_in()
        original(self, *args, **kwargs)

    return __init__


def _compile_without_gpu_check(original):
    from tilus.hidet.backend.build import NVCC

    @functools.wraps(original)
    def compile_source(
        source_file,
        output_library_file,
        target,
        include_dirs=(),
        linking_dirs=(),
        linking_libraries=(),
        object_files=(),
    ):
        if not target.is_nvgpu():
            return original(
                source_file, output_library_file, target, include_dirs, linking_dirs, linking_libraries, object_files
            )
        stand_in = stand_in_libcuda_dir()
        NVCC().compile(
            os.path.abspath(source_file),
            os.path.abspath(output_library_file),
            target,
            include_dirs=include_dirs,
            linking_dirs=[*linking_dirs, *([stand_in] if stand_in else [])],
            linking_libs=linking_libraries,
            object_files=[os.path.abspath(f) for f in object_files or []],
        )

    return compile_source


def make() -> Fix:
    import tilus.drivers as drivers
    from tilus.runtime import compiled_program

    return Fix(
        name="build_without_gpu",
        fault="building needs torch.cuda.is_available() and a driver libcuda.so for -lcuda",
        patches=[
            (drivers, "compile_source", _compile_without_gpu_check),
            (compiled_program.CompiledProgram, "__init__", _load_with_stand_in),
        ],
    )
