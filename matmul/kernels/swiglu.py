"""``silu(gate) * up`` of a product computed with ``variant.gate_up``'s interleaved weight, and its
gradient, each in one pass over memory: the activation of a gated MLP wherever the product kernel
did not fuse it (a training step keeps the product for the backward; the cuBLAS candidate of the
call runs the activation after it).

The product y [M, 2 I'] holds gate and up columns interleaved in groups of 8 (``SWIGLU_GROUP``):
columns ``16 q .. 16 q + 7`` are gate's ``8 q ..``, the next 8 up's. torch's elementwise kernels see
each half as a strided view, which they read element by element, and autograd through the views
zero-fills and adds a y-sized gradient per half. Here y is viewed as [M, I' / 8, 2, 8]: each thread
loads one group of 8 gate values and the 8 up values beside it (16 bytes each), computes in float32
and writes 8 outputs; the backward reads the gradient and y and writes both halves of dy in place.
One rounding to the 16-bit dtype per value written.

``forward`` and ``backward`` take the built kernel, or None: then torch's operators compute the
same on the strided halves. The call decides which (``matmul.call.activation``: the kernel once its
build child has built it, on a Hopper GPU).
"""

from typing import Optional

import tilus
import torch
from tilus import float32, int32, void_p
from tilus.ir.layout.ops.register_ops import local, spatial
from tilus.utils import cdiv

from . import device_context
from .variant import SWIGLU_GROUP, gate_up_groups

ROWS, GROUPS = 16, 8  # a CTA's tile: 16 rows x 8 column groups of each half, a group per thread
DTYPES = {torch.float16: tilus.float16, torch.bfloat16: tilus.bfloat16}
ARCH = "sm_90a"  # run where it was checked; other GPUs and the CPU take torch's path
MAX_ELEMENTS = 2**31 - 1  # y is addressed with int32 element offsets


def thread_groups():
    """A [ROWS, GROUPS, 1, 8] tile as registers: one thread per (row, group), its 8 values contiguous."""
    return spatial(ROWS, GROUPS, 1, 1) * local(1, 1, 1, SWIGLU_GROUP)


class InterleavedSwigluKernel(tilus.Script):
    """Forward: out [M, I'] = silu(gate) * up of y [M, 2 I']. Backward: dy [M, 2 I'] from the
    gradient of out and y (module doc)."""

    def __init__(self, dtype, backward: bool):
        super().__init__()
        self.dtype = dtype
        self.backward = backward

    def __call__(self, m_size: int32, groups: int32, y_ptr: void_p, grad_ptr: void_p, out_ptr: void_p):
        self.attrs.blocks = [cdiv(groups, GROUPS), cdiv(m_size, ROWS)]
        self.attrs.warps = 4
        row: int32 = self.blockIdx.y * ROWS
        group: int32 = self.blockIdx.x * GROUPS
        halves = [m_size, groups, 2, SWIGLU_GROUP]  # y: each group of 8 gate columns, then its up
        halves_strides = [groups * 2 * SWIGLU_GROUP, 2 * SWIGLU_GROUP, SWIGLU_GROUP, 1]
        single = [m_size, groups, 1, SWIGLU_GROUP]  # out and its gradient: [M, I'] as groups of 8
        single_strides = [groups * SWIGLU_GROUP, SWIGLU_GROUP, SWIGLU_GROUP, 1]
        g_y = self.global_view(y_ptr, dtype=self.dtype, shape=halves, strides=halves_strides)
        tile = [ROWS, GROUPS, 1, SWIGLU_GROUP]
        gate = self.load_global(g_y, offsets=[row, group, 0, 0], shape=tile)
        self.annotate_layout(gate, thread_groups())
        up = self.load_global(g_y, offsets=[row, group, 1, 0], shape=tile)
        self.annotate_layout(up, thread_groups())
        g = gate.to(float32)
        u = up.to(float32)
        sigmoid = 1.0 / (1.0 + self.exp(-g))
        if not self.backward:
            g_out = self.global_view(out_ptr, dtype=self.dtype, shape=single, strides=single_strides)
            self.store_global(g_out, (g * sigmoid * u).to(self.dtype), offsets=[row, group, 0, 0])
        else:
            g_grad = self.global_view(grad_ptr, dtype=self.dtype, shape=single, strides=single_strides)
            grad = self.load_global(g_grad, offsets=[row, group, 0, 0], shape=tile)
            self.annotate_layout(grad, thread_groups())
            d = grad.to(float32)
            # d/dg silu(g) = sigmoid(g) (1 + g (1 - sigmoid(g))); d/du = silu(g)
            d_gate = d * u * sigmoid * (1.0 + g * (1.0 - sigmoid))
            d_up = d * g * sigmoid
            g_dy = self.global_view(out_ptr, dtype=self.dtype, shape=halves, strides=halves_strides)
            self.store_global(g_dy, d_gate.to(self.dtype), offsets=[row, group, 0, 0])
            self.store_global(g_dy, d_up.to(self.dtype), offsets=[row, group, 1, 0])


def script(dtype: torch.dtype, config: dict) -> InterleavedSwigluKernel:
    """The kernel for ``dtype``, forward or ``config["backward"]`` (what the build child builds)."""
    return InterleavedSwigluKernel(dtype=DTYPES[dtype], backward=config["backward"])


def takes(y: torch.Tensor) -> bool:
    """Whether the kernel takes y (on a GPU, 16-bit, dense, addressable with int32 offsets; rows to
    compute: an empty grid is no launch, and torch's path returns the empty result)."""
    return y.is_cuda and y.dtype in DTYPES and y.is_contiguous() and 0 < y.numel() <= MAX_ELEMENTS


def forward(y: torch.Tensor, out: Optional[torch.Tensor] = None, kernel=None) -> torch.Tensor:
    """silu(gate) * up of y [..., 2 I'] (interleaved halves): [..., I'] (into ``out``, dense, if given),
    by ``kernel`` (the forward's, built) if given, else by torch."""
    if kernel is None:
        gate, up = gate_up_groups(y)
        result = torch.nn.functional.silu(gate).mul_(up).flatten(-2)  # silu's result is dense: a view
        return result if out is None else out.copy_(result)
    if out is None:
        out = torch.empty((*y.shape[:-1], y.shape[-1] // 2), dtype=y.dtype, device=y.device)
    with device_context.on_device(y.device):
        kernel(y.numel() // y.shape[-1], y.shape[-1] // (2 * SWIGLU_GROUP), y, y, out)
    return out


def backward(y: torch.Tensor, grad: torch.Tensor, dy: Optional[torch.Tensor] = None, kernel=None) -> torch.Tensor:
    """The gradient of ``forward`` at y for the gradient ``grad`` of its output: dy, y's shape
    (into ``dy``, dense, if given), by ``kernel`` (the backward's, built) if given, else by torch."""
    grad = grad.contiguous()
    if dy is None:
        dy = torch.empty_like(y, memory_format=torch.contiguous_format)
    if kernel is None:
        gate, up = gate_up_groups(y)
        grad = grad.unflatten(-1, (-1, SWIGLU_GROUP))
        d_gate, d_up = gate_up_groups(dy)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=d_gate)  # (grad up) silu'(gate)
        torch.mul(grad, torch.nn.functional.silu(gate), out=d_up)
        return dy
    with device_context.on_device(y.device):
        kernel(y.numel() // y.shape[-1], y.shape[-1] // (2 * SWIGLU_GROUP), y, grad, dy)
    return dy
