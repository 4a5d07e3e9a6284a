"""Hopper V8 for a few tokens: int4 weights read straight into registers, widened there and
multiplied on the tensor core by ``mma.sync``, with no ring, no TMA and no cluster.

Idea: at one to eight tokens V8 spends a fixed ~7,600 cycles a launch (``plots/h100/v8/probe/``:
the TMA descriptors and the first round trip through its ring, the split-K exchange between the
CTAs of a cluster, the cluster barriers), as long as its bytes take at 4096 x 4096. This kernel
keeps only what the bytes need. One CTA takes a packed tile row (64 weight rows, the whole of K);
its warpgroups take the scale groups in turn. Each thread loads its 16 bytes of a half tile
(``matmul.quant.int4``'s layout) with one vector load from HBM into registers: in that layout they
already are an ``mma.sync.m16n8k16`` A fragment for its warp (the wgmma A fragment of V8 is four
of them, one a warp: ``a_fragment`` and ``OPERAND`` are the same layout), so they are widened and
scaled in place (``pipeline.widen``'s magic-number cast, the same values as
``QuantizedWeight.dequantize()``) and multiplied by the tokens (the B operand, eight columns, the
rows past M read as zeros). The warpgroups' float32 partials meet in shared memory once, and the
first warpgroup writes the tile of C.

K must be a multiple of 128 (one scale group), as for V8; M at most ``TOKENS``.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, float32, int4b, int32, void_p
from tilus.ir.layout.ops.register_ops import column_local, column_spatial, divide, local, permute, reduce, spatial
from tilus.utils import cdiv

from ..entry import PackedWeightKernel

IDEA = "int4 weights loaded into registers and widened there for mma.sync: no ring, no cluster, at a few tokens"
PTX_MARKERS = (
    "mma.sync.aligned.m16n8k16",
    "lop3.b32",  # the magic-number int4 -> float16 conversion
    "ld.global.v4",  # a thread's 16 bytes of a half tile, one load
)
REPRESENTATIVE = dict(warpgroups=2, depth=4)
B_LAYOUTS = ("nk",)
FUSED_EPILOGUE = False
MAX_ELEMENTS = 2**31 - 1

TOKENS = 8  # the mma's N: tokens a launch
TILE_ROWS = 64  # weight rows of a packed tile, one CTA
GROUP = 128  # K columns of a packed tile, one scale group
HALF_K = 64  # K columns a thread's 16 bytes cover
# the mma.sync m16n8k16 fragments (tilus's AtomicMmaConfig), four warps down the tile's 64 rows:
# the accumulator, and the A operand the dot infers from it (equal to wgmma's a_fragment(64, 64))
ACCUMULATOR = spatial(4, 1) * local(2, 1).spatial(8, 4).local(1, 2)
OPERAND = spatial(4, 1).local(1, HALF_K // 16) * column_local(2, 2).spatial(8, 4).local(1, 2)
# a half tile's words as they lie in HBM, [8, 64] int32 of the packed weight's matrix: thread
# 16 r + q holds words 4 q ... 4 q + 3 of row r, its 16 bytes in matmul.quant.int4's order
WORDS = spatial(8, 16).local(1, 4)
# a half group's tokens [8, 64] as the dot takes them (transposed, its B operand: tilus's m16n8k16 B
# fragment, the same in every warp)
TOKEN_TILE = permute(
    divide(ACCUMULATOR, local(2, 1).spatial(8, 4).local(1, 2)).reduce_to([1, 1]).local(HALF_K // 16, 1)
    * local(2, 1).column_spatial(4, 8).local(2, 1),
    [1, 0],
)


def supports(m: int, n: int, k: int) -> bool:
    """At most ``TOKENS`` tokens; K a multiple of the group."""
    return 1 <= m <= TOKENS and n >= 1 and k >= 1 and k % GROUP == 0


def shared_bytes(warpgroups: int) -> int:
    """The warpgroups' float32 partial tiles."""
    return warpgroups * TILE_ROWS * TOKENS * 4


@tilus.autotune("warpgroups, depth", [(2, 4), (4, 2), (2, 2)])
class Kernel(PackedWeightKernel):
    def __init__(
        self, dtype, warpgroups: int, depth: int, b_layout: str = "nk", bias: bool = False, activation: str = ""
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        if b_layout != "nk" or bias or activation:
            raise ValueError("V8 reads its packed weight in one layout, with a plain epilogue")
        if warpgroups not in (1, 2, 4, 8):
            raise ValueError(f"1, 2, 4 or 8 warpgroups, not {warpgroups}")
        self.warpgroups = warpgroups
        if depth not in (2, 4):
            raise ValueError(f"2 or 4 scale groups in flight a warpgroup, not {depth}")
        self.depth = depth

    def __call__(
        self,
        m_size: int32,
        n_size: int32,
        k_size: int32,
        a_ptr: void_p,
        b_ptr: void_p,
        c_ptr: void_p,
        lda: int32,
        ldb: int32,
        ldc: int32,
        bias_ptr: void_p,
        scales_ptr: void_p,
    ):
        """``PackedWeightKernel``'s entry with the weight's and the scales' views of its own: tilus
        0.2.0 emits no device pointer for a global view whose shape divides (V8's ``[N_pad / 4, K /
        2]``; its TMA loads never need one, and this kernel's plain loads do), so their shapes here
        are bounds past every word and scale they hold (no load of this kernel leaves the packed
        tensor, whose rows and groups are padded). The scales [K / 128, N_pad] are seen transposed:
        a tile's 64 scales of a group are then a column, each thread's two rows."""
        self.batches = 1
        self.assume(ldb % 64 == 0 and k_size % 128 == 0)  # K a multiple of the group: 16-byte loads of whole words
        self.assume(lda % 8 == 0)  # the call's tokens: 16-byte aligned rows
        n_pad = cdiv(n_size, TILE_ROWS) * TILE_ROWS
        g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size], strides=[lda, 1])
        g_w = self.global_view(b_ptr, dtype=int32, shape=[n_size + TILE_ROWS, k_size], strides=[ldb, 1])
        g_s = self.global_view(scales_ptr, dtype=self.dtype, shape=[n_size + TILE_ROWS, k_size], strides=[1, n_pad])
        g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size], strides=[ldc, 1])
        self.matmul(g_a, g_w, g_s, g_c, m_size, n_size, k_size)

    def matmul(
        self,
        g_a: GlobalTensor,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        g_c: GlobalTensor,
        m_size: int32,
        n_size: int32,
        k_size: int32,
    ):
        self.attrs.blocks = cdiv(n_size, TILE_ROWS)
        self.attrs.warps = 4 * self.warpgroups
        tile: int32 = self.blockIdx.x
        num_groups: int32 = k_size // GROUP
        s_part = self.shared_tensor(dtype=float32, shape=[self.warpgroups, TILE_ROWS, TOKENS])
        # each warpgroup written out (a store into a shared tile indexed by a device loop's variable
        # does not build in tilus 0.2.0)
        self.partial(0, g_a, g_w, g_s, s_part, tile, num_groups)
        if self.warpgroups > 1:
            self.partial(1, g_a, g_w, g_s, s_part, tile, num_groups)
        if self.warpgroups > 2:
            self.partial(2, g_a, g_w, g_s, s_part, tile, num_groups)
            self.partial(3, g_a, g_w, g_s, s_part, tile, num_groups)
        if self.warpgroups > 4:
            self.partial(4, g_a, g_w, g_s, s_part, tile, num_groups)
            self.partial(5, g_a, g_w, g_s, s_part, tile, num_groups)
            self.partial(6, g_a, g_w, g_s, s_part, tile, num_groups)
            self.partial(7, g_a, g_w, g_s, s_part, tile, num_groups)
        self.sync()  # every partial stored
        with self.warp_group(warp_begin=0, num_warps=4):
            total = self.load_shared(s_part[0])
            self.annotate_layout(total, ACCUMULATOR)
            if self.warpgroups > 1:
                total = total + self.load_shared(s_part[1])
            if self.warpgroups > 2:
                total = total + self.load_shared(s_part[2]) + self.load_shared(s_part[3])
            if self.warpgroups > 4:
                total = total + self.load_shared(s_part[4]) + self.load_shared(s_part[5])
                total = total + self.load_shared(s_part[6]) + self.load_shared(s_part[7])
            out = self.transpose(total).to(self.dtype)  # C's [tokens, rows]; TOKENS rows past M are not stored
            self.store_global(g_c, out, offsets=[0, tile * TILE_ROWS])

    def partial(
        self,
        wg: int,
        g_a: GlobalTensor,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        s_part: SharedTensor,
        tile: int32,
        num_groups: int32,
    ):
        """Warpgroup ``wg``: scale groups ``wg``, ``wg + warpgroups``, ... of the tile into its partial,
        ``depth`` groups' operands in flight: each buffer, once multiplied, is refilled with the group
        ``depth`` further on, so the loads of the next groups run while this one is widened."""
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            acc = self.register_tensor(dtype=float32, shape=[TILE_ROWS, TOKENS], init=0.0)
            self.annotate_layout(acc, ACCUMULATOR)
            count: int32 = (num_groups - wg + self.warpgroups - 1) // self.warpgroups  # this warpgroup's groups
            w0, v0, s0, x0, y0 = self.buffer()  # (all four made here: a tensor made under an if
            w1, v1, s1, x1, y1 = self.buffer()  # lives in that if's scope)
            w2, v2, s2, x2, y2 = self.buffer()
            w3, v3, s3, x3, y3 = self.buffer()
            self.fetch(g_a, g_w, g_s, tile, wg, 0, count, w0, v0, s0, x0, y0)
            self.fetch(g_a, g_w, g_s, tile, wg, 1, count, w1, v1, s1, x1, y1)
            if self.depth > 2:
                self.fetch(g_a, g_w, g_s, tile, wg, 2, count, w2, v2, s2, x2, y2)
                self.fetch(g_a, g_w, g_s, tile, wg, 3, count, w3, v3, s3, x3, y3)
            for i in self.range(0, count, self.depth):
                self.step(g_a, g_w, g_s, tile, wg, i, count, w0, v0, s0, x0, y0, acc)
                self.step(g_a, g_w, g_s, tile, wg, i + 1, count, w1, v1, s1, x1, y1, acc)
                if self.depth > 2:
                    self.step(g_a, g_w, g_s, tile, wg, i + 2, count, w2, v2, s2, x2, y2, acc)
                    self.step(g_a, g_w, g_s, tile, wg, i + 3, count, w3, v3, s3, x3, y3, acc)
            self.store_shared(s_part[wg], acc)

    def buffer(self):
        """Registers for one scale group's operands: its two halves' words, its 64 scales, its two
        halves' tokens (zero-filled where they are made: a tensor first written under an ``if``
        would be declared in that ``if``'s scope)."""
        w = self.register_tensor(dtype=int32, shape=[8, 64], init=0)
        self.annotate_layout(w, WORDS)
        v = self.register_tensor(dtype=int32, shape=[8, 64], init=0)
        self.annotate_layout(v, WORDS)
        s = self.register_tensor(dtype=self.dtype, shape=[TILE_ROWS, 1], init=0.0)
        self.annotate_layout(s, reduce(OPERAND, dims=[1], keepdims=True))
        x = self.register_tensor(dtype=self.dtype, shape=[TOKENS, HALF_K], init=0.0)
        self.annotate_layout(x, TOKEN_TILE)
        y = self.register_tensor(dtype=self.dtype, shape=[TOKENS, HALF_K], init=0.0)
        self.annotate_layout(y, TOKEN_TILE)
        return w, v, s, x, y

    def fetch(
        self,
        g_a: GlobalTensor,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        tile: int32,
        wg: int,
        i: int32,
        count: int32,
        w: RegisterTensor,
        v: RegisterTensor,
        s: RegisterTensor,
        x: RegisterTensor,
        y: RegisterTensor,
    ):
        """The operands of this warpgroup's ``i``-th group into a buffer (nothing past its last)."""
        if i < count:
            g = wg + i * self.warpgroups
            self.assign(w, self.load_global(g_w, offsets=[tile * 16, g * 64], shape=[8, 64]))
            self.assign(v, self.load_global(g_w, offsets=[tile * 16 + 8, g * 64], shape=[8, 64]))
            self.assign(s, self.load_global(g_s, offsets=[tile * TILE_ROWS, g], shape=[TILE_ROWS, 1]))
            self.assign(x, self.load_global(g_a, offsets=[0, g * GROUP], shape=[TOKENS, HALF_K]))
            self.assign(y, self.load_global(g_a, offsets=[0, g * GROUP + HALF_K], shape=[TOKENS, HALF_K]))

    def step(
        self,
        g_a: GlobalTensor,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        tile: int32,
        wg: int,
        i: int32,
        count: int32,
        w: RegisterTensor,
        v: RegisterTensor,
        s: RegisterTensor,
        x: RegisterTensor,
        y: RegisterTensor,
        acc: RegisterTensor,
    ):
        """The ``i``-th group, from its buffer, into the partial; the buffer refilled ``depth`` groups on."""
        if i < count:
            self.half(w, s, x, acc)
            self.half(v, s, y, acc)
            self.fetch(g_a, g_w, g_s, tile, wg, i + self.depth, count, w, v, s, x, y)

    def half(self, words: RegisterTensor, scale: RegisterTensor, tokens: RegisterTensor, acc: RegisterTensor):
        """A half group (64 K columns): its words widened into the A operand, times the tokens."""
        values = self.view(words, layout=OPERAND, dtype=int4b)
        wide = values.to(self.dtype)
        self.annotate_layout(wide, OPERAND)
        operand = wide * scale
        self.annotate_layout(operand, OPERAND)
        self.dot(operand, self.transpose(tokens), acc, out=acc)
