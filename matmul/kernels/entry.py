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

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, int32, void_p
from tilus.ir.layout import SharedLayout
from tilus.ir.layout.cuda.tcgen05.smem import Tcgen05SwizzleMode, generate_canonical_layout
from tilus.ir.layout.ops import shared_compose, shared_row_major

from pipeline.fused_epilogue import FusedEpilogue, output_columns

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
    def __init__(self, dtype, b_layout: str = "nk", bias: bool = False, activation: str = ""):
        super().__init__()
        self.dtype = dtype
        self.b_layout = b_layout  # "nk": B [N, K] row-major; "kn": b [K, N] row-major (variant.Variant)
        self.bias = bias
        self.activation = activation

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
    ):
        """TMA-load the A tile at (offset_m, offset_k) into ``s_a`` and the B tile at (offset_n,
        offset_k) into ``s_b``, both completing on ``barrier``: one elected thread arrives on it,
        announcing both tiles' bytes. Called by one whole warp (a TMA copy is a warp instruction
        that elects a lane). ``s_a`` is ``[rows, block_k]``, or ``[2, rows / 2, block_k]`` for a CTA
        whose two consumer warpgroups each read their own slab of A's rows (one TMA copy a slab)."""
        with self.single_thread():
            self.mbarrier.arrive_and_expect_tx(barrier, transaction_bytes=s_a.nbytes + s_b.nbytes)
        if len(s_a.shape) == 3:  # decided when the kernel is built
            self.tma.global_to_shared(src=g_a, dst=s_a[0], offsets=[offset_m, offset_k], mbarrier=barrier)
            self.tma.global_to_shared(
                src=g_a, dst=s_a[1], offsets=[offset_m + s_a.shape[1], offset_k], mbarrier=barrier
            )
        else:
            self.tma.global_to_shared(src=g_a, dst=s_a, offsets=[offset_m, offset_k], mbarrier=barrier)
        self.load_b(g_b, s_b, barrier, offset_n, offset_k)

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
    ):
        """TMA-load the B tile [rows, block_k] at (offset_n, offset_k) of B into ``s_b``, completing
        on ``barrier`` (``cta_group``, ``multicast_mask`` as ``tma.global_to_shared`` takes them). From
        b [K, N] ("kn") the tile is ``rows / 64`` (16-bit) boxes of b, [block_k, 64] each: a swizzled
        box is at most 128 bytes wide. Called by one whole warp."""
        if self.b_layout == "kn":
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
