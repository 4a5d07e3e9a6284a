"""Work-arounds for faults of tilus 0.2.0, applied once when ``pipeline`` is imported.

Each fix names the fault it works around, is guarded to the tilus release that has it, and can be
taken out again (``disabled(name)``) so that the tests can show the fault comes back without it.

Faults (tilus 0.2.0, seen on an H100 and on machines without a GPU):

``tma_sm90``
    Every TMA global-to-shared copy is emitted with ``.cta_group::1``. That qualifier exists only
    from sm_100 on; ptxas rejects it for sm_90a ("Feature '.cta_group::1' not supported on .target
    'sm_90a'"), so no TMA load builds for Hopper. Below sm_100 the qualifier is dropped (it means
    the default there); ``cta_group=2`` below sm_100 is refused with a clear error.
``build_without_gpu``
    Building calls ``torch.cuda.is_available()`` and stops without a GPU, even with the target set
    explicitly, and links every kernel library with ``-lcuda``, which needs a driver library. The
    device code (nvcc + ptxas) does not need either. The check is skipped and, where no
    ``libcuda.so`` exists, the link goes against a stand-in built once with the host compiler: it
    has the driver's soname, so the kernel library still loads against the real driver when it is
    carried to a GPU machine; on the machine without a driver, the stand-in is loaded first
    whenever tilus loads a kernel library (to read its autotuning result, say).
``serial_transpile``
    A script's autotune space is transpiled in forked worker processes and the programs come back
    to the parent pickled. Built from such a copy, some kernels (Hopper V2) trip an assertion in
    tilus's loop-invariant hoisting pass (``assert len(bind_vars) > 0``), so every configuration
    of the space fails to build, while the same program transpiled in-process builds. Transpiling
    takes milliseconds: it is done in-process; building (nvcc) still runs in parallel.
``fence_tall_accumulators``
    A wgmma accumulator's registers are not fenced (CUTLASS's ``warpgroup_fence_operand``), so
    nvcc materializes a zero-filled accumulator lazily, right before each instruction that reads
    it. For an accumulator of two or more rows of wgmma instructions (a warpgroup's tile taller
    than 64 rows) the second row's zero-fill lands between the first row's wgmma and its own,
    after the ``wgmma.fence``: ptxas injects a ``warpgroup.arrive`` (info C7519) and a
    ``warpgroup.wait`` (C7517), so the wgmma group kept in flight is waited for at once (Hopper V2
    with 128 x 128 tiles), and, when that code is in a warp-specialized branch, serializes every
    wgmma of the kernel (C7520; a V3 with one 128 x 128 consumer warpgroup ran at 0.55x of
    cuBLAS). Before the wgmma of such an accumulator, every register of it goes through an empty
    ``asm volatile`` (``"+f"``), which forces the fill before it, and a second ``wgmma.fence``
    follows. One-row accumulators are left as they are.
``keep_ptx``
    The PTX of a kernel is kept only with ``tilus.option.debug.dump_ir()``, which also dumps the IR
    after every pass (slow and large). nvcc is asked to keep ``source.ptx`` beside every built
    library, and, where ``cuobjdump`` and ``nvdisasm`` are available (PATH or NVIDIA's wheels
    ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``), the SASS to ``source.sass``.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import tilus

FAULTY_RELEASES = ("0.2.0",)


@dataclass
class Fix:
    name: str
    fault: str
    # (module, attribute name, replacement factory taking the original)
    patches: list[tuple[object, str, Callable]] = field(default_factory=list)
    originals: list[tuple[object, str, object]] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        return bool(self.originals)

    def apply(self) -> None:
        if self.applied:
            return
        for module, attr, make in self.patches:
            original = getattr(module, attr)
            self.originals.append((module, attr, original))
            setattr(module, attr, make(original))

    def revert(self) -> None:
        for module, attr, original in reversed(self.originals):
            setattr(module, attr, original)
        self.originals.clear()


def _sm_major() -> int:
    return tilus.target.get_current_target().properties.compute_capability[0]


# --- tma_sm90 ------------------------------------------------------------------------------------


def _drop_cta_group_below_sm100(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _sm_major() < 10:
            if kwargs.get("cta_group") not in (None, 1):
                raise ValueError(
                    "TMA with cta_group=2 needs sm_100 or newer; on Hopper use cta_group=1 (the default)"
                )
            kwargs["cta_group"] = None
        return original(*args, **kwargs)

    return wrapper


def _tma_sm90_fix() -> Fix:
    from tilus.backends.emitters.cuda import cp_async_tensor as emitter

    return Fix(
        name="tma_sm90",
        fault="TMA loads are emitted with .cta_group::1, which ptxas rejects for sm_90a",
        patches=[
            (emitter, "cp_async_tensor_global_to_shared", _drop_cta_group_below_sm100),
            (emitter, "cp_async_tensor_global_to_cluster_shared", _drop_cta_group_below_sm100),
        ],
    )


# --- build_without_gpu ---------------------------------------------------------------------------


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
        subprocess.run([host_cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-x", "c", "-", "-o", str(tmp)],
                       input=_STAND_IN_SOURCE, text=True, check=True)
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
    def compile_source(source_file, output_library_file, target, include_dirs=(), linking_dirs=(),
                       linking_libraries=(), object_files=()):
        if not target.is_nvgpu():
            return original(source_file, output_library_file, target, include_dirs, linking_dirs,
                            linking_libraries, object_files)
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


def _build_without_gpu_fix() -> Fix:
    import tilus.drivers as drivers
    from tilus.runtime import compiled_program

    return Fix(
        name="build_without_gpu",
        fault="building needs torch.cuda.is_available() and a driver libcuda.so for -lcuda",
        patches=[(drivers, "compile_source", _compile_without_gpu_check),
                 (compiled_program.CompiledProgram, "__init__", _load_with_stand_in)],
    )


# --- keep_ptx ------------------------------------------------------------------------------------


@functools.cache
def _cuda_tool(name: str) -> str | None:
    """A CUDA binary tool from PATH or from NVIDIA's wheels (nvidia-cuda-cuobjdump, -nvdisasm)."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia  # the wheels install nvidia/cu*/bin/<tool>
    except ImportError:
        return None
    for root in nvidia.__path__:
        for candidate in sorted(Path(root).glob(f"cu*/bin/{name}")):
            return str(candidate)
    return None


def disassembler() -> tuple[str, dict] | None:
    """cuobjdump and the environment it runs in (it calls nvdisasm), or None if either is missing."""
    cuobjdump, nvdisasm = _cuda_tool("cuobjdump"), _cuda_tool("nvdisasm")
    if not (cuobjdump and nvdisasm):
        return None
    env = dict(os.environ, PATH=f"{os.path.dirname(nvdisasm)}{os.pathsep}{os.environ.get('PATH', '')}")
    return cuobjdump, env


def _keep_ptx_and_sass(original):
    @functools.wraps(original)
    def run_compile_command(self, command, src_path, out_lib_path, keep_files):
        if "--keep " not in command:
            compiler, rest = command.split(" ", 1)
            command = f"{compiler} --keep {rest}"
        keep_files = [*keep_files, "source.ptx"]
        original(self, command, src_path, out_lib_path, keep_files)
        tool = disassembler()
        if tool and out_lib_path.endswith(".so"):
            cuobjdump, env = tool
            result = subprocess.run([cuobjdump, "-sass", out_lib_path], capture_output=True, text=True, env=env)
            if result.returncode == 0:
                Path(out_lib_path).with_name("source.sass").write_text(result.stdout)

    return run_compile_command


def _keep_ptx_fix() -> Fix:
    from tilus.hidet.backend.build import SourceCompiler

    return Fix(
        name="keep_ptx",
        fault="the PTX of a kernel is kept only when every IR pass is dumped too",
        patches=[(SourceCompiler, "run_compile_command", _keep_ptx_and_sass)],
    )


# --- serial_transpile ----------------------------------------------------------------------------


def _transpile_in_process(original):
    from tilus.lang.instantiated_script import JitInstance

    @functools.wraps(original)
    def parallel_imap(func, jobs, num_workers=None):
        if func is JitInstance._instantiate_schedule:
            return map(func, jobs)
        return original(func, jobs, num_workers)

    return parallel_imap


def _serial_transpile_fix() -> Fix:
    from tilus.lang import instantiated_script

    return Fix(
        name="serial_transpile",
        fault="programs transpiled in forked workers fail tilus's loop-invariant hoisting when built",
        patches=[(instantiated_script, "parallel_imap", _transpile_in_process)],
    )


# --- fence_tall_accumulators ---------------------------------------------------------------------

WGMMA_ROWS = 64  # rows of one wgmma instruction: a taller accumulator takes several rows of them


def _fence_tall_accumulator_first(original):
    @functools.wraps(original)
    def emit_wgmma(self, inst):
        from tilus.hidet.ir.expr import deref
        from tilus.hidet.ir.primitives.cuda.wgmma import wgmma_fence, wgmma_fence_operand

        acc = inst.inputs[2].as_register_tensor()
        if acc.shape[0] > WGMMA_ROWS:
            registers = ~self.tensor2var[acc][0]  # a pointer to the first register
            for i in range(acc.layout.local_size):
                self.append(wgmma_fence_operand(deref(registers + i)))
            self.append(wgmma_fence())
        original(self, inst)

    return emit_wgmma


def _fence_tall_accumulators_fix() -> Fix:
    from tilus.backends.emitters.cuda.wgmma import WgmmaMmaSSEmitter

    return Fix(
        name="fence_tall_accumulators",
        fault="wgmma accumulators are not fenced: ptxas serializes the wgmma of a warp-specialized 128-row tile",
        patches=[(WgmmaMmaSSEmitter, "emit_wgmma", _fence_tall_accumulator_first)],
    )


# --- registry ------------------------------------------------------------------------------------

FIXES: dict[str, Fix] = {}


def apply_all() -> dict[str, Fix]:
    """Apply every fix the installed tilus needs (none for a release without the faults)."""
    if tilus.__version__ in FAULTY_RELEASES and not FIXES:
        for make in (_tma_sm90_fix, _build_without_gpu_fix, _keep_ptx_fix, _serial_transpile_fix,
                     _fence_tall_accumulators_fix):
            fix = make()
            fix.apply()
            FIXES[fix.name] = fix
    return FIXES


@contextlib.contextmanager
def disabled(name: str) -> Iterator[None]:
    """Take one fix out for the duration of the block (for tests that show the fault)."""
    fix = FIXES[name]
    fix.revert()
    try:
        yield
    finally:
        fix.apply()
