"""Hopper V8 for many tokens (``matmul/kernels/hopper/v8_prefill.py``) against what the call runs
above 256 tokens today (the weight widened by ``matmul.quant.widen``'s kernel, then cuBLAS) and
cuBLAS on the 16-bit weight, int4 weights, in one window per shape (L2 flushed by reading before
each launch, ``interleaved_ms``), the kernel's output checked against a float32 reference from
``qw.dequantize()`` first. Build on the CPU machine first (tilus caches the programs under
``$MATMUL_CACHE_DIR``), then time on the GPU:

    MATMUL_CACHE_DIR=.cache/probe python plots/h100/v8/prefill_probe.py OUT --build-only
    MATMUL_CACHE_DIR=$PWD/.cache/probe python plots/h100/v8/prefill_probe.py OUT     # prefill_probe.json
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
from matmul.quant import widen as device_widen

PREFILL = importlib.import_module("matmul.kernels.hopper.v8_prefill")
TOKENS = (512, 1024, 2048, 4096)


CONFIG_KEYS = ("block_n", "stages", "packed_stages")


def parse_config(text: str) -> dict:
    """``block_n,stages,packed_stages``, e.g. ``128,4,2``."""
    return dict(PREFILL.REPRESENTATIVE, **dict(zip(CONFIG_KEYS, map(int, text.split(",")), strict=True)))


def program(dtype: torch.dtype, config: dict):
    with target("sm_90a"):  # built here, or found in tilus's cache
        script = versions.fixed_script(PREFILL.Kernel, config, dtype, name="v8_prefill")
        return tilus_autotune.load(tilus_autotune.build(script))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--configs", nargs="+", default=["128,4,2"], help="block_n,stages,packed_stages each")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    configs = {text: parse_config(text) for text in args.configs}
    programs = {(dtype, text): program(dtype, config) for dtype in dtypes for text, config in configs.items()}
    if args.build_only:  # the libraries are opened, not loaded onto a GPU
        return
    rows = []
    for dtype in dtypes:
        assert device_widen.wait_until_built(dtype, "int4"), "the widening kernel did not build"
        for n, k in WEIGHTS:
            gen = torch.Generator().manual_seed(0)
            qw = matmul.quantize((torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda(), format="int4")
            w16 = qw.dequantize()
            for m in map(int, args.tokens.split(",")):
                x = torch.randn(m, k, generator=gen).to(dtype).cuda()
                reference = x.float() @ w16.float().T
                out = torch.empty(m, n, dtype=dtype, device="cuda")
                operands = (m, n, k, x, qw.packed, out, x.stride(0), qw.packed.stride(0), out.stride(0), 0, qw.scales)
                for text in configs:
                    out.fill_(float("nan"))
                    programs[dtype, text](*operands)
                    error = relative_error(out, reference)
                    print(f"{dtype} {m}x{n}x{k} {text}: error {error:.2e}", flush=True)
                    assert error < 1e-2, "the prefill kernel is wrong"
                fns = [
                    lambda x=x, w16=w16: torch.matmul(x, w16.T),
                    lambda x=x, qw=qw: quant_linear.widened(x, qw),
                ] + [lambda program=programs[dtype, text], operands=operands: program(*operands) for text in configs]
                cublas, widened, *prefill = interleaved_ms(fns, 50, 300)
                row = dict(
                    dtype=str(dtype).removeprefix("torch."),
                    m=m,
                    n=n,
                    k=k,
                    cublas_us=cublas * 1e3,
                    widened_us=widened * 1e3,
                    prefill_us={text: ms * 1e3 for text, ms in zip(configs, prefill, strict=True)},
                    prefill_x_cublas={text: cublas / ms for text, ms in zip(configs, prefill, strict=True)},
                    prefill_x_widened={text: widened / ms for text, ms in zip(configs, prefill, strict=True)},
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "prefill_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
