"""Build kernels for a chosen architecture without running them, and read what they compiled to.

Works on a machine without a GPU (see ``matmul.tilus_fixes``): tilus transpiles each
configuration, nvcc/ptxas build it for the target, and the PTX, the ptxas resource report and,
where ``cuobjdump`` exists, the SASS are kept in tilus's cache beside the library.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Optional

import tilus
import tilus.target
from tilus.drivers import BuildOptions, build_program, get_cache_dir
from tilus.lang.instantiated_script import CallParameters, JitInstance

from ..kernels import versions
from ..kernels.entry import batched_class
from ..kernels.variant import PLAIN, Variant

TARGETS = {"sm_100a": tilus.target.nvgpu_sm100a, "sm_90a": tilus.target.nvgpu_sm90a}
SHARED_MEMORY_LIMIT = {"sm_100a": 227 * 1024, "sm_90a": 227 * 1024}  # per block, opt-in maximum


@contextlib.contextmanager
def target(arch: str) -> Iterator[None]:
    """Build for ``arch`` inside the block, whatever GPU (if any) this machine has."""
    import tilus.target as tt

    previous = getattr(tt, "_target", None)
    tt.set_current_target(TARGETS[versions.normalize_arch(arch)])
    try:
        yield
    finally:
        tt._target = previous


@dataclass
class BuildResult:
    arch: str
    version: str
    config: dict[str, Any]
    ok: bool
    seconds: float = 0.0
    error: str = ""
    program_dir: Optional[Path] = None
    registers: int = 0
    spill_bytes: int = 0
    stack_bytes: int = 0
    shared_bytes: int = 0
    cluster: tuple[int, int, int] = (1, 1, 1)
    threads: int = 0

    @property
    def ptx_path(self) -> Optional[Path]:
        return self.program_dir / "module" / "source.ptx" if self.program_dir else None

    @property
    def sass_path(self) -> Optional[Path]:
        path = self.program_dir / "module" / "source.sass" if self.program_dir else None
        return path if path and path.exists() else None

    def ptx(self) -> str:
        return self.ptx_path.read_text() if self.ptx_path else ""

    def sass(self) -> str:
        return self.sass_path.read_text() if self.sass_path else ""

    def mma_loop(self) -> list[str]:
        """The SASS instructions of the kernel's innermost loop that issues MMAs (its K loop), from
        its head to its backward branch; empty without a disassembler (``sass``)."""
        return mma_loop(self.sass())

    @property
    def within_shared_limit(self) -> bool:
        return self.shared_bytes <= SHARED_MEMORY_LIMIT[self.arch]


SASS_INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def mma_loop(sass: str) -> list[str]:
    """The instructions (text, predicate included) of the shortest loop of ``sass`` that issues a
    wgmma (``HGMMA``) or tcgen05 MMA (``UTCHMMA``/``UTCQMMA``): from the target of a backward branch
    to that branch."""
    found = [(int(m.group(1), 16), m.group(2)) for m in SASS_INSTRUCTION.finditer(sass)]
    index = {address: i for i, (address, _) in enumerate(found)}
    loops = []
    for i, (address, text) in enumerate(found):
        branch = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        target = int(branch.group(1), 16) if branch else None
        if target is not None and target < address and target in index:
            body = [t for _, t in found[index[target] : i + 1]]
            if any(op in t for t in body for op in ("HGMMA", "UTCHMMA", "UTCQMMA")):
                loops.append(body)
    return min(loops, key=len) if loops else []


def _read_resources(result: BuildResult) -> None:
    module = result.program_dir / "module"
    report = (module / "nvcc_output.txt").read_text()
    result.registers = max(int(x) for x in re.findall(r"Used (\d+) registers", report))
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    result.spill_bytes = sum(int(s) + int(l) for s, l in spills)
    result.stack_bytes = max((int(x) for x in re.findall(r"(\d+) bytes stack frame", report)), default=0)
    source = (module / "source.cu").read_text()
    # kernel<<<grid, dim3(threads, 1, 1), dynamic shared bytes, stream>>>
    launches = re.findall(r"dim3\((\d+), 1, 1\), (\d+), \(cudaStream_t\)", source)
    result.threads = max(int(t) for t, _ in launches)
    result.shared_bytes = max(int(s) for _, s in launches)
    cluster = re.search(r"__cluster_dims__\((\d+), (\d+), (\d+)\)", source)
    if cluster:
        result.cluster = tuple(int(x) for x in cluster.groups())


def build_script(kernel_cls: type, arch: str, schedule: dict[str, Any], version: str = "") -> BuildResult:
    """Transpile and build one schedule (the script's __init__ arguments) of a tilus Script for
    ``arch``. A kernel that fails to build gives a result with the error; it does not raise."""
    arch = versions.normalize_arch(arch)
    result = BuildResult(arch=arch, version=version, config=dict(schedule), ok=False)
    start = time.time()
    params = CallParameters(kernel_cls)
    # every size/stride is a run-time int32: nothing specialises on them ("divisible by 1")
    divisibility = {params.param_names[i]: 1 for i in params.tuning_params}
    with target(arch):
        program = JitInstance._instantiate_schedule((kernel_cls, params, schedule, {}, divisibility))
        if isinstance(program, str):
            result.error = program
        else:
            try:
                result.program_dir = Path(build_program(program, BuildOptions.create()))
                _read_resources(result)
                result.ok = True
            except Exception as e:  # a failed build is a result to report, not a crash
                result.error = f"{type(e).__name__}: {e}"
                result.program_dir = get_cache_dir(program, BuildOptions.create())
    result.seconds = time.time() - start
    return result


def build_config(
    module: ModuleType, arch: str, config: dict[str, Any], dtype=tilus.float16, variant: Variant = PLAIN
) -> BuildResult:
    """Build one configuration of a version's autotune space, for ``variant`` (B's layout, the epilogue,
    a batch of products: then behind the batched entry point, ``entry.batched_class``)."""
    options = {} if variant == PLAIN else variant.kernel_options()
    schedule = {"dtype": dtype, **config, **options}
    kernel_cls = batched_class(module.Kernel) if variant.batched else module.Kernel
    result = build_script(kernel_cls, arch, schedule, version=module.__name__.rsplit(".", 1)[-1])
    result.config = dict(config)
    return result


def build_version(
    module: ModuleType, arch: str, all_configs: bool = False, dtype=tilus.float16, progress=None
) -> list[BuildResult]:
    """Build the version's REPRESENTATIVE configuration, or every configuration it has (its space and
    its ``EXTRA_CONFIGS``); ``progress(config)`` is called before each build (the CLI shows what it
    is building)."""
    configs = versions.build_configs(module) if all_configs else [module.REPRESENTATIVE]
    results = []
    for config in configs:
        if progress is not None:
            progress(config)
        results.append(build_config(module, arch, config, dtype))
    return results


def normalized_ptx(ptx: str) -> str:
    """The PTX without what changes when nothing the GPU runs changes: source line information
    (``.loc``/``.file``), comments, the DWARF sections, and the hash nvcc puts in internal names
    (it depends on the source file's path). Two builds of the same kernel from different trees
    compare equal; any change of an instruction does not."""
    import re

    text = ptx.split("\t.section\t.debug", 1)[0]
    lines = [
        line
        for line in text.splitlines()
        if not line.lstrip().startswith((".loc", ".file", "//")) and not line.startswith(".section\t.debug")
    ]
    return re.sub(r"_INTERNAL_[0-9a-f]{8}", "_INTERNAL_", "\n".join(lines))


def markers_found(result: BuildResult, markers) -> dict[str, bool]:
    ptx = result.ptx()
    return {marker: marker in ptx for marker in markers}
