"""Low-precision weights widened on chip: a packed int4 tile in shared memory -> the 16-bit wgmma A
operand in registers, scaled, one 64 x 64 half of a 64 x 128 group tile at a time.

The packed tile is the layout ``matmul.quant`` writes (``matmul.quant.int4``): a 64-row x 128-column
tile of signed int4 (one scale group along K) is 4 KiB, ``[half h][thread t][word j]`` int32 words,
so thread ``t`` of a warpgroup reads its 16 bytes of half ``h`` with one ``ld.shared.v4`` (128
threads read 2 KiB one after another: no bank conflict). Word ``j`` holds the 8 values of K step
``4 h + j`` that thread ``t`` holds in the wgmma A fragment (``tilus_fixes.wgmma_register_a.a_fragment``),
in register order, low nibble first. Viewed as an int4 register tensor in that fragment layout, the
words are widened by tilus's own cast (``int4b -> float16``: lop3 with the 0x6400 magic number,
one subtraction or fma, prmt to restore the order: 8 values from one word; ``bfloat16``: the same
with 0x4300, ``matmul.tilus_fixes.int4_bf16_cast``), then multiplied by the
row's scale, loaded once per tile in the layout of one column of the fragment (each thread the two
rows it holds).
"""

import tilus
from tilus import RegisterTensor, SharedTensor, float8_e4m3, float16, int4b, int32, uint6b
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
    language slices registers only by whole dimensions)."""
    builder = base._current_builder
    if builder is None:
        raise RuntimeError("word_columns is called from kernel code only")
    return builder.slice_register(words, offsets=[0, first], slice_dims=[0, 1], slice_shape=[128, count])


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

    def values(self, words: RegisterTensor, scale: RegisterTensor, part: int) -> RegisterTensor:
        """Part ``part`` (``cols`` K columns) of a half tile's ``words`` as the 64 x ``cols`` A operand
        of integers -8 .. 7 in the scales' dtype (exact in float16 and bfloat16), unscaled."""
        per_part = self.cols // 16  # words: one a K step of 16 columns
        if per_part == WORDS:
            mine = words
        else:  # the part's words, as a tensor of their own: a view keeps every bit of its source
            mine = word_columns(words, part * per_part, per_part)
            self.annotate_layout(mine, packed_words(per_part))
        values = self.view(mine, layout=self.fragment, dtype=int4b)
        wide = values.to(scale.dtype)  # 8 values a word (bfloat16: matmul.tilus_fixes.int4_bf16_cast)
        self.annotate_layout(wide, self.fragment)
        return wide

    def operand(self, words: RegisterTensor, scale: RegisterTensor, part: int) -> RegisterTensor:
        """``values``, each multiplied by its row's scale: the dequantized weight, rounded once."""
        out = self.values(words, scale, part) * scale
        self.annotate_layout(out, self.fragment)
        return out


def is_float16(dtype) -> bool:
    """(a plain function: kernel code would turn the comparison into a device expression)"""
    return dtype.name == "float16"


class Int6Widen(tilus.Class):
    """Widen packed 6-bit tiles (``matmul.quant.int6``): a half tile's
    32 values of a thread are 6 words (value l at bits 6 l ... 6 l + 5 of the 192), unsigned with the
    zero point 32, in the fragment order; tilus's uint6 -> float16 cast takes them two at a time."""

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
        """A half tile's ``words`` as the 64 x 64 A operand: (u - 32) * scale."""
        values = self.view(words, layout=self.fragment, dtype=uint6b)
        if is_float16(scale.dtype):
            wide = values.to(float16)
        else:  # no uint6 -> bfloat16 cast in tilus: through float16 (exact: integers of 0..63)
            wide = values.to(float16).to(scale.dtype)
        self.annotate_layout(wide, self.fragment)
        out = (wide - 32.0) * scale
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


__all__ = ["Fp8Widen", "Int4Widen", "Int6Widen", "reduce_layout", "packed_words", "ROWS", "HALF_K", "WORDS", "int32"]
