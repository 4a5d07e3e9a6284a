"""How close V8 is, at decode sizes, to a kernel that only reads the same bytes.

#25's bar is a share of an attainable floor: the packed bytes at the copy bandwidth of 512 MiB plus
an empty kernel. A launch that moves a few MiB never reaches a 512 MiB copy's rate: the first round
trip to HBM and the grid's ramp are paid once per launch, not spread over half a gigabyte. This
probe asks what a kernel with no arithmetic at all takes for V8's bytes at V8's sizes, in the same
window as V8 (L2 flushed by reading before each launch, ``matmul.measure.timing.interleaved_ms``):

* ``read_kernel.cu``: a plain CUDA read of the packed weight (not its scales: one launch), each thread keeping 1-8
  16-byte loads in flight, 1-8 CTAs an SM of 256-1024 threads; the fastest of those 48 launches on
  each shape (chosen in a short window, then timed beside V8);
* ``read_kernel.cu``'s ``read_tma``: the packed weight through a TMA ring and nothing else (one
  thread a CTA waits for each box and issues the next), once with V8's box ([16, 64] int32, 4 KiB),
  ring depth (4) and grid (a CTA per 64 rows and K half), once the fastest of boxes of 16 or 64 rows,
  2-16 stages and 1-8 CTAs an SM: does V8's transport cost anything by itself?
* ``torch.amax`` of the packed weight (the fp16 tables' "read B" control);
* V8 as the call runs it (``matmul.quant.linear.linear(x, qw, out=...)``, what ``matmul.linear(x, qw)``
  runs: the call's configuration, its output checked first).

    nvcc -O3 -arch=sm_90a -shared -Xcompiler -fPIC -o .cache/libread_kernel.so plots/h200/v8-read-control/read_kernel.cu
    python plots/h200/v8-read-control/read_control.py OUT_DIR [--dtype float16] [--tokens 1,16]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import itertools
import json
import operator
import sys
from pathlib import Path

import torch

import matmul
from matmul.harness import roofline
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error
from matmul.measure.timing import interleaved_ms
from matmul.quant import linear as quant_linear

WEIGHTS = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))
LIBRARY = Path(".cache/libread_kernel.so")
CTAS_PER_SM, THREADS, UNROLL = (1, 2, 4, 8), (256, 512, 1024), (1, 2, 4, 8)
# read_tma: boxes of [box_rows, 64] int32 (V8's int4 box: 16 rows, 4 KiB), ring depths, CTAs an SM
BOX_ROWS, STAGES, TMA_CTAS_PER_SM = (16, 64), (2, 4, 8, 16), (1, 2, 4, 8)
MAX_RING_BYTES = 200 << 10
V8_SPLIT = 2  # the call's int4 configurations at decode sizes split K over a cluster of 2


class ReadKernel:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path.resolve()))
        self.lib.read_bytes.restype = ctypes.c_int
        self.lib.read_bytes.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p] + [ctypes.c_int] * 3
        self.lib.read_bytes.argtypes += [ctypes.c_void_p]
        self.lib.read_tma.restype = ctypes.c_int
        self.lib.read_tma.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 4 + [ctypes.c_void_p, ctypes.c_int]
        self.lib.read_tma.argtypes += [ctypes.c_void_p]
        self.sink = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count

    def launcher(self, buffers, ctas_per_sm: int, threads: int, unroll: int):
        args = [(b.data_ptr(), b.numel() * b.element_size()) for b in buffers]
        blocks = self.sms * ctas_per_sm

        def launch():
            stream = torch.cuda.current_stream().cuda_stream
            for ptr, nbytes in args:
                code = self.lib.read_bytes(ptr, nbytes, self.sink.data_ptr(), blocks, threads, unroll, stream)
                if code:
                    raise RuntimeError(f"read kernel launch failed: CUDA error {code}")

        return launch

    def tma_launcher(self, words: torch.Tensor, box_rows: int, stages: int, blocks: int):
        rows, cols = words.shape

        def launch():
            stream = torch.cuda.current_stream().cuda_stream
            code = self.lib.read_tma(
                words.data_ptr(), rows, cols, box_rows, stages, self.sink.data_ptr(), blocks, stream
            )
            if code:
                raise RuntimeError(f"TMA read launch failed: code {code}")

        return launch

    def check_tma(self, words: torch.Tensor, box_rows: int, stages: int, blocks: int) -> None:
        """One launch, its xor against word ``box % 64`` of each box's first row taken here."""
        rows, cols = words.shape
        per_band = cols // 64
        box = torch.arange(rows // box_rows * per_band, device=words.device)
        picked = words[(box // per_band) * box_rows, (box % per_band) * 64 + box % 64]
        expected = int(functools.reduce(operator.xor, picked.tolist(), 0))
        self.sink.zero_()
        self.tma_launcher(words, box_rows, stages, blocks)()
        got = int(self.sink.item())
        if got != expected:
            raise AssertionError(f"TMA read {box_rows}/{stages}/{blocks}: xor {got:#x}, expected {expected:#x}")


def fastest(shapes: list[tuple], launcher) -> tuple[tuple, dict]:
    """The launch shape whose ``launcher(shape)`` is fastest in one short window (L2 flushed), and
    every shape's time in us, keyed "a/b/c"."""
    trial = interleaved_ms([launcher(s) for s in shapes], 5, 20)
    best = shapes[min(range(len(shapes)), key=trial.__getitem__)]
    return best, {"/".join(map(str, s)): t * 1e3 for s, t in zip(shapes, trial)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--tokens", default="1,16")
    parser.add_argument("--format", default="int4")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    reader = ReadKernel(LIBRARY)
    floor = {
        "copy_tb_per_s": roofline.copy_tb_per_s(512 << 20, 100, 200),
        "empty_ms": roofline.empty_kernel_ms(100, 200),
    }
    print(json.dumps(floor), flush=True)
    rows = []
    for n, k in WEIGHTS:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda()
        qw = matmul.quantize(w, format=args.format)
        # one launch, as V8's: the packed weight alone (V8 also reads the scales, 1/32 of int4's bytes)
        buffers = [qw.packed]
        nbytes = qw.packed.numel() * qw.packed.element_size()
        # the fastest plain read of these bytes
        best, _ = fastest(
            list(itertools.product(CTAS_PER_SM, THREADS, UNROLL)), lambda s, b=buffers: reader.launcher(b, *s)
        )
        read = reader.launcher(buffers, *best)
        # the same bytes through a TMA ring: V8's own box, depth and grid, and the fastest of the others
        v8_grid = -(-n // 64) * V8_SPLIT
        tma_shapes = [
            (rows, stages, blocks)
            for rows in BOX_ROWS
            for stages in STAGES
            if stages * rows * 256 <= MAX_RING_BYTES
            for blocks in [v8_grid] + [reader.sms * c for c in TMA_CTAS_PER_SM]
        ]
        tma_best, tma_trials = fastest(tma_shapes, lambda s, w=qw.packed: reader.tma_launcher(w, *s))
        for shape in tma_shapes:  # each box read once: the xor of one word a box, as the kernel takes it
            reader.check_tma(qw.packed, *shape)
        v8_like = reader.tma_launcher(qw.packed, 16, 4, v8_grid)
        tma_read = reader.tma_launcher(qw.packed, *tma_best)
        for m in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(m, k, generator=gen).to(dtype).cuda()
            config = quant_linear.kernel_config(args.format, quant_linear.config_for(m, n, k, args.format))
            if not quant_linear.wait_until_built(dtype, args.format, config):
                print(f"{m}x{n}x{k}: V8 {config} did not build", flush=True)
                continue
            out = poisoned_output(m, n, dtype)
            quant_linear.linear(x, qw, out=out)
            error = relative_error(out, x.float() @ qw.dequantize().float().T)
            assert error <= TOLERANCE[dtype], f"V8 wrong at {m}x{n}x{k}: {error}"
            v8_ms, read_ms, amax_ms, v8_like_ms, tma_ms = interleaved_ms(
                [
                    lambda x=x, qw=qw, out=out: quant_linear.linear(x, qw, out=out),
                    read,
                    lambda qw=qw: torch.amax(qw.packed),
                    v8_like,
                    tma_read,
                ],
                30,
                150,
            )
            floor_us = (
                roofline.quantized_bytes_floor(m, n, k, x.element_size(), args.format)
                / (floor["copy_tb_per_s"] * 1e12)
                * 1e6
                + floor["empty_ms"] * 1e3
            )
            row = {
                "m": m,
                "n": n,
                "k": k,
                "dtype": args.dtype,
                "format": args.format,
                "config": config,
                "bytes_read": nbytes,
                "error": error,
                "v8_us": v8_ms * 1e3,
                "read_us": read_ms * 1e3,
                "amax_us": amax_ms * 1e3,
                "floor_us": floor_us,
                "read_launch": dict(zip(("ctas_per_sm", "threads", "unroll"), best)),
                "v8_share_of_floor": floor_us / (v8_ms * 1e3),
                "read_share_of_floor": floor_us / (read_ms * 1e3),
                "v8_share_of_read": read_ms / v8_ms,
                "tma_v8_like_us": v8_like_ms * 1e3,
                "tma_us": tma_ms * 1e3,
                "tma_launch": dict(zip(("box_rows", "stages", "blocks"), tma_best)),
                "tma_trials_us": tma_trials,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"device": torch.cuda.get_device_name(), "floor": floor, "rows": rows, "command": " ".join(sys.argv)}
    (args.out / f"read-control-{args.dtype}.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"{result['device']}, {args.format}, {args.dtype}; copy bandwidth {floor['copy_tb_per_s']:.2f} TB/s (512 MiB), "
        f"empty kernel {floor['empty_ms'] * 1e3:.1f} us; L2 flushed by reading before each launch",
        "",
        "| M x N x K | floor us | V8 us | read us | amax us | V8 % floor | read % floor | read / V8 | read launch "
        "| TMA, V8's box and grid us | TMA best us | TMA best launch |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for r in rows:
        launch = "{ctas_per_sm}/SM x {threads} x {unroll}".format(**r["read_launch"])
        tma = "box {box_rows} rows, {stages} stages, {blocks} CTAs".format(**r["tma_launch"])
        lines.append(
            f"| {r['m']} x {r['n']} x {r['k']} | {r['floor_us']:.1f} | {r['v8_us']:.1f} | {r['read_us']:.1f} "
            f"| {r['amax_us']:.1f} | {100 * r['v8_share_of_floor']:.0f}% | {100 * r['read_share_of_floor']:.0f}% "
            f"| {r['v8_share_of_read']:.2f} | {launch} | {r['tma_v8_like_us']:.1f} | {r['tma_us']:.1f} "
            f"| {tma} |"
        )
    (args.out / f"read-control-{args.dtype}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
