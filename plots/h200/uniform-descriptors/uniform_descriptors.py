"""A candidate tilus fix, not applied by the package: each wgmma's shared-memory addresses broadcast
from lane 0 of the warp, so that nvcc keeps its descriptors in uniform registers.

In a consumer's K loop the ring's stage is a loop-carried value that nvcc keeps in an ordinary
register: it cannot prove it equal across the warp. Every address derived from it is then computed
per thread, and each wgmma's two 64-bit descriptors are built with 64-bit adds in ordinary registers
and moved to uniform registers (R2UR) one half at a time: 40 of the 72 SASS instructions of a K block
of V7's 128-token tile (``plots/h200/README.md``, "A K block's descriptors"). A wgmma's
descriptors must be the same in every thread of the warpgroup anyway, and every thread executes the
instruction together (``.sync.aligned``), so taking the address from lane 0 (``__shfl_sync``)
changes no result and tells nvcc what it could not prove (CUTLASS makes its warpgroup index
warp-uniform the same way).

It lives here, not in ``matmul/tilus_fixes/``, until it is measured: every file there is part of
every version's fingerprint (``tuner.fingerprint_files``), so adding it would stale every shipped
choice. tilus keys its program cache by the IR and build options only, so a build with it applied
needs a cache of its own (``MATMUL_CACHE_DIR``).
"""

from __future__ import annotations

from matmul.tilus_fixes.fix import Fix


def _lane_zero(value):
    """``__shfl_sync(0xffffffff, value, 0)`` for a 32-bit integer. tilus's own ``shfl_sync`` infers
    its types, which the pass that adds explicit casts does not accept; this one declares them."""
    from tilus.hidet.ir.primitives.func import call_primitive_func, is_primitive_function, register_primitive_function
    from tilus.hidet.ir.type import FuncType

    dtype = value.type.name  # int32 or uint32: a shared-space address
    name = f"matmul_lane_zero_{dtype}"
    if not is_primitive_function(name):
        register_primitive_function(name, FuncType(["uint32", dtype, "int32"], dtype), codegen_name="__shfl_sync")
    return call_primitive_func(name, [0xFFFFFFFF, value, 0])


def _broadcast_addresses(original):
    from tilus.ir.tensor import SharedTensor

    def emit_wgmma(self, inst):
        addresses = self.shared_tensor_shared_space_addr
        saved = {}
        for operand in inst.inputs[:2]:  # A (in registers in the RS form: no address) and B
            tensor = operand.as_shared_tensor() if isinstance(operand, SharedTensor) else None
            if tensor is None or tensor in saved:
                continue
            saved[tensor] = addresses[tensor]
            addresses[tensor] = self.declare_var("uniform_addr", saved[tensor].type, init=_lane_zero(saved[tensor]))
        try:
            original(self, inst)
        finally:
            addresses.update(saved)

    return emit_wgmma


def make() -> Fix:
    """Both forms of wgmma: tilus's (A and B in shared memory) and the package's own A-in-registers
    emitter (``tilus_fixes.wgmma_register_a``, V8's), which the package has registered by now."""
    from tilus.backends.emitter import BaseInstEmitter
    from tilus.backends.emitters.cuda.wgmma import WgmmaMmaSSEmitter
    from tilus.ir.instructions.cuda.wgmma import WgmmaMmaRSInst
    from tilus.target import nvgpu_sm90a

    register_a = BaseInstEmitter.REGISTRY[WgmmaMmaRSInst][nvgpu_sm90a]
    return Fix(
        name="wgmma_uniform_descriptors",
        fault="a wgmma's descriptors are built per thread where the stage is a loop-carried value",
        patches=[(cls, "emit_wgmma", _broadcast_addresses) for cls in (WgmmaMmaSSEmitter, register_a)],
    )
