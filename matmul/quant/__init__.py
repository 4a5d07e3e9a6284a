"""Low-precision weights: ``quantize(w)`` packs a linear layer's weight once, and ``matmul.matmul(x,
qw.T)`` / ``matmul.linear(x, qw)`` run the product with it.

``quantize(w, format="int4", group=128)`` returns a ``QuantizedWeight``: the format, its bits and
group, the scales, the original shape and dtype, the packed words in the layout Hopper V8 reads
(``matmul.quant.int4``), and ``dequantize()``, the float16/bfloat16 weight it stands for.
``format="int6"`` (``matmul.quant.int6``): 6-bit values, one scale per 128 columns, as int4's;
``format="fp8_e4m3"`` (``matmul.quant.fp8``): float8 e4m3 values with one float32 scale per row
(the group is the whole row); ``format="int4_channel"``: int4's values and packed words with one
float32 scale per row (per output channel, as fp8's: ``scale = absmax / 7``), which V8 applies to
the sum instead of to every value. V8 reads all four formats (``tests/test_v8_gpu.py`` checks each
on a GPU).

The call (``matmul.call.quantized``) runs V8 (``matmul/kernels/hopper/v8.py``, the GEMM that widens
the weight on chip) on a Hopper GPU up to the format's token limit, and elsewhere widens the weight
to its 16-bit dtype once per call (``matmul.quant.widen``) for cuBLAS. This package holds the
formats: how a weight is packed, scaled and read back."""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..contract import MatmulInputError
from . import fp8, int4, int6

# format -> (bits, its group; None: a row)
FORMATS = {"int4": (4, int4.GROUP), "int4_channel": (4, None), "int6": (6, int4.GROUP), "fp8_e4m3": (8, None)}
ROW_SCALED = ("fp8_e4m3", "int4_channel")  # formats with one float32 scale a row (``fp8.pack_scales``)
INT4_PACKED = ("int4", "int4_channel")  # formats whose values are int4's packed words (``int4.pack``)
DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A weight [N, K] stored in ``bits`` bits (module doc). int4: ``packed`` int32 [N_pad / 4, K / 2],
    ``scales`` [K / group, N_pad] in ``dtype``; int6: ``packed`` [N_pad / 2, 3 K / 8], scales as
    int4's; fp8_e4m3: ``packed`` int32 [N_pad / 2, K / 2], ``scales`` float32 [N_pad], ``group`` K;
    int4_channel: ``packed`` as int4's, ``scales`` as fp8's, ``group`` K.
    ``shape``: (N, K)."""

    format: str
    bits: int
    group: int
    shape: tuple[int, int]
    dtype: torch.dtype
    packed: torch.Tensor
    scales: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def T(self) -> "TransposedWeight":  # noqa: N802 (torch's name)
        """``qw.T``: the [K, N] operand of ``matmul.matmul(x, qw.T)``, as ``w.T`` is for a 16-bit weight."""
        return TransposedWeight(self)

    def q(self) -> torch.Tensor:
        """The quantized values [N, K]: int8 (int4's -8..7), or float8_e4m3fn."""
        if self.format == "fp8_e4m3":
            return fp8.unpack(self.packed, self.shape[0])
        if self.format == "int6":
            return int6.unpack(self.packed, self.shape[0])
        return int4.unpack(self.packed, self.shape[0])

    def group_scales(self) -> torch.Tensor:
        """The scales as [N, K / group]."""
        if self.format in ROW_SCALED:
            return self.scales[: self.shape[0]].unsqueeze(1)
        return self.scales[:, : self.shape[0]].T

    def dequantize(self) -> torch.Tensor:
        """The float16/bfloat16 weight [N, K] this stands for (``q * scale``, rounded once)."""
        if self.format in ROW_SCALED:  # q * scale from float32, rounded once
            return fp8.dequantize(self.q(), self.group_scales()[:, 0], self.dtype)
        return int4.dequantize(self.q(), self.group_scales(), self.dtype, self.group)

    def check_for(self, x: torch.Tensor) -> None:
        """MatmulInputError unless ``x`` [..., K] may be multiplied by this weight."""
        if not isinstance(x, torch.Tensor):
            raise MatmulInputError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise MatmulInputError(
                f"x is {x.dtype} but the weight was quantized for {self.dtype} activations; "
                f"quantize the {x.dtype} weight, or convert x"
            )
        if x.dim() < 1 or x.shape[-1] != self.shape[1]:
            raise MatmulInputError(
                f"x [..., K] = {list(x.shape)} does not fit a weight quantized for shape [N, K] = "
                f"{list(self.shape)}: K differs"
            )
        if x.device != self.device:
            raise MatmulInputError(f"x is on {x.device}, the quantized weight on {self.device}")


@dataclasses.dataclass(frozen=True, eq=False)
class TransposedWeight:
    """``qw.T``: the [K, N] right operand of ``x @ qw.T``."""

    weight: QuantizedWeight

    @property
    def shape(self) -> tuple[int, int]:
        return (self.weight.shape[1], self.weight.shape[0])

    @property
    def T(self) -> QuantizedWeight:  # noqa: N802
        return self.weight


def quantize(w: torch.Tensor, format: str = "int4", group: Optional[int] = 128) -> QuantizedWeight:
    """Pack a weight w [N, K] (float16 or bfloat16, as ``nn.Linear`` stores it) in ``format``, one
    scale per ``group`` columns of a row (module doc; fp8_e4m3: one a row, ``group`` None or K).
    Once, when a model is converted."""
    if format not in FORMATS:
        raise MatmulInputError(f"format {format!r} is not supported; choose one of {', '.join(FORMATS)}")
    bits, kernel_group = FORMATS[format]
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise MatmulInputError(f"w must be a 2-D tensor [N, K], got {getattr(w, 'shape', type(w).__name__)}")
    if w.dtype not in DTYPES:
        raise MatmulInputError(f"w must be float16 or bfloat16 (the activations' dtype), got {w.dtype}")
    n, k = w.shape
    if not bool(torch.isfinite(w).all()):  # once, at packing: a scale of inf or NaN would spoil a whole group
        bad = int((~torch.isfinite(w)).sum())
        raise MatmulInputError(
            f"w has {bad} infinite or NaN value(s); a group's scale would be non-finite and every value of "
            "the group lost with it. Repair the checkpoint (or keep this layer in 16 bits)"
        )
    if format in ROW_SCALED:
        if group not in (None, 128, k):  # 128: quantize()'s default, which names int4's group
            raise MatmulInputError(f"{format} has one scale per row: group None or K = {k}, not {group}")
        if k % int4.GROUP or n < 1:
            raise MatmulInputError(f"K = {k} must be a positive multiple of 128 (V8's K block); pad the columns")
        if format == "fp8_e4m3":
            q, row_scale = fp8.reference(w)
            packed = fp8.pack(q)
        else:
            q, row_scale = int4.row_reference(w)
            packed = int4.pack(q)
        return QuantizedWeight(
            format=format,
            bits=bits,
            group=k,
            shape=(n, k),
            dtype=w.dtype,
            packed=packed,
            scales=fp8.pack_scales(row_scale),
        )
    if group != kernel_group:
        hint = "; int4 with one scale per row is format='int4_channel'" if format == "int4" else ""
        raise MatmulInputError(f"{format} takes a group of {kernel_group} columns (V8's K block), not {group}{hint}")
    if k % group or n < 1:
        raise MatmulInputError(f"K = {k} must be a positive multiple of the group ({group}); pad the weight's columns")
    width = int6 if format == "int6" else int4
    q, scale = width.reference(w, group)
    return QuantizedWeight(
        format=format,
        bits=bits,
        group=group,
        shape=(n, k),
        dtype=w.dtype,
        packed=width.pack(q),
        scales=int4.pack_scales(scale),
    )


__all__ = ["QuantizedWeight", "TransposedWeight", "quantize", "FORMATS", "ROW_SCALED", "INT4_PACKED"]
