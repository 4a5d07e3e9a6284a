"""The activation of a product whose kernel did not fuse it: after cuBLAS (``launch.VendorPlan``), and
in a training step, which keeps the pre-activation for the backward (``torch_op.linear_with_grad``).

swiglu runs ``kernels.swiglu``'s one-pass kernels once the chooser's build child has built them (on a
Hopper GPU; asked for at the first call, never inside a CUDA graph capture), torch's operators on the
strided halves until then and elsewhere; the other activations are torch's (``variant.activate``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..kernels import swiglu, versions
from ..kernels.variant import PLAIN, activate
from .chooser import Chooser


def swiglu_entry(backward: bool) -> dict:
    """The chooser's entry for swiglu's forward or backward kernel (``building.OUTSIDE``)."""
    return {"version": "swiglu", "config": {"backward": backward}}


def swiglu_kernels(dtype: torch.dtype) -> list[tuple]:
    """Both of swiglu's kernels for ``dtype``, as ``Chooser.build_now`` takes them."""
    return [(swiglu.ARCH, dtype, swiglu_entry(backward), PLAIN) for backward in (False, True)]


def _kernel(chooser: Optional[Chooser], y: torch.Tensor, backward: bool):
    """The built kernel for y, or None (torch's path): while it builds, where it does not run."""
    if chooser is None or not swiglu.takes(y) or versions.local_arch() != swiglu.ARCH:
        return None
    return chooser.kernel(swiglu.ARCH, y.dtype, swiglu_entry(backward), device=y.device)


class InterleavedSwiglu(torch.autograd.Function):
    """swiglu differentiable: autograd through the column views (``variant.activate``) would copy each
    half to make it contiguous, and in the backward allocate a zero-filled gradient of y's size for
    each half and add the two; here the backward is ``swiglu.backward``, one pass."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, chooser: Optional[Chooser]) -> torch.Tensor:
        ctx.save_for_backward(y)
        ctx.chooser = chooser
        return swiglu.forward(y, kernel=_kernel(chooser, y, backward=False))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (y,) = ctx.saved_tensors
        return swiglu.backward(y, grad, kernel=_kernel(ctx.chooser, y, backward=True)), None


def activation(chooser: Optional[Chooser], y: torch.Tensor, name: Optional[str]) -> torch.Tensor:
    """The activation ``name`` of the product y: swiglu through its kernels (differentiable where
    autograd records y), the others as ``variant.activate`` computes them."""
    if name != "swiglu":
        return activate(y, name)
    if torch.is_grad_enabled() and y.requires_grad:
        return InterleavedSwiglu.apply(y, chooser)
    return swiglu.forward(y, kernel=_kernel(chooser, y, backward=False))
