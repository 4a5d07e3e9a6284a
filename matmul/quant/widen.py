"""Widening on the device: a packed weight (int4, int4_channel, int6 or fp8_e4m3, ``matmul.quant``) into its 16-bit
[N, K] weight in HBM, the value ``QuantizedWeight.dequantize()`` gives, bit for bit. The call runs
it where V8 does not (``matmul.call.quantized``): past the tokens V8 takes, then cuBLAS on the
widened weight, and for the gradient of a quantized layer's input.

The kernel: one CTA of one warpgroup per packed tile (64 weight rows x 128 columns, one scale
group). Each thread loads its words of the tile straight from HBM (the packed layouts are made for
this: a thread's bytes of a part are contiguous, 16 bytes for int4 and fp8, 24 for int6), views
them in the wgmma A-fragment layout and widens them with V8's own conversion (``pipeline.widen``:
the same magic-number conversions, the same single rounding of ``q * scale`` in the 16-bit dtype;
fp8 and int4_channel: ``q`` widened exactly, times the float32 row scale, rounded once), then writes
each part's fragment into a staging tile in shared memory (``stmatrix``) from which one TMA store
writes it to ``out``: whole 128-byte rows instead of the fragment's 4-byte pieces, and the store
clips at N, so the padding rows are never written. A staging buffer per part lets the part's store
run while the next part is widened. The packed bytes and scales are read once and the widened
weight written once (int4 moves 2.5 bytes a weight, int6 2.75, fp8 3): the kernel is bound by HBM.

Why widen once for many tokens: from about a thousand tokens the product is bound by the tensor
core, ``2 M N K / F`` on the widened weight as on the original, and widening adds ``b N K / B`` (b
the bytes moved a weight, B the HBM bandwidth), so the ratio to cuBLAS on the 16-bit weight is
``1 / (1 + b F / (2 M B))`` whatever N and K: it approaches 1 as M grows. Below that V8 widens per
tile in registers and never writes the widened weight.

``widen`` takes the built kernel, or None: then torch's ``dequantize`` computes the same.
"""

from typing import Optional

import tilus
import torch
from tilus import GlobalTensor, RegisterTensor, float16, float32, int32, void_p
from tilus.ir.layout.ops.register_ops import local, spatial
from tilus.utils import cdiv

from matmul.kernels import device_context
from matmul.quant import ROW_SCALED
from pipeline.tma_store import StagedTmaStore
from pipeline.widen import Fp8Widen, Int4Widen, Int6Widen, reduce_layout

TILE_ROWS = 64  # weight rows of a packed tile: one warpgroup's A fragment
BLOCK_K = 128  # K columns of a packed tile (one scale group)
# per format: the int32 words of one part of a tile as a [rows, columns] box of the packed matrix,
# the threads along a box row (each holding words // threads consecutive words), the parts of a
# tile (K columns a part: 128 / parts) and the packed matrix's rows a tile spans (matmul.quant)
PARTS = {
    "int4": dict(box=(8, 64), per_row=16, parts=2, tile_rows=16, tile_cols=64),
    "int4_channel": dict(box=(8, 64), per_row=16, parts=2, tile_rows=16, tile_cols=64),
    "int6": dict(box=(16, 48), per_row=8, parts=2, tile_rows=32, tile_cols=48),
    "fp8_e4m3": dict(box=(8, 64), per_row=16, parts=4, tile_rows=32, tile_cols=64),
}
MAX_ELEMENTS = 2**31 - 1  # the output is addressed with int32 element offsets
ARCH = "sm_90a"  # run where it was checked; other GPUs and the CPU take torch's path


def thread_words(rows: int, cols: int, per_row: int):
    """A [rows, cols] box of words as registers: ``per_row`` threads along a row, each holding its
    ``cols / per_row`` consecutive words (a plain function: kernel code cannot compose layouts)."""
    return spatial(rows, per_row) * local(1, cols // per_row)


class WidenKernel(tilus.Script):
    """out [N, K] (``dtype``) = the packed ``weight`` format's tiles widened (module doc)."""

    def __init__(self, dtype, weight: str):
        super().__init__()
        if weight not in PARTS:
            raise ValueError(f"weight format {weight!r}: one of {', '.join(PARTS)}")
        self.dtype = dtype
        self.weight = weight
        self.row_scales = weight in ROW_SCALED  # one float32 scale a row
        spec = PARTS[weight]  # (kernel code takes attributes, not dict items)
        self.box_rows, self.box_cols = spec["box"]
        self.per_row, self.parts = spec["per_row"], spec["parts"]
        self.tile_rows, self.tile_cols = spec["tile_rows"], spec["tile_cols"]

    def __call__(self, n_size: int32, k_size: int32, packed_ptr: void_p, scales_ptr: void_p, out_ptr: void_p):
        n_pad = cdiv(n_size, TILE_ROWS) * TILE_ROWS
        k_blocks = k_size // BLOCK_K
        self.attrs.blocks = n_pad // TILE_ROWS * k_blocks
        self.attrs.warps = 4
        # neighbouring CTAs widen neighbouring K blocks of the same rows: their stores fill whole rows
        row_tile: int32 = self.blockIdx.x // k_blocks
        block: int32 = self.blockIdx.x % k_blocks
        g_w = self.global_view(
            packed_ptr,
            dtype=int32,
            shape=[n_pad // TILE_ROWS * self.tile_rows, k_blocks * self.tile_cols],
            strides=[k_blocks * self.tile_cols, 1],
        )
        g_out = self.global_view(out_ptr, dtype=self.dtype, shape=[n_size, k_size], strides=[k_size, 1])
        if self.row_scales:
            g_s = self.global_view(scales_ptr, dtype=float32, shape=[n_pad, 1], strides=[1, 1])
        else:  # [K / 128, N_pad], read as its transpose: a tile's scales are one column
            g_s = self.global_view(scales_ptr, dtype=self.dtype, shape=[n_pad, k_blocks], strides=[1, n_pad])

        rows, cols = self.box_rows, self.box_cols
        k_part = BLOCK_K // self.parts
        # a staging buffer per part: the parts' TMA stores run while the next part is widened
        store = StagedTmaStore(self.shared_tensor(dtype=self.dtype, shape=[self.parts, TILE_ROWS, k_part]))
        for part in range(self.parts):
            # a part's words, each thread its consecutive ones: the [part][thread][word] order
            words = self.load_global(
                g_w,
                offsets=[row_tile * self.tile_rows + part * rows, block * self.tile_cols],
                shape=[rows, cols],
            )
            self.annotate_layout(words, thread_words(rows, cols, self.per_row))
            self.widen_part(words, g_s, g_out, store, row_tile, block, block * BLOCK_K + part * k_part)
        store.finish()

    def widen_part(
        self,
        words: RegisterTensor,
        g_s: GlobalTensor,
        g_out: GlobalTensor,
        store: StagedTmaStore,
        row_tile: int32,
        block: int32,
        column: int32,
    ):
        """One part of a tile: its words widened into the 16-bit [64, K columns of a part] fragment,
        stored at ``column`` of the tile's rows."""
        if self.weight == "int4":
            conversion = Int4Widen(64)
            scale = self.load_global(g_s, offsets=[row_tile * TILE_ROWS, block], shape=[TILE_ROWS, 1])
            self.annotate_layout(scale, reduce_layout(conversion.fragment))
            store.put(conversion.operand(words, scale, 0), g_out, row_tile * TILE_ROWS, column)
        elif self.weight == "int6":
            conversion = Int6Widen()
            scale = self.load_global(g_s, offsets=[row_tile * TILE_ROWS, block], shape=[TILE_ROWS, 1])
            self.annotate_layout(scale, reduce_layout(conversion.fragment))
            store.put(conversion.operand(words, scale), g_out, row_tile * TILE_ROWS, column)
        else:  # a float32 scale a row
            conversion = Fp8Widen() if self.weight == "fp8_e4m3" else Int4Widen(64)
            scale = self.load_global(g_s, offsets=[row_tile * TILE_ROWS, 0], shape=[TILE_ROWS, 1])
            self.annotate_layout(scale, reduce_layout(conversion.fragment))
            # q is exact in float16 (and in float32); dequantize() rounds q * scale once, from float32
            if self.weight == "fp8_e4m3":
                exact = conversion.values(words).to(float16).to(float32)
            else:
                exact = conversion.values(words, "float16", 0).to(float32)
            self.annotate_layout(exact, conversion.fragment)
            product = exact * scale
            self.annotate_layout(product, conversion.fragment)
            wide = product.to(self.dtype)
            self.annotate_layout(wide, conversion.fragment)
            store.put(wide, g_out, row_tile * TILE_ROWS, column)


DTYPES = {torch.float16: tilus.float16, torch.bfloat16: tilus.bfloat16}


def script(dtype: torch.dtype, config: dict) -> WidenKernel:
    """The kernel for ``dtype`` and the format ``config["weight"]`` (what the build child builds)."""
    return WidenKernel(dtype=DTYPES[dtype], weight=config["weight"])


def takes(weight) -> bool:
    """Whether the kernel widens this weight: addressable with int32 offsets (where it runs at all:
    ``matmul.call.quantized.runs_here``)."""
    n, k = weight.shape
    return n * k <= MAX_ELEMENTS


def widen(weight, out: Optional[torch.Tensor] = None, kernel=None) -> torch.Tensor:
    """``weight.dequantize()``, the 16-bit [N, K] weight (into ``out``, dense, if given): one launch of
    ``kernel`` (built for the weight's dtype and format) if given, else torch's ``dequantize``."""
    if kernel is None:
        wide = weight.dequantize()
        return wide if out is None else out.copy_(wide)
    n, k = weight.shape
    if out is None:
        out = torch.empty((n, k), dtype=weight.dtype, device=weight.device)
    with device_context.on_device(weight.device):
        kernel(n, k, weight.packed, weight.scales, out)
    return out
