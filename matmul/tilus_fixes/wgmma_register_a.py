"""tilus 0.2.0 fault ``wgmma_register_a``: ``wgmma.mma`` with its A operand in registers cannot be built.

The language takes a register tensor as A (``self.wgmma.mma(a_registers, b_shared, acc)`` makes a
``WgmmaMmaRSInst``), and hidet has the PTX for it (``wgmma_async`` with a register pointer), but
tilus 0.2.0 registers no emitter for the instruction (the build stops with "no emitter") and no
layout inference rule (B's shared layout and the accumulator's are never inferred). The fix adds
both, after the shared-memory form ``WgmmaMmaSSInst``:

* the rule gives B and D the layouts the SS rule gives them (B K-major, the widest swizzle that
  fits; D the wgmma accumulator fragment). A's layout is the kernel's to give: it is the
  register fragment of the A operand (``a_fragment``), which the kernel builds in registers;
* the emitter issues one ``wgmma.mma_async ... {a0, a1, a2, a3}, b_desc`` per 16-column K step
  and per instruction tile of N, A's registers taken from its local array in fragment order
  (``a_fragment``: eight 16-bit values a K step, rows g and g + 8, columns 2c, 2c + 1, 2c + 8,
  2c + 9 of the PTX manual's figure for A in registers).
"""

from __future__ import annotations

import functools

from .fix import Fix

WGMMA_ROWS = 64


def a_fragment(rows: int, cols: int):
    """The register layout of a 16-bit wgmma A operand ``rows x cols`` (rows 64, cols a multiple of
    16) in one warpgroup: per 16-column K step, thread ``32 w + 4 g + c`` holds rows ``16 w + g``
    and ``16 w + g + 8`` at columns ``2c, 2c + 1, 2c + 8, 2c + 9``, in the register order of the
    PTX manual (a0 a1: row g; a2 a3: row g + 8; a4 a5: row g, columns + 8; a6 a7: row g + 8)."""
    from tilus.ir.layout.inference.inference_rules.wgmma import generate_wgmma_register_layout

    if rows != WGMMA_ROWS or cols % 16:
        raise ValueError(f"a wgmma A operand in registers is 64 x (a multiple of 16), not {rows} x {cols}")
    # the accumulator fragment of an m64n16 instruction has exactly this shape, K steps as its N tiles
    return generate_wgmma_register_layout(rows, cols, WGMMA_ROWS, 16, 16)


@functools.cache
def _rule():
    from tilus.ir.instructions.cuda.wgmma import WgmmaMmaSSInst
    from tilus.ir.layout.cuda.tcgen05.smem import Tcgen05SwizzleMode, generate_canonical_layout
    from tilus.ir.layout.inference.inference_rules.wgmma import generate_wgmma_register_layout
    from tilus.ir.layout.inference.rule import LayoutInferenceRule

    class WgmmaMmaRSRule(LayoutInferenceRule):
        @staticmethod
        def inference(ctx, inst):
            a = inst.inputs[0].as_register_tensor()
            b = inst.inputs[1].as_shared_tensor()
            d = inst.inputs[2].as_register_tensor()
            m, n, k = d.shape[0], d.shape[1], a.shape[1]
            found = {}
            if not b.has_layout():
                for mode in (
                    Tcgen05SwizzleMode.B128_SWIZZLE,
                    Tcgen05SwizzleMode.B64_SWIZZLE,
                    Tcgen05SwizzleMode.B32_SWIZZLE,
                    Tcgen05SwizzleMode.NO_SWIZZLE,
                ):
                    try:
                        canonical = generate_canonical_layout(
                            shape=(n, k), dtype=b.dtype, major_kind="K", swizzle_mode=mode
                        )
                    except ValueError:
                        continue
                    found[b] = canonical.as_shared_layout().permute(dims=[1, 0])
                    break
            if not d.has_layout():
                inst_m, inst_n, inst_k = WgmmaMmaSSInst.get_inst_mnk(m, n, k, a.dtype, b.dtype, d.dtype)
                found[d] = generate_wgmma_register_layout(m, n, inst_m, inst_n, inst_k)
            return found

    return WgmmaMmaRSRule


def _emitter():
    from tilus.backends.emitters.cuda.wgmma import (
        SharedMatrixDescriptor,
        WgmmaBaseEmitter,
        canonicalize_shared_layout,
        encode_swizzle_mode,
    )
    from tilus.hidet.ir.primitives.cuda.wgmma import WgmmaConfig, wgmma_async
    from tilus.ir.instructions.cuda.wgmma import WgmmaMmaSSInst

    class WgmmaMmaRSEmitter(WgmmaBaseEmitter):
        def emit_wgmma(self, inst) -> None:
            a_tensor = inst.inputs[0].as_register_tensor()
            b_tensor = inst.inputs[1].as_shared_tensor()
            d_tensor = inst.inputs[2].as_register_tensor()
            m, n, k = d_tensor.shape[0], d_tensor.shape[1], a_tensor.shape[1]
            if m != WGMMA_ROWS or b_tensor.shape[0] != k or b_tensor.shape[1] != n:
                raise ValueError(
                    f"wgmma with A in registers: shapes {a_tensor.shape}, {b_tensor.shape}, {d_tensor.shape}"
                )
            if a_tensor.layout != a_fragment(m, k):
                raise ValueError(f"A in registers must have the wgmma A fragment layout, got {a_tensor.layout}")
            inst_m, inst_n, inst_k = WgmmaMmaSSInst.get_inst_mnk(
                m, n, k, a_tensor.dtype, b_tensor.dtype, d_tensor.dtype
            )
            config = WgmmaConfig.get(
                inst_m, inst_n, inst_k, a_tensor.dtype.short_name, b_tensor.dtype.short_name, d_tensor.dtype.short_name
            )
            b_canonical = canonicalize_shared_layout(b_tensor.layout.transpose(), dtype=b_tensor.dtype)
            if b_canonical is None:
                raise ValueError(f"Cannot canonicalize the layout of b tensor: {b_tensor.layout}.")
            b_cute = b_canonical.swizzled_cute_layout.layout
            b_addr = self.shared_tensor_shared_space_addr[b_tensor]
            a_registers = ~(self.tensor2var[a_tensor][0])
            d_registers = ~(self.tensor2var[d_tensor][0])
            repeat_n = n // inst_n
            d_stride = d_tensor.layout.local_size // repeat_n
            a_stride = a_tensor.layout.local_size // (k // inst_k)  # 8 values a K step
            for kk in range(k // inst_k):
                for j in range(repeat_n):
                    b_desc = SharedMatrixDescriptor(
                        addr=b_addr + b_cute(j * inst_n, kk * inst_k) * b_tensor.dtype.nbytes,
                        lbo=b_canonical.LBO * b_tensor.dtype.nbytes,
                        sbo=b_canonical.SBO * b_tensor.dtype.nbytes,
                        base_offset=0,
                        swizzle_mode=encode_swizzle_mode(b_canonical.swizzle_mode),
                    )
                    self.append(
                        wgmma_async(
                            config, a_registers + kk * a_stride, d_registers + j * d_stride, b_desc.encoded(), trans_b=0
                        )
                    )

    return WgmmaMmaRSEmitter


def _with_rs_emitter(original: dict) -> dict:
    from tilus.ir.instructions.cuda.wgmma import WgmmaMmaRSInst
    from tilus.target import nvgpu_sm90a

    registry = dict(original)
    registry[WgmmaMmaRSInst] = {**original.get(WgmmaMmaRSInst, {}), nvgpu_sm90a: _emitter()}
    return registry


def _with_rs_rule(original):
    from collections import defaultdict

    from tilus.ir.instructions.cuda.wgmma import WgmmaMmaRSInst

    rules = defaultdict(list, {key: list(value) for key, value in original.items()})
    rules[WgmmaMmaRSInst].append(_rule())
    return rules


def _with_rs_order(original: dict) -> dict:
    from tilus.ir.layout.inference.inference_rules.wgmma import WgmmaMmaSSRule

    return {**original, _rule(): original[WgmmaMmaSSRule]}  # inferred when the SS form would be


def make() -> Fix:
    from tilus.backends.emitter import BaseInstEmitter
    from tilus.ir.layout.inference import inference, rule

    return Fix(
        name="wgmma_register_a",
        fault="wgmma.mma with A in registers has no emitter and no layout inference rule",
        patches=[
            (BaseInstEmitter, "REGISTRY", _with_rs_emitter),
            (rule, "_inference_rules", _with_rs_rule),
            (inference, "rule2order", _with_rs_order),
        ],
    )
