"""tilus 0.2.0 fault ``int4_bf16_cast``: a register cast from int4 to bfloat16 is done one value at a time.

tilus casts ``int4b`` register tensors to ``float16`` eight values at a time with the magic-number
trick (``lop3`` into the mantissa of 1024.0, one subtraction, ``prmt``), but has no such path to
``bfloat16``: the generic cast extracts and converts each value on its own (Hopper V8 with
bfloat16 activations went through ``float16`` and a ``cvt`` per value: twice the instructions of
its float16 twin). The fix adds the bfloat16 twin of the float16 path: per 32-bit word of eight
values, the sign offset (``xor 0x88888888``: ``q + 8``, 0..15), ``lop3`` of the word shifted by 0,
4, 8, 12 bits with the mask ``0x000F000F`` into the mantissa of 128.0 (``0x4300``: the low 7 bits
of the mantissa count 1s from 128 on, so 128 + u is exact), ``fma.rn.bf16x2`` by 1 and -136 (exact:
the result is an integer of -8..7), and ``prmt`` to put the pairs in order: 16 instructions for 8
values.
"""

import functools

from .fix import Fix

_FMA = "int4_bf16_fma_bf16x2"


def _register_fma() -> None:
    from tilus.hidet.ir.dtypes import uint32
    from tilus.hidet.ir.primitives.func import is_primitive_function, register_primitive_function
    from tilus.hidet.ir.stmt import asm
    from tilus.hidet.lang import attrs, script

    if is_primitive_function("cuda_" + _FMA):
        return

    @script
    def cuda_int4_bf16_fma_bf16x2(a: uint32, b: uint32, c: uint32) -> uint32:
        attrs.func_name = "cuda_" + _FMA
        attrs.func_kind = "cuda_internal"
        ret: uint32 = 0
        asm(template="fma.rn.bf16x2 %0, %1, %2, %3;", outputs=[ret], inputs=[a, b, c], is_volatile=False)
        return ret

    register_primitive_function(name=cuda_int4_bf16_fma_bf16x2.name, func_or_type=cuda_int4_bf16_fma_bf16x2)


def cast_i4_to_bf16(self, src, dst) -> None:
    """The emitter method (``NvgpuCastInstEmitter``) for int4b -> bfloat16 (module doc)."""
    from tilus.hidet.ir.dtypes import uint32
    from tilus.hidet.ir.expr import Var, cast, tensor_pointer_var, tensor_var
    from tilus.hidet.ir.primitives.cuda.funcs import call_cuda
    from tilus.hidet.ir.primitives.cuda.lop3 import lop3
    from tilus.hidet.ir.primitives.cuda.prmt import prmt

    if self.size % 8 != 0:
        self.cast_generic(src, dst)
        return
    _register_fma()
    words, pairs = self.size // 8, self.size // 2
    src_u32 = self.declare(v=tensor_pointer_var("src_u32", shape=[words], dtype="uint32"), init=cast(src, ~uint32))
    dst_u32 = self.declare(v=tensor_pointer_var("dst_u32", shape=[pairs], dtype="uint32"), init=cast(dst, ~uint32))
    imm_lut = (0xF0 & 0xCC) | 0xAA  # (a & b) | c
    with self.for_range(extent=self.size // 8) as i:
        u = self.declare(v=Var("u", type=uint32), init=src_u32[i] ^ uint32(0x88888888))  # q + 8 per nibble
        h = self.declare(v=tensor_var("h", shape=[4], dtype=uint32))
        for j in range(4):  # h[j]: values j (low half) and j + 4 (high half), 128 + u each
            self.append(lop3(~h[j], u >> (4 * j), uint32(0x000F000F), uint32(0x43004300), imm_lut=imm_lut))
            one, minus_136 = uint32(0x3F803F80), uint32(0xC308C308)
            self.buffer_store(h, indices=[j], value=call_cuda(_FMA, [h[j], one, minus_136]))
        self.append(prmt(d=~dst_u32[(i << 2) | 0], a=h[0], b=h[1], c=uint32(0x5410)))  # values 0, 1
        self.append(prmt(d=~dst_u32[(i << 2) | 1], a=h[2], b=h[3], c=uint32(0x5410)))  # values 2, 3
        self.append(prmt(d=~dst_u32[(i << 2) | 2], a=h[0], b=h[1], c=uint32(0x7632)))  # values 4, 5
        self.append(prmt(d=~dst_u32[(i << 2) | 3], a=h[2], b=h[3], c=uint32(0x7632)))  # values 6, 7


def _with_bf16_path(original):
    @functools.wraps(original)
    def __init__(self, codegen):  # noqa: N807
        from tilus.hidet.ir.dtypes import bfloat16, int4b

        original(self, codegen)
        self.specialized_cast[(int4b, bfloat16)] = functools.partial(cast_i4_to_bf16, self)

    return __init__


def make() -> Fix:
    from tilus.backends.emitters.cast import NvgpuCastInstEmitter

    return Fix(
        name="int4_bf16_cast",
        fault="int4 -> bfloat16 register casts convert one value at a time (float16 has an 8-value path)",
        patches=[(NvgpuCastInstEmitter, "__init__", _with_bf16_path)],
    )
