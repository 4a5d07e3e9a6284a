"""V8's configurations timed against cuBLAS, outside the call's choice: every configuration of its
space (``--configs all``), the one the call picks (``chosen``) or named ones, on given shapes, each
checked first and then timed in one window with cuBLAS on the unquantized weight (as ``python -m
matmul quantized``); with ``--widened`` the call's path past 256 tokens (widen, then cuBLAS) too.
Writes ``OUT/probe_configs.json``: one row per (shape, configuration), its time and ``x_cublas``.
With ``--ncu``, one launch each for Nsight Compute, nothing else on the GPU, nothing written.

    python -m matmul v8-configs --out DIR [--configs all|chosen|8/1/2/4/64[/2],...] [--shapes 1x4096x4096,...]
        [--format int4|int6|fp8_e4m3] [--dtype float16|bfloat16] [--widened] [--no-prebuild]
    MATMUL_CACHE_DIR=DIR python -m matmul v8-configs --out DIR --build-only ...   # no GPU needed
    ncu --nvtx --nvtx-include "probe/" --csv ... python -m matmul v8-configs --out DIR --ncu --configs chosen
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .. import quantize
from ..call import quantized as quant_linear
from ..kernels import versions
from ..kernels.variant import PLAIN
from ..measure.correctness import poisoned_output, relative_error
from ..measure.timing import interleaved_ms
from . import roofline

CONFIG_KEYS = ("block_m", "warpgroups", "split", "stages", "chunk", "interleave")  # interleave: 1 if left out
SHAPES = ((1, 4096, 4096), (16, 4096, 4096), (1, 28672, 4096), (16, 28672, 4096), (1, 4096, 14336))


def shape_list(text: str):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments (``python -m matmul v8-configs``)."""
    parser.add_argument("--out", type=Path, required=True, help="directory for probe_configs.json")
    parser.add_argument(
        "--configs",
        default="all",
        help="all: the int4 space; chosen: the call's configuration; "
        "else block_m/warpgroups/split/stages/chunk[/interleave],...",
    )
    parser.add_argument("--shapes", type=shape_list, default=SHAPES, help="MxNxK, comma-separated")
    parser.add_argument("--ncu", action="store_true", help="one launch each, nothing else on the GPU")
    parser.add_argument("--no-prebuild", action="store_true", help="let the call's build child build each kernel")
    parser.add_argument("--dtype", default="float16", help="float16 or bfloat16")
    parser.add_argument("--format", default="int4", help="the weight format: int4, int6 or fp8_e4m3")
    parser.add_argument(
        "--widened", action="store_true", help="time the call's path past 256 tokens too: widen, then cuBLAS"
    )
    parser.add_argument(
        "--build-only", action="store_true", help="build the kernels into the tilus cache (no GPU needed), time nothing"
    )


def run(args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    module = quant_linear.v8_module()
    space = versions.space(module)
    named = args.configs not in ("all", "chosen")
    if named:  # named configurations: each timed wherever its tile holds M, however large the tile
        space = [{"interleave": 1, **dict(zip(CONFIG_KEYS, map(int, c.split("/"))))} for c in args.configs.split(",")]
        args.configs = "all"
    if args.build_only:
        build_all(dtype, args.format, args.shapes, space if args.configs == "all" else None, args.widened, named)
        return
    if not args.no_prebuild and args.format == "int4":
        chosen = {str(quant_linear.config_for(m)): quant_linear.config_for(m) for m, _, _ in args.shapes}
        roofline.prebuild(module, space if args.configs == "all" else list(chosen.values()), [dtype])
    rows = []
    for m, n, k in args.shapes:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        qw = quantize(w.cuda(), format=args.format)
        configs = space if args.configs == "all" else [quant_linear.config_for(m, n, k, args.format)]
        configs = fitting(configs, m, k, named)
        # each built by the call's build child, in parallel (v8() runs the widened path until then)
        built = quant_linear.wait_until_all_built((dtype, args.format, c) for c in configs)
        for config in (c for c, ok in zip(configs, built) if not ok):
            print(f"{m}x{n}x{k} {config}: V8 did not build, skipped", flush=True)
        configs = [c for c, ok in zip(configs, built) if ok]
        if args.ncu:
            for config in configs:
                out = torch.empty(m, n, dtype=dtype, device="cuda")
                quant_linear.v8(x, qw, out, config)  # loaded and warm before the profiled launch
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push("probe")
                quant_linear.v8(x, qw, out, config)
                torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
                print(f"profiled {m}x{n}x{k} {config}", flush=True)
            continue
        reference = x.float() @ qw.dequantize().float().T
        w16 = qw.dequantize()
        fns, names = [lambda x=x, w16=w16: torch.matmul(x, w16.T)], ["cublas"]
        if args.widened and quant_linear.widening_built(dtype, qw.format):
            fns.append(lambda x=x, qw=qw: quant_linear.widened(x, qw))
            names.append("widen + cuBLAS")
        for config in configs:
            out = poisoned_output(m, n, dtype)
            quant_linear.v8(x, qw, out, config)
            error = relative_error(out, reference)
            if error > 1e-2:
                print(f"{m}x{n}x{k} {config}: error {error:.2e}, skipped", flush=True)
                continue
            fns.append(lambda config=config, out=out, x=x, qw=qw: quant_linear.v8(x, qw, out, config))
            names.append(config)
        times = interleaved_ms(fns, 50, 300)
        for name, ms in zip(names, times):
            row = dict(m=m, n=n, k=k, config=name, us=ms * 1e3, x_cublas=times[0] / ms)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if not args.ncu:
        (args.out / "probe_configs.json").write_text(json.dumps(rows, indent=1))


def fitting(configs: list[dict], m: int, k: int, named: bool = False) -> list[dict]:
    """The configurations worth timing at M tokens and K: token tiles that hold M (at most twice, unless
    ``named``), a split no larger than K's blocks."""
    return [
        c
        for c in configs
        if c["block_m"] >= min(m, 8)
        and (named or c["block_m"] <= 16 or c["block_m"] < 2 * m)
        and k // 128 >= c["split"]
    ]


def build_all(
    dtype: torch.dtype, weight_format: str, shapes, space, widened: bool = False, named: bool = False
) -> None:
    """Build, as the call's build child does (``matmul.call.building.build_kernel``), every kernel the probe
    times, in parallel processes: tilus caches each under ``$MATMUL_CACHE_DIR``."""
    from ..build import parallel

    configs = space or [quant_linear.config_for(m, n, k, weight_format) for m, n, k in shapes]
    configs = [c for m, _, k in shapes for c in fitting(configs, m, k, named)]
    unique = {str(quant_linear.v8_program(dtype, weight_format, c)): c for c in configs}
    jobs = [(str(dtype).removeprefix("torch."), weight_format, c) for c in unique.values()]
    if widened:
        jobs.append((str(dtype).removeprefix("torch."), weight_format, None))
    errors = parallel.in_forked_processes(_build, jobs, report_built=True)
    print(f"{len(jobs) - sum(map(bool, errors))} of {len(jobs)} built", flush=True)


def _build(dtype: str, weight_format: str, config: dict) -> str:
    from ..call import building

    try:
        if config is None:  # the widening kernel, as the call's build child builds it
            entry = quant_linear.widen_entry(weight_format)
        else:
            entry = quant_linear.v8_entry(weight_format, config)
        building.build_kernel(quant_linear.ARCH, getattr(torch, dtype), entry["version"], entry["config"], PLAIN)
    except Exception as error:  # noqa: BLE001 (reported with its job)
        return repr(error)
    return ""
