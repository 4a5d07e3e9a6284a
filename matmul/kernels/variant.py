"""What a kernel computes around its product: the layout it reads B in, and the epilogue it applies.

Every version computes C = A @ B^T with A [M, K] row-major. A ``Variant`` names the rest, fixed when
the kernel is built (each variant is its own compiled program, tuned and cached on its own):

* ``b_layout``: ``"nk"``, B [N, K] row-major (a linear layer's weight ``w``, as in ``x @ w.T``), or
  ``"kn"``, torch's own b [K, N] row-major read in place (a plain ``a @ b``). The tensor cores read
  16-bit operands from shared memory along either dimension, so neither needs a copy.
* ``bias``: a float vector of N values added to every row, before the activation.
* ``activation``: applied to the float32 accumulator in the epilogue, where the tile already sits
  in registers, instead of in a second kernel that reads and writes C again:
  ``relu``, ``gelu_tanh`` (GELU, tanh approximation), ``gelu_erf`` (exact GELU), ``silu``, and
  ``swiglu``: ``silu(gate) * up`` of a fused gate-up weight, the output half as wide as the weight
  (``gate_up`` below says how the two are interleaved).
* ``batches``: 0 for one product; else a batch of products of one shape (torch.bmm's case), run by
  one launch whose tile schedule enumerates (batch, m-tile, n-tile) (``entry.batched_class``). The
  value is the batch count's bucket (``batch_bucket``): a choice is tuned per bucket, and every
  count of it launches the same kernel with its own count.

Kernels receive a bias pointer always (the last launch argument, 0 without a bias) so that every
variant of a version shares one launch signature.

``torch_epilogue`` is the same epilogue in torch, for the vendor candidate (cuBLAS followed by
torch's own elementwise kernels, as a model runs it today) and for the float32 reference.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

B_LAYOUTS = ("nk", "kn")
ACTIVATIONS = ("relu", "gelu_tanh", "gelu_erf", "silu", "swiglu")
# swiglu's fused weight interleaves gate and up rows in groups of this many: every thread of a
# wgmma or tcgen05 accumulator fragment holds columns j and j + 8 together (see ``gate_up``)
SWIGLU_GROUP = 8


def batch_bucket(batches: int) -> int:
    """The batch count a choice is made for: ``batches`` rounded up to a power of two (1, 2, 4, 8...)."""
    return 1 << max(batches - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True)
class Variant:
    b_layout: str = "nk"
    bias: bool = False
    activation: Optional[str] = None
    batches: int = 0

    def __post_init__(self):
        if self.b_layout not in B_LAYOUTS:
            raise ValueError(f"b_layout must be one of {B_LAYOUTS}, got {self.b_layout!r}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be None or one of {ACTIVATIONS}, got {self.activation!r}")
        if self.batches < 0 or (self.batches and batch_bucket(self.batches) != self.batches):
            raise ValueError(f"batches must be 0 (one product) or a power of two, got {self.batches!r}")

    @property
    def fused(self) -> bool:
        """Whether the epilogue does more than convert the accumulator to the output dtype."""
        return self.bias or self.activation is not None

    @property
    def batched(self) -> bool:
        """Whether the kernel computes a batch of products (``batches``)."""
        return self.batches > 0

    def key(self) -> str:
        """A short name: '' for the plain kernel; else e.g. 'kn', 'bias+gelu_tanh', 'swiglu', 'kn+batch8'."""
        parts = [] if self.b_layout == "nk" else [self.b_layout]
        parts += ["bias"] if self.bias else []
        parts += [self.activation] if self.activation else []
        parts += [f"batch{self.batches}"] if self.batches else []
        return "+".join(parts)

    @classmethod
    def parse(cls, key: str) -> "Variant":
        """The inverse of ``key``."""
        parts = [p for p in key.split("+") if p]
        b_layout = "kn" if "kn" in parts else "nk"
        activation = next((p for p in parts if p in ACTIVATIONS), None)
        batch_parts = [p for p in parts if p.startswith("batch") and p[5:].isdigit()]
        known = {"kn", "bias", *ACTIVATIONS, *batch_parts}
        if any(p not in known for p in parts) or len(batch_parts) > 1:
            raise ValueError(f"not a variant key: {key!r}")
        return cls(b_layout, "bias" in parts, activation, int(batch_parts[0][5:]) if batch_parts else 0)

    def kernel_options(self) -> dict:
        """The keyword arguments a version's ``Kernel`` takes for this variant (beside its configuration)."""
        return {"b_layout": self.b_layout, "bias": self.bias, "activation": self.activation or ""}

    def out_columns(self, n: int) -> int:
        """Columns of C for a B of ``n`` rows: half of them for swiglu (gate and up make one output)."""
        if self.activation == "swiglu":
            return n // 2
        return n


PLAIN = Variant()


def supported(module, variant: Variant) -> bool:
    """Whether a version module builds ``variant``: it lists the B layouts it reads (``B_LAYOUTS``,
    default ``("nk",)``), whether its epilogue fuses bias and activations (``FUSED_EPILOGUE``) and
    whether its tile schedule has a batch index (``BATCHED``, default False)."""
    if variant.b_layout not in getattr(module, "B_LAYOUTS", ("nk",)):
        return False
    if variant.batched and not getattr(module, "BATCHED", False):
        return False
    return not variant.fused or bool(getattr(module, "FUSED_EPILOGUE", False))


# --- the same epilogue in torch ------------------------------------------------------------------


def activation_name(activation: Optional[str]) -> Optional[str]:
    """The epilogue's name for a user's ``activation``: "gelu" is the exact (erf) form, as in torch."""
    return "gelu_erf" if activation == "gelu" else activation


def activate(y: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    """``activation`` of y [..., N] as torch computes it (swiglu: of y's interleaved gate and up columns)."""
    if activation is None or activation == "":
        return y
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    if activation == "gelu_erf":
        return torch.nn.functional.gelu(y)
    if activation == "silu":
        return torch.nn.functional.silu(y)
    if activation == "swiglu":
        gate, up = split_gate_up_columns(y)
        return torch.nn.functional.silu(gate) * up
    raise ValueError(f"unknown activation {activation!r}")


def torch_epilogue(y: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str]) -> torch.Tensor:
    """bias and activation applied to y [M, N] with torch's own kernels (in y's dtype)."""
    if bias is not None:
        y = y + bias
    return activate(y, activation)


# --- swiglu's fused gate-up weight ---------------------------------------------------------------


def gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The fused weight [2 I', K] for ``activation="swiglu"`` from gate and up [I, K] (I' = I rounded
    up to a multiple of 8, the extra rows zero): rows interleaved in groups of ``SWIGLU_GROUP``,
    gate rows 8q..8q+7 then up rows 8q..8q+7. Output column j of the product then has its gate at
    fused column 16 (j // 8) + j % 8 and its up 8 columns further, in the same thread of every MMA
    fragment, so the epilogue pairs them without moving data. Made once, when a model is converted."""
    if gate.shape != up.shape or gate.dim() != 2:
        raise ValueError(
            f"gate and up must be two [I, K] matrices of one shape, got {tuple(gate.shape)}, {tuple(up.shape)}"
        )
    rows, k = gate.shape
    padded = math.ceil(rows / SWIGLU_GROUP) * SWIGLU_GROUP
    fused = gate.new_zeros((padded // SWIGLU_GROUP, 2, SWIGLU_GROUP, k))
    for half, rows_of in ((0, gate), (1, up)):
        padded_rows = rows_of.new_zeros((padded, k))
        padded_rows[:rows] = rows_of
        fused[:, half] = padded_rows.view(-1, SWIGLU_GROUP, k)
    return fused.view(2 * padded, k)


def split_gate_up(fused: torch.Tensor, rows: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """gate and up [I, K] back from ``gate_up``'s fused weight (``rows`` = I, default all of them)."""
    grouped = fused.view(-1, 2, SWIGLU_GROUP, fused.shape[-1])
    gate = grouped[:, 0].reshape(-1, fused.shape[-1])
    up = grouped[:, 1].reshape(-1, fused.shape[-1])
    return (gate, up) if rows is None else (gate[:rows], up[:rows])


def gate_up_groups(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate and up columns of y [..., 2 I'] computed with a ``gate_up`` weight, as strided views
    [..., I' / 8, 8] of y (no copy)."""
    grouped = y.unflatten(-1, (-1, 2, SWIGLU_GROUP))
    return grouped[..., 0, :], grouped[..., 1, :]


def split_gate_up_columns(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate and up halves of y [..., 2 I'] computed with a ``gate_up`` weight: each [..., I']."""
    gate, up = gate_up_groups(y)
    return gate.flatten(-2), up.flatten(-2)
