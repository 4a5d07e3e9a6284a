"""tilus 0.2.0 fault ``wgmma_uniform_descriptors``: in a K loop, each wgmma's descriptors are built
per thread and moved to uniform registers one half at a time.

In a consumer's K loop the ring's stage is a loop-carried value that nvcc keeps in an ordinary
register: it cannot prove it equal across the warp. Every shared-memory address derived from it is
then computed per thread, and each wgmma's two 64-bit descriptors are built with 64-bit adds in
ordinary registers and moved to uniform registers (R2UR), sixteen moves a K block of four wgmma:
40 of the 72 SASS instructions of a K block of V7's 128-token tile, between the stage's wait and
its first wgmma (``python -m matmul compile`` shows the SASS). The peeled first K block,
whose stage is a constant, builds the same descriptors with four uniform adds.

The work-around takes each shared operand's address from lane 0 of the warp (``__shfl_sync``) where
the wgmma is emitted. A wgmma's descriptors must be the same in every thread of the warpgroup, and
every thread executes the instruction together (``.sync.aligned``), so this changes no result; it
tells nvcc what it could not prove, and the descriptors stay in uniform registers (two R2UR a K
block; CUTLASS makes its warpgroup index warp-uniform the same way). Both wgmma forms: tilus's (A and
B in shared memory) and the package's A-in-registers emitter (``wgmma_register_a``), whose B alone
is in shared memory.
"""

from __future__ import annotations

from .fix import Fix


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
