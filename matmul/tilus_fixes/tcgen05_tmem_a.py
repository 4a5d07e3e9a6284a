"""tilus 0.2.0 fault ``tcgen05_tmem_a``: ``tcgen05.mma`` with its A operand in tensor memory cannot be built.

The language takes a tensor-memory tensor as A (``self.tcgen05.mma(a_tmem, b_shared, d_tmem)``
makes a ``Tcgen05MmaTSInst``), tilus has a layout inference rule for it (B's shared layout), and
hidet has the PTX (``tcgen05.mma.cta_group::1.kind::f16 [d], [a], b_desc, idesc, p``), but tilus
0.2.0 registers no emitter and no layout validation rule for the instruction: the build stops
with "No layout validation rule registered for Tcgen05MmaTSInst" (and then "no emitter"). The fix
gives it the validation rule the shared-memory form has (``AlwaysOkayRule``: the operands'
layouts are checked by the emitter), and an emitter modelled on the shared-memory form's
(``TMemoryMmaSSEmitter``, whose MMA kind, shape and instruction descriptor it reuses):

* one ``tcgen05.mma`` per 16-column K step (kind::f16) and per instruction tile of N, issued by
  the warp's leader lane, as the shared-memory form issues them;
* A's address is the tensor-memory address of the tile plus the K step's columns: A in tensor
  memory is K-major by definition (PTX: row ``i`` of a 128-row A is lane ``i``, its 16-bit values
  two to a 32-bit column in K order), so a step of 16 values is 8 columns and the descriptor's
  transpose-A bit is 0;
* B's shared-memory descriptor and the descriptor's transpose-B bit as the shared-memory form
  computes them (K-major or MN-major, the canonical swizzled layouts).

Only ``cta_group::1`` (Blackwell V8, its widened weight as A) is supported; a 2-CTA MMA with A in
tensor memory is refused when the kernel is built.
"""

from __future__ import annotations

from .fix import Fix


def _emitter():
    from tilus.backends.codegen import CodeGenerationFailed
    from tilus.backends.emitters.cuda.tcgen05.mma import Tcgen05MmaInstDesc, TMemoryMmaSSEmitter
    from tilus.backends.emitters.cuda.tcgen05.smem_desc import SharedMatrixDescriptor
    from tilus.hidet.ir.dtypes import uint32, uint64
    from tilus.hidet.ir.expr import as_expr, logical_or
    from tilus.hidet.ir.primitives.cuda.tcgen05 import (
        COLUMN_STRIDE,
        Tcgen05CtaGroupKind,
        tcgen05_mma_with_tmem_a,
    )
    from tilus.ir.layout.cuda.tcgen05.smem import canonicalize_shared_layout

    class Tcgen05MmaTSEmitter(TMemoryMmaSSEmitter):
        def emit(self, inst) -> None:
            self.assert_is_warp_aligned(inst, "tcgen05.mma is a warp-cooperative instruction")
            a_tensor = inst.inputs[0].as_tmemory_tensor()
            b_tensor = inst.inputs[1].as_shared_tensor()
            d_tensor = inst.inputs[2].as_tmemory_tensor()
            if inst.cta_group != 1:
                raise CodeGenerationFailed("tcgen05.mma with A in tensor memory: only cta_group::1 is supported")
            (m_size, k_size), (b_k, n_size) = a_tensor.shape, b_tensor.shape
            if b_k != k_size or tuple(d_tensor.shape) != (m_size, n_size):
                raise CodeGenerationFailed(
                    f"tcgen05.mma with A in tensor memory: shapes a={a_tensor.shape}, b={b_tensor.shape}, "
                    f"d={d_tensor.shape}"
                )
            if a_tensor.layout.lane_offset != 0 or a_tensor.layout.column_strides[-1] != 1:
                raise CodeGenerationFailed(f"A in tensor memory must start at lane 0, K-contiguous: {a_tensor.layout}")
            b_canonical = canonicalize_shared_layout(b_tensor.layout.transpose(), dtype=b_tensor.dtype)  # [n, k]
            if b_canonical is None:
                raise CodeGenerationFailed(f"Cannot canonicalize the layout of b tensor: {b_tensor.layout}.")
            mma_kind = self.get_mma_kind(a_tensor.dtype, b_tensor.dtype, d_tensor.dtype)
            inst_m, inst_n, inst_k = self.get_inst_mnk(mma_kind, 1, m_size, n_size, k_size)
            i_desc = Tcgen05MmaInstDesc.create(
                mma_kind=mma_kind,
                sparsity_selector=0,
                sparsity=False,
                saturate_for_integer=False,
                d_dtype=d_tensor.dtype,
                a_dtype=a_tensor.dtype,
                b_dtype=b_tensor.dtype,
                negate_a=False,
                negate_b=False,
                transpose_a=False,  # A in tensor memory is K-major
                transpose_b=b_canonical.major_kind == "MN",
                n=inst_n,
                m=inst_m,
                maximim_shift_in_ws=0,
            )
            b_cute = b_canonical.swizzled_cute_layout.layout
            a_tmem_addr = self.tensor2var[a_tensor]
            b_shared_addr = self.shared_tensor_shared_space_addr[b_tensor]
            d_tmem_addr = self.tensor2var[d_tensor]
            step_columns = inst_k * a_tensor.dtype.nbits // 32  # 32-bit TMEM columns of one K step of A
            i_desc_var = self.declare_var("i_desc", tp=uint32, init=as_expr(i_desc.encoded()))
            for k in range(k_size // inst_k):
                for j in range(n_size // inst_n):
                    b_desc = SharedMatrixDescriptor(
                        addr=b_shared_addr + b_cute(j * inst_n, k * inst_k) * b_tensor.dtype.nbytes,
                        lbo=b_canonical.LBO * b_tensor.dtype.nbytes,
                        sbo=b_canonical.SBO * b_tensor.dtype.nbytes,
                        base_offset=0,
                        stride_mode=0,
                        swizzle_mode=b_canonical.swizzle_mode.encode(),
                    )
                    b_desc_var = self.declare_var("b_desc", tp=uint64, init=b_desc.encoded())
                    self.append(
                        tcgen05_mma_with_tmem_a(
                            d_tmem=d_tmem_addr + j * inst_n * COLUMN_STRIDE,
                            a_tmem=a_tmem_addr + k * step_columns * COLUMN_STRIDE,
                            b_desc=b_desc_var,
                            i_desc=i_desc_var,
                            enable_input_d=logical_or(inst.enable_input_d, k != 0),
                            cta_group=Tcgen05CtaGroupKind.CTA_1,
                            mma_kind=mma_kind,
                            predicate=self.contexts.leader_lane_ctx.leader_lane,
                        )
                    )

    return Tcgen05MmaTSEmitter


def _with_ts_emitter(original: dict) -> dict:
    from tilus.ir.instructions.cuda.tcgen05 import Tcgen05MmaTSInst
    from tilus.target import nvgpu_sm100a

    registry = dict(original)
    registry[Tcgen05MmaTSInst] = {**original.get(Tcgen05MmaTSInst, {}), nvgpu_sm100a: _emitter()}
    return registry


def _with_ts_validation(original: dict) -> dict:
    from tilus.ir.instructions.cuda.tcgen05 import Tcgen05MmaSSInst, Tcgen05MmaTSInst

    return {**original, Tcgen05MmaTSInst: original[Tcgen05MmaSSInst]}


def make() -> Fix:
    from tilus.backends.emitter import BaseInstEmitter
    from tilus.ir.layout.inference import rule

    return Fix(
        name="tcgen05_tmem_a",
        fault="tcgen05.mma with A in tensor memory has no emitter and no layout validation rule",
        patches=[
            (BaseInstEmitter, "REGISTRY", _with_ts_emitter),
            (rule, "_validation_rules", _with_ts_validation),
        ],
    )
