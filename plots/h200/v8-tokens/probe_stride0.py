"""One token through a token tile of ``block_m`` rows: V7 and V8 at M = 1 with the tokens' TMA boxes
whole (a tensor map of ``block_m`` rows whose row stride is 0: every row is the one token) against
the boxes as the call makes them today (one row in the tensor, the rest of each box past it, which
TMA fills with zeros), and against a token padded to ``block_m`` rows of zeros (a whole box of real
rows). The output of the stride-0 launch has ``block_m`` rows (all the same); its first and last
rows are checked.

L2 flushed by reading, the variants of a shape in one window (``interleaved_ms``), float16.

    MATMUL_CACHE_DIR=DIR python plots/h200/v8-tokens/probe_stride0.py --list > kernels.txt   # CPU
    MATMUL_CACHE_DIR=DIR python -m matmul compile --arch sm_90a --kernels kernels.txt          # CPU
    MATMUL_CACHE_DIR=DIR python plots/h200/v8-tokens/probe_stride0.py OUT                     # GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import matmul
from matmul.kernels import device_context, versions
from matmul.measure.correctness import poisoned_output, relative_error
from matmul.measure.timing import interleaved_ms
from matmul.quant import linear as quant_linear

V7_CONFIGS = [
    {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 8, "multicast": 1},
    {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 20, "multicast": 1},
]
V8_CONFIGS = [
    dict(block_m=8, warpgroups=1, split=2, stages=4, chunk=64, interleave=1),
    dict(block_m=16, warpgroups=1, split=2, stages=4, chunk=64, interleave=1),
    dict(block_m=8, warpgroups=1, split=2, stages=4, chunk=64, interleave=2),
]
V7_WEIGHTS = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (128256, 4096))
V8_WEIGHTS = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--list", action="store_true", help="print V7's kernels for `matmul compile --kernels`")
    parser.add_argument("--only", default="v7,v8")
    args = parser.parse_args(argv)
    if args.list:
        for config in V7_CONFIGS:
            print(f"v7|{json.dumps(config, sort_keys=True)}|float16")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = torch.float16
    rows = []
    if "v8" in args.only:
        assert all(quant_linear.wait_until_all_built((dtype, "int4", c) for c in V8_CONFIGS))
    v7 = versions.load("sm_90a", "v7")
    for n, k in sorted(set(V7_WEIGHTS) | set(V8_WEIGHTS)):
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda()
        x = torch.randn(1, k, generator=gen).to(dtype).cuda()
        fns, names, checks = [], [], []
        if "v7" in args.only and (n, k) in V7_WEIGHTS:
            reference = x.float() @ w.float().T
            for config in V7_CONFIGS:
                script = versions.kernel(v7, dtype, config)
                fns_here = variants(
                    lambda m, a, out, lda, script=script, n=n, k=k, w=w: script(m, n, k, a, w, out, lda, k, n, 0),
                    x,
                    n,
                    config,
                )
                add(fns, names, checks, fns_here, f"v7 {config['stages']} stages", reference)
        if "v8" in args.only and (n, k) in V8_WEIGHTS:
            qw = matmul.quantize(w)
            reference = x.float() @ qw.dequantize().float().T
            for config in V8_CONFIGS:
                kernel = quant_linear.built_kernel(x, qw, config)

                def launch(m, a, out, lda, kernel=kernel, qw=qw, n=n, k=k):
                    device_context.launch_on(
                        0, kernel, m, n, k, a, qw.packed, out, lda, qw.packed.stride(0), n, 0, qw.scales
                    )

                name = f"v8 tile {config['block_m']} interleave {config['interleave']}"
                add(fns, names, checks, variants(launch, x, n, config), name, reference)
        for name, error in checks:
            print(f"{n}x{k} {name}: error {error:.2e}", flush=True)
            assert error < 1e-2, (name, error)
        for name, ms in zip(names, interleaved_ms(fns, 50, 400)):
            row = dict(n=n, k=k, kernel=name, us=ms * 1e3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "probe_stride0.json").write_text(json.dumps(rows, indent=1))


def variants(launch, x, n, config) -> dict:
    """The three ways of giving one token to a kernel of ``config``'s token tile, each a function of
    nothing that launches it, and the output whose row 0 it writes."""
    tile, dtype = config["block_m"], x.dtype
    padded = torch.zeros(tile, x.shape[1], dtype=dtype, device=x.device)
    padded[0] = x[0]
    outs = {
        name: poisoned_output(rows, n, dtype) for name, rows in (("rows 1", 1), ("stride 0", tile), ("zero rows", tile))
    }
    return {
        "rows 1": (lambda: launch(1, x, outs["rows 1"], x.shape[1]), outs["rows 1"]),
        "stride 0": (lambda: launch(tile, x, outs["stride 0"], 0), outs["stride 0"]),
        "zero rows": (lambda: launch(tile, padded, outs["zero rows"], x.shape[1]), outs["zero rows"]),
    }


def add(fns, names, checks, launches: dict, kernel: str, reference) -> None:
    for how, (fn, out) in launches.items():
        fn()
        torch.cuda.synchronize()
        checks.append((f"{kernel} {how}", relative_error(out[:1], reference)))
        if how == "stride 0":  # every row is the token's
            checks.append((f"{kernel} {how} (last row)", relative_error(out[-1:], reference)))
        fns.append(fn)
        names.append(f"{kernel} {how}")


if __name__ == "__main__":
    sys.exit(main())
