"""tilus 0.2.0 fault ``mn_major_operands``: MMA operands stored MN-major in shared memory.

The tensor cores read a 16-bit operand from shared memory along either dimension: K-major (a row
of A or of B [N, K] is contiguous) or MN-major (a column is: b [K, N] row-major, as torch stores
it). tilus 0.2.0 recognizes both canonical layouts (``canonicalize_shared_layout`` returns
``major_kind`` "K" or "MN", with the leading and stride byte offsets of the PTX ISA's matrix
descriptor for that majorness), but three steps lose an MN-major operand:

* wgmma: ``WgmmaMmaSSEmitter`` emits every ``wgmma.mma_async`` with ``imm-trans-a`` and
  ``imm-trans-b`` = 0, so an MN-major operand's descriptor is read as K-major: wrong products,
  silently. Here the flags follow the canonical layouts' majorness (16-bit types only, as PTX
  allows).
* tcgen05: ``TMemoryMmaSSEmitter.check_majorness`` accepts only two K-major or two MN-major
  operands and refuses a K-major A with an MN-major B; the instruction descriptor has one
  transpose bit per operand (which the emitter already sets from the majorness), and PTX allows
  every combination for 8- and 16-bit types. Here a mixed pair is accepted for those.
* layout inference: an MMA's rule runs before the rules that carry a layout from a shared tensor
  to its views (``s[slot]``, ``.transpose()``, ``reshape_shared``), so the MMA rule gives the view
  it reads its own K-major guess even when the tensor the view is cut from has an MN-major layout
  (annotated), and nothing checks that the two agree: the MMA reads a layout that the TMA loads
  never wrote. Here a view whose source's layout is known takes it before any other rule runs
  (the views' rules themselves keep their place: run first, their other direction, from a view
  to its source, fails on layouts that other rules would have given the source first).
"""

from __future__ import annotations

import functools

from .fix import Fix

SIXTEEN_BIT_OR_NARROWER = (8, 16)  # type sizes (bits) whose operands may be MN-major in shared memory


def _major(tensor, transposed: bool) -> str:
    from tilus.ir.layout.cuda.tcgen05.smem import canonicalize_shared_layout

    layout = tensor.layout.transpose() if transposed else tensor.layout
    canonical = canonicalize_shared_layout(layout, dtype=tensor.dtype)
    return canonical.major_kind if canonical is not None else "K"  # the emitter reports an unknown layout


def _wgmma_transpose_flags(original):
    # wraps ``emit`` (inherited from WgmmaBaseEmitter), not ``emit_wgmma``: fence_tall_accumulators
    # wraps that one, and taking one fix out must not take the other's wrapper with it
    @functools.wraps(original)
    def emit(self, inst):
        from tilus.backends.emitters.cuda import wgmma as emitter

        a, b = inst.inputs[0].as_shared_tensor(), inst.inputs[1].as_shared_tensor()
        trans_a = int(_major(a, transposed=False) == "MN")  # A [m, k]
        trans_b = int(_major(b, transposed=True) == "MN")  # B [k, n], canonicalized as [n, k]
        if not (trans_a or trans_b):
            return original(self, inst)
        if a.dtype.nbits != 16:
            raise ValueError(f"wgmma reads an MN-major operand only for 16-bit types, not {a.dtype.name}")
        emit_async = emitter.wgmma_async

        def wgmma_async(*args, **kwargs):
            return emit_async(*args, **{**kwargs, "trans_a": trans_a, "trans_b": trans_b})

        emitter.wgmma_async = wgmma_async  # what emit_wgmma calls, for this instruction only
        try:
            return original(self, inst)
        finally:
            emitter.wgmma_async = emit_async

    return emit


def _mixed_majorness_for_narrow_types(original: staticmethod):
    check = original.__func__

    @functools.wraps(check)
    def check_majorness(a_major_kind, b_major_kind, type_size, swizzle_mode):
        if a_major_kind != b_major_kind and type_size in SIXTEEN_BIT_OR_NARROWER:
            return None
        return check(a_major_kind, b_major_kind, type_size, swizzle_mode)

    return staticmethod(check_majorness)


def _view_rules():
    from tilus.ir.instructions import PermuteSharedInst, ReshapeSharedInst, SliceSharedInst
    from tilus.ir.layout.inference.inference_rules.reshape_shared import ReshapeSharedRule
    from tilus.ir.layout.inference.inference_rules.transform_shared import PermuteSharedRule, SharedSliceRule

    return {
        SliceSharedInst: SharedSliceRule,
        PermuteSharedInst: PermuteSharedRule,
        ReshapeSharedInst: ReshapeSharedRule,
    }


@functools.cache
def _view_of_a_known_layout():
    """A rule for the shared views (slice, permute, reshape) that only carries a known layout from the
    source to the view, as the view's own rule does; it runs before every other rule."""
    from tilus.ir.layout.inference.rule import LayoutInferenceRule

    rules = _view_rules()

    class ViewOfAKnownLayout(LayoutInferenceRule):
        @staticmethod
        def inference(ctx, inst):
            if inst.shared_input.optional_layout is None or inst.shared_output.optional_layout is not None:
                return {}
            return rules[type(inst)].inference(ctx, inst)

    return ViewOfAKnownLayout


def _with_view_rule(original):
    """The rule registry (instruction -> rules) with ``ViewOfAKnownLayout`` added for the views."""
    rules = type(original)(list, {inst: list(found) for inst, found in original.items()})
    for inst in _view_rules():
        rules[inst] = [_view_of_a_known_layout(), *rules[inst]]
    return rules


def _view_rule_first(original: dict) -> dict:
    """The rules' order with ``ViewOfAKnownLayout`` before every other rule."""
    return {**original, _view_of_a_known_layout(): min(original.values()) - 1}


def make() -> Fix:
    from tilus.backends.emitters.cuda.tcgen05.mma import TMemoryMmaSSEmitter
    from tilus.backends.emitters.cuda.wgmma import WgmmaMmaSSEmitter
    from tilus.ir.layout.inference import inference, rule

    return Fix(
        name="mn_major_operands",
        fault="an MN-major shared operand gets wgmma's trans flags 0, tcgen05 refuses it beside a K-major one, "
        "and layout inference lets the MMA's K-major guess override the layout of the tensor it is a view of",
        patches=[
            (WgmmaMmaSSEmitter, "emit", _wgmma_transpose_flags),
            (TMemoryMmaSSEmitter, "check_majorness", _mixed_majorness_for_narrow_types),
            (rule, "_inference_rules", _with_view_rule),
            (inference, "rule2order", _view_rule_first),
        ],
    )
