"""The launch every version of the series shares.

``MatmulKernel.__call__`` is the kernel's entry point for every version: it receives the sizes,
the three pointers and the row strides, wraps the pointers into global tensor views, and hands
them to the version's own ``matmul`` method, which is where the versions differ. The operands were
validated on the host first (``matmul.contract``): row-major, row strides multiples of 16 bytes.
"""

import tilus
from tilus import int32, void_p


class MatmulKernel(tilus.Script):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def __call__(self, m_size: int32, n_size: int32, k_size: int32, a_ptr: void_p, b_ptr: void_p,
                 c_ptr: void_p, lda: int32, ldb: int32, ldc: int32):
        # C = A @ B^T: A [M, K] and B [N, K] are both read along K, C [M, N] is written row by row
        g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size], strides=[lda, 1])
        g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size], strides=[ldb, 1])
        g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size], strides=[ldc, 1])
        self.matmul(g_a, g_b, g_c, m_size, n_size, k_size)
