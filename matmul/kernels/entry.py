"""The launch every version of the series shares.

``MatmulKernel.__call__`` is the kernel's entry point for every version: it receives the sizes,
the three pointers, the row strides and a bias pointer, wraps the pointers into global tensor
views, and hands them to the version's own ``matmul`` method, which is where the versions differ.
The variant (``matmul.kernels.variant``: B's layout, bias, activation) is fixed when the kernel is
built; the bias pointer is an argument of every kernel (0 where the variant has none) so that all
variants of a version launch alike. ``load_k_block``
and ``store_tile`` are the TMA load of one K block and the TMA-store epilogue that V1 introduces
and every later version calls on itself. The operands were validated on the host first
(``matmul.contract``): row-major, row strides multiples of 16 bytes.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, int32, void_p


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
        g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size], strides=[ldb, 1])
        g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size], strides=[ldc, 1])
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
        self.tma.global_to_shared(src=g_b, dst=s_b, offsets=[offset_n, offset_k], mbarrier=barrier)

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
