"""V8 with a stage's weight in one TMA box: does it close the gap ``read_control.py`` found?

``read_control.py`` timed V8's transport alone (boxes of [16, 64] int32, 4 KiB, four a CTA in flight,
V8's grid) at 8.4-17.0 us where a plain read of the same bytes takes 6.7-11.7 us, and the same ring
with boxes of [64, 64] (16 KiB) at 6.8-12.0 us: with one producer thread a CTA, the number of boxes,
not the bytes in flight, sets the pace. V8 with ``interleave`` j brings j K blocks a stage, each in
a box of its own (and a scales box each). ``OneBox`` brings them in one box each:

* the weight in the layout of ``plots/h100/v8/layout_probe.py`` (a row tile's K blocks one after
  another, [row tile, K block, 16, 64], seen as an int32 matrix of 64 columns), so the j tiles of a
  stage are one box [16 j, 64] that lands in the stage in the order the consumers read it. Past a
  row tile's last K block this matrix holds the next row tile, not zeros: only shapes whose CTAs'
  K ranges are whole stages are timed (all here: 16 or 56 blocks a CTA). A product would view it as
  [N_pad / 64, K / 128 * 16, 64], so that TMA fills zeros there, but tilus 0.2.0 writes 0 for the
  outer stride of that 3-D view's tensor map (seen in the generated host code);
* the scales of the j blocks, rows ``first .. first + j - 1`` of the [K / 128, N_pad] scales: one box
  [j, 64];
* the tokens as in V8.

One slab a CTA only (``warpgroups`` 1). Every output is checked against a float32 reference from
``qw.dequantize()``; timed in one window per shape with V8 in the same configuration, V8 in the
call's configuration and cuBLAS fp16 (L2 flushed by reading, ``matmul.measure.timing.interleaved_ms``).

    MATMUL_CACHE_DIR=.cache/onebox python plots/h200/v8-read-control/one_box_probe.py OUT --build-only   # CPU
    MATMUL_CACHE_DIR=$PWD/.cache/onebox python plots/h200/v8-read-control/one_box_probe.py OUT           # GPU
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from tilus import GlobalTensor, SharedTensor, int32, void_p

import matmul
from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.kernels import versions
from matmul.measure.correctness import relative_error
from matmul.measure.timing import interleaved_ms
from pipeline import Pipeline

V8 = versions.load("sm_90a", "v8")
SHAPES = tuple((m, n, k) for n, k in ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)) for m in (1, 16))
CALLS = (  # the call's int4 configurations at 1-8 and 9-16 tokens, timed as V8 only
    {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1},
    {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1},
)
CONFIGS = tuple(  # interleaved configurations: V8 and OneBox each
    {"block_m": bm, "warpgroups": 1, "split": 2, "stages": stages, "chunk": 64, "interleave": j}
    for bm in (8, 16)
    for j, stages in ((2, 4), (4, 2), (4, 4))
)


# (tilus reads the annotations of a kernel's methods)
class OneBox(V8.Kernel):
    def weight_view(self, b_ptr: void_p, ldb: int32, n_pad: int32, k_size: int32) -> GlobalTensor:
        self.k_blocks = k_size // V8.BLOCK_K
        return self.global_view(
            b_ptr,
            dtype=int32,
            shape=[n_pad // V8.TILE_ROWS * self.k_blocks * self.word_rows, self.word_cols],
            strides=[self.word_cols, 1],
        )

    def load_stage(
        self,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        g_a: GlobalTensor,
        s_w: SharedTensor,
        s_s: SharedTensor,
        s_x: SharedTensor,
        slot: int32,
        first: int32,
        offset_m: int32,
        offset_n: int32,
        ring: Pipeline,
    ):
        j = self.interleave
        self.tma.global_to_shared(
            src=g_w,
            dst=self.reshape_shared(s_w[slot], [j * self.word_rows, self.word_cols]),
            offsets=[(offset_n // V8.TILE_ROWS * self.k_blocks + first) * self.word_rows, 0],
            mbarrier=ring.producer_barrier(),
        )
        self.tma.global_to_shared(
            src=g_s,
            dst=self.reshape_shared(s_s[slot], [j, V8.TILE_ROWS]),
            offsets=[first, offset_n],
            mbarrier=ring.producer_barrier(),
        )
        parts = V8.BLOCK_K // self.chunk
        for turn in range(j):
            for part in range(parts):
                self.tma.global_to_shared(
                    src=g_a,
                    dst=s_x[slot, turn * parts + part],
                    offsets=[offset_m, (first + turn) * V8.BLOCK_K + part * self.chunk],
                    mbarrier=ring.producer_barrier(),
                )


def tiles_in_order(packed: torch.Tensor, k: int) -> torch.Tensor:
    """``matmul.quant.int4``'s packed [N_pad / 4, K / 2] int32 weight as [row tile, K block, 16, 64]."""
    blocks = k // V8.BLOCK_K
    return packed.view(-1, 16, blocks, 64).permute(0, 2, 1, 3).contiguous().view(-1, 64)


def script(cls, config):
    return versions.fixed_script(cls, config, torch.float16, name=f"{cls.__name__}_one_box_probe")


def label(name, config):
    return name + " " + "/".join(str(config[key]) for key in ("block_m", "split", "stages", "interleave"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--build-only", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    programs = {}
    jobs = [("v8", V8.Kernel, c) for c in CALLS + CONFIGS] + [("onebox", OneBox, c) for c in CONFIGS]
    for name, cls, config in jobs:
        with target("sm_90a"):  # built here, or found in tilus's cache
            programs[label(name, config)] = (
                name,
                config,
                tilus_autotune.load(tilus_autotune.build(script(cls, config))),
            )
        print(f"built {label(name, config)}", flush=True)
    if args.build_only:  # the libraries are opened, not loaded onto a GPU
        return 0
    rows = []
    for m, n, k in SHAPES:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).half().cuda()
        x = torch.randn(m, k, generator=gen).half().cuda()
        qw = matmul.quantize(w, format="int4")
        w16 = qw.dequantize()
        reference = x.float() @ w16.float().T
        packed = {"v8": qw.packed, "onebox": tiles_in_order(qw.packed, k)}
        fns, names = [lambda x=x, w16=w16: torch.matmul(x, w16.T)], ["cublas"]
        for key, (name, config, program) in programs.items():
            if (m <= 8) != (config["block_m"] == 8):  # the call's tile for M
                continue
            out = torch.empty(m, n, dtype=torch.float16, device="cuda")
            b = packed[name]
            operands = (m, n, k, x, b, out, x.stride(0), b.stride(0), out.stride(0), 0, qw.scales)

            def launch(program=program, operands=operands):
                program(*operands)

            out.fill_(float("nan"))
            launch()
            error = relative_error(out, reference)
            print(f"{m}x{n}x{k} {key}: error {error:.2e}", flush=True)
            if not error < 1e-2:
                rows.append(dict(m=m, n=n, k=k, kernel=key, failed=True, error=error))
                continue
            fns.append(launch)
            names.append(key)
        times = interleaved_ms(fns, 50, 300)
        for name, ms in zip(names, times):
            row = dict(m=m, n=n, k=k, kernel=name, us=ms * 1e3, x_cublas=times[0] / ms)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "one_box_probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
