"""The options a version has outside its tuned space, against that version as its space holds it
and cuBLAS: Hopper V6 with ping-pong consumer warpgroups (``v6.PINGPONG``: 128 x 128 tiles a
warpgroup, 6 stages; ``v6.PINGPONG_WIDE``: 64 x 256, 4 stages; each with both group sizes) and V5
with stream-K (``v5.STREAM_K``), on 4096^3, 8192^3 and 8192 x 8192 x 2048, both dtypes. Fixed
configurations, no tuning, checked and timed by the bench's own loop (``harness.bench.measure``).
Prints one line per kernel; writes ``OUT/pingpong.json`` (every window's times, the machine before
and after).

    python -m matmul options --out DIR [--rounds 8] [--kernels plain-g8,pingpong-g8,...] [--dtypes float16]
    python -m matmul options --prebuild    # builds only (no GPU needed), the GPU tests' variants too
"""

import argparse
import functools
import json
import os
import statistics

import torch

from ..build import parallel
from ..kernels import versions
from ..measure.correctness import poisoned_output, random_operands, reference
from ..measure.timing import interleaved_ms
from . import bench
from .presets import Shape
from .results import CUBLAS, DTYPES, machine, software

ARCH = "sm_90a"
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 2048))
# variants of the builds that tests/test_pingpong_gpu.py runs, built beforehand too
TEST_VARIANTS = (
    *(("PINGPONG", key, "float16") for key in ("kn", "bias", "relu", "gelu_tanh", "bias+gelu_tanh", "swiglu")),
    ("PINGPONG_WIDE", "bias+gelu_tanh", "float16"),
    ("REPRESENTATIVE", "bias+gelu_tanh", "float16"),
)


KERNELS = ("plain-g8", "plain-g16", "pingpong-g8", "pingpong-g16", "pingpong64x256-g8", "v5-plain", "v5-stream-k")


def configs() -> dict[str, tuple[str, dict]]:
    """Each kernel's name: (version, configuration). A name without a version's prefix is V6's."""
    v5, v6 = versions.load(ARCH, "v5"), versions.load(ARCH, "v6")
    return {
        "plain-g8": ("v6", v6.REPRESENTATIVE),
        "plain-g16": ("v6", dict(v6.REPRESENTATIVE, group=16)),
        "pingpong-g8": ("v6", v6.PINGPONG),
        "pingpong-g16": ("v6", dict(v6.PINGPONG, group=16)),
        "pingpong64x256-g8": ("v6", v6.PINGPONG_WIDE),
        "v5-plain": ("v5", v5.REPRESENTATIVE),
        "v5-stream-k": ("v5", v5.STREAM_K),
    }


def _build(version: str, config: dict, dtype: str, key: str) -> str:
    import tilus  # noqa: F401 (in the worker)

    from ..build import compiler
    from ..kernels.variant import Variant

    module = versions.load(ARCH, version)
    result = compiler.build_config(module, ARCH, config, versions.TILUS_DTYPES[DTYPES[dtype]], Variant.parse(key))
    return "" if result.ok else result.error[-600:]


def prebuild(kernels: list[str], dtypes: list[str]) -> None:
    """Every configuration timed here and the variants of ``TEST_VARIANTS``, in parallel processes:
    tilus caches each program on disk, where the launches find it."""
    module = versions.load(ARCH, "v6")
    jobs = [(*configs()[name], dtype, "") for name in kernels for dtype in dtypes]
    jobs += [("v6", getattr(module, name), dtype, key) for name, key, dtype in TEST_VARIANTS]
    parallel.in_forked_processes(_build, jobs, report_built=True)  # before this process touches CUDA


def contenders(kernels, a, b, out_dtype, m, n) -> list[bench.Contender]:
    cublas_out = torch.empty(m, n, dtype=out_dtype, device="cuda")
    found = [bench.Contender(CUBLAS, "baseline", functools.partial(torch.matmul, a, b.T, out=cublas_out), cublas_out)]
    for name in kernels:
        version, config = configs()[name]
        out = poisoned_output(m, n, out_dtype)
        run = functools.partial(versions.run, versions.load(ARCH, version), a, b, out, config=config)
        label = name if name.startswith(version) else f"{version} {name}"
        found.append(bench.Contender(label, "version", run, out, lambda config=config: config))
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments (``python -m matmul options``)."""
    parser.add_argument("--out", help="directory for the results file (default: the current directory)")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated (default: both)")
    parser.add_argument("--rounds", type=int, default=8, help="timing rounds (default 8)")
    parser.add_argument("--warmup-ms", type=float, default=300.0)
    parser.add_argument("--repeat-ms", type=float, default=100.0)
    parser.add_argument("--kernels", default=",".join(KERNELS), help="of: " + ", ".join(KERNELS))
    parser.add_argument("--prebuild", action="store_true", help="only build (no GPU needed)")
    parser.add_argument("--json", default="pingpong.json", help="the results file's name (default pingpong.json)")


def run(args) -> None:
    dtypes = args.dtypes.split(",")
    kernels = args.kernels.split(",")
    if args.prebuild:
        prebuild(kernels, dtypes)
        return
    timer = functools.partial(interleaved_ms, warmup_ms=args.warmup_ms, repeat_ms=args.repeat_ms)
    arguments = {k: v for k, v in vars(args).items() if k not in ("func", "argv")}
    record = {"machine": machine(), "software": software(), "args": arguments, "rows": []}
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for m, n, k in SHAPES:
            a, b = random_operands(m, n, k, dtype)
            ref = reference(a, b)
            shape = Shape(m, n, k, "")
            rows = bench.measure(shape, contenders(kernels, a, b, dtype, m, n), ref, dtype, timer, args.rounds)
            del ref
            for row in rows:
                row.update(dtype=dtype_name, m=m, n=n, k=k)
                record["rows"].append(row)
                if not row.get("ok"):
                    print(f"{dtype_name} {m}x{n}x{k} {row['kernel']}: WRONG {row.get('message') or row.get('error')}")
                    continue
                if row["kernel"] == CUBLAS:
                    line = f"{statistics.median(row['ms_rounds']) * 1e3:9.1f} us"
                else:
                    windows = " ".join(f"{c / t:.3f}" for t, c in zip(row["ms_rounds"], row["cublas_ms_rounds"]))
                    line = f"{row['vs_cublas']:.3f}x cuBLAS (windows {windows})"
                label = f"{dtype_name:>8} {m}x{n}x{k} {row['kernel']:>16}"
                print(f"{label}: {row['tflops']:6.1f} TFLOPS {line}", flush=True)
            torch.cuda.empty_cache()
    record["machine_after"] = machine()
    out = args.out or "."
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, args.json)
    with open(path, "w") as f:
        json.dump(record, f, indent=1, default=str)
    print(f"wrote {path}")
