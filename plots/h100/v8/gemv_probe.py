"""Hopper V8 for a few tokens (``matmul/kernels/hopper/v8_gemv.py``: no ring, no TMA, no cluster)
against V8 in the call's configuration for the shape (``matmul.quant.linear.config_for``) and cuBLAS
on the 16-bit weight, int4 weights, in one window per shape (L2 flushed by reading before each
launch, ``interleaved_ms``), every output checked against a float32 reference from
``qw.dequantize()`` first (NaN-poisoned). Build on the CPU machine first:

    MATMUL_CACHE_DIR=.cache/probe python plots/h100/v8/gemv_probe.py OUT --build-only
    MATMUL_CACHE_DIR=$PWD/.cache/probe python plots/h100/v8/gemv_probe.py OUT     # gemv_probe.json
"""

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch
from bench_v8 import WEIGHTS  # (this script's folder)

import matmul
from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.kernels import versions
from matmul.measure.correctness import relative_error
from matmul.measure.timing import interleaved_ms
from matmul.quant import linear as quant_linear

GEMV = importlib.import_module("matmul.kernels.hopper.v8_gemv")
TOKENS = (1, 4, 8)


def build(cls, config: dict, dtype: torch.dtype, name: str):
    with target("sm_90a"):  # built here, or found in tilus's cache
        return tilus_autotune.load(tilus_autotune.build(versions.fixed_script(cls, config, dtype, name=name)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--configs", default="2/4,4/2,2/2", help="warpgroups/depth,...")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    configs = {
        c: dict(zip(("warpgroups", "depth"), map(int, c.split("/")), strict=True)) for c in args.configs.split(",")
    }
    v8 = quant_linear.v8_module()
    programs = {}
    for dtype in dtypes:
        for name, config in configs.items():
            programs[dtype, f"gemv {name}"] = build(GEMV.Kernel, config, dtype, "v8_gemv")
        for m in tokens:
            for n, k in WEIGHTS:
                config = quant_linear.config_for(m, n, k, "int4")
                key = (dtype, f"v8 {json.dumps(config)}")
                if key not in programs:
                    programs[key] = build(v8.Kernel, config, dtype, "v8_call")
    if args.build_only:
        return
    rows = []
    for dtype in dtypes:
        for n, k in WEIGHTS:
            gen = torch.Generator().manual_seed(0)
            qw = matmul.quantize((torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda(), format="int4")
            w16 = qw.dequantize()
            for m in tokens:
                x = torch.randn(m, k, generator=gen).to(dtype).cuda()
                reference = x.float() @ w16.float().T
                names = [f"gemv {name}" for name in configs] + [
                    f"v8 {json.dumps(quant_linear.config_for(m, n, k, 'int4'))}"
                ]
                fns = [lambda x=x, w16=w16: torch.matmul(x, w16.T)]
                for name in names:
                    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
                    operands = (
                        m,
                        n,
                        k,
                        x,
                        qw.packed,
                        out,
                        x.stride(0),
                        qw.packed.stride(0),
                        out.stride(0),
                        0,
                        qw.scales,
                    )
                    programs[dtype, name](*operands)
                    error = relative_error(out, reference)
                    print(f"{dtype} {m}x{n}x{k} {name}: error {error:.2e}", flush=True)
                    assert error < 1e-2, f"{name} is wrong"
                    fns.append(lambda program=programs[dtype, name], operands=operands: program(*operands))
                cublas, *times = interleaved_ms(fns, 50, 300)
                row = dict(
                    dtype=str(dtype).removeprefix("torch."),
                    m=m,
                    n=n,
                    k=k,
                    cublas_us=cublas * 1e3,
                    us={name: t * 1e3 for name, t in zip(names, times, strict=True)},
                    x_cublas={name: cublas / t for name, t in zip(names, times, strict=True)},
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "gemv_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
