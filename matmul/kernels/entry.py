"""The launch every version of the series shares.

``MatmulKernel.__call__`` is the kernel's entry point for every version: it receives the sizes,
the three pointers and the row strides, wraps the pointers into global tensor views, and hands
them to the version's own ``matmul`` method, which is where the versions differ. ``load_k_block``
and ``store_tile`` are the TMA load of one K block and the TMA-store epilogue that V1 introduces
and later versions reuse; ``store_tile_in_slots`` is the epilogue of Hopper V2-V4, which stage the
output tile in their idle ring of A tiles. The operands were validated on the host first (``matmul.contract``): row-major, row strides multiples of 16 bytes.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, int32, void_p

from pipeline.epilogue import wgmma_fragment_grid


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

    def load_k_block(self, g_a: GlobalTensor, g_b: GlobalTensor, s_a: SharedTensor, s_b: SharedTensor,
                     barrier: RegisterTensor, offset_m: int32, offset_n: int32, offset_k: int32):
        """TMA-load the A tile at (offset_m, offset_k) into ``s_a`` and the B tile at (offset_n,
        offset_k) into ``s_b``, both completing on ``barrier``: one elected thread arrives on it,
        announcing both tiles' bytes. Called by one whole warp (a TMA copy is a warp instruction
        that elects a lane). ``s_a`` is ``[rows, block_k]``, or ``[2, rows / 2, block_k]`` for a CTA
        whose two consumer warpgroups each read their own slab of A's rows (one TMA copy a slab)."""
        with self.single_thread():
            self.mbarrier.arrive_and_expect_tx(barrier, transaction_bytes=s_a.nbytes + s_b.nbytes)
        if len(s_a.shape) == 3:  # decided when the kernel is built
            self.tma.global_to_shared(src=g_a, dst=s_a[0], offsets=[offset_m, offset_k], mbarrier=barrier)
            self.tma.global_to_shared(src=g_a, dst=s_a[1], offsets=[offset_m + s_a.shape[1], offset_k],
                                      mbarrier=barrier)
        else:
            self.tma.global_to_shared(src=g_a, dst=s_a, offsets=[offset_m, offset_k], mbarrier=barrier)
        self.tma.global_to_shared(src=g_b, dst=s_b, offsets=[offset_n, offset_k], mbarrier=barrier)

    def store_tile(self, s_c: SharedTensor, tile: RegisterTensor, g_c: GlobalTensor, offset_m: int32,
                   offset_n: int32):
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

    def store_tile_in_slots(self, slots: SharedTensor, acc: RegisterTensor, g_c: GlobalTensor, offset_m: int32,
                            offset_n: int32, slab: int):
        """``store_tile`` for a wgmma accumulator (``rows x cols`` float32 in tilus's wgmma layout),
        staged in the slots of an idle ring of A tiles: ``slots`` is ``[stages, rows, block_k]``, or
        ``[stages, slabs, rows, block_k]`` of which slab ``slab`` is used (one slab of A per
        consumer warpgroup); ``stages * block_k >= cols``. Column block ``j`` (``block_k`` wide)
        goes into slot ``j``, swizzled as the TMA loads wrote it, and its own TMA store reads it
        back the same way: the output needs no shared memory of its own. Called by the
        accumulator's warpgroup once every load into these slots has landed and every wgmma of the
        group is complete."""
        rows, cols = acc.shape
        sub_cols = slots.shape[-1]
        if slots.shape[0] * sub_cols < cols:
            raise ValueError(f"a {rows} x {cols} tile does not fit in {slots.shape[0]} slots of {sub_cols} columns: "
                             f"use stages * block_k >= block_n")
        grid = self.view(acc, layout=wgmma_fragment_grid(rows, cols, sub_cols))  # no copy
        self.sync()  # every warp of the group is past its wgmma wait: no wgmma reads the slots now
        for i in self.range(rows // 64, unroll="all"):
            for j in self.range(cols // sub_cols, unroll="all"):
                slot = slots[j, slab] if len(slots.shape) == 4 else slots[j]
                self.store_shared(slot, grid[i, j].to(self.dtype), offsets=[i * 64, 0])
        self.fence.proxy_async(space="shared")  # generic-proxy stores -> the TMA unit's (async-proxy) reads
        self.sync()
        with self.single_warp():
            for j in self.range(cols // sub_cols, unroll="all"):
                slot = slots[j, slab] if len(slots.shape) == 4 else slots[j]
                self.tma.shared_to_global(slot, g_c, offsets=[offset_m, offset_n + j * sub_cols])
            self.tma.commit_group()
            self.tma.wait_group(0)
