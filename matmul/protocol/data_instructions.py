"""The instructions that only place, view or move data: allocations of shared, tensor and register
memory, views and slices of them, register arithmetic, and loads and stores between global memory,
shared memory and registers. None of them blocks or completes a barrier, and nothing is computed: a
view is an address range (``state.MemRef``), and a value carries only what feeds control flow
(barrier addresses) and its provenance tag (which A and B tiles, which accumulator), so that a
store into C can be checked (``coverage``) and a write into shared memory that an asynchronous
read may still be using is a race (``events.SyncEvents.check_write``). A kernel's own global
workspace (``global_tensor``: Hopper V5's stream-K partial tiles) holds the tags stored into it,
and a load that finds nothing stored there yet is a race.

``DataInstructions`` is a mixin of ``machine.Machine``: its ``i_<Instruction>`` methods are handlers
that the interpreter dispatches to.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .state import ROW_STRIDE, AccTag, GlobalRef, LoadTag, MemRef, PiecedTag, RegVal, row_major

# kernel parameters that point at a side operand (its loads are tracked for races, and their tags
# do not feed an MMA's operands): V8's group scales, a fused epilogue's bias vector
SIDE_OPERANDS = {"scales_ptr": "S", "bias_ptr": "bias"}


class DataInstructions:
    """Handlers of the data instructions (allocations, views, loads and stores)."""

    def _alloc(self, inst, role, make):
        cta = role.cta
        key = id(inst)
        if key not in cta.allocs:
            cta.allocs[key] = make()
        return cta.allocs[key]

    def i_GlobalViewInst(self, inst, env, role, group, active):
        out = inst.global_output
        side = SIDE_OPERANDS.get(getattr(inst.ptr, "hint", None))
        if side is not None:  # read beside B (V8's scales) or C (the bias), never stored
            env[out] = GlobalRef(side)
            return
        if out not in self.global_names:
            names = "ABC"
            if len(self.global_names) >= 3:
                self.fail("unsupported", "more than three global views")
            self.global_names[out] = GlobalRef(names[len(self.global_names)])
        env[out] = self.global_names[out]

    def i_AllocateGlobalInst(self, inst, env, role, group, active):
        # a kernel's own global workspace (Hopper V5's stream-K partials and flags): one allocation
        # shared by every CTA; "clean" (zero at the start, and must be left zero) or not
        ref = self.workspaces.setdefault(
            id(inst), GlobalRef(f"{'flags' if inst.require_clean else 'workspace'} #{len(self.workspaces)}")
        )
        env[inst.global_output] = ref

    def workspace_key(self, ref: GlobalRef, offsets: list) -> Optional[tuple]:
        """Where a load or store of a workspace starts (None for A, B, C and the side operands)."""
        if not _is_workspace(ref):
            return None
        row, col = offsets[-2:] if len(offsets) >= 2 else (0, offsets[0] if offsets else 0)
        return ref.matrix, ref.base + row * ROW_STRIDE + col

    def load_workspace(self, key: tuple, env, inst, role, shape: tuple) -> None:
        # a partial accumulator another CTA stored: it carries the K blocks that CTA consumed
        if key not in self.global_memory:
            self.fail("race", f"{role.name} reads {key[0]} at {key[1]} before anything was stored there")
        self.log(f"{role.name}: reads {key[0]} at {key[1]}")
        env[inst.register_output] = RegVal(None, shape, self.global_memory[key])

    def store_workspace(self, key: tuple, value: RegVal, role) -> None:
        self.log(f"{role.name}: stores {key[0]} at {key[1]}")
        self.global_memory[key] = value.tag

    def _mem(self, inst, role, tensor):
        shape = tuple(int(s) for s in tensor.shape)
        return MemRef(role.cta.index, id(inst), 0, shape, row_major(shape), tensor.dtype.nbits / 8)

    def i_AllocateSharedInst(self, inst, env, role, group, active):
        env[inst.shared_output] = self._alloc(inst, role, lambda: self._mem(inst, role, inst.shared_output))

    def i_Tcgen05AllocInst(self, inst, env, role, group, active):
        env[inst.output] = self._alloc(inst, role, lambda: self._mem(inst, role, inst.output))

    def i_AllocateRegisterInst(self, inst, env, role, group, active):
        # a tensor whose values are a function of their indices (int4's pair indices, which the widening
        # combines with the words) is a table of constants, no accumulator: it carries no data's tag
        env[inst.register_output] = RegVal(
            None, tuple(inst.register_output.shape), None if _indexed(inst) else AccTag()
        )

    def _slice(self, ref: MemRef, offsets, dims, out_shape) -> MemRef:
        start = ref.start + sum(o * st for o, st in zip(offsets, ref.strides))
        keep = range(len(ref.shape)) if dims is None else dims
        strides = tuple(ref.strides[d] for d in keep)
        shape = tuple(int(s) for s in out_shape)
        if len(strides) != len(shape):
            strides = row_major(shape)
        return dataclasses.replace(ref, start=start, shape=shape, strides=strides)

    def i_SliceSharedInst(self, inst, env, role, group, active):
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        env[inst.shared_output] = self._slice(env[inst.inputs[0]], offsets, inst.dims, inst.shared_output.shape)

    def i_Tcgen05SliceInst(self, inst, env, role, group, active):
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        env[inst.output] = self._slice(env[inst.inputs[0]], offsets, inst.slice_dims, inst.output.shape)

    def i_PermuteSharedInst(self, inst, env, role, group, active):
        ref = env[inst.inputs[0]]
        dims = inst.dims
        env[inst.shared_output] = dataclasses.replace(
            ref, shape=tuple(ref.shape[d] for d in dims), strides=tuple(ref.strides[d] for d in dims)
        )

    def i_ReshapeSharedInst(self, inst, env, role, group, active):
        ref = env[inst.inputs[0]]
        shape = tuple(int(s) for s in inst.shared_output.shape)
        env[inst.shared_output] = dataclasses.replace(ref, shape=shape, strides=row_major(shape))

    def i_SliceRegisterInst(self, inst, env, role, group, active):
        value = env[inst.inputs[0]]
        out = inst.register_output
        if value.data is not None:
            offsets = [self.eval(o, env, role) for o in inst.offsets]
            strides = row_major(value.shape)
            start = sum(o * s for o, s in zip(offsets, strides))
            size = math.prod(int(s) for s in out.shape)
            if size != 1:
                self.fail("unsupported", "a slice of more than one element of a tensor of addresses")
            env[out] = RegVal([value.data[start]], (), None)
        else:
            if isinstance(value.tag, PiecedTag):
                self.fail("unsupported", "a slice of a value that several accumulators wrote")
            env[out] = RegVal(None, tuple(out.shape), value.tag)

    def _same_tag(self, inst, env, role, group, active):
        value = env[inst.inputs[0]]
        shape = tuple(inst.register_output.shape)
        if isinstance(value.tag, PiecedTag) and shape[-2:] != tuple(value.shape[-2:]):
            self.fail("unsupported", "a reshape of a value that several accumulators wrote")
        env[inst.register_output] = RegVal(value.data, shape, value.tag)

    i_CastInst = _same_tag
    i_ViewInst = _same_tag

    def i_TransposeInst(self, inst, env, role, group, active):
        value = env[inst.inputs[0]]
        tag = value.tag
        if isinstance(tag, PiecedTag):  # its rows are the result's columns
            tag = dataclasses.replace(tag, transposed=not tag.transposed)
        env[inst.register_output] = RegVal(value.data, tuple(inst.register_output.shape), tag)

    def i_AddInst(self, inst, env, role, group, active):
        # split-K partials of one tile added: one accumulator with every partial's MMAs
        if any(isinstance(env[x].tag, PiecedTag) for x in inst.inputs):  # no kernel adds to one
            self.fail("unsupported", "a sum with a value that several accumulators wrote")
        tags = [env[x].tag for x in inst.inputs if isinstance(env[x].tag, AccTag)]
        if len(tags) > 1:
            merged = AccTag()
            for t in tags:
                merged.terms.extend(t.terms)
            tags = [merged]
        env[inst.register_output] = RegVal(None, tuple(inst.register_output.shape), tags[0] if tags else None)

    def _elementwise(self, inst, env, role, group, active):
        # a fused epilogue's arithmetic on the accumulator (bias, activation, swiglu's gate times up):
        # the result carries the accumulator's tag, not the bias's
        env[inst.register_output] = RegVal(
            None, tuple(inst.register_output.shape), _result_tag([env[x].tag for x in inst.inputs])
        )

    i_SubInst = _elementwise
    i_DivInst = _elementwise
    i_WhereInst = _elementwise
    i_ElementwiseUnaryInst = _elementwise
    i_ElementwiseBinaryInst = _elementwise
    i_UnsqueezeInst = _same_tag

    def i_SliceAssignInst(self, inst, env, role, group, active):
        # dst[offsets...] = src, in place (swiglu's output assembled piece by piece): dst takes the
        # accumulator src holds
        dst, src = (env[x] for x in inst.inputs)
        env[inst.inputs[0]] = dataclasses.replace(dst, tag=_result_tag([src.tag, dst.tag]))

    def i_MulInst(self, inst, env, role, group, active):
        # a widened weight times its scales: the product carries the weight's tag, not the scales'
        tags = [env[x].tag for x in inst.inputs if env[x].tag is not None]
        tags = [t for t in tags if not (isinstance(t, LoadTag) and t.matrix in SIDE_OPERANDS.values())] or tags
        env[inst.register_output] = RegVal(None, tuple(inst.register_output.shape), tags[0] if tags else None)

    def i_LoadSharedInst(self, inst, env, role, group, active):
        ref = env[inst.inputs[0]]
        spans = role.cta.read_spans(ref)
        accs = [t for _, _, t in spans if isinstance(t, (AccTag, PiecedTag))]
        if len({id(t) for t in accs}) > 1:  # several accumulators' slabs of one buffer, read whole
            tag = self._pieces(ref, spans)
        else:
            tag = accs[0] if accs else (spans[0][2] if spans else None)
        env[inst.register_output] = RegVal(None, tuple(inst.register_output.shape), tag)

    def _pieces(self, ref: MemRef, spans: list) -> PiecedTag:
        """The rows of a row-major view that each accumulator's span covers; a span that is not
        whole rows of a 2-D view is beyond the model."""
        width, height = ref.shape[-1], math.prod(ref.shape[:-1])
        if ref.strides != row_major(ref.shape) or height != ref.shape[-2]:
            self.fail("unsupported", f"a read of several accumulators' slabs through a {ref.shape} view")
        pieces = []
        for start, end, tag in spans:
            first, last = start - ref.start, end - ref.start
            if not isinstance(tag, AccTag) or first % width or last % width:
                self.fail("unsupported", "a read of several accumulators' slabs that are not whole rows of it")
            pieces.append((tag, first // width, last // width))
        return PiecedTag(tuple(sorted(pieces, key=lambda p: p[1])))

    def i_MapSharedAddrInst(self, inst, env, role, group, active):
        value = env[inst.inputs[0]]
        rank = self.eval(inst.target_rank, env, role)
        target = self.cta_of(role.cta, rank).index
        data = [dataclasses.replace(a, cta=target) for a in value.data]
        env[inst.register_output] = RegVal(data, value.shape, None)

    def i_LoadGlobalInst(self, inst, env, role, group, active):
        src: GlobalRef = env[inst.inputs[0]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        shape = tuple(int(s) for s in inst.register_output.shape)
        key = self.workspace_key(src, offsets)
        if key is not None:
            self.load_workspace(key, env, inst, role, shape)
            return
        if src.matrix == "A" and self.k_block is None:
            self.k_block = shape[-1]
        env[inst.register_output] = RegVal(None, shape, LoadTag(src.matrix, offsets[0], shape[0], offsets[1], shape[1]))

    def i_SliceGlobalInst(self, inst, env, role, group, active):
        ref: GlobalRef = env[inst.inputs[0]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        row, col = offsets[-2:] if len(offsets) >= 2 else (0, offsets[0] if offsets else 0)
        env[inst.global_output] = dataclasses.replace(ref, base=ref.base + row * ROW_STRIDE + col)

    def _generic_start(self, inst, env, role) -> tuple[GlobalRef, int]:
        """The tensor a lowered load/store reaches and the element offset it starts at (its offset
        at axes 0): for A, B and C a (row, column) at ``ROW_STRIDE``, for a workspace its own layout's."""
        ref: GlobalRef = env[inst.ptr]
        local = dict(env)
        for axis in inst.axes:
            local[axis] = 0
        return ref, ref.base + self.eval(inst.offset, local, role)

    def i_LoadGlobalGenericInst(self, inst, env, role, group, active):
        shape = tuple(int(s) for s in inst.register_output.shape)
        ref, offset = self._generic_start(inst, env, role)
        if _is_workspace(ref):
            self.load_workspace((ref.matrix, offset), env, inst, role, shape)
            return
        row, col = divmod(offset, ROW_STRIDE)
        if ref.matrix == "A" and self.k_block is None:
            self.k_block = shape[-1]
        env[inst.register_output] = RegVal(None, shape, LoadTag(ref.matrix, row, shape[0], col, shape[1]))

    def i_StoreGlobalGenericInst(self, inst, env, role, group, active):
        ref, offset = self._generic_start(inst, env, role)
        value: RegVal = env[inst.inputs[0]]
        if _is_workspace(ref):
            self.store_workspace((ref.matrix, offset), value, role)
            return
        if ref.matrix != "C":
            self.fail("unsupported", f"a store into {ref.matrix}")
        self.record_store(role, [value.tag], list(divmod(offset, ROW_STRIDE)), value.shape[-2:], "store")

    def i_StoreGlobalInst(self, inst, env, role, group, active):
        # the destination is C (the only global view stored to) or a workspace of the kernel's own
        value: RegVal = env[inst.inputs[1]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        key = self.workspace_key(env[inst.inputs[0]], offsets)
        if key is not None:
            self.store_workspace(key, value, role)
            return
        self.record_store(role, [value.tag], offsets, value.shape[-2:], "store")

    def i_StoreSharedInst(self, inst, env, role, group, active):
        dst: MemRef = env[inst.inputs[0]]
        value: RegVal = env[inst.inputs[1]]
        self.check_write(role.cta, dst.alloc, dst.start, dst.end, f"{role.name}'s store")
        role.cta.write_tag(dst, value.tag)


def _is_workspace(ref: GlobalRef) -> bool:
    """A kernel's own global allocation (``i_AllocateGlobalInst``), not A, B, C or a side operand."""
    return ref.matrix.startswith(("workspace", "flags"))


def _indexed(inst) -> bool:
    """Whether an allocated register tensor's initial values depend on their indices."""
    from tilus.hidet.ir.expr import Var
    from tilus.hidet.ir.tools import collect

    return inst.init is not None and bool(set(collect(inst.init, Var)) & set(inst.axes or ()))


def _result_tag(tags: list):
    """The tag of an elementwise result: the first accumulator among its inputs' tags, else a load
    of A or B (not of a side operand), else None."""
    accs = [t for t in tags if isinstance(t, (AccTag, PiecedTag))]
    if accs:
        return accs[0]
    loads = [t for t in tags if isinstance(t, LoadTag) and t.matrix not in SIDE_OPERANDS.values()]
    return loads[0] if loads else None
