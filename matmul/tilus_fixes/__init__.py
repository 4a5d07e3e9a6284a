"""Work-arounds for faults of tilus 0.2.0, one fault per module, applied by ``apply_all()``.

``matmul/__init__.py`` calls ``apply_all()`` when the package is imported, before any kernel can
be built, so every kernel builds the same way on every machine. Each fix names the fault it works
around, is guarded to the tilus release that has it, and can be taken out again
(``disabled(name)``) so that the tests can show the fault comes back without it
(``tests/test_tilus_fixes.py``). The faults (on a GPU, and on machines without one):

* ``tma_sm90``: TMA loads are emitted with ``.cta_group::1``, which ptxas rejects for sm_90a;
* ``build_without_gpu``: building needs ``torch.cuda.is_available()`` and a driver ``libcuda.so``;
* ``atomic_library``: a kernel's ``lib.so`` is visible to other processes, which load it, while
  nvcc is still writing it;
* ``keep_ptx``: the PTX of a kernel is kept only when every IR pass is dumped too;
* ``serial_transpile``: programs transpiled in forked workers fail tilus's loop-invariant hoisting;
* ``serial_instantiation``: two threads transpiling at once share the transpiler's global builder
  (a serving loop's threads meeting a kernel for the first time together);
* ``fence_tall_accumulators``: wgmma accumulators are not fenced, and ptxas serializes the wgmma of
  a warp-specialized 128-row tile;
* ``workspace_in_shared_memory``: the shared workspace that receives the tensor-memory address is
  placed 128-byte aligned, but the dynamic shared memory is sized from the unaligned top;
* ``mn_major_operands``: an MMA operand stored MN-major in shared memory (b [K, N] read in place)
  is read as K-major by wgmma, refused by tcgen05 beside a K-major one, and loses its layout to
  the MMA's guess in layout inference;
* ``wgmma_register_a``: ``wgmma.mma`` with its A operand in registers has no emitter and no layout
  inference rule (V8 widens its int4 weight into that operand);
* ``int4_bf16_cast``: a register cast from int4 to bfloat16 converts one value at a time (the
  float16 cast converts eight at once). V8 does not cast (its packed order lets it widen pairs
  itself, ``pipeline.widen.int4_pairs``); the fix is for kernels that do, and its code is part of
  every stored choice's fingerprint (removing it makes the shipped tables stale);
* ``tcgen05_tmem_a``: ``tcgen05.mma`` with its A operand in tensor memory has no emitter
  (Blackwell V8 widens its int4 weight into that operand);
* ``wgmma_instruction_width``: a wgmma tile is issued in instructions only as wide as the greatest
  power of two dividing its N (a 96-column tile as three ``m64n32k16``);
* ``wgmma_descriptor_offsets``: every wgmma of a tile encodes its shared-memory descriptors from
  the full address, where the tile's base descriptor plus a constant would do;
* ``wgmma_uniform_descriptors``: in a K loop each wgmma's descriptors are built per thread and moved
  to uniform registers half by half, where the stage is a loop-carried value nvcc cannot prove
  warp-uniform.

Each module's docstring describes its fault and the work-around in full. A module that sets
``CHANGES_GENERATED_CODE = False`` changes how kernels are built or loaded, not the code they are
built to: it does not name the tilus cache folder nor make stored choices stale
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
