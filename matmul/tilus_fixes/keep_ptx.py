"""tilus 0.2.0 fault ``keep_ptx``: the PTX and SASS of every built kernel.

The PTX of a kernel is kept only with ``tilus.option.debug.dump_ir()``, which also dumps the IR
after every pass (slow and large). nvcc is asked to keep ``source.ptx`` beside every built
library, and, where ``cuobjdump`` and ``nvdisasm`` are available (PATH or NVIDIA's wheels
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``), the SASS to ``source.sass``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from .fix import Fix

CHANGES_GENERATED_CODE = False  # files kept beside the library, not what it holds


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


def make() -> Fix:
    from tilus.hidet.backend.build import SourceCompiler

    return Fix(
        name="keep_ptx",
        fault="the PTX of a kernel is kept only when every IR pass is dumped too",
        patches=[(SourceCompiler, "run_compile_command", _keep_ptx_and_sass)],
    )
