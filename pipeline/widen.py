"""Low-precision weights widened on chip: a packed int4 tile in shared memory -> the 16-bit wgmma A
operand in registers, scaled, one 64 x 64 half of a 64 x 128 group tile at a time.

The packed tile is the layout ``matmul.quant`` writes (``matmul.quant.int4``): a 64-row x 128-column
tile of signed int4 (one scale group along K) is 4 KiB, ``[half h][thread t][word j]`` int32 words,
so thread ``t`` of a warpgroup reads its 16 bytes of half ``h`` with one ``ld.shared.v4`` (128
threads read 2 KiB one after another: no bank conflict). Word ``j`` holds the 8 values of K step
``4 h + j`` that thread ``t`` holds in the wgmma A fragment (``tilus_fixes.wgmma_register_a.a_fragment``),
in register order, low nibble first. Viewed as an int4 register tensor in that fragment layout, the
words are widened by tilus's own cast (``int4b -> float16``: lop3 with the 0x6400 magic number,
one subtraction or fma, prmt to restore the order: 8 values from one word), then multiplied by the
row's scale, loaded once per tile in the layout of one column of the fragment (each thread the two
rows it holds).
"""

import tilus
from tilus import RegisterTensor, SharedTensor, float16, int4b, int32
from tilus.ir.layout.ops.register_ops import local, reduce, spatial

from matmul.tilus_fixes.wgmma_register_a import a_fragment

ROWS = 64  # weight rows of a warpgroup: the wgmma's M
HALF_K = 64  # K columns widened at once (one wgmma call, 4 K steps)
WORDS = HALF_K * ROWS * 4 // 32 // 128  # int32 words a thread reads per half: 4 (16 bytes)


def is_float16(dtype) -> bool:
    """(a plain function: kernel code would turn the comparison into a device expression)"""
    return dtype.name == "float16"


def packed_words():
    """The layout of a half tile's packed words as a [128, WORDS] int32 register tensor: thread t holds row t."""
    return spatial(128, 1) * local(1, WORDS)


class Int4Widen(tilus.Class):
    """Widen halves of packed int4 group tiles of a warpgroup (module doc) into A operands of the
    scales' dtype (float16 or bfloat16)."""

    def __init__(self):
        self.fragment = a_fragment(ROWS, HALF_K)

    def scales(self, s_scale: SharedTensor) -> RegisterTensor:
        """The tile's 64 scales ([64, 1] in shared memory) in the layout of one column of the A fragment."""
        scale = self.load_shared(s_scale)
        self.annotate_layout(scale, reduce(self.fragment, dims=[1], keepdims=True))
        return scale

    def half(self, s_packed: SharedTensor, scale: RegisterTensor) -> RegisterTensor:
        """Half ``h`` of a tile (``s_packed``: its [128, WORDS] int32 words) as the 64 x 64 A operand, scaled."""
        words = self.load_shared(s_packed)
        self.annotate_layout(words, packed_words())
        values = self.view(words, layout=self.fragment, dtype=int4b)
        if is_float16(scale.dtype):
            wide = values.to(float16)
        else:  # no fast int4 -> bfloat16 cast in tilus 0.2.0: through float16, exact for |q| <= 8
            wide = values.to(float16).to(scale.dtype)
        self.annotate_layout(wide, self.fragment)
        out = wide * scale
        self.annotate_layout(out, self.fragment)
        return out


__all__ = ["Int4Widen", "packed_words", "ROWS", "HALF_K", "WORDS", "int32"]
