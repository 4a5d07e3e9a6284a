"""The launch every version of the series shares.

``MatmulKernel.__call__`` is the kernel's entry point for every version: it receives the sizes,
the three pointers, the row strides and a bias pointer, wraps the pointers into global tensor
views, and hands them to the version's own ``matmul`` method, which is where the versions differ.
The variant (``matmul.kernels.variant``: B's layout, bias, activation) is fixed when the kernel is
built; the bias pointer is an argument of every kernel (0 where the variant has none) so that all
variants of a version launch alike. ``self.epilogue`` (``pipeline.fused_epilogue.FusedEpilogue``)
is the variant's bias and activation, which each version's epilogue applies to the float32 tile
before converting it (it emits nothing for a plain variant); for swiglu C's view is half as wide as
B has rows. ``load_k_block``
and ``store_tile`` are the TMA load of one K block and the TMA-store epilogue that V1 introduces
and every later version calls on itself. The operands were validated on the host first
(``matmul.contract``): row-major, row strides multiples of 16 bytes.

B's layout is the one thing here that differs between variants, and nothing else differs for it:
``g_b`` is B [N, K] ("nk") or b [K, N] ("kn"), ``load_b`` TMA-loads a B tile ``[rows, block_k]``
from either, and ``b_tiles_layout`` gives the shared B tiles their layout. A version keeps its B
tiles ``[..., rows, block_k]`` and hands ``tile.transpose()`` to the MMA in both layouts: for "kn"
the tiles are stored MN-major (N contiguous, as TMA writes boxes of b's rows), the layout the
tensor cores read with their transpose flag (``matmul.tilus_fixes.mn_major_operands``).
"""

import functools

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, int32, int64, void_p
from tilus.ir.layout import SharedLayout
from tilus.ir.layout.cuda.tcgen05.smem import Tcgen05SwizzleMode, generate_canonical_layout
from tilus.ir.layout.ops import shared_compose, shared_row_major
from tilus.utils import cdiv

from pipeline.fused_epilogue import FusedEpilogue, output_columns

PACKED_ROWS = 64  # a packed weight's N is padded to this (matmul.quant)
PACKED_GROUP = 128  # K columns a scale covers (matmul.quant.int4)
SWIZZLE_BYTES = 128  # the widest swizzled TMA box, and the swizzle the MMA reads: one box is 128 bytes wide


def mn_major_tiles(shape, dtype) -> SharedLayout:
    """The layout of B tiles ``shape`` = [..., rows, block_k] read from b [K, N]: each tile MN-major
    with the 128-byte swizzle, i.e. ``rows / 64`` (16-bit) boxes [block_k, 64] of b one after another,
    each row of a box (64 N columns of one k) 128 bytes, as TMA writes them; the tiles row-major."""
    rows, cols = shape[-2:]
    tile = generate_canonical_layout((rows, cols), dtype, "MN", Tcgen05SwizzleMode.B128_SWIZZLE).as_shared_layout()
    if len(shape) == 2:
        return tile
    lead = len(shape) - 2
    tiles = shared_compose(shared_row_major(*shape[:-2], 1, 1), tile.unsqueeze(dims=range(lead)))
    return tiles.apply_swizzle(tile.swizzle)


class MatmulKernel(tilus.Script):
    batched = False  # the entry of a batch of products (batched_class); a build-time fact

    def __init__(self, dtype, b_layout: str = "nk", bias: bool = False, activation: str = ""):
        super().__init__()
        self.dtype = dtype
        self.b_layout = b_layout  # "nk": B [N, K] row-major; "kn": b [K, N] row-major (variant.Variant)
        self.bias = bias
        self.activation = activation

    def require_whole_b_boxes(self, rows: int):
        """Refuse, when the kernel is built, a B tile of ``rows`` rows that torch's b [K, N] cannot give:
        its MN-major tiles are read in boxes of 64 columns (``mn_major_tiles``)."""
        if self.b_layout == "kn" and rows % 64:
            raise ValueError(
                f"b [K, N] is read in boxes of 64 columns: a B tile of {rows} rows is no multiple of 64; "
                "pass B as [N, K] (w, not w.T) or pick a tile a multiple of 64 wide"
            )

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
    ):
        self.batches = 1  # one product: the batch branches below fold away when the kernel is built
        # C = A @ B^T: A [M, K] and B [N, K] are both read along K, C [M, N] is written row by row
        g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size], strides=[lda, 1])
        if self.b_layout == "kn":  # torch's b [K, N], read in place (the MMA reads its tiles MN-major)
            g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[k_size, n_size], strides=[ldb, 1])
        else:
            g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size], strides=[ldb, 1])
        c_columns = output_columns(n_size, self.activation)  # swiglu: one column of C per gate-up pair
        g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, c_columns], strides=[ldc, 1])
        # the variant's bias and activation, applied by each version's epilogue (self.epilogue.apply)
        g_bias = self.global_view(bias_ptr, dtype=self.dtype, shape=[1, n_size])
        self.epilogue = FusedEpilogue(g_bias, self.bias, self.activation)
        self.matmul(g_a, g_b, g_c, m_size, n_size, k_size)

    def load_k_block(
        self,
        g_a: GlobalTensor,
        g_b: GlobalTensor,
        s_a: SharedTensor,
        s_b: SharedTensor,
        barrier: RegisterTensor,
        offset_m: int32,
        offset_n: int32,
        offset_k: int32,
        batch: int32 = 0,
    ):
        """TMA-load the A tile at (offset_m, offset_k) into ``s_a`` and the B tile at (offset_n,
        offset_k) into ``s_b``, both completing on ``barrier``: one elected thread arrives on it,
        announcing both tiles' bytes. Called by one whole warp (a TMA copy is a warp instruction
        that elects a lane). ``s_a`` is ``[rows, block_k]``, or ``[2, rows / 2, block_k]`` for a CTA
        whose two consumer warpgroups each read their own slab of A's rows (one TMA copy a slab).
        ``batch``: the product of a batched kernel the tiles belong to (ignored by a plain one)."""
        with self.single_thread():
            self.mbarrier.arrive_and_expect_tx(barrier, transaction_bytes=s_a.nbytes + s_b.nbytes)
        if len(s_a.shape) == 3:  # decided when the kernel is built
            self.load_a(g_a, s_a[0], barrier, offset_m, offset_k, batch)
            self.load_a(g_a, s_a[1], barrier, offset_m + s_a.shape[1], offset_k, batch)
        else:
            self.load_a(g_a, s_a, barrier, offset_m, offset_k, batch)
        self.load_b(g_b, s_b, barrier, offset_n, offset_k, batch=batch)

    def load_a(
        self,
        g_a: GlobalTensor,
        s_a: SharedTensor,
        barrier: RegisterTensor,
        offset_m: int32,
        offset_k: int32,
        batch: int32 = 0,
    ):
        """TMA-load the A tile ``s_a`` [rows, block_k] at (offset_m, offset_k), of matrix ``batch``
        in a batched kernel (module doc), completing on ``barrier``. Called by one whole warp."""
        if len(g_a.shape) == 3:  # batched: a box [1, rows, block_k] of the 3-D tensor map
            self.tma.global_to_shared(
                src=g_a,
                dst=unit_batch(self, s_a),
                offsets=[batch % g_a.shape[0], offset_m, offset_k],
                mbarrier=barrier,
            )
        else:
            self.tma.global_to_shared(src=g_a, dst=s_a, offsets=[offset_m, offset_k], mbarrier=barrier)

    def b_tiles_layout(self, s_b: SharedTensor):
        """Give the B tiles ``s_b`` [..., rows, block_k] the layout this variant's loads write: for "kn"
        MN-major (``mn_major_tiles``); for "nk" the MMA's K-major one, which tilus infers."""
        if self.b_layout == "kn":
            self.annotate_layout(s_b, mn_major_tiles(s_b.shape, self.dtype))

    def load_b(
        self,
        g_b: GlobalTensor,
        s_b: SharedTensor,
        barrier: RegisterTensor,
        offset_n: int32,
        offset_k: int32,
        cta_group: int = 1,
        multicast: bool = False,
        multicast_mask: int32 = 0,
        batch: int32 = 0,
    ):
        """TMA-load the B tile [rows, block_k] at (offset_n, offset_k) of B into ``s_b``, completing
        on ``barrier`` (``cta_group``, ``multicast_mask`` as ``tma.global_to_shared`` takes them). From
        b [K, N] ("kn") the tile is ``rows / 64`` (16-bit) boxes of b, [block_k, 64] each: a swizzled
        box is at most 128 bytes wide. Called by one whole warp. In a batched kernel (module doc)
        the boxes are [1, ...] boxes of matrix ``batch`` of the 3-D tensor map."""
        # batched or not is decided when the kernel is built: each condition below tests the shape
        # itself (a local bool would become a device variable, and its branches would be built too)
        if self.b_layout == "kn" and len(g_b.shape) == 3:  # each box [1, block_k, 64]: a unit batch dimension in front
            box = SWIZZLE_BYTES // self.dtype.nbytes
            unit_boxes = self.reshape_shared(s_b, [s_b.shape[0] // box, 1, box, s_b.shape[1]])
            for j in range(s_b.shape[0] // box):
                self.tma.global_to_shared(
                    src=g_b,
                    dst=unit_boxes[j].permute([0, 2, 1]),
                    offsets=[batch % g_b.shape[0], offset_k, offset_n + j * box],
                    mbarrier=barrier,
                    cta_group=cta_group,
                    multicast_mask=multicast_mask if multicast else None,
                )
        elif self.b_layout == "kn":
            box = SWIZZLE_BYTES // self.dtype.nbytes
            boxes = self.reshape_shared(s_b, [s_b.shape[0] // box, box, s_b.shape[1]])
            for j in range(s_b.shape[0] // box):
                self.tma.global_to_shared(
                    src=g_b,
                    dst=boxes[j].transpose(),
                    offsets=[offset_k, offset_n + j * box],
                    mbarrier=barrier,
                    cta_group=cta_group,
                    multicast_mask=multicast_mask if multicast else None,
                )
        elif len(g_b.shape) == 3:
            self.tma.global_to_shared(
                src=g_b,
                dst=unit_batch(self, s_b),
                offsets=[batch % g_b.shape[0], offset_n, offset_k],
                mbarrier=barrier,
                cta_group=cta_group,
                multicast_mask=multicast_mask if multicast else None,
            )
        else:
            self.tma.global_to_shared(
                src=g_b,
                dst=s_b,
                offsets=[offset_n, offset_k],
                mbarrier=barrier,
                cta_group=cta_group,
                multicast_mask=multicast_mask if multicast else None,
            )

    def store_tile(self, s_c: SharedTensor, tile: RegisterTensor, g_c: GlobalTensor, offset_m: int32, offset_n: int32):
        """Registers -> shared memory -> one TMA store of ``s_c``'s shape at (offset_m, offset_n);
        the TMA unit clips the rows and columns past the matrix edge. Called by a whole thread group
        (the CTA, or the epilogue warpgroup): it syncs that group, and returns once the store has read
        ``s_c``, so the buffer may be written again."""
        self.store_shared(s_c, tile)
        self.fence.proxy_async(space="shared")  # generic-proxy stores -> the TMA unit's (async-proxy) reads
        self.sync()
        with self.single_warp():
            self.tma.shared_to_global(s_c, g_c, offsets=[offset_m, offset_n])
            self.tma.commit_group()
            self.tma.wait_group(0)


class PackedWeightKernel(MatmulKernel):
    """The entry point of the versions whose weight comes packed (V8 of each architecture, and
    Hopper V8 for many tokens): the sizes, pointers and row strides of every version, then the
    pointer to the weight's scales. ``weight_view`` and ``scale_view`` wrap the packed weight and
    its scales (``matmul.quant.int4``'s by default: int32 [N_pad / 4, K / 2], ``ldb`` its row
    stride in words, and the activations' dtype [K / 128, N_pad]), and the version's ``matmul``
    takes them beside A and C. The epilogue is plain."""

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
        self.batches = 1  # one product, as MatmulKernel's entry
        n_pad = cdiv(n_size, PACKED_ROWS) * PACKED_ROWS
        g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size], strides=[lda, 1])
        g_w = self.weight_view(b_ptr, ldb, n_pad, k_size)
        g_s = self.scale_view(scales_ptr, n_pad, k_size)
        g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size], strides=[ldc, 1])
        g_bias = self.global_view(bias_ptr, dtype=self.dtype, shape=[1, n_size])
        self.epilogue = FusedEpilogue(g_bias, False, "")
        self.matmul(g_a, g_w, g_s, g_c, m_size, n_size, k_size)

    def weight_view(self, b_ptr: void_p, ldb: int32, n_pad: int32, k_size: int32) -> GlobalTensor:
        """The packed int4 weight: int32 [N_pad / 4, K / 2] (eight values a word)."""
        return self.global_view(b_ptr, dtype=int32, shape=[n_pad // 4, k_size // 2], strides=[ldb, 1])

    def scale_view(self, scales_ptr: void_p, n_pad: int32, k_size: int32) -> GlobalTensor:
        """One scale a row and group of ``PACKED_GROUP`` along K, in the activations' dtype: [K / 128, N_pad]."""
        return self.global_view(scales_ptr, dtype=self.dtype, shape=[k_size // PACKED_GROUP, n_pad], strides=[n_pad, 1])


def unit_batch(script, tile: SharedTensor) -> SharedTensor:
    """``tile`` [rows, cols] seen as [1, rows, cols]: the box of a batched kernel's 3-D tensor map
    (same shared memory, same swizzle). Called at transpile time from kernel code."""
    return script.reshape_shared(tile, [1, *tile.shape])


class _BatchedEntry(MatmulKernel):
    """``batched_class``'s entry point: ``__call__`` of a batch of products (module doc)."""

    def __call__(
        self,
        batches: int32,
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
        a_batches: int32,
        b_batches: int32,
        a_batch_stride: int64,
        b_batch_stride: int64,
        c_batch_stride: int64,
    ):
        # C[i] = A[i % a_batches] @ B[i % b_batches]^T for i < batches: a_batches and b_batches are
        # ``batches``, or 1 for an operand shared by every product; strides in elements, 64-bit
        # (a batch of matrices easily spans more than 2^31 elements)
        self.batches = batches
        g_a = self.global_view(
            a_ptr, dtype=self.dtype, shape=[a_batches, m_size, k_size], strides=[a_batch_stride, lda, 1]
        )
        if self.b_layout == "kn":
            g_b = self.global_view(
                b_ptr, dtype=self.dtype, shape=[b_batches, k_size, n_size], strides=[b_batch_stride, ldb, 1]
            )
        else:
            g_b = self.global_view(
                b_ptr, dtype=self.dtype, shape=[b_batches, n_size, k_size], strides=[b_batch_stride, ldb, 1]
            )
        c_columns = output_columns(n_size, self.activation)
        g_c = self.global_view(
            c_ptr, dtype=self.dtype, shape=[batches, m_size, c_columns], strides=[c_batch_stride, ldc, 1]
        )
        g_bias = self.global_view(bias_ptr, dtype=self.dtype, shape=[1, n_size])
        self.epilogue = FusedEpilogue(g_bias, self.bias, self.activation)
        self.matmul(g_a, g_b, g_c, m_size, n_size, k_size)


@functools.cache
def batched_class(kernel_cls: type) -> type:
    """``kernel_cls`` (a version's ``Kernel``, possibly fixed to one configuration) behind the batched
    entry point: the same ``matmul``, launched with ``batched_launch_args``."""
    return type(
        kernel_cls.__name__,
        (kernel_cls,),
        {"__call__": _BatchedEntry.__call__, "batched": True, "__module__": kernel_cls.__module__},
    )
