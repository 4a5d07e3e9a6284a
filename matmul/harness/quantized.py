"""Low-precision weights on a Hopper GPU: ``matmul.linear(x, qw)`` for every format (int4 with a
scale per 128 columns, ``int4_channel``, int6, fp8_e4m3), float16 and bfloat16 activations, M in
{1, 16, 64, 128, 256, 1024, 4096}, on the weights 4096 x 4096, 6144 x 4096, 28672 x 4096 and
4096 x 14336.

Each row times the call as it runs (V8 up to 256 tokens, above that the weight widened on the GPU
then cuBLAS; each kernel built by the call's build child and waited for: ``v8_kernel``/
``widen_kernel``), its output checked first, against:

* cuBLAS (``torch.matmul``) on the unquantized weight, the yardstick;
* torch's int4 kernel (``torch._weight_int4pack_mm``; bfloat16 int4 only) on the same q and scales;
* the attainable floor: the larger of the memory floor (the bytes the call must move, the widened
  weight's write and read included for widen + cuBLAS) at the copy bandwidth plus an empty kernel,
  and the compute floor (2 M N K at cuBLAS's rate on 8192^3, or cuBLAS's time on the row's weight
  where shorter), all measured in the run;
* the widening kernel alone (above 256 tokens); on V8's rows, ``torch.amax`` and a device copy of
  the packed weight: what streaming those bytes with no arithmetic takes.

Two timings of each: L2 flushed by reading before each launch (a layer finds its weight in HBM),
and back to back with no flush, queued while the GPU sleeps so the host's pace does not count (the
host's time per call beside it: ``*_host_us``). Each row is written to ``bench.json`` as measured,
so a run cut short keeps it; ``bench.md`` is the table. Every kernel is built first, in parallel,
into tilus's cache (``--no-prebuild``: the build child builds each).

    python -m matmul quantized --out DIR [--formats int4,fp8_e4m3] [--dtypes bfloat16]
        [--tokens 1,1024] [--shapes 4096x4096,28672x4096] [--no-prebuild]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from .. import quantize
from ..call import quantized as quant_linear
from ..measure.correctness import TOLERANCE, poisoned_output, relative_error
from ..measure.timing import interleaved_ms
from ..quant import FORMATS
from ..quant import widen as widening
from . import results as results_file
from . import roofline

WEIGHTS = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))
TOKENS = (1, 16, 64, 128, 256, 1024, 4096)
BENCH_FORMATS = ("int4", "int4_channel", "fp8_e4m3", "int6")
CONFIG_KEYS = ("block_m", "warpgroups", "split", "stages", "chunk")
WINDOW = (20, 60)  # ms of warm-up and of timed turns a window: many short rows fit in one command
SLEEP_CYCLES = 50_000_000  # ~30 ms at a Hopper's clock: longer than the host takes to issue a batch


def floor_us(m, n, k, qw, itemsize, floor, cublas_us) -> float:
    """The call's attainable time (module doc): memory floor or compute floor, the larger; cuBLAS's
    own time on the unquantized weight, where it beats the 8192^3 rate, is attainable too."""
    moved = roofline.quantized_bytes_floor(m, n, k, itemsize, qw.format)  # packed weight, scales, A, C
    if not quant_linear.uses_v8(m, qw):
        moved += 2 * n * k * itemsize  # the widened weight written, then read by cuBLAS
    memory = moved / (floor["copy_tb_per_s"] * 1e12) * 1e6 + floor["empty_ms"] * 1e3
    compute = min(2 * m * n * k / (floor["cublas_tflops"] * 1e12) * 1e6, cublas_us)
    return max(memory, compute)


def back_to_back_ms(fns, repeat: int = 20, rounds: int = 5) -> tuple[list[float], list[float]]:
    """Per fn: the median over ``rounds`` of the mean GPU time of ``repeat`` consecutive calls (no
    flush), and the host's time to issue one call. The GPU sleeps while the host queues the calls,
    so the GPU time is the kernels' back to back, not the host's pace."""
    device, host = [[] for _ in fns], [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            issued = time.perf_counter()
            for _ in range(repeat):
                fn()
            host[i].append((time.perf_counter() - issued) / repeat * 1e3)
            end.record()
            torch.cuda.synchronize()
            device[i].append(start.elapsed_time(end) / repeat)
    return [statistics.median(t) for t in device], [statistics.median(t) for t in host]


def torch_int4(x, qw):
    """torch's tinygemm int4 kernel with the same q and scales (bf16, int4 only), or None."""
    if x.dtype != torch.bfloat16 or qw.format != "int4" or not hasattr(torch, "_weight_int4pack_mm"):
        return None
    q = (qw.q().to(torch.int32) + 8).contiguous()
    try:
        as_uint8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        packed = torch._convert_weight_to_int4pack(as_uint8, 8)
        scales = qw.group_scales().T.contiguous()  # [K / 128, N]
        scales_and_zeros = torch.stack([scales, torch.zeros_like(scales)], dim=-1).contiguous()

        def fn():
            return torch._weight_int4pack_mm(x, packed, 128, scales_and_zeros)

        return fn, relative_error(fn(), x.float() @ qw.dequantize().float().T)
    except Exception as e:  # noqa: BLE001 (reported, the rest still runs)
        print(f"torch int4: {type(e).__name__}: {e}", flush=True)
        return None


def measure(fmt, m, w, qw, floor) -> dict:
    n, k = w.shape
    dtype = w.dtype
    x = torch.empty(m, k, dtype=dtype, device="cuda").uniform_(-1, 1)
    ref = x.float() @ qw.dequantize().float().T
    v8 = quant_linear.uses_v8(m, qw)
    row = {
        "format": fmt,
        "dtype": str(dtype).removeprefix("torch."),
        "m": m,
        "n": n,
        "k": k,
        "path": "V8" if v8 else "widen + cuBLAS",
    }
    if v8:  # V8 is built by the call's build child: time it, not the widened path that runs meanwhile
        row["config"] = quant_linear.kernel_config(qw.format, quant_linear.config_for(m, n, k, qw.format))
        row["v8_kernel"] = quant_linear.wait_until_built(dtype, qw.format, row["config"])
    else:  # the widening kernel is built by the call's build child: time it, not torch's dequantize meanwhile
        row["widen_kernel"] = quant_linear.widening_built(dtype, qw.format)
    out = poisoned_output(m, n, dtype)
    quant_linear.linear(x, qw, out=out)
    row["error"] = relative_error(out, ref)
    del ref
    if not row["error"] <= TOLERANCE[dtype]:
        row["failed"] = True
        return row
    c16 = torch.empty(m, n, dtype=dtype, device="cuda")
    fns = {
        "call": lambda: quant_linear.linear(x, qw, out=out),
        "cublas": lambda: torch.matmul(x, w.T, out=c16),
    }
    if not v8:
        wide = torch.empty(n, k, dtype=dtype, device="cuda")
        fns["widen"] = lambda: quant_linear.widen(qw, out=wide)
    else:  # controls: a plain read of the packed weight (as roofline's "read B"), and its copy (twice the bytes)
        copy = torch.empty_like(qw.packed)
        fns["read"] = lambda: torch.amax(qw.packed)
        fns["copy"] = lambda: copy.copy_(qw.packed)
    int4 = torch_int4(x, qw)
    if int4 is not None:
        fns["torch_int4"] = int4[0]
        row["torch_int4_error"] = int4[1]
    flushed = interleaved_ms(list(fns.values()), *WINDOW)
    unflushed, host = back_to_back_ms(list(fns.values()))
    for name, t, t_b2b, t_host in zip(fns, flushed, unflushed, host):
        row[f"{name}_us"], row[f"{name}_b2b_us"], row[f"{name}_host_us"] = t * 1e3, t_b2b * 1e3, t_host * 1e3
    row["floor_us"] = floor_us(m, n, k, qw, x.element_size(), floor, row["cublas_us"])
    row["share_of_floor"] = row["floor_us"] / row["call_us"]
    row["x_cublas"] = row["cublas_us"] / row["call_us"]
    row["x_cublas_b2b"] = row["cublas_b2b_us"] / row["call_b2b_us"]
    if int4 is not None:
        row["x_torch_int4"] = row["torch_int4_us"] / row["call_us"]
    if v8:  # the field matmul.harness.roofline reads V8's time from
        row["v8_us"] = row["call_us"]
        row["x_read"] = row["read_us"] / row["call_us"]
    return row


def table(results) -> str:
    f = results["floor"]
    lines = [
        f"{results['device']}; copy bandwidth {f['copy_tb_per_s']:.2f} TB/s (512 MiB, L2 flushed by reading), "
        f"empty kernel {f['empty_ms'] * 1e3:.1f} us, cuBLAS fp16 8192^3 {f['cublas_tflops']:.0f} TFLOP/s",
        "",
        "| format | dtype | N x K | M | path | call us | floor us | % floor | x cuBLAS | x cuBLAS b2b "
        "| x torch int4 | widen us | read us | x read | copy us |",
        "|" + " --- |" * 15,
    ]
    for r in results["rows"]:
        if r.get("unsupported"):
            lines.append(f"| {r['format']} | | | | {r['unsupported']} |" + " |" * 10)
            continue
        head = f"| {r['format']} | {r['dtype']} | {r['n']} x {r['k']} | {r['m']} |"
        if r.get("failed"):
            lines.append(f"{head} {r['path']}: FAILED (error {r.get('error', float('nan')):.3g}) |" + " |" * 10)
            continue
        t4 = f"{r['x_torch_int4']:.2f}" if "x_torch_int4" in r else "-"
        path = r["path"]
        if "config" in r:
            path += " " + "/".join(str(r["config"][key]) for key in CONFIG_KEYS)
        widen = f"{r['widen_us']:.1f}" if "widen_us" in r else "-"
        read = f"{r['read_us']:.1f} | {r['x_read']:.2f} | {r['copy_us']:.1f}" if "read_us" in r else "- | - | -"
        lines.append(
            f"{head} {path} | {r['call_us']:.1f} | {r['floor_us']:.1f} | {100 * r['share_of_floor']:.0f}% "
            f"| {r['x_cublas']:.2f} | {r['x_cublas_b2b']:.2f} | {t4} | {widen} | {read} |"
        )
    lines += [
        "",
        "x cuBLAS: cuBLAS fp16/bf16 on the unquantized weight over the call, L2 flushed by reading before "
        "each launch; b2b: the same, back to back without a flush. x torch int4: tinygemm's time over the "
        "call's (bf16 int4). widen us: the widening kernel alone (flushed). read us: torch.amax of the packed "
        "weight alone (V8 rows; a kernel that only reads those bytes, flushed), x read: its time over the call's; "
        "copy us: a device copy of the packed weight (reads and writes its bytes). V8's configuration: tokens a tile / "
        "warpgroups / split / stages / K columns a wgmma group.",
    ]
    return "\n".join(lines)


def prebuild(formats, dtypes) -> None:
    """Every V8 configuration the call picks and every widening kernel, built in parallel processes
    before this process touches CUDA (tilus caches each on disk, where the launches find it)."""
    from ..build import parallel

    jobs = []
    for fmt in formats:
        for dtype in dtypes:
            jobs.append(("widen", fmt, dtype, None))
            for config in quant_linear.configs(fmt):
                jobs.append(("v8", fmt, dtype, config))
    parallel.in_forked_processes(_build, jobs)


def _build(kind, fmt, dtype, config) -> str:
    import tilus

    from .. import build
    from ..kernels import versions

    tilus_dtype = {"float16": tilus.float16, "bfloat16": tilus.bfloat16}[dtype]
    if kind == "widen":
        result = build.build_script(widening.WidenKernel, "sm_90a", {"dtype": tilus_dtype, "weight": fmt})
    else:
        module = versions.load("sm_90a", "v8")
        schedule = {"dtype": tilus_dtype, **config}
        if fmt != "int4":
            schedule["weight"] = fmt
        result = build.build_script(module.Kernel, "sm_90a", schedule, version="v8")
    return "" if result.ok else result.error


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments (``python -m matmul quantized``)."""
    parser.add_argument("--out", dest="out_dir", type=Path, required=True, help="directory for bench.json and bench.md")
    parser.add_argument("--formats", default=",".join(BENCH_FORMATS), help="weight formats, comma-separated")
    parser.add_argument("--dtypes", default=",".join(results_file.DTYPES), help="activation dtypes, comma-separated")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="M values, comma-separated")
    parser.add_argument(
        "--shapes", default=",".join(f"{n}x{k}" for n, k in WEIGHTS), help="weights as NxK, comma-separated"
    )
    parser.add_argument("--no-prebuild", action="store_true", help="let the call's build child build each kernel")


def run(args) -> None:
    formats = args.formats.split(",")
    dtypes = args.dtypes.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    if not args.no_prebuild:
        prebuild([f for f in formats if f in FORMATS], dtypes)
        print(f"built in {time.time() - start:.0f} s", flush=True)

    floor = {
        "copy_tb_per_s": roofline.copy_tb_per_s(512 << 20, 100, 200),
        "empty_ms": roofline.empty_kernel_ms(100, 200),
    }
    square = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    (ms,) = interleaved_ms([lambda: square @ square.T], 100, 300)
    floor["cublas_tflops"] = 2 * 8192**3 / (ms * 1e-3) / 1e12
    print(json.dumps(floor), flush=True)
    command = "python -m matmul " + " ".join(sys.argv[1:])
    results = {"device": torch.cuda.get_device_name(), "floor": floor, "rows": [], "command": command}
    results["software"] = results_file.software()

    def save():
        (args.out_dir / "bench.json").write_text(json.dumps(results, indent=1))
        (args.out_dir / "bench.md").write_text(table(results) + "\n")

    for fmt in formats:
        if fmt not in FORMATS:
            results["rows"].append({"format": fmt, "unsupported": "not a format of matmul.quant"})
            continue
        for dtype_name in dtypes:
            dtype = results_file.DTYPES[dtype_name]
            for n, k in shapes:
                w = torch.empty(n, k, dtype=dtype, device="cuda").normal_(0, 0.05)
                qw = quantize(w, format=fmt)
                for m in tokens:
                    try:
                        row = measure(fmt, m, w, qw, floor)
                    except Exception as e:  # noqa: BLE001 (the row says so, the rest still runs)
                        row = {"format": fmt, "dtype": dtype_name, "m": m, "n": n, "k": k, "path": "?"}
                        row.update(failed=True, exception=f"{type(e).__name__}: {str(e)[-300:]}")
                    row["elapsed_s"] = time.time() - start
                    results["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    save()
                del w, qw
                torch.cuda.empty_cache()
    save()
    print(table(results), flush=True)
