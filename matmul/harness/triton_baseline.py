"""A plain autotuned Triton kernel for C = A @ B^T: the baseline a reader could write in an afternoon.

One program per ``BLOCK_M x BLOCK_N`` tile of C, a K loop of ``tl.dot`` over tiles that Triton
loads and software-pipelines itself (``num_stages``), programs grouped along M so that neighbours
share tiles of B in L2. No persistence, no warp specialisation, no hand-written TMA: what the
series adds over this is what it measures.

Triton is optional: ``available()`` says whether it is installed, and the harness skips the
baseline without it.
"""

from __future__ import annotations

from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the baseline is optional
    triton = None


def available() -> bool:
    return triton is not None


if triton is not None:

    def _configs():
        # (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps): large tiles for large outputs, smaller ones so
        # that a short M (decoding) still fills the SMs
        shapes = [
            (128, 256, 64, 3, 8),
            (256, 128, 64, 3, 8),
            (128, 128, 64, 4, 4),
            (128, 128, 64, 4, 8),
            (64, 256, 64, 4, 4),
            (64, 128, 64, 4, 4),
            (64, 64, 64, 5, 4),
        ]
        return [
            triton.Config(
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=stages, num_warps=warps
            )
            for bm, bn, bk, stages, warps in shapes
        ]

    @triton.autotune(configs=_configs(), key=["M", "N", "K"])
    @triton.jit
    def _abt_kernel(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        lda,
        ldb,
        ldc,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        # GROUP_M consecutive programs walk down a column of tiles: they reuse one tile of B from L2
        per_group = GROUP_M * tiles_n
        first_m = (pid // per_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % group_m
        pid_n = (pid % per_group) // group_m

        # rows past the edge wrap around (they are computed and then not stored): no M/N masks in the loop
        rows_a = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        rows_b = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        cols = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rows_a[:, None] * lda + cols[None, :]
        b_ptrs = b_ptr + rows_b[:, None] * ldb + cols[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            in_k = cols[None, :] < K - k0
            a = tl.load(a_ptrs, mask=in_k, other=0.0)
            b = tl.load(b_ptrs, mask=in_k, other=0.0)
            acc = tl.dot(a, tl.trans(b), acc)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K

        out_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        out_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + out_m[:, None] * ldc + out_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(out_m[:, None] < M) & (out_n[None, :] < N))


def matmul_abt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[M, N] = a[M, K] @ b[N, K]^T; all three with unit stride along their rows."""
    if triton is None:
        raise RuntimeError("Triton is not installed: pip install triton")
    (m, k), n = a.shape, b.shape[0]
    assert a.stride(1) == 1 and b.stride(1) == 1 and out.stride(1) == 1 and b.shape[1] == k
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    _abt_kernel[grid](a, b, out, m, n, k, a.stride(0), b.stride(0), out.stride(0))
    return out


def best_config() -> Optional[dict]:
    """The configuration the autotuner chose at the last call."""
    config = getattr(_abt_kernel, "best_config", None) if triton is not None else None
    if config is None:
        return None
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
