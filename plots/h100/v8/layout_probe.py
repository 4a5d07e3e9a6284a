"""Does the packed int4 weight's layout in HBM set Hopper V8's pace at decode sizes? V8 against the
same kernel reading a layout whose tiles are contiguous, timed in one window (L2 flushed by reading,
as ``bench_v8.py``), with cuBLAS fp16 beside:

* ``v8``: ``matmul.quant.int4``'s layout, an int32 matrix [N_pad / 4, K / 2]: a 4 KiB tile (64
  weight rows x 128 K columns) is 16 rows of 256 bytes, one row of the matrix apart (K / 2 words:
  8 KiB at K = 4096), so each TMA box gathers 16 pieces of 256 bytes;
* ``contiguous``: the same tiles in the order the kernel takes them, [row tile, K block, 16, 64]:
  a tile is 4 KiB in one piece, and a CTA's whole K range of a row tile is one stretch of HBM;
* ``onebox`` (``--variants``, added for ``plots/h200/v8-read-control/``): the contiguous layout, and
  each stage's ``interleave`` tiles in one TMA box [16 j, 64] instead of one box each, its scales
  in one box [j, 64] (one slab a CTA: ``warpgroups`` 1). A 3-D view [N_pad / 64, K / 128 * 16, 64]
  would let TMA fill zeros past a row tile's last block; tilus 0.2.0 writes an outer stride of 0
  into that view's tensor map, so the 2-D view it is.

Both outputs are checked against a float32 reference from ``qw.dequantize()`` (the probe's K ranges
end on a whole number of blocks: past a row tile's last block the contiguous layout holds the next
row tile, not TMA's zeros, so it is only a probe). Build on the CPU machine first (tilus caches the
programs under ``$MATMUL_CACHE_DIR``), then time on the GPU:

    MATMUL_CACHE_DIR=.cache/probe python plots/h100/v8/layout_probe.py OUT --build-only
    MATMUL_CACHE_DIR=$PWD/.cache/probe python plots/h100/v8/layout_probe.py OUT     # layout_probe.json
        [--variants v8,onebox] [--configs interleaved]   # (default: v8,contiguous and the call's)
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from bench_v8 import DECODE_SHAPES  # (this script's folder)
from tilus import GlobalTensor, SharedTensor, int32, void_p

import matmul
from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.kernels import versions
from matmul.measure.correctness import relative_error
from matmul.measure.timing import interleaved_ms
from pipeline import Pipeline
from pipeline.token_boxes import TokenBoxes

V8 = versions.load("sm_90a", "v8")
# the call's int4 configurations at 1 and 16 tokens (``matmul.quant.linear.config_for``)
CONFIGS = (
    {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1},
    {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 2},
    {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1},
    {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 4},
)
# V8 with 2 or 4 K blocks a stage, at tiles of 8 and 16 tokens (``onebox``'s configurations)
INTERLEAVED = tuple(
    {"block_m": bm, "warpgroups": 1, "split": 2, "stages": stages, "chunk": 64, "interleave": j}
    for bm in (8, 16)
    for j, stages in ((2, 4), (4, 2), (4, 4))
)
SHAPES = DECODE_SHAPES


# (tilus reads the annotations of a kernel's methods)
class Contiguous(V8.Kernel):
    def weight_view(self, b_ptr: void_p, ldb: int32, n_pad: int32, k_size: int32) -> GlobalTensor:
        self.k_blocks = k_size // V8.BLOCK_K
        return self.global_view(
            b_ptr,
            dtype=int32,
            shape=[n_pad // V8.TILE_ROWS * self.k_blocks * self.word_rows, self.word_cols],
            strides=[self.word_cols, 1],
        )

    def load_weight_tile(self, g_w: GlobalTensor, dst: SharedTensor, row_tile: int32, block: int32, ring: Pipeline):
        self.tma.global_to_shared(
            src=g_w,
            dst=dst,
            offsets=[(row_tile * self.k_blocks + block) * self.word_rows, 0],
            mbarrier=ring.producer_barrier(),
        )


def contiguous(packed: torch.Tensor, k: int) -> torch.Tensor:
    """``matmul.quant.int4``'s packed [N_pad / 4, K / 2] int32 weight as [row tile, K block, 16, 64]."""
    blocks = k // V8.BLOCK_K
    return packed.view(-1, 16, blocks, 64).permute(0, 2, 1, 3).contiguous().view(-1, 64)


class OneBox(Contiguous):
    def load_stage(
        self,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        g_a: GlobalTensor,
        s_w: SharedTensor,
        s_s: SharedTensor,
        token_boxes: TokenBoxes,
        slot: int32,
        first: int32,
        offset_m: int32,
        offset_n: int32,
        ring: Pipeline,
    ):
        j = self.interleave
        self.tma.global_to_shared(  # the stage's j tiles of the slab, one after another in HBM and here
            src=g_w,
            dst=self.reshape_shared(s_w[slot], [j * self.word_rows, self.word_cols]),
            offsets=[(offset_n // V8.TILE_ROWS * self.k_blocks + first) * self.word_rows, 0],
            mbarrier=ring.producer_barrier(),
        )
        self.tma.global_to_shared(  # their scales: rows first .. first + j - 1 of [K / 128, N_pad]
            src=g_s,
            dst=self.reshape_shared(s_s[slot], [j, V8.TILE_ROWS]),
            offsets=[first, offset_n],
            mbarrier=ring.producer_barrier(),
        )
        parts = V8.BLOCK_K // self.chunk
        for turn in range(j):
            for part in range(parts):
                token_boxes.load(
                    g_a,
                    slot,
                    turn * parts + part,
                    offset_m,
                    (first + turn) * V8.BLOCK_K + part * self.chunk,
                    ring.producer_barrier(),
                )


VARIANTS = {"v8": V8.Kernel, "contiguous": Contiguous, "onebox": OneBox}
LAYOUTS = {"v8": "v8", "contiguous": "contiguous", "onebox": "contiguous"}  # the packed weight each reads


def script(cls, config):
    return versions.fixed_script(cls, config, torch.float16, name=f"{cls.__name__}_layout_probe")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--variants", default="v8,contiguous")
    parser.add_argument("--configs", default="calls", help="calls: the call's; interleaved: 2 or 4 K blocks a stage")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    configs = {"calls": CONFIGS, "interleaved": INTERLEAVED}[args.configs]
    programs = {}
    for name in args.variants.split(","):
        cls = VARIANTS[name]
        for config in configs:
            with target("sm_90a"):  # built here, or found in tilus's cache
                programs[name, json.dumps(config)] = tilus_autotune.load(tilus_autotune.build(script(cls, config)))
            print(f"built {name} {config}", flush=True)
    if args.build_only:  # the libraries are opened, not loaded onto a GPU
        return
    rows = []
    for m, n, k in SHAPES:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).half().cuda()
        x = torch.randn(m, k, generator=gen).half().cuda()
        qw = matmul.quantize(w, format="int4")
        w16 = qw.dequantize()
        reference = x.float() @ w16.float().T
        packed = {"v8": qw.packed, "contiguous": contiguous(qw.packed, k)}
        packed = {name: packed[layout] for name, layout in LAYOUTS.items()}
        fns, names = [lambda x=x, w16=w16: torch.matmul(x, w16.T)], ["cublas"]
        for (name, config), program in programs.items():
            if (m <= 8) != (json.loads(config)["block_m"] == 8):  # the call's tile for M
                continue
            out = torch.empty(m, n, dtype=torch.float16, device="cuda")
            b = packed[name]
            operands = (m, n, k, x, b, out, x.stride(0), b.stride(0), out.stride(0), 0, qw.scales)

            def launch(program=program, operands=operands):
                program(*operands)

            out.fill_(float("nan"))
            launch()
            error = relative_error(out, reference)
            print(f"{m}x{n}x{k} {name} {config}: error {error:.2e}", flush=True)
            if not error < 1e-2:
                continue
            fns.append(launch)
            names.append(f"{name} {config}")
        times = interleaved_ms(fns, 50, 300)
        for name, ms in zip(names, times):
            row = dict(m=m, n=n, k=k, kernel=name, us=ms * 1e3, x_cublas=times[0] / ms)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "layout_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
