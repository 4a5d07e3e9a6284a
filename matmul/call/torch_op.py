"""``matmul()`` as torch custom operators, for ``torch.compile`` and autograd.

* ``torch.ops.tilus_matmul.mm(a, b) -> c`` and ``torch.ops.tilus_matmul.mm_out(a, b, out)``
  (mutates ``out``): their implementation is ``matmul()``'s own launch path; their fake
  implementations give the result's shape and strides (rows padded to 16 bytes, as the kernels
  allocate them), so ``torch.compile(fullgraph=True)`` traces a function that calls ``matmul()``
  with no graph break.
* autograd through ``mm``: with C = A B (torch's form), dA = dC B^T and dB = A^T dC, computed by
  the same operator, so by the same kernels; ``out=`` has no backward (torch's rule for ``out=``).

Eager calls without gradients do not pass through here: the dispatcher costs microseconds per
call, which ``matmul()``'s short path does not pay (``api.python_matmul`` routes only traced calls and
calls that need a gradient to these operators).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..contract import TMA_ALIGN_BYTES, MatmulInputError, check_shapes, empty_padded


def _plans():
    from . import api

    return api._plans


@torch.library.custom_op("tilus_matmul::mm", mutates_args=())
def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = empty_padded(a.shape[0], b.shape[1], a.dtype, a.device)  # the strides the fake promises
    return _plans().launch(a, b, out)


@mm.register_fake
def _(a, b):
    check_shapes(a, b)
    return empty_padded(a.shape[0], b.shape[1], a.dtype, a.device)


@torch.library.custom_op("tilus_matmul::mm_out", mutates_args=("out",))
def mm_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    _plans().launch(a, b, out)
    return None


@mm_out.register_fake
def _(a, b, out):
    check_shapes(a, b)


def _setup(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a kernel operand: row-major with rows 16-byte aligned (a gradient may be expanded)."""
    if t.stride(1) == 1 and (t.stride(0) * t.element_size()) % TMA_ALIGN_BYTES == 0 and t.stride(0) >= t.shape[1]:
        return t
    return empty_padded(*t.shape, t.dtype, t.device).copy_(t)


def _backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad = _operand(grad)
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:  # dA [M, K] = dC [M, N] @ B^T, B^T a view [N, K]
        grad_a = torch.ops.tilus_matmul.mm(grad, b.T)
    if ctx.needs_input_grad[1]:  # dB [K, N] = (dC^T [N, M] @ A [M, K])^T
        grad_b = torch.ops.tilus_matmul.mm(_operand(grad.T), a).T
    return grad_a, grad_b


mm.register_autograd(_backward, setup_context=_setup)


def traced(a, b, out: Optional[torch.Tensor]):
    """``matmul()`` while torch.compile traces it."""
    if out is None:
        return torch.ops.tilus_matmul.mm(a, b)
    torch.ops.tilus_matmul.mm_out(a, b, out)
    return out


def with_grad(a, b, out: Optional[torch.Tensor]):
    """``matmul()`` when autograd must record it."""
    if out is not None:
        raise MatmulInputError(
            "matmul(out=...) does not support automatic differentiation (as torch's "
            "out= functions); call matmul(a, b) without out, or under torch.no_grad()"
        )
    return torch.ops.tilus_matmul.mm(a, b)
