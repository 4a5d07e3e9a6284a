"""Hopper V8 as it is against V8 at an earlier revision, in the same window: the call's
configuration (``matmul.quant.linear.config_for``) on the bench's decode shapes, both outputs
checked against a float32 reference from ``qw.dequantize()`` first, L2 flushed by reading before
each launch (``interleaved_ms``), cuBLAS fp16 on the 16-bit weight beside. The earlier source is
taken from git on the CPU machine and kept beside the built programs, since the GPU machine's copy
of the tree has no history to read it from:

    MATMUL_CACHE_DIR=.cache/probe python plots/h100/v8/ab_probe.py OUT --base REV --build-only
    MATMUL_CACHE_DIR=$PWD/.cache/probe python plots/h100/v8/ab_probe.py OUT     # ab_probe.json
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from bench_v8 import DECODE_SHAPES  # (this script's folder)

import matmul
from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.kernels import versions
from matmul.measure.correctness import relative_error
from matmul.measure.timing import interleaved_ms
from matmul.quant import linear as quant_linear

SOURCE = "matmul/kernels/hopper/v8.py"
SHAPES = DECODE_SHAPES
FORMATS = ("int4", "fp8_e4m3")


def base_path() -> Path:
    return Path(os.environ.get("MATMUL_CACHE_DIR", ".cache")) / "v8_base.py"


def base_module():
    """V8's module at the base revision, from the copy ``--build-only`` kept."""
    path = base_path()
    spec = importlib.util.spec_from_file_location("v8_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["v8_base"] = module
    spec.loader.exec_module(module)
    return module


def keep_base(rev: str) -> None:
    rev = subprocess.check_output(["git", "rev-parse", "--short", rev], text=True).strip()
    source = subprocess.check_output(["git", "show", f"{rev}:{SOURCE}"], text=True)
    source = source.replace("from ..entry import", "from matmul.kernels.entry import")
    base_path().parent.mkdir(parents=True, exist_ok=True)
    base_path().write_text(f"# {SOURCE} at {rev}\n" + source)


def script(module, name: str, weight_format: str, config: dict):
    cls = versions._fixed_kernel_class(
        module.Kernel, tuple(sorted(quant_linear.kernel_config(weight_format, config).items()))
    )
    cls = type(f"{name}_{weight_format}", (cls,), {"__module__": cls.__module__})
    return cls(dtype=versions.TILUS_DTYPES[torch.float16], weight=weight_format)


CONFIG_KEYS = ("block_m", "warpgroups", "split", "stages", "chunk")


def configs_at(m: int, n: int, k: int, fmt: str, named: list[dict]) -> list[dict]:
    """The named configurations, else the call's for the shape."""
    return named or [quant_linear.config_for(m, n, k, fmt)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--base", help="the revision to compare with (with --build-only)")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--shapes", default=None, help="MxNxK,... (default: the bench's decode shapes)")
    parser.add_argument(
        "--configs",
        default=None,
        help="block_m/warpgroups/split/stages/chunk,... for every shape (default: the call's)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    formats = args.formats.split(",")
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes else SHAPES
    named = [
        {"interleave": 1, **dict(zip(CONFIG_KEYS, map(int, c.split("/")), strict=True))}
        for c in (args.configs.split(",") if args.configs else [])
    ]
    if args.build_only:
        keep_base(args.base)
    modules = {"head": quant_linear.v8_module(), "base": base_module()}
    programs = {}
    for fmt in formats:
        for m, n, k in shapes:
            for config in configs_at(m, n, k, fmt, named):
                for name, module in modules.items():
                    key = (name, fmt, json.dumps(config))
                    if key not in programs:
                        with target("sm_90a"):  # built here, or found in tilus's cache
                            programs[key] = tilus_autotune.load(tilus_autotune.build(script(module, name, fmt, config)))
                        print(f"built {key}", flush=True)
    if args.build_only:  # the libraries are opened, not loaded onto a GPU
        return
    rows = []
    for fmt in formats:
        for m, n, k in shapes:
            for config in configs_at(m, n, k, fmt, named):
                gen = torch.Generator().manual_seed(0)
                w = (torch.randn(n, k, generator=gen) / k**0.5).half().cuda()
                x = torch.randn(m, k, generator=gen).half().cuda()
                qw = matmul.quantize(w, format=fmt)
                w16 = qw.dequantize()
                reference = x.float() @ w16.float().T
                config = json.dumps(config)
                fns, names = [lambda x=x, w16=w16: torch.matmul(x, w16.T)], ["cublas"]
                for name in ("base", "head"):
                    program = programs[name, fmt, config]
                    out = torch.empty(m, n, dtype=torch.float16, device="cuda")
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

                    def launch(program=program, operands=operands):
                        program(*operands)

                    out.fill_(float("nan"))
                    launch()
                    error = relative_error(out, reference)
                    print(f"{fmt} {m}x{n}x{k} {name} {config}: error {error:.2e}", flush=True)
                    assert error < 1e-2, f"{name} is wrong"
                    fns.append(launch)
                    names.append(name)
                times = interleaved_ms(fns, 50, 300)
                row = dict(
                    format=fmt, m=m, n=n, k=k, config=json.loads(config), **{n_: t * 1e3 for n_, t in zip(names, times)}
                )
                row["head_over_base"] = row["base"] / row["head"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "ab_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
