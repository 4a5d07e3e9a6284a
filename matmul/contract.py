"""The operand contract of the series, checked in one place with one set of messages.

The kernels compute C = A @ B^T with A [M, K] and B [N, K], both row-major; C [M, N] row-major in
the inputs' dtype; float16 or bfloat16 inputs, float32 accumulation. TMA reads and writes the
matrices, so each row stride must be a multiple of 16 bytes and each base address 16-byte aligned;
the rows themselves may be of any length (a [M, 17] view of a [M, 24] buffer is fine).

Two entry points, one path:

* ``check_operands(a, b, out)``: the kernels' own form, B [N, K] (``versions.run``, the harness).
* ``check_call(a, b, out)``: torch's form ``a @ b`` with b [K, N] (``matmul.matmul``): ``kernel_b``
  says how the kernels read b in place (as w [N, K] for ``b = w.T``, as b [K, N] for a row-major b),
  then the same checks run. What torch takes and TMA cannot read or write in place (rows or a base
  not 16-byte aligned, strides of neither layout) passes as ``TORCH_ONLY``: cuBLAS runs it.

Every rule is one function here, and each raises ``MatmulInputError`` naming the problem and
the fix; nothing is launched before they pass.
"""

from __future__ import annotations

import torch

DTYPES = (torch.float16, torch.bfloat16)
TMA_ALIGN_BYTES = 16
# ``check_call``'s layout of a call whose operands torch takes but TMA cannot read or write in place
TORCH_ONLY = "torch"


class MatmulInputError(ValueError):
    """An operand the kernels cannot take; the message names the problem and the fix."""


# --- the rules -----------------------------------------------------------------------------------


def _check_tensors(a, b) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            if name == "b" and hasattr(t, "dequantize"):  # a QuantizedWeight, [N, K] as nn.Linear stores it
                raise MatmulInputError(
                    f"b is a {type(t).__name__} of shape [N, K] = {list(t.shape)}: pass its transpose, "
                    "matmul(a, qw.T), or call matmul.linear(a, qw)"
                )
            raise MatmulInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise MatmulInputError(
                f"{name} must be 2-D, got shape {tuple(t.shape)}; reshape it to 2-D (e.g. x.reshape(-1, x.shape[-1]))"
            )
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        raise MatmulInputError(
            f"a and b must both be float16 or both bfloat16, got {a.dtype} and {b.dtype}; "
            "convert with .half() or .bfloat16()"
        )


def _check_inner(a: torch.Tensor, b: torch.Tensor, b_form: str) -> None:
    """K of a [M, K] against K of b, which is ``b_form`` ('[K, N]' for torch's a @ b, '[N, K]' for A @ B^T)."""
    k_b = b.shape[0] if b_form == "[K, N]" else b.shape[1]
    if a.shape[1] != k_b:
        raise MatmulInputError(
            f"inner dimensions differ: a is [M, K] = {list(a.shape)} but b is {b_form} = "
            f"{list(b.shape)}" + ("" if b_form == "[K, N]" else "; these kernels compute a @ b.T")
        )


def _check_nonempty(a: torch.Tensor, b: torch.Tensor, b_form: str) -> None:
    """The kernels' rule: M, N and K at least 1 (``matmul()`` and ``linear`` compute an empty product
    without them: ``shapes.empty_product``)."""
    if min(*a.shape, *b.shape) < 1:
        m, k = a.shape
        n = b.shape[1] if b_form == "[K, N]" else b.shape[0]
        raise MatmulInputError(f"every dimension must be at least 1, got M={m}, N={n}, K={k}")


def _check_device(a: torch.Tensor, b: torch.Tensor) -> None:
    if not (a.is_cuda and b.is_cuda):
        raise MatmulInputError(
            f"a and b must be CUDA tensors, got devices {a.device} and {b.device}; move them with .cuda()"
        )
    if a.device != b.device:
        raise MatmulInputError(f"a and b are on different devices ({a.device}, {b.device}); put both on one GPU")


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
    check_aligned(name, t.data_ptr())


def check_aligned(name: str, pointer: int) -> None:
    """The base-address rule alone: what may change from call to call for operands of one layout."""
    if pointer % TMA_ALIGN_BYTES:
        raise MatmulInputError(
            f"{name}'s data pointer is not {TMA_ALIGN_BYTES}-byte aligned, which TMA requires; "
            f"pass a freshly allocated tensor or {name}.clone()"
        )


def layout(t: torch.Tensor) -> tuple[int, int, int, int, int]:
    """What decides where a 2-D tensor's elements lie, apart from its base: rows, columns, strides, item size."""
    return t.shape[0], t.shape[1], t.stride(0), t.stride(1), t.element_size()


def overlaps(pointer_1: int, layout_1: tuple, pointer_2: int, layout_2: tuple) -> bool:
    """Whether two 2-D tensors share an element. Exact for row-major matrices with one row stride
    (e.g. two column blocks of one buffer); otherwise whether their spans of bytes meet."""
    rows_1, cols_1, ld_1, unit_1, item = layout_1
    rows_2, cols_2, ld_2, unit_2, _ = layout_2
    end_1 = pointer_1 + ((rows_1 - 1) * ld_1 + (cols_1 - 1) * unit_1 + 1) * item
    end_2 = pointer_2 + ((rows_2 - 1) * ld_2 + (cols_2 - 1) * unit_2 + 1) * item
    if not (pointer_1 < end_2 and pointer_2 < end_1):
        return False
    if (unit_1, unit_2) != (1, 1) or ld_1 != ld_2 or cols_1 > ld_1 or cols_2 > ld_2 or (pointer_2 - pointer_1) % item:
        return True  # the spans meet; not worth an exact answer for such layouts
    # tensor 2 in tensor 1's frame: rows from q, columns from r, its rows wrapping past the stride
    q, r = divmod((pointer_2 - pointer_1) // item, ld_1)
    parts = [(q, min(r + cols_2, ld_1), r)]
    if r + cols_2 > ld_1:
        parts.append((q + 1, r + cols_2 - ld_1, 0))
    return any(row < rows_1 and 0 < row + rows_2 and start < cols_1 and 0 < end for row, end, start in parts)


def check_no_overlap(out_pointer: int, out_layout: tuple, name: str, pointer: int, input_layout: tuple) -> None:
    """``out`` must not share memory with an input: the kernels read A and B while C is written."""
    if overlaps(out_pointer, out_layout, pointer, input_layout):
        raise MatmulInputError(
            f"out overlaps {name} in memory: the kernels read {name} while writing out, which would "
            f"corrupt the result; pass a separate out (torch.empty_like) or none"
        )


def matrix_layout(t: torch.Tensor) -> tuple[int, tuple]:
    """``t``'s base and ``layout`` as a matrix for ``overlaps``: its rows flattened where a view allows
    (x [..., K] as [M, K]); else its whole span of elements as one row, which ``overlaps`` compares
    by bytes."""
    try:
        return t.data_ptr(), layout(t.view(-1, t.shape[-1]) if t.dim() else t.view(1, 1))
    except RuntimeError:  # rows no view can flatten
        span = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
        return t.data_ptr(), (1, span, span, 1, t.element_size())


def check_apart(out: torch.Tensor, inputs: tuple) -> None:
    """``check_no_overlap`` for ``out`` against each ``(name, tensor)`` of ``inputs`` of any number of
    dimensions; a tensor of another element size is compared by its span of bytes."""
    out_pointer, out_layout = matrix_layout(out)
    for name, t in inputs:
        if not (out.numel() and t.numel()):  # nothing to share
            continue
        pointer, input_layout = matrix_layout(t)
        if input_layout[4] == out_layout[4]:
            check_no_overlap(out_pointer, out_layout, name, pointer, input_layout)
        else:  # another element size (a packed weight's int32 words): their spans of bytes
            check_no_overlap(out_pointer, _byte_span(out_layout), name, pointer, _byte_span(input_layout))


def _byte_span(matrix: tuple) -> tuple:
    rows, cols, ld, unit, item = matrix
    span = ((rows - 1) * ld + (cols - 1) * unit + 1) * item
    return 1, span, span, 1, 1


def check_no_internal_overlap(out: torch.Tensor) -> None:
    """``out`` must not hold one element in two places (a broadcast view, rows closer than their
    length): torch refuses to write such a tensor, and a kernel would leave only one of the values.
    Checked dimension by dimension, the smallest stride first: each must step past everything the
    smaller ones span."""
    span = 1
    for stride, size in sorted((out.stride(d), out.shape[d]) for d in range(out.dim()) if out.shape[d] > 1):
        if stride < span:
            raise MatmulInputError(
                f"out {list(out.shape)} with strides {tuple(out.stride())} holds one element in several places "
                "(a broadcast or overlapping view), so its values would overwrite each other; pass a dense out "
                "(torch.empty)"
            )
        span = stride * (size - 1) + span


def check_bias(bias, x: torch.Tensor, n: int) -> None:
    """A linear layer's bias: None, or [N] of x's dtype on x's device."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise MatmulInputError(f"bias must be a torch.Tensor, got {type(bias).__name__}")
    if bias.dim() != 1 or bias.shape[0] != n:
        raise MatmulInputError(f"bias must be [N] = [{n}], got {tuple(bias.shape)}")
    if bias.dtype != x.dtype or bias.device != x.device:
        raise MatmulInputError(
            f"bias must be {x.dtype} on {x.device} like x, got {bias.dtype} on {bias.device}; convert it with .to(x)"
        )


def _check_out(out, a: torch.Tensor, m: int, n: int, inputs: tuple, tma: bool = True) -> torch.Tensor:
    """``out`` of the product's shape, dtype and device, no element in two places, apart from the
    inputs (what torch refuses too) and, with ``tma``, rows TMA may write."""
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or tuple(out.shape) != (m, n):
        raise MatmulInputError(
            f"out must be a tensor of shape [{m}, {n}], got "
            f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}"
        )
    if out.dtype != a.dtype or out.device != a.device:
        raise MatmulInputError(
            f"out must be {a.dtype} on {a.device} like the inputs, got {out.dtype} on "
            f"{out.device}; allocate it with torch.empty_like"
        )
    if tma:
        _check_row_major("out", out)
    check_no_internal_overlap(out)
    check_apart(out, inputs)
    return out


# --- layouts -------------------------------------------------------------------------------------


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


def kernel_b(b: torch.Tensor) -> tuple[torch.Tensor, str]:
    """B as the kernels read it, from torch's b [K, N], and its layout (``variant.Variant.b_layout``),
    never a copy: "nk", the row-major w [N, K] behind b = w.T; "kn", a row-major b itself."""
    bt = b.T
    row_major = b.stride(1) == 1 or b.shape[1] == 1
    if bt.stride(1) == 1 or bt.shape[1] == 1:  # b = w.T of a row-major w [N, K]: read w in place
        try:
            _check_row_major("b.T", bt)  # its rows must suit TMA; the message says how to pad them
            return bt, "nk"
        except MatmulInputError:
            if not row_major:  # (with K = 1, b [1, N] is both: then read it as [K, N])
                raise
    if row_major:
        return b, "kn"
    raise MatmulInputError(
        f"b [K, N] = {list(b.shape)} has strides {tuple(b.stride())}: neither row-major [K, N] nor the "
        "transposed view w.T of a row-major [N, K] matrix; pass b.contiguous()"
    )


def tma_readable(t: torch.Tensor) -> bool:
    """Whether TMA can read the row-major matrix ``t`` in place: rows and base 16-byte aligned."""
    try:
        _check_row_major("b", t)
    except MatmulInputError:
        return False
    return True


def readable(t: torch.Tensor) -> torch.Tensor:
    """The matrix ``t`` itself where TMA can read it in place (``tma_readable``), else a copy whose
    rows it can (padded to 16 bytes): ``linear`` takes its input in any strides, as torch does."""
    if tma_readable(t):
        return t
    return empty_padded(*t.shape, t.dtype, t.device).copy_(t)


# --- the two entry points ------------------------------------------------------------------------


def check_operands(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    require_cuda: bool = True,
    b_layout: str = "nk",
    columns: int | None = None,
    allocate: bool = True,
) -> torch.Tensor:
    """Validate A [M, K] and B [N, K] (``b_layout`` "nk") or b [K, N] ("kn"), and C [M, ``columns``]
    if given (default N: swiglu's C is half as wide as B); return C, allocated if not given (with
    ``allocate=False``: its strides only, on the meta device). ``require_cuda=False`` only for CPU
    stand-ins of the kernels (tests)."""
    _check_tensors(a, b)
    b_form = "[N, K]" if b_layout == "nk" else "[K, N]"
    _check_inner(a, b, b_form)
    _check_nonempty(a, b, b_form)
    _check_row_major("a", a)
    _check_row_major("b", b)
    if require_cuda:
        _check_device(a, b)
    m = a.shape[0]
    n = columns if columns is not None else b.shape[0] if b_layout == "nk" else b.shape[1]
    if out is None:  # a view of exactly [M, N]; TMA may store its rows
        return empty_padded(m, n, a.dtype, a.device if allocate else "meta")
    return _check_out(out, a, m, n, (("a", a), ("b", b)))


def check_shapes(a, b) -> None:
    """The rules a traced call can check (no data, no pointers): tensors, 2-D, dtypes, a [M, K] @ b [K, N]
    (any of them may be 0 here: ``check_call`` refuses that for the kernels)."""
    _check_tensors(a, b)
    _check_inner(a, b, "[K, N]")


def check_empty_call(a, b, out=None) -> None:
    """``check_call``'s rules for a product with an empty dimension, which no kernel runs: tensors,
    dtypes, shapes, devices, ``out``."""
    check_shapes(a, b)
    _check_device(a, b)
    if out is not None:
        _check_out(out, a, a.shape[0], b.shape[1], (("a", a), ("b", b)))


def check_call(
    a, b, out=None, *, require_cuda: bool = True, columns: int | None = None, allocate: bool = True
) -> tuple[torch.Tensor, str, torch.Tensor]:
    """Validate torch's ``a @ b`` (a [M, K], b [K, N], out [M, N]) for the kernels: B as they read it
    (``kernel_b``: w [N, K] of b = w.T, or b itself), its layout, and C (allocated if not given;
    ``allocate=False``: a C of the strides an allocated one would have, on the meta device, without
    memory: what a plan's derivation needs). Operands that torch takes but TMA cannot read or write
    in place (``a``, ``b`` or ``out`` with rows or a base not 16-byte aligned, or strides of neither
    layout) pass with the layout ``TORCH_ONLY`` and ``b`` itself: cuBLAS takes them as they are."""
    check_shapes(a, b)
    _check_nonempty(a, b, "[K, N]")
    if require_cuda:
        _check_device(a, b)
    n = columns if columns is not None else b.shape[1]
    if out is not None:
        _check_out(out, a, a.shape[0], n, (("a", a), ("b", b)), tma=False)
    c = out if out is not None else empty_padded(a.shape[0], n, a.dtype, a.device if allocate else "meta")
    if not (tma_readable(a) and (out is None or tma_readable(out))):
        return b, TORCH_ONLY, c
    try:
        operand, b_layout = kernel_b(b)
    except MatmulInputError:
        return b, TORCH_ONLY, c
    if b_layout == "kn" and not tma_readable(b):
        return b, TORCH_ONLY, c
    checked = check_operands(
        a, operand, out, require_cuda=require_cuda, b_layout=b_layout, columns=n, allocate=allocate
    )
    return operand, b_layout, checked
