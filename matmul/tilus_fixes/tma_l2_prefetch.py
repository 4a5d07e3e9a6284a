"""tilus 0.2.0 fault ``tma_l2_prefetch``: no TMA prefetch into L2.

Hopper's TMA can fetch a tile of global memory into L2 without a destination in shared memory and
without a barrier (``cp.async.bulk.prefetch.tensor.Nd.L2.global.tile``): a kernel whose shared
memory holds only a few stages of its stream can ask for the rest at once, so that the stream's
later loads meet L2 instead of a round trip to HBM each. tilus 0.2.0 has the copy into shared
memory only. The fix adds ``self.tma.prefetch_to_l2(src=..., box=..., offsets=...)``: the tile of
``src`` at ``offsets`` the shape of the shared tensor ``box`` (which is not written: it names the
box and its swizzle, so the prefetch and the loads of that box share one tensor map's shape), one
instruction from the warp's leader lane as tilus issues its TMA loads.

It adds an instruction (with its emitter and its layout rules) and changes no other: a kernel that
does not prefetch is built to the same code with or without it, so the fix does not name the tilus
cache folder (``CHANGES_GENERATED_CODE``). A kernel that does prefetch holds the instruction in its
IR, ``revision`` included, which names its program: a change to the emitted code must raise
``REVISION`` so that no kernel built before it is loaded again.
"""


import functools
from dataclasses import dataclass
from typing import Optional, Sequence

from .fix import Fix

CHANGES_GENERATED_CODE = False  # only kernels holding the new instruction change; their IR names them
REVISION = 1


@functools.cache
def instruction_class():
    """``TmaPrefetchL2Inst``: inputs (box, src), the tile's offsets and the dims of ``src`` it spans."""
    from tilus.hidet.ir.expr import Expr
    from tilus.ir.inst import Instruction

    @dataclass(frozen=True, eq=False)
    class TmaPrefetchL2Inst(Instruction):
        offsets: tuple[Expr, ...]
        dims: tuple[int, ...]
        revision: int

    return TmaPrefetchL2Inst


def prefetch_to_l2(self, *, src, box, offsets: Sequence, dims: Optional[Sequence[int]] = None) -> None:
    """Fetch the tile of the global tensor ``src`` at ``offsets`` into L2, the shape of the shared
    tensor ``box`` (not written), without a barrier: a later TMA load of that tile meets it in L2.
    A warp-cooperative instruction, as ``global_to_shared`` (one TMA instruction, its leader lane)."""
    from tilus.hidet.ir.expr import as_expr

    if dims is None:
        dims = list(range(len(src.shape)))
    inst = instruction_class()(
        output=None,
        inputs=(box, src),
        offsets=tuple(as_expr(o) for o in offsets),
        dims=tuple(dims),
        revision=REVISION,
    )
    self._builder.append(inst)


@functools.cache
def _primitive(dim: int) -> str:
    """The device function that issues the prefetch of a ``dim``-dimensional box, predicated."""
    from tilus.hidet.ir.dtypes import int32, uint32
    from tilus.hidet.ir.primitives.cuda.tensor_map import CUTensorMapPointerType
    from tilus.hidet.ir.primitives.utils import register_primitive_function_decorator
    from tilus.hidet.lang import asm, attrs, meta, script

    name = f"matmul_tma_prefetch_l2_{dim}d"
    coords = ", ".join(f"%{i + 1}" for i in range(dim))
    bare = f"cp.async.bulk.prefetch.tensor.{dim}d.L2.global.tile [%0, {{{coords}}}];"
    template = f"{{.reg.pred __pred; setp.ne.u32 __pred, %{dim + 1}, 0; @__pred {bare}}}"
    coords_type = meta.types([int32 for _ in range(dim)])

    @register_primitive_function_decorator
    @script
    def prefetch(tensor_map: CUTensorMapPointerType, coords: coords_type, predicate: uint32):  # noqa: F811
        attrs.func_name = name
        attrs.func_kind = "cuda_internal"
        asm(template=template, inputs=[tensor_map, *coords, predicate], is_volatile=True, memory_fence=True)

    return name


@functools.cache
def _emitter():
    from tilus.backends.emitters.cuda.cp_async_tensor import CopyAsyncTensorBaseEmitter
    from tilus.hidet.ir.primitives.func import call_primitive_func

    class TmaPrefetchL2Emitter(CopyAsyncTensorBaseEmitter):
        def emit(self, inst) -> None:
            self.assert_is_warp_aligned(inst, "a TMA prefetch is a warp-cooperative instruction")
            src = inst.inputs[1].as_global_tensor()
            box = inst.inputs[0].as_shared_tensor()
            if src.dtype != box.dtype:
                raise ValueError(f"a TMA prefetch of {src.dtype.name} in boxes of {box.dtype.name}")
            global_info = self.resolve_global_tensor_info(src, offsets=inst.offsets, dims=inst.dims)
            tensor_map = ~self.create_tensor_map(global_info, self.resolve_shared_tensor_info(box), src.dtype)
            coords = list(reversed(inst.offsets))
            predicate = self.contexts.leader_lane_ctx.leader_lane
            self.append(call_primitive_func(_primitive(len(coords)), args=[tensor_map, *coords, predicate]))

    return TmaPrefetchL2Emitter


def _with_emitter(original: dict) -> dict:
    from tilus.target import nvgpu_sm90

    return {**original, instruction_class(): {nvgpu_sm90: _emitter()}}


def _with_inference_rule(original):
    from tilus.ir.layout.inference.inference_rules.empty_rule import EmptyRule

    rules = original.copy()  # a defaultdict(list): the copy keeps its default
    rules[instruction_class()] = [EmptyRule]  # no layout to infer: the box keeps its own
    return rules


def _with_validation_rule(original: dict) -> dict:
    from tilus.ir.layout.inference.validation_rules.always_ok import AlwaysOkayRule

    return {**original, instruction_class(): AlwaysOkayRule}


def _with_method(original):
    return prefetch_to_l2


def make() -> Fix:
    from tilus.backends.emitter import BaseInstEmitter
    from tilus.ir.layout.inference import rule
    from tilus.lang.instructions.tma import TmaInstructionGroup

    return Fix(
        name="tma_l2_prefetch",
        fault="there is no TMA prefetch into L2 (cp.async.bulk.prefetch.tensor)",
        patches=[
            (BaseInstEmitter, "REGISTRY", _with_emitter),
            (rule, "_inference_rules", _with_inference_rule),
            (rule, "_validation_rules", _with_validation_rule),
            (TmaInstructionGroup, "prefetch_to_l2", _with_method),
        ],
    )
