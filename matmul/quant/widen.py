"""Widening on the device: a packed weight (int4, int4_channel, int6 or fp8_e4m3, ``matmul.quant``) into its 16-bit
[N, K] weight in HBM, the value ``QuantizedWeight.dequantize()`` gives, bit for bit. The call runs
it above ``linear.max_tokens(format)`` tokens, then cuBLAS on the widened weight.

The kernel is built on first use, off the caller's path (by the call's build child,
``matmul.call.building.widen_in_child``, one kernel per format and dtype; tilus caches the build on
disk); until its build is ready, if it failed, and on any machine that is not a Hopper GPU,
``widen`` computes the same with torch (``dequantize``), so no call waits for a compiler. A call
inside a CUDA graph capture starts no build (it runs the kernel if it is built, else torch's path).

The kernel: one CTA of one warpgroup per packed tile (64 weight rows x 128 columns, one scale
group). Each thread loads its words of the tile straight from HBM (the packed layouts are made for
this: a thread's bytes of a part are contiguous, 16 bytes for int4 and fp8, 24 for int6), views
them in the wgmma A-fragment layout and widens them with V8's own conversion
(``pipeline.widen``: the same magic-number conversions, the same single rounding of ``q *
scale`` in the 16-bit dtype; fp8 and int4_channel: ``q`` widened exactly, times the float32 row scale, rounded once),
then writes each part's fragment into a staging tile in shared memory (``stmatrix``) from which one
TMA store writes it to ``out``: whole 128-byte rows instead of the fragment's 4-byte pieces, and the
store clips at N, so the padding rows are never written. A staging buffer per part lets the part's
store run while the next part is widened.
The packed bytes and scales are read once and the widened weight written once: int4 moves 2.5
bytes a weight (0.5 + 2), int6 2.75, fp8 3, so the kernel is bound by HBM, ~0.11 ms for int4 at
28672 x 4096 at 3 TB/s, where torch's unpacking (a 10-dimensional permute) takes 1.8 ms.

Why widen once and call cuBLAS for many tokens, and where that falls short of 0.9x cuBLAS on the
unquantized weight. From ~1024 tokens the product is bound by the tensor core: cuBLAS takes
``2 M N K / F`` (F ~ 700 TFLOP/s at fp16 on the H100), the same on the widened weight as on the
original. Widening once adds ``b N K / B`` (b the bytes moved a weight, B ~ 3 TB/s), so the ratio
to cuBLAS is ``1 / (1 + b F / (2 M B))``, independent of N and K: ``b F / 2B`` is ~290 tokens for
int4, ~320 for int6 and ~350 for fp8. 0.9x needs ``M >= 9 x`` that: ~2600 tokens (int4), ~2900
(int6), ~3150 (fp8). So M = 4096 meets it (int4 ~0.93x), M = 1024 does not (int4 ~0.78x at every
weight shape, 4096 x 4096 included; ~0.75x fp8), and a prefill of a few hundred tokens is well
below (at 256 tokens V8 itself is the faster path). These are upper bounds: the kernel runs a little
below the copy bandwidth and adds a launch, and the call writes cuBLAS's product straight into
``out`` so that no copy of it comes on top (``plots/h100/v8/bench_v8.py`` measures all of it).

What meets it at M = 1024 is widening per tile inside a compute-bound kernel, so that the widened
weight never goes to HBM (reads drop from 2 bytes a weight to 0.5) and the cost is SM work: each
weight tile is widened once per token tile that uses it, ``M / block_m`` times (8 times at M = 1024
with 128-token tiles), ~1 conversion instruction a weight per widening, hidden behind the tensor
core where another warpgroup's wgmma runs meanwhile. ``matmul/kernels/hopper/v8_prefill.py`` does
it with a widening warpgroup writing the 16-bit tile into shared memory for V5's MMA warpgroups
(correct on the H100, 0.58-0.65x cuBLAS: the widened tile's shared-memory traffic). V8 itself does it
in registers, and without a split of K it writes its slabs of C by TMA stores with no float32 tile
in between: 0.87-0.92x cuBLAS at 1024-1536 tokens on the H200 (``plots/h200/v8-prefill/``). So the
call runs int4 through V8 up to ``linear.INT4_MAX_M`` tokens where its tiles fill the GPU's waves
(``linear.prefill_pays``), int6 and fp8 up to ``linear.LARGE_TILE_MAX_M``, and widens once above
that and where they do not.
"""

import logging
from typing import Optional

import tilus
import torch
from tilus import GlobalTensor, RegisterTensor, float16, float32, int32, void_p
from tilus.ir.layout.ops.register_ops import local, spatial
from tilus.utils import cdiv

from matmul.kernels import device_context, versions
from matmul.kernels.child_built import ChildBuilt, capturing
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

log = logging.getLogger(__name__)


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

# the kernels, keyed (dtype, format), built by the call's build child: the call installs its builder
# (``matmul.call.building.widen_in_child``) when the package is imported; none: torch's path
builds = ChildBuilt(log, "the widening kernel %s did not build (%s); torch's dequantize widens")


def set_builder(builder) -> None:
    """Build the kernels with ``builder`` from now on (``child_built.Builder``)."""
    builds.set_builder(builder)


def runs_here(weight) -> bool:
    """Whether the kernel widens this weight here once it is built (a Hopper GPU, a weight it can
    address), else torch does."""
    n, k = weight.shape
    return weight.device.type == "cuda" and versions.local_arch() == ARCH and n * k <= MAX_ELEMENTS


def widen(weight, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``weight.dequantize()``, the 16-bit [N, K] weight (into ``out``, dense, if given): one launch
    of the kernel once it is built, torch's ``dequantize`` until then and where it does not run."""
    kernel = None
    if runs_here(weight):
        kernel = builds.launch((weight.dtype, weight.format), start=not capturing(weight.device))
    if kernel is None:
        wide = weight.dequantize()
        return wide if out is None else out.copy_(wide)
    n, k = weight.shape
    if out is None:
        out = torch.empty((n, k), dtype=weight.dtype, device=weight.device)
    with device_context.on_device(weight.device):
        kernel(n, k, weight.packed, weight.scales, out)
    return out


def wait_until_built(dtype: torch.dtype, weight_format: str, timeout_s: float = 300.0) -> bool:
    """Start the build of the kernel for ``dtype`` and ``weight_format`` if it has not started, and
    wait for it (tests, benchmarks); False where it does not run or did not build in time."""
    return versions.local_arch() == ARCH and builds.wait((dtype, weight_format), timeout_s)
