"""Work-arounds for faults of tilus 0.2.0, one fault per module, applied by ``apply_all()``.

``matmul/__init__.py`` calls ``apply_all()`` on import, before any kernel can be built, so every
kernel builds the same way on every machine. Each fix is guarded to the tilus release that has the
fault and can be taken out (``disabled(name)``), so the tests show the fault comes back without it
(``tests/test_tilus_fixes.py``). Each module's docstring describes its fault and work-around:

* ``tma_sm90``: TMA loads emitted with ``.cta_group::1``, which ptxas rejects for sm_90a;
* ``build_without_gpu``: building needs a GPU and a driver ``libcuda.so``;
* ``atomic_library``: other processes load a kernel's ``lib.so`` while nvcc still writes it;
* ``keep_ptx``: a kernel's PTX is kept only when every IR pass is dumped too;
* ``serial_transpile``: transpiling in forked workers fails tilus's loop-invariant hoisting;
* ``serial_instantiation``: two threads transpiling at once share the transpiler's global builder;
* ``fence_tall_accumulators``: unfenced wgmma accumulators serialize a warp-specialized 128-row tile;
* ``workspace_in_shared_memory``: dynamic shared memory sized from the unaligned top of the workspace;
* ``mn_major_operands``: an MN-major MMA operand in shared memory is read or inferred as K-major;
* ``wgmma_register_a``: ``wgmma.mma`` with A in registers has no emitter nor layout rule (V8);
* ``int4_bf16_cast``: an int4 to bfloat16 register cast converts one value at a time (V8 does not
  cast; its code is in every stored choice's fingerprint, so removing it stales the shipped tables);
* ``tcgen05_tmem_a``: ``tcgen05.mma`` with A in tensor memory has no emitter (Blackwell V8);
* ``wgmma_instruction_width``: a wgmma tile issued in instructions only as wide as the greatest
  power of two dividing its N;
* ``wgmma_descriptor_offsets``: every wgmma encodes its descriptors from the full address;
* ``wgmma_uniform_descriptors``: a K loop's wgmma descriptors built per thread, not warp-uniform.

A module that sets ``CHANGES_GENERATED_CODE = False`` changes how kernels are built or loaded, not
their code: it does not name the tilus cache folder nor stale stored choices
(``matmul.call.choice_cache.tilus_fix_sources``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import tilus

from . import (
    atomic_library,
    build_without_gpu,
    fence_tall_accumulators,
    int4_bf16_cast,
    keep_ptx,
    mn_major_operands,
    serial_instantiation,
    serial_transpile,
    tcgen05_tmem_a,
    tma_sm90,
    wgmma_descriptor_offsets,
    wgmma_instruction_width,
    wgmma_register_a,
    wgmma_uniform_descriptors,
    workspace_in_shared_memory,
)
from .build_without_gpu import stand_in_libcuda_dir
from .fix import Fix
from .keep_ptx import disassembler

FAULTY_RELEASES = ("0.2.0",)
MODULES = (
    tma_sm90,
    build_without_gpu,
    atomic_library,  # after build_without_gpu: it wraps that compile
    keep_ptx,
    serial_transpile,
    serial_instantiation,
    fence_tall_accumulators,
    workspace_in_shared_memory,
    mn_major_operands,
    wgmma_register_a,
    int4_bf16_cast,
    tcgen05_tmem_a,
    wgmma_instruction_width,
    wgmma_descriptor_offsets,
    wgmma_uniform_descriptors,  # after wgmma_register_a: it patches that emitter too
)

FIXES: dict[str, Fix] = {}


def apply_all() -> dict[str, Fix]:
    """Apply every fix the installed tilus needs (none for a release without the faults); idempotent."""
    if tilus.__version__ in FAULTY_RELEASES and not FIXES:
        for module in MODULES:
            fix = module.make()
            fix.apply()
            FIXES[fix.name] = fix
    return FIXES


@contextlib.contextmanager
def disabled(name: str) -> Iterator[None]:
    """Take one fix out for the duration of the block (for tests that show the fault). A fix stores
    what it replaced when it was applied, which may hold the patches of the fixes applied before it;
    so the fixes applied after this one are taken out first and applied again on top, both ways."""
    names = list(FIXES)
    later = [FIXES[other] for other in names[names.index(name) + 1 :]]

    def restack(middle) -> None:
        for other in reversed(later):
            other.revert()
        middle()
        for other in later:
            other.apply()

    fix = FIXES[name]
    restack(fix.revert)
    try:
        yield
    finally:
        restack(fix.apply)


__all__ = ["FIXES", "Fix", "apply_all", "disabled", "disassembler", "stand_in_libcuda_dir"]
