"""The fused epilogue: a bias and an activation applied to the float32 accumulator tile while it
sits in registers, before its one conversion to the output dtype (``matmul.kernels.variant``).

``FusedEpilogue.apply(tile, column, fragment)`` takes a float32 register tile of C whose first
column is C's column ``column`` and returns the output tile and the column of C it starts at:

* bias: the ``tile``'s slice of the bias vector (masked at the matrix edge) is loaded once, in the
  layout of one row of the tile (each thread loads the columns it holds, nothing else), converted
  to float32 and added to every row;
* activation, in float32: ``relu``; ``silu(x) = x / (1 + exp(-x))``; ``gelu_tanh(x) = x / (1 +
  exp(-2u))``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``, which is ``0.5 x (1 + tanh(u))`` written so
  that no intermediate overflows (``exp(-2u)`` -> inf gives -0, not NaN); ``gelu_erf(x) = x
  Phi(x)`` with ``erfc`` from Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7 on the whole
  line), ``Phi(x) = erfc(|x| / sqrt 2) / 2`` or one minus that;
* ``swiglu``: ``silu(gate) * up`` of column pairs (16 q + i, 16 q + 8 + i), i < 8, which
  ``variant.gate_up`` interleaves so that both lie in the same thread: the tile of width ``W``
  becomes one of width ``W / 2`` starting at column ``column / 2``, with no data moved between
  threads.

Where the pairs lie in registers depends on the tile's ``fragment``, the register layout it comes
in. In each of them a thread's registers are the tile's groups of 8 columns one after the other
(``column_groups``): the fragment of ``rows x W`` is ``W / 8`` times the fragment of ``rows x 8``,
so the gate and up halves of a group of 16 columns are two register ranges of the same threads:

* ``"wgmma"``: a wgmma accumulator of one row of instructions (64 x W; ``epilogue.wgmma_fragment``);
* ``"tcgen05"``: a ``tcgen05.load`` of a 128-lane TMEM slice (tilus picks the 16x256b shape, whose
  atom is 8 float32 columns wide);
* ``"split_k"``: the transposed split-K tile of ``cluster_reduce.ClusterSplitKReduce`` (the swap-AB
  V7: C^T's rows are C's columns), loaded from shared memory in ``split_k_layout`` so that its
  transpose has that form too.

One fragment is not in column groups: ``"wgmma_t"``, a 64-row wgmma accumulator of C^T seen
transposed (``epilogue.SwappedSlabStore``: the swap-AB V7 writing its slabs straight from the
registers), ``tokens x 64``. Its 64 columns are spread over the warpgroup's threads, not over a
thread's registers: thread ``(w, g)`` holds columns ``16 w + g`` and ``16 w + 8 + g``. Those are
exactly a gate-up pair (``q = w``, ``i = g``), so swiglu needs no data moved here either; it takes
the pairs from a register view of the tile by blocks of 8 rows and halves (``swiglu_blocks``).

A plain variant (no bias, no activation) gets the tile and column back untouched: ``apply``
emits nothing, and the kernel is the same as without an epilogue.
"""

import types

import tilus
from tilus import GlobalTensor, RegisterTensor, float32, int32
from tilus.ir.layout import RegisterLayout
from tilus.ir.layout.inference.inference_rules.tcgen05.ldst import Tcgen05LdstRule
from tilus.ir.layout.inference.inference_rules.wgmma import generate_wgmma_register_layout
from tilus.ir.layout.ops.register_ops import (
    column_spatial,
    compose,
    left_divide,
    local,
    permute,
    reduce,
    reshape,
    squeeze,
    unsqueeze,
)

GROUP = 8  # variant.SWIGLU_GROUP: gate and up columns interleave in groups of 8
SQRT_2_OVER_PI = 0.7978845608028654
GELU_CUBIC = 0.044715
SQRT_HALF = 0.7071067811865476
# Abramowitz & Stegun 7.1.26: erfc(z) = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2) + e(z),
# t = 1 / (1 + p z), z >= 0, |e(z)| <= 1.5e-7
ERFC_P = 0.3275911
ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def output_columns(columns, activation: str):
    """Columns of C that ``columns`` columns of the product make (an int or a size in kernel code):
    half of them for swiglu."""
    return columns // 2 if activation == "swiglu" else columns


def product_columns(columns: int, activation: str) -> int:
    """Columns of the product that make ``columns`` columns of C: twice as many for swiglu."""
    return 2 * columns if activation == "swiglu" else columns


def swiglu_pairs(cols: int) -> int:
    """The gate-up pairs of column groups in ``cols`` columns (a multiple of 16)."""
    if cols % (2 * GROUP):
        raise ValueError(f"swiglu needs a multiple of {2 * GROUP} columns, not {cols}")
    return cols // (2 * GROUP)


def tcgen05_fragment(rows: int, cols: int) -> RegisterLayout:
    """The register layout of a ``tcgen05.load`` of a ``rows x cols`` float32 TMEM slice (tilus's own
    rule for it, ``Tcgen05LdstRule``)."""
    tmem = types.SimpleNamespace(shape=(rows, cols), dtype=float32, layout=types.SimpleNamespace(column_strides=(0, 1)))
    return Tcgen05LdstRule.get_register_layout(tmem)


def split_k_layout(rows: int, cols: int) -> RegisterLayout:
    """The layout ``ClusterSplitKReduce`` loads a fused variant's ``rows x cols`` float32 C^T slice in
    (128 threads): groups of 8 rows one after the other in every thread's registers, each group
    spread over the threads with 8 neighbouring rows (8 neighbouring columns of C) in 8 neighbouring
    threads, for the transposed store."""
    if rows % GROUP or cols % 16:
        raise ValueError(f"a {rows} x {cols} split-K slice: need a multiple of {GROUP} rows and of 16 columns")
    return compose(local(rows // GROUP, 1), compose(column_spatial(GROUP, 16), local(1, cols // 16)))


def column_groups(fragment: str, rows: int) -> RegisterLayout:
    """The layout of ``rows x 8`` columns of a ``fragment`` tile (module doc): a ``rows x W`` tile's
    layout is ``compose(local(1, W / 8), column_groups(fragment, rows))``."""
    if fragment == "wgmma":
        return generate_wgmma_register_layout(rows, GROUP, 64, GROUP, 16)
    if fragment == "tcgen05":
        return tcgen05_fragment(rows, GROUP)
    if fragment == "split_k":  # the transpose of split_k_layout's group of 8 rows
        return permute(split_k_layout(GROUP, rows), [1, 0])
    raise ValueError(f"unknown fragment {fragment!r}: wgmma, tcgen05 or split_k")


def is_fused(bias: bool, activation: str) -> bool:
    """Whether the epilogue does more than convert the tile (a plain function: kernel code turns
    ``and``/``or`` into device expressions)."""
    return bias or activation != ""


def fragment_layout(fragment: str, rows: int, cols: int) -> RegisterLayout:
    """The register layout of a ``rows x cols`` ``fragment`` tile, as tilus gives it."""
    if fragment == "wgmma":  # epilogue.wgmma_fragment (a 64-row wgmma accumulator)
        return generate_wgmma_register_layout(rows, cols, 64, cols, 16)
    if fragment == "wgmma_t":  # the transpose of a cols x rows one (cols = 64)
        return permute(generate_wgmma_register_layout(cols, rows, 64, rows, 16), [1, 0])
    if fragment == "tcgen05":
        return tcgen05_fragment(rows, cols)
    if fragment == "split_k":
        return permute(split_k_layout(cols, rows), [1, 0])
    raise ValueError(f"unknown fragment {fragment!r}: wgmma, wgmma_t, tcgen05 or split_k")


def swiglu_blocks(rows: int, cols: int) -> tuple[RegisterLayout, RegisterLayout]:
    """``fragment_layout("wgmma_t", rows, cols)``'s registers seen as ``[rows / 8, 2, 8, cols / 2]``
    (view ``[j, h, t, 8 q + i]`` is row ``8 j + t``, column ``16 q + 8 h + i``: ``h`` = 0 the gate,
    1 the up column of a pair), and the layout of one ``[8, cols / 2]`` block of it. In the
    accumulator's registers the block of 8 rows and the half are a thread's two outermost
    register ranges, so ``view[j, h]`` is a block of constant registers, as the other fragments'
    column groups are (module doc)."""
    pairs, blocks = swiglu_pairs(cols), rows // GROUP
    split = reshape(fragment_layout("wgmma_t", rows, cols), [blocks, GROUP, pairs, 2, GROUP])
    view = reshape(permute(split, [0, 3, 1, 2, 4]), [blocks, 2, GROUP, cols // 2])
    return view, squeeze(left_divide(view, local(blocks, 2, 1, 1)), [0, 1])


def swiglu_layouts(fragment: str, rows: int, cols: int) -> tuple[RegisterLayout, RegisterLayout, RegisterLayout]:
    """For ``FusedEpilogue.swiglu`` on a ``rows x cols`` ``fragment`` tile: its registers seen as
    ``[blocks, 2, ...]`` (``[k, 0]`` the gates, ``[k, 1]`` the ups of output block ``k``, each a
    thread's constant register range), the layout of one output block, and the output tile's
    layout (``rows x cols / 2``). Column-group fragments: a block is a group of 8 columns
    (``column_groups``); ``"wgmma_t"``: 8 rows of every pair (``swiglu_blocks``)."""
    if fragment == "wgmma_t":
        view, block = swiglu_blocks(rows, cols)
        return view, block, reshape(compose(local(rows // GROUP, 1, 1), unsqueeze(block, [0])), [rows, cols // 2])
    group = column_groups(fragment, rows)
    view = compose(local(swiglu_pairs(cols), 2, 1, 1), unsqueeze(group, [0, 1]))
    return view, group, fragment_layout(fragment, rows, cols // 2)


def in_column_groups(fragment: str, rows: int, cols: int) -> bool:
    """Whether a ``rows x cols`` ``fragment`` tile is, register for register, its groups of 8 columns
    one after the other in ``column_groups``'s layout: what ``FusedEpilogue.swiglu``'s register views
    rest on (the tests check it for every tile the versions use)."""
    whole = fragment_layout(fragment, rows, cols)
    groups = compose(local(cols // GROUP, 1, 1), unsqueeze(column_groups(fragment, rows), [0]))
    if whole.spatial_size != groups.spatial_size or whole.local_size != groups.local_size:
        return False
    for thread in range(whole.spatial_size):
        for i in range(whole.local_size):
            r, c = (int(x) for x in whole.get_global(spatial_index=thread, local_index=i))
            g, r2, c2 = (int(x) for x in groups.get_global(spatial_index=thread, local_index=i))
            if (r, c) != (r2, GROUP * g + c2):
                return False
    return True


class FusedEpilogue(tilus.Class):
    """A variant's epilogue (module doc). ``g_bias``: the bias vector as a ``[1, N]`` global view
    (N: B's rows, the fused width for swiglu), unused without ``bias``; ``activation``: '' or one
    of ``variant.ACTIVATIONS``."""

    def __init__(self, g_bias: GlobalTensor, bias: bool, activation: str):
        self.g_bias: GlobalTensor = g_bias
        self.bias: bool = bias
        self.activation: str = activation
        self.fused: bool = is_fused(bias, activation)

    def apply(self, tile: RegisterTensor, column: int32, fragment: str):
        """(the output tile, its first column of C) for ``tile``, a float32 ``fragment`` tile whose
        first column is C's ``column`` (the product's column, for swiglu). The output tile is
        float32, in ``tile``'s layout (half as wide for swiglu)."""
        if self.fused:
            rows, cols = tile.shape
            layout = fragment_layout(fragment, rows, cols)
            self.annotate_layout(tile, layout)  # (kernel code builds views of it: its layout is needed now)
            if self.bias:
                bias = self.load_global(self.g_bias, offsets=[0, column], shape=[1, cols])
                # one row of the tile's layout: each thread loads the columns it holds
                self.annotate_layout(bias, reduce(layout, dims=[0], keepdims=True))
                x = tile + bias.to(float32)
                self.annotate_layout(x, layout)
            else:
                x = tile
            if self.activation == "swiglu":
                out = self.swiglu(x, fragment)
                out_column = column // 2
            else:
                out = self.activate(x)
                self.annotate_layout(out, layout)
                out_column = column
        else:
            out = tile
            out_column = column
        return out, out_column

    def swiglu(self, tile: RegisterTensor, fragment: str) -> RegisterTensor:
        """``silu(gate) * up`` of ``tile``'s interleaved column groups: ``rows x W`` -> ``rows x W / 2``.
        Groups ``2 q`` (gate) and ``2 q + 1`` (up) of 8 columns are register ranges ``2 q`` and
        ``2 q + 1`` of every thread, and output group ``q`` is range ``q`` of the output: register
        views and constant register indices (the loop is unrolled), no data moved between threads.
        A ``"wgmma_t"`` tile holds its pairs across threads instead: its blocks are 8 rows of every
        pair (``swiglu_layouts``)."""
        rows, cols = tile.shape
        view, block, out_layout = swiglu_layouts(fragment, rows, cols)
        count = view.shape[0]
        halves = self.view(tile, layout=view)  # [k, 0] and [k, 1]: the gates and ups of output block k
        out_blocks = self.register_tensor(dtype=float32, shape=[count, block.shape[0], block.shape[1]])
        self.annotate_layout(out_blocks, compose(local(count, 1, 1), unsqueeze(block, [0])))
        for k in self.range(count, unroll="all"):
            product = self.unsqueeze(self.silu(halves[k, 0]) * halves[k, 1], dim=0)
            self.annotate_layout(product, unsqueeze(block, [0]))
            out_blocks[k : k + 1] = product
        return self.view(out_blocks, layout=out_layout)

    def activate(self, x: RegisterTensor) -> RegisterTensor:
        """``self.activation`` of a float32 tile, elementwise (module doc)."""
        if self.activation == "relu":
            y = self.where(x > 0.0, x, 0.0)
        elif self.activation == "silu":
            y = self.silu(x)
        elif self.activation == "gelu_tanh":
            u = (x + x * x * x * GELU_CUBIC) * SQRT_2_OVER_PI
            y = x / (self.exp(u * -2.0) + 1.0)
        elif self.activation == "gelu_erf":
            z = self.abs(x) * SQRT_HALF
            t = 1.0 / (z * ERFC_P + 1.0)
            poly = t * (t * (t * (t * (t * ERFC_A[4] + ERFC_A[3]) + ERFC_A[2]) + ERFC_A[1]) + ERFC_A[0])
            half_erfc = poly * self.exp(-(z * z)) * 0.5  # Phi(-|x|)
            y = x * self.where(x >= 0.0, 1.0 - half_erfc, half_erfc)
        else:
            y = x
        return y

    def silu(self, x: RegisterTensor) -> RegisterTensor:
        return x / (self.exp(-x) + 1.0)
