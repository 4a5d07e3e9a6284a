"""Low-precision weights widened on chip: a packed int4 tile in shared memory -> the 16-bit wgmma A
operand in registers, scaled, one 64 x 64 half of a 64 x 128 group tile at a time.

The packed tile is the layout ``matmul.quant`` writes (``matmul.quant.int4``): a 64-row x 128-column
tile of signed int4 (one scale group along K) is 4 KiB, ``[half h][thread t][word j]`` int32 words,
so thread ``t`` of a warpgroup reads its 16 bytes of half ``h`` with one ``ld.shared.v4`` (128
threads read 2 KiB one after another: no bank conflict). Word ``j`` holds the 8 values of K step
``4 h + j`` that thread ``t`` holds in the wgmma A fragment (``tilus_fixes.wgmma_register_a.a_fragment``),
value ``2 p`` of them in nibble ``p`` and value ``2 p + 1`` in nibble ``p + 4`` (``p < 4``): the
order in which the magic-number conversion makes its pairs, so each pair lands in the 32-bit
register the fragment wants it in and nothing reorders it (tilus's own cast of an ``int4b`` tensor
keeps the values' order and spends four ``prmt`` a word on it).

The conversion (``int4_pairs``): pair ``p`` of a word, two 16-bit values in 32 bits, is one
``lop3`` (the mask of nibbles ``p`` and ``p + 4`` and one constant xored in: the sign's offset, ``q + 8``,
and the magic number touch disjoint bits) and one 16-bit-pair instruction. float16: the magic
number 1024 (``0x6400``) under nibbles 0 and 4 (bits 0-3 of each half; ``sub.f16x2`` of 1032) or 1
and 5 (bits 4-7; ``fma.rn.f16x2`` by 1/16, less 72), the word shifted by 8 for pairs 2 and 3.
bfloat16, 7 mantissa bits: the magic number 128 (``0x4300``) under bits 0-3 of the word shifted by
``4 p``, ``fma.rn.bf16x2`` by 1 and -136. The result is the integer -8..7, exact in both dtypes;
the operand is it times the row's scale, loaded once per tile in the layout of one column of the
fragment (each thread the two rows it holds).
"""

import tilus
from tilus import RegisterTensor, SharedTensor, bfloat16, float8_e4m3, float16, float32, int32
from tilus.ir.layout.ops.register_ops import local, reduce, spatial
from tilus.lang.instructions import base

from matmul.tilus_fixes.wgmma_register_a import a_fragment

ROWS = 64  # weight rows of a warpgroup: the wgmma's M
HALF_K = 64  # K columns widened at once (one wgmma call, 4 K steps)
WORDS = HALF_K * ROWS * 4 // 32 // 128  # int32 words a thread reads per half: 4 (16 bytes)


def packed_words(words: int = WORDS):
    """The layout of packed words as a [128, words] int32 register tensor: thread t holds row t."""
    return spatial(128, 1) * local(1, words)


def word_columns(words: RegisterTensor, first: int, count: int) -> RegisterTensor:
    """In kernel code: columns ``first ... first + count - 1`` of a [128, n] words tensor (the
    language slices registers only by whole dimensions). A thread's columns are consecutive
    registers: tilus 0.2.0 copies any register slice as if it were (a strided one comes out wrong)."""
    return _builder().slice_register(words, offsets=[0, first], slice_dims=[0, 1], slice_shape=[128, count])


def _builder():
    builder = base._current_builder
    if builder is None:
        raise RuntimeError("called from kernel code only")
    return builder


# the 32-bit instructions of the conversion, as functions returning their result (expressions, so
# that one elementwise instruction can compose them); registered with hidet once per process
_PAIR_PTX = {
    "int4_pairs_and_xor": "lop3.b32 %0, %1, %2, %3, 0x6A;",  # (a & b) ^ c: nvcc would emit two
    "int4_pairs_sub_f16x2": "sub.f16x2 %0, %1, %2;",
    "int4_pairs_fma_f16x2": "fma.rn.f16x2 %0, %1, %2, %3;",
    "int4_pairs_fma_bf16x2": "fma.rn.bf16x2 %0, %1, %2, %3;",
}


def _register_pair_ptx() -> None:
    for name, template in _PAIR_PTX.items():
        _register_ptx("cuda_" + name, template)


def _register_ptx(name: str, template: str) -> None:
    """``template`` (two or three 32-bit inputs) as the hidet function ``name``, once per process."""
    from tilus.hidet.ir.dtypes import uint32
    from tilus.hidet.ir.primitives.func import is_primitive_function, register_primitive_function
    from tilus.hidet.ir.stmt import asm
    from tilus.hidet.lang import attrs, script

    if is_primitive_function(name):
        return
    if "%3" not in template:

        @script
        def function(a: uint32, b: uint32) -> uint32:
            attrs.func_name = name
            attrs.func_kind = "cuda_internal"
            ret: uint32 = 0
            asm(template=template, outputs=[ret], inputs=[a, b], is_volatile=False)
            return ret

    else:

        @script
        def function(a: uint32, b: uint32, c: uint32) -> uint32:
            attrs.func_name = name
            attrs.func_kind = "cuda_internal"
            ret: uint32 = 0
            asm(template=template, outputs=[ret], inputs=[a, b, c], is_volatile=False)
            return ret

    register_primitive_function(name=function.name, func_or_type=function)


# how pair p of a word is made, per dtype: (shift, mask, constant, instruction, its operands):
# ``instruction((word >> shift) & mask ^ constant, *operands)`` (module doc); the constant is the
# magic number's bits and the sign's offset (+ 8 in the nibble's place) at once
_FP16_LOW = (0x000F000F, 0x64086408, "sub_f16x2", (0x64086408,))  # 1024 + q + 8, less 1032
_FP16_HIGH = (0x00F000F0, 0x64806480, "fma_f16x2", (0x2C002C00, 0xD480D480))  # 1024 + 16 (q + 8), / 16 - 72
PAIR_STEPS = {
    "float16": ((0, *_FP16_LOW), (0, *_FP16_HIGH), (8, *_FP16_LOW), (8, *_FP16_HIGH)),
    # 128 + q + 8, times 1 less 136
    "bfloat16": tuple((4 * p, 0x000F000F, 0x43084308, "fma_bf16x2", (0x3F803F80, 0xC308C308)) for p in range(4)),
}


def _and_xor(x, shift: int, mask: int, constant: int):
    """``(x >> shift) & mask ^ constant`` in one ``lop3`` (``x`` a uint32 device expression)."""
    from tilus.hidet.ir.dtypes import uint32
    from tilus.hidet.ir.primitives.cuda.funcs import call_cuda

    return call_cuda("int4_pairs_and_xor", [x >> uint32(shift) if shift else x, uint32(mask), uint32(constant)])


def _pair(word, which, dtype_name: str):
    """Pair ``which`` (0..3) of a packed ``word``: its nibbles ``which`` and ``which + 4`` as two
    16-bit integers in 32 bits (``PAIR_STEPS``), a device expression."""
    from tilus.hidet.ir.dtypes import uint32
    from tilus.hidet.ir.expr import cast, if_then_else
    from tilus.hidet.ir.primitives.cuda.funcs import call_cuda

    x = cast(word, uint32)
    pairs = []
    for shift, mask, constant, instruction, operands in PAIR_STEPS[dtype_name]:
        pairs.append(
            call_cuda("int4_pairs_" + instruction, [_and_xor(x, shift, mask, constant), *(uint32(v) for v in operands)])
        )
    return if_then_else(
        which == 0, pairs[0], if_then_else(which == 1, pairs[1], if_then_else(which == 2, pairs[2], pairs[3]))
    )


def int4_pairs(words: RegisterTensor, dtype) -> RegisterTensor:
    """In kernel code: packed int4 ``words`` [128, n] (a thread's row, ``local(1, n)``; or any box
    of 128 n words whose layout gives each thread n consecutive ones) widened into
    [128, n, 4] 32-bit registers, register ``4 j + p`` the pair ``p`` of word ``j`` (values ``2 p``,
    ``2 p + 1`` of the word's 8), integers -8..7 in ``dtype`` (float16 or bfloat16): a thread's 8 n
    values in the order of its words, to be viewed as a 16-bit tensor of that many per thread.
    One elementwise instruction of each word (seen 4 times, broadcast) and its pair's index."""
    if dtype.name not in PAIR_STEPS:
        raise ValueError(f"int4 widens into float16 or bfloat16, not {dtype.name}")
    _register_pair_ptx()
    builder = _builder()
    count = words.shape[0] * words.shape[1] // 128
    if list(words.shape) != [128, count]:  # a box of words, each thread its consecutive ones
        words = builder.view(words, layout=packed_words(count))
    column = builder.unsqueeze(words, dim=2)
    builder.annotate_layout(column, spatial(128, 1, 1) * local(1, count, 1))
    which = builder.allocate_register(int32, shape=[128, count, 4], f_init=lambda index: index[2])
    builder.annotate_layout(which, pair_layout(count))
    pairs = builder.elementwise_binary(column, which, f_compute=lambda word, p: _pair(word, p, dtype.name))
    builder.annotate_layout(pairs, pair_layout(count))
    return pairs


def pair_layout(count: int):
    """[128, count, 4]: thread t holds row t, its words' pairs in order."""
    return spatial(128, 1, 1) * local(1, count, 4)


class Int4Widen(tilus.Class):
    """Widen packed int4 group tiles of a warpgroup (module doc) into A operands of ``cols`` K
    columns (64: a half tile, one word per K step of 16; 32: a quarter), in the scales' dtype
    (float16 or bfloat16)."""

    def __init__(self, cols: int):
        self.cols: int = cols
        self.fragment = a_fragment(ROWS, cols)

    def scales(self, s_scale: SharedTensor) -> RegisterTensor:
        """The tile's 64 scales ([64, 1] in shared memory) in the layout of one column of the A fragment."""
        scale = self.load_shared(s_scale)
        self.annotate_layout(scale, reduce(self.fragment, dims=[1], keepdims=True))
        return scale

    def words(self, s_packed: SharedTensor) -> RegisterTensor:
        """A half tile's packed words ([128, WORDS] int32 in shared memory): 16 bytes a thread."""
        words = self.load_shared(s_packed)
        self.annotate_layout(words, packed_words())
        return words

    def values(self, words: RegisterTensor, dtype_name: str, part: int) -> RegisterTensor:
        """Part ``part`` (``cols`` K columns) of a half tile's ``words`` as the 64 x ``cols`` A operand
        of integers -8 .. 7 in the dtype named ``dtype_name`` ("float16" or "bfloat16": exact in
        both; a name, as tilus passes no data type to a method), unscaled."""
        dtype = named_dtype(dtype_name)
        per_part = self.cols // 16  # words: one a K step of 16 columns
        if per_part == WORDS:
            mine = words
        else:  # the part's words, as a tensor of their own: a view keeps every bit of its source
            mine = word_columns(words, part * per_part, per_part)
            self.annotate_layout(mine, packed_words(per_part))
        return self.view(int4_pairs(mine, dtype), layout=self.fragment, dtype=dtype)

    def operand(self, words: RegisterTensor, scale: RegisterTensor, part: int) -> RegisterTensor:
        """``values``, each multiplied by its row's scale: the dequantized weight, rounded once."""
        out = self.values(words, scale.dtype.name, part) * scale
        self.annotate_layout(out, self.fragment)
        return out


def scale_view(script, scales_ptr, n_pad, k_size, row_scales: bool, group: int = 128):
    """A packed weight's scales (``matmul.quant``), from kernel code (a plain function, called at
    transpile time): group scales [K / group, N_pad] in the activations' dtype, or with
    ``row_scales`` one float32 a row, [N_pad, 1]."""
    if row_scales:
        return script.global_view(scales_ptr, dtype=float32, shape=[n_pad, 1], strides=[1, 1])
    return script.global_view(scales_ptr, dtype=script.dtype, shape=[k_size // group, n_pad], strides=[n_pad, 1])


def named_dtype(name: str):
    """The 16-bit data type of that name (a plain function, for kernel code)."""
    return {"float16": float16, "bfloat16": bfloat16}[name]


# int6 (``matmul.quant.int6``): pair 8 g + 4 k + s of a thread's half is, with w its group's word k
# and c the group's shared word, ``(w >> 6 s) & 0x003F003F`` (s < 2), ``(w >> 12) & 0x000F000F``
# with its high bits ``(c >> 8 + 2 k) & 0x00300030`` (s = 2), or ``(c >> 6 k) & 0x003F003F``
# (s = 3); the magic number xored in (its bits are not the value's), then one 16-bit-pair
# instruction takes off the magic number and the zero point 32: float16 1024 + u less 1056,
# bfloat16 128 + u times 1 less 160
INT6_STEPS = {
    "float16": (0x64006400, "sub_f16x2", (0x64206420,)),
    "bfloat16": (0x43004300, "fma_bf16x2", (0x3F803F80, 0xC320C320)),
}
_WHOLE, _LOW_BITS, _HIGH_BITS = 0x003F003F, 0x000F000F, 0x00300030


def _int6_own(word, s, magic: int):
    """What pair s (< 3) of a group's word takes from that word, the magic number xored in; pair 3
    takes nothing (0). A device expression; ``s`` is a constant once nvcc unrolls."""
    from tilus.hidet.ir.dtypes import uint32
    from tilus.hidet.ir.expr import cast, if_then_else

    x = cast(word, uint32)
    return if_then_else(
        s == 0,
        _and_xor(x, 0, _WHOLE, magic),
        if_then_else(
            s == 1, _and_xor(x, 6, _WHOLE, magic), if_then_else(s == 2, _and_xor(x, 12, _LOW_BITS, magic), uint32(0))
        ),
    )


def _int6_shared(top, ks, magic: int):
    """What pair ``ks`` (4 k + s) of a group takes from the group's shared word ``top``: the high
    bits of a split pair (s = 2), the whole pair with the magic number (s = 3), else 0."""
    from tilus.hidet.ir.dtypes import uint32
    from tilus.hidet.ir.expr import cast, if_then_else

    x = cast(top, uint32)
    return if_then_else(
        ks == 2,
        (x >> uint32(8)) & uint32(_HIGH_BITS),
        if_then_else(
            ks == 3,
            _and_xor(x, 0, _WHOLE, magic),
            if_then_else(
                ks == 6,
                (x >> uint32(10)) & uint32(_HIGH_BITS),
                if_then_else(ks == 7, _and_xor(x, 6, _WHOLE, magic), uint32(0)),
            ),
        ),
    )


def int6_pairs(words: RegisterTensor, dtype) -> RegisterTensor:
    """In kernel code: a half tile's packed int6 ``words`` [128, 6] (a thread's row) widened into
    [128, 2, 2, 4] 32-bit registers, [t, g, k, s] the pair ``8 g + 4 k + s`` of the thread's 16
    (``matmul.quant.int6``): integers -32..31 in ``dtype`` (float16 or bfloat16), exact, to be
    viewed as the thread's 32 16-bit values of the A fragment. Words 0-3 (each group's words k) and
    4-5 (the groups' shared words) are contiguous registers: tilus 0.2.0 slices registers right only
    where the slice is contiguous."""
    if dtype.name not in INT6_STEPS:
        raise ValueError(f"int6 widens into float16 or bfloat16, not {dtype.name}")
    _register_pair_ptx()
    from tilus.hidet.ir.dtypes import uint32
    from tilus.hidet.ir.primitives.cuda.funcs import call_cuda

    magic, instruction, operands = INT6_STEPS[dtype.name]
    builder = _builder()
    pairs_layout = spatial(128, 1, 1, 1) * local(1, 2, 2, 4)
    own, shared = word_columns(words, 0, 4), word_columns(words, 4, 2)
    builder.annotate_layout(own, packed_words(4))
    builder.annotate_layout(shared, packed_words(2))
    own = builder.view(own, layout=spatial(128, 1, 1, 1) * local(1, 2, 2, 1))  # [t, g, k, 1]
    shared = builder.view(shared, layout=spatial(128, 1, 1, 1) * local(1, 2, 1, 1))  # [t, g, 1, 1]
    s = builder.allocate_register(int32, shape=[128, 2, 2, 4], f_init=lambda at: at[3])
    builder.annotate_layout(s, pairs_layout)
    ks = builder.allocate_register(int32, shape=[128, 2, 2, 4], f_init=lambda at: 4 * at[2] + at[3])
    builder.annotate_layout(ks, pairs_layout)
    from_own = builder.elementwise_binary(own, s, f_compute=lambda word, slot: _int6_own(word, slot, magic))
    builder.annotate_layout(from_own, pairs_layout)
    from_shared = builder.elementwise_binary(shared, ks, f_compute=lambda top, slot: _int6_shared(top, slot, magic))
    builder.annotate_layout(from_shared, pairs_layout)
    pairs = builder.elementwise_binary(
        from_own,
        from_shared,
        f_compute=lambda a, b: call_cuda("int4_pairs_" + instruction, [a ^ b, *(uint32(v) for v in operands)]),
    )
    builder.annotate_layout(pairs, pairs_layout)
    return pairs


class Int6Widen(tilus.Class):
    """Widen packed 6-bit group tiles (``matmul.quant.int6``) of a warpgroup into 64 x 64 A
    operands: a half tile's 32 values of a thread are its 6 words, 16 pairs two to a word and four
    split over the leftover bits, widened by ``int6_pairs``."""

    def __init__(self):
        self.fragment = a_fragment(ROWS, HALF_K)

    def scales(self, s_scale: SharedTensor) -> RegisterTensor:
        scale = self.load_shared(s_scale)
        self.annotate_layout(scale, reduce(self.fragment, dims=[1], keepdims=True))
        return scale

    def words(self, s_packed: SharedTensor) -> RegisterTensor:
        words = self.load_shared(s_packed)
        self.annotate_layout(words, packed_words(6))
        return words

    def operand(self, words: RegisterTensor, scale: RegisterTensor) -> RegisterTensor:
        """A half tile's ``words`` as the 64 x 64 A operand: (u - 32) * scale, rounded once."""
        wide = self.view(int6_pairs(words, scale.dtype), layout=self.fragment, dtype=scale.dtype)
        out = wide * scale
        self.annotate_layout(out, self.fragment)
        return out


def reduce_layout(fragment):
    """One column of a register ``fragment`` (each thread its rows' entries): a per-row operand."""
    return reduce(fragment, dims=[1], keepdims=True)


class Fp8Widen(tilus.Class):
    """Widen packed fp8 e4m3 tiles (``matmul.quant.fp8``): a thread's 16 bytes of a part are the 16
    values it holds in the A fragment of 32 K columns (two K steps), in register order."""

    def __init__(self):
        self.fragment = a_fragment(ROWS, 32)

    def words(self, s_packed: SharedTensor) -> RegisterTensor:
        words = self.load_shared(s_packed)
        self.annotate_layout(words, packed_words())
        return words

    def values(self, words: RegisterTensor) -> RegisterTensor:
        """The words as the 64 x 32 fp8 A operand, to be cast to the activations' dtype (tilus's fp8
        -> float16/bfloat16 casts take 4 values a word)."""
        return self.view(words, layout=self.fragment, dtype=float8_e4m3)


__all__ = [
    "Fp8Widen",
    "Int4Widen",
    "Int6Widen",
    "int4_pairs",
    "int6_pairs",
    "reduce_layout",
    "scale_view",
    "packed_words",
    "ROWS",
    "HALF_K",
    "WORDS",
    "int32",
]
