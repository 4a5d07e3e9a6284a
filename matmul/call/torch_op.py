"""``matmul()`` as torch custom operators, for ``torch.compile`` and autograd.

* ``torch.ops.tilus_matmul.mm(a, b)`` and ``mm_out(a, b, out)``: ``matmul()``'s own launch path;
  their fake implementations give the result's shape and strides (rows padded to 16 bytes), so
  ``torch.compile(fullgraph=True)`` traces ``matmul()`` with no graph break.
* ``torch.ops.tilus_matmul.linear(x, weight, bias, activation)``: ``act(x @ weight.T + bias)`` with
  the epilogue fused (``matmul.kernels.variant``).
* autograd: for C = A B, dA = dC B^T through the same operator (B^T is the weight, read in place)
  and dB = A^T dC through cuBLAS (A^T is column-major, which no version reads); ``linear`` likewise,
  the bias's gradient a sum; activations by torch, swiglu by its own kernels
  (``linear_with_grad``). ``out=`` has no backward (torch's rule).

Eager calls do not pass through the operators: the dispatcher costs microseconds a call, and a
custom operator's autograd wrapper tens each way, which a training step pays per projection. So
``api.python_matmul`` sends only traced calls here, and eager calls that need a gradient run the
same launches through ``torch.autograd.Function``s (``_EagerMatmul``, ``_EagerLinear``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..contract import TMA_ALIGN_BYTES, MatmulInputError, check_shapes, empty_padded, readable, tma_readable
from ..kernels.variant import Variant
from . import yielding
from .activation import activation as activation_of

# the process's plans (``launch.Plans``), as ``api.use_plans`` last set them: handed in by ``api``,
# which imports this module (so this one does not import it back)
plans_of = None


def _plans():
    return plans_of()


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    yielding.stamp_call()  # a compiled graph or a backward pass calls this, not matmul()
    out = empty_padded(a.shape[0], b.shape[1], a.dtype, a.device)  # the strides the fake promises
    return _plans().launch(a, b, out)


@torch.library.custom_op("tilus_matmul::mm", mutates_args=())
def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _product(a, b)


@mm.register_fake
def _(a, b):
    check_shapes(a, b)
    return empty_padded(a.shape[0], b.shape[1], a.dtype, a.device)


@torch.library.custom_op("tilus_matmul::mm_out", mutates_args=("out",))
def mm_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    yielding.stamp_call()
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


def _mm_grads(ctx, grad, product):
    """dA and dB of C = A B, dA's product launched by ``product`` (the operator, or eager's)."""
    a, b = ctx.saved_tensors
    grad = _operand(grad)
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:  # dA [M, K] = dC [M, N] @ b^T: for b = w.T, b^T is w, read in place ([K, N] form)
        # a b [K, N] whose rows TMA cannot read ran cuBLAS forward: b^T, column-major, runs cuBLAS too
        grad_a = product(grad, b.T) if b.stride(0) == 1 or tma_readable(b) else torch.mm(grad, b.T)
    if ctx.needs_input_grad[1]:  # dB [K, N] = A^T @ dC: A^T is column-major, which no version reads: cuBLAS
        grad_b = torch.mm(a.T, grad)
    return grad_a, grad_b


def _backward(ctx, grad):
    return _mm_grads(ctx, grad, torch.ops.tilus_matmul.mm)


mm.register_autograd(_backward, setup_context=_setup)


class _EagerMatmul(torch.autograd.Function):
    """``mm`` and its backward for eager autograd: the same launches without the dispatcher, whose
    custom-operator call costs tens of microseconds of host time each way, paid by a training step
    for every projection. (``torch.compile`` traces the operator instead: it cannot look into this.)"""

    @staticmethod
    def forward(a, b):
        return _product(a, b)

    @staticmethod
    def setup_context(ctx, inputs, output):  # the form torch.func's transforms take
        _setup(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad):
        return _mm_grads(ctx, grad, _eager_product)


def _eager_product(a, b):
    """A backward's product in eager mode: recorded (a double backward: ``create_graph``) or not."""
    return _EagerMatmul.apply(a, b) if torch.is_grad_enabled() else _product(a, b)


# --- linear: the product with its epilogue -------------------------------------------------------


def _linear_product(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: str):
    yielding.stamp_call()
    x = readable(x)  # a compiled graph's input may come in any strides, as matmul.linear's may
    variant = Variant("nk", bias is not None, activation or None)
    out = empty_padded(x.shape[0], variant.out_columns(weight.shape[0]), x.dtype, x.device)
    return _plans().launch_fused(x, weight.T, bias, variant, out)


@torch.library.custom_op("tilus_matmul::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: str) -> torch.Tensor:
    """act(x @ weight.T + bias) for x [M, K], weight [N, K]: the variant's kernel (``launch.Plans.launch_fused``)."""
    return _linear_product(x, weight, bias, activation)


@linear.register_fake
def _(x, weight, bias, activation):
    check_shapes(x, weight.T)
    columns = Variant("nk", bias is not None, activation or None).out_columns(weight.shape[0])
    return empty_padded(x.shape[0], columns, x.dtype, x.device)


def _setup_linear(ctx, inputs, output):
    x, weight, bias, activation = inputs
    if activation:  # the pre-activation is not kept: linear_with_grad applies activations outside
        raise RuntimeError("tilus_matmul::linear is differentiated only without an activation")
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_grads(ctx, grad, product):
    """dX, dW and the bias's gradient of Y = X W^T + bias, dX's product launched by ``product``."""
    x, weight = ctx.saved_tensors
    grad = _operand(grad)
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:  # dX [M, K] = dY [M, N] @ W [N, K]: W read in place as b [K, N]
        grad_x = product(grad, weight)
    if ctx.needs_input_grad[1]:  # dW [N, K] = dY^T @ X: dY^T is column-major, which no version reads: cuBLAS
        grad_w = torch.mm(grad.T, x)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = grad.sum(0)
    return grad_x, grad_w, grad_b


def _backward_linear(ctx, grad):
    return (*_linear_grads(ctx, grad, torch.ops.tilus_matmul.mm), None)


linear.register_autograd(_backward_linear, setup_context=_setup_linear)


class _EagerLinear(torch.autograd.Function):
    """``linear`` without an activation and its backward for eager autograd (``_EagerMatmul``'s reason)."""

    @staticmethod
    def forward(x, weight, bias):
        return _linear_product(x, weight, bias, "")

    @staticmethod
    def setup_context(ctx, inputs, output):  # the operator's, for its inputs without the activation
        _setup_linear(ctx, (*inputs, ""), output)

    @staticmethod
    def backward(ctx, grad):
        return _linear_grads(ctx, grad, _eager_product)


def linear_with_grad(x, weight, bias, activation: Optional[str]):
    """``linear`` when autograd must record it: the product and bias through the operator while
    ``torch.compile`` traces, else ``_EagerLinear`` (either's backward runs the series' kernels where
    they win), the activation after it, so that autograd keeps the pre-activation its derivative
    needs (``activation.activation``)."""
    if torch.compiler.is_compiling():
        y = torch.ops.tilus_matmul.linear(x, weight, bias, "")
    else:
        y = _EagerLinear.apply(x, weight, bias)
    return activation_of(_plans().chooser, y, activation)


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
    return _EagerMatmul.apply(a, b)
