"""torch.matmul's shape rules on top of the 2-D call: what ``matmul(a, b)`` does with operands that
are not two matrices, and how ``linear`` flattens its input.

* ``a`` of any number of leading dimensions against a 2-D ``b`` ([..., K] @ [K, N] -> [..., N]): the
  leading dimensions are flattened into M, a view wherever a's strides allow (every contiguous
  tensor, and any whose leading dimensions nest); otherwise ``reshape`` copies it once, as
  torch.matmul does. The result is a view of the 2-D result.
* a 1-D ``a`` ([K] -> [1, K]) or ``b`` ([K] -> [K, 1]): the dimension is added, then removed from
  the result, as torch does.
* a ``b`` of more than two dimensions (a batch of matrices, torch.bmm's case and broadcasting):
  ``matmul()`` hands it to ``batched`` (one launch of a batched kernel, or torch.matmul where the
  kernels cannot take it, ``matmul.choice`` saying why) before it comes here; ``general`` itself
  computes it with ``torch.matmul``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..contract import MatmulInputError, check_empty_call


def flatten_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as [M, K], a view where the strides allow (else one copy)."""
    if x.dim() == 2:
        return x
    if x.dim() == 1:
        return x.unsqueeze(0)
    return x.reshape(-1, x.shape[-1])


def general(two_d: Callable, a, b, out: Optional[torch.Tensor]):
    """``a @ b`` for operands that are not both matrices, through ``two_d(a2, b2, out=...)`` for the
    2-D product (see the module's docstring)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return two_d(a, b, out=out)  # the 2-D checks name the problem
    if a.dim() == 0 or b.dim() == 0:
        raise MatmulInputError(
            f"both operands must have at least one dimension, got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if b.dim() > 2:
        if out is not None:
            return torch.matmul(a, b, out=out)
        return torch.matmul(a, b)
    shape = (*a.shape[:-1], *b.shape[1:])  # torch's result shape: a's leading dimensions, then b's columns
    a2 = flatten_rows(a)
    b2 = b if b.dim() == 2 else b.unsqueeze(1)
    if a2.shape[1] != b2.shape[0]:
        raise MatmulInputError(
            f"inner dimensions differ: a is {list(a.shape)} and b is {list(b.shape)} "
            f"(a's last dimension must equal b's first)"
        )
    out2 = None
    if out is not None:
        if tuple(out.shape) != shape:
            raise MatmulInputError(f"out must have shape {list(shape)}, got {list(out.shape)}")
        try:
            out2 = out.view(a2.shape[0], b2.shape[1])
        except RuntimeError:
            raise MatmulInputError(
                "out's strides do not let it be seen as one [M, N] matrix; pass a contiguous out"
            ) from None
    result = two_d(a2, b2, out=out2)
    return out if out is not None else result.view(shape)  # splits M, or drops a unit dimension: a view


def empty_product(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    """``a @ b`` for matrices with an empty dimension (M, N or K = 0): no kernel has work to do, and
    torch's result is the answer (an empty [M, N]; zeros where K = 0), after the checks any call
    passes (dtypes, devices, ``out``), so that an empty batch behaves as torch's does, not as an error."""
    check_empty_call(a, b, None if torch.compiler.is_compiling() else out)  # traced: no data pointers to check
    return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)


def is_empty(a, b) -> bool:
    """Whether two matrices ``a @ b`` have an empty dimension (M, N or K = 0)."""
    return a.numel() == 0 or b.numel() == 0
