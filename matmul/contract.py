"""The contract every kernel of the series shares, checked before any launch.

C = A @ B^T with A [M, K] and B [N, K], both row-major; C [M, N] row-major in the inputs' dtype;
float16 or bfloat16 inputs, float32 accumulation. TMA reads and writes the matrices, so each row
stride must be a multiple of 16 bytes and each base address 16-byte aligned; the rows themselves
may be of any length (a [M, 17] view of a [M, 24] buffer is fine).
"""

from __future__ import annotations

import torch

DTYPES = (torch.float16, torch.bfloat16)
TMA_ALIGN_BYTES = 16


class MatmulInputError(ValueError):
    """An operand the kernels cannot take; the message names the problem and the fix."""


def _check_row_major(name: str, t: torch.Tensor) -> None:
    item = t.element_size()
    if t.stride(1) != 1 and t.shape[1] > 1:
        raise MatmulInputError(
            f"{name} must be row-major with unit stride along its last dimension (got strides "
            f"{tuple(t.stride())}); pass {name}.contiguous()"
        )
    if (t.stride(0) * item) % TMA_ALIGN_BYTES and t.shape[0] > 1:
        raise MatmulInputError(
            f"{name}'s row stride ({t.stride(0)} elements = {t.stride(0) * item} bytes) is not a "
            f"multiple of {TMA_ALIGN_BYTES} bytes, which TMA requires; pad its rows to a multiple of "
            f"{TMA_ALIGN_BYTES // item} elements (allocate [rows, padded] and slice [:, :cols])"
        )
    if t.data_ptr() % TMA_ALIGN_BYTES:
        raise MatmulInputError(
            f"{name}'s data pointer is not {TMA_ALIGN_BYTES}-byte aligned, which TMA requires; "
            f"pass a freshly allocated tensor or {name}.clone()"
        )


def aligned_row_length(cols: int, dtype: torch.dtype) -> int:
    """The shortest row of at least ``cols`` elements whose size is a multiple of 16 bytes."""
    per_row = TMA_ALIGN_BYTES // dtype.itemsize
    return cols + (-cols) % per_row


def empty_padded(rows: int, cols: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised [rows, cols] view of rows padded to 16 bytes, so that TMA may read or write it."""
    return torch.empty((rows, aligned_row_length(cols, dtype)), dtype=dtype, device=device)[:, :cols]


def row_stride(t: torch.Tensor) -> int:
    """The row stride to hand the kernel (a one-row matrix may report any stride)."""
    if t.shape[0] > 1:
        return t.stride(0)
    return aligned_row_length(t.shape[1], t.dtype)  # only row 0 is read: any aligned stride will do


def check_operands(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Validate A [M, K], B [N, K] (and C [M, N] if given); return C, allocated if not given."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise MatmulInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise MatmulInputError(f"{name} must be 2-D, got shape {tuple(t.shape)}; reshape it to 2-D")
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        raise MatmulInputError(
            f"a and b must both be float16 or both bfloat16, got {a.dtype} and {b.dtype}; "
            "convert with .half() or .bfloat16()"
        )
    (m, k), (n, k_b) = a.shape, b.shape
    if k != k_b:
        raise MatmulInputError(f"inner dimensions differ: a is [M, K] = {list(a.shape)} but b is [N, K] = "
                               f"{list(b.shape)}; these kernels compute a @ b.T")
    if min(m, n, k) < 1:
        raise MatmulInputError(f"every dimension must be at least 1, got M={m}, N={n}, K={k}")
    _check_row_major("a", a)
    _check_row_major("b", b)
    if not a.is_cuda or not b.is_cuda:
        raise MatmulInputError(
            f"a and b must be CUDA tensors, got devices {a.device} and {b.device}; move them with .cuda()"
        )
    if a.device != b.device:
        raise MatmulInputError(f"a and b are on different devices ({a.device}, {b.device}); put both on one GPU")
    if out is None:
        out = empty_padded(m, n, a.dtype, a.device)  # a view of exactly [M, N]; TMA may store its rows
    else:
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or tuple(out.shape) != (m, n):
            raise MatmulInputError(f"out must be a tensor of shape [{m}, {n}], got "
                                   f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
        if out.dtype != a.dtype or out.device != a.device:
            raise MatmulInputError(f"out must be {a.dtype} on {a.device} like the inputs, got {out.dtype} on "
                                   f"{out.device}; allocate it with torch.empty_like")
        _check_row_major("out", out)
    return out
