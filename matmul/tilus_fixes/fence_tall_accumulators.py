"""tilus 0.2.0 fault ``fence_tall_accumulators``: fenced wgmma accumulators taller than 64 rows.

A wgmma accumulator's registers are not fenced (CUTLASS's ``warpgroup_fence_operand``), so
nvcc materializes a zero-filled accumulator lazily, right before each instruction that reads
it. For an accumulator of two or more rows of wgmma instructions (a warpgroup's tile taller
than 64 rows) the second row's zero-fill lands between the first row's wgmma and its own,
after the ``wgmma.fence``: ptxas injects a ``warpgroup.arrive`` (info C7519) and a
``warpgroup.wait`` (C7517), so the wgmma group kept in flight is waited for at once (Hopper V2
with 128 x 128 tiles), and, when that code is in a warp-specialized branch, serializes every
wgmma of the kernel (C7520). Before the wgmma of such an accumulator, every register of it goes through an empty
``asm volatile`` (``"+f"``), which forces the fill before it, and a second ``wgmma.fence``
follows. One-row accumulators are left as they are.
"""

from __future__ import annotations

import functools

from .fix import Fix

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


def make() -> Fix:
    from tilus.backends.emitters.cuda.wgmma import WgmmaMmaSSEmitter

    return Fix(
        name="fence_tall_accumulators",
        fault="wgmma accumulators are not fenced: ptxas serializes the wgmma of a warp-specialized 128-row tile",
        patches=[(WgmmaMmaSSEmitter, "emit_wgmma", _fence_tall_accumulator_first)],
    )
