"""Hopper V6 with ping-pong consumer warpgroups against V6 without them and cuBLAS, on the square-ish
shapes of issue #26 (4096^3, 8192^3, 8192 x 8192 x 2048), both dtypes (H100).

Fixed configurations, no tuning: V6 as its space holds it (128 x 256 tiles, 4 stages) and with the
ping-pong option (``v6.PINGPONG``: 128 x 128 tiles a warpgroup, 6 stages), each at both group sizes
of the space. Per shape and dtype the bench's own loop (``harness.bench.measure``): every kernel is
first checked against a float32 reference (fresh random operands, output poisoned with NaN) and one
that fails is reported and not timed; then, in rounds whose order is reversed every other round,
each kernel is timed in one window with cuBLAS (``timing.interleaved_ms``: the two launched in turn,
L2 flushed by reading 256 MiB before each launch, ``--warmup-ms`` then ``--repeat-ms``). A kernel's
ratio is the median of its windows' ratios. Prints one line per kernel and writes
$OUT/pingpong.json (every window's times, the machine before and after).

    source .gpu/env.sh && python plots/h100/pingpong/bench_pingpong.py --prebuild   # builds only
    source .gpu/env.sh && python plots/h100/pingpong/bench_pingpong.py [--rounds 8]
"""

import argparse
import concurrent.futures
import functools
import json
import multiprocessing
import os
import statistics

import torch

from matmul.harness import bench
from matmul.harness.presets import Shape
from matmul.harness.results import CUBLAS, machine, software
from matmul.kernels import versions
from matmul.measure.correctness import poisoned_output, random_operands, reference
from matmul.measure.timing import interleaved_ms

ARCH = "sm_90a"
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 2048))
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# the GPU test's variants of the ping-pong build (tests/test_pingpong_gpu.py), built beforehand too
TEST_VARIANTS = (("kn", "float16"), ("bias+gelu_tanh", "float16"), ("swiglu", "float16"))


def configs() -> dict[str, dict]:
    module = versions.load(ARCH, "v6")
    found = {}
    for config in versions.space(module):
        kind = "pingpong" if config["pingpong"] else "plain"
        found[f"{kind} g{config['group']}"] = config
    return found


def _build(config: dict, dtype: str, key: str) -> str:
    import tilus  # noqa: F401 (in the worker)

    from matmul.build import compiler
    from matmul.kernels.variant import Variant

    module = versions.load(ARCH, "v6")
    result = compiler.build_config(module, ARCH, config, versions.TILUS_DTYPES[DTYPES[dtype]], Variant.parse(key))
    return "" if result.ok else result.error[-600:]


def prebuild(dtypes: list[str]) -> None:
    """Every configuration timed here and the GPU test's builds, in parallel processes: tilus caches
    each program on disk, where the launches find it."""
    module = versions.load(ARCH, "v6")
    jobs = [(config, dtype, "") for config in configs().values() for dtype in dtypes]
    jobs += [(module.PINGPONG, dtype, key) for key, dtype in TEST_VARIANTS]
    context = multiprocessing.get_context("fork")  # before this process touches CUDA
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count(), mp_context=context) as pool:
        for job, error in zip(jobs, pool.map(_build, *zip(*jobs))):
            print(f"built {job}" if not error else f"BUILD FAILED {job}: {error}", flush=True)


def contenders(a, b, out_dtype, m, n) -> list[bench.Contender]:
    module = versions.load(ARCH, "v6")
    cublas_out = torch.empty(m, n, dtype=out_dtype, device="cuda")
    found = [bench.Contender(CUBLAS, "baseline", functools.partial(torch.matmul, a, b.T, out=cublas_out), cublas_out)]
    for name, config in configs().items():
        out = poisoned_output(m, n, out_dtype)
        run = functools.partial(versions.run, module, a, b, out, config=config)
        found.append(bench.Contender(f"v6 {name}", "version", run, out, lambda config=config: config))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup-ms", type=float, default=300.0)
    parser.add_argument("--repeat-ms", type=float, default=100.0)
    parser.add_argument("--prebuild", action="store_true", help="only build (no GPU needed)")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    if args.prebuild:
        prebuild(dtypes)
        return
    timer = functools.partial(interleaved_ms, warmup_ms=args.warmup_ms, repeat_ms=args.repeat_ms)
    record = {"machine": machine(), "software": software(), "args": vars(args), "rows": []}
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for m, n, k in SHAPES:
            a, b = random_operands(m, n, k, dtype)
            ref = reference(a, b)
            shape = Shape(m, n, k, "")
            rows = bench.measure(shape, contenders(a, b, dtype, m, n), ref, dtype, timer, args.rounds)
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
    path = os.path.join(os.environ.get("OUT", "/tmp"), "pingpong.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1, default=str)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
