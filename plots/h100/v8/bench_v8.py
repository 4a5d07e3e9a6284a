"""Hopper V8 (int4 weights, group 128) on the H100 against cuBLAS fp16/bf16 on the unquantized
weight, the widened-weight path (dequantize + cuBLAS), torch's own int4 kernel
(``torch._weight_int4pack_mm``, bf16) and V8's own attainable floor.

Floor: (packed weight + scales + activations + output) bytes at the copy bandwidth (512 MiB
device-to-device copy, L2 flushed by reading) plus an empty kernel's time, as
``matmul.harness.roofline`` measures both. Every V8 configuration worth timing at M is checked
against a float32 reference from ``qw.dequantize()`` (output NaN-poisoned), timed in one window
with cuBLAS (``timing.interleaved_ms``, L2 flushed by reading before each launch); the fastest is
timed again in a longer window with cuBLAS, the widened path and torch's int4 kernel.

    python plots/h100/v8/bench_v8.py OUT_DIR     # bench.json, bench.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

import matmul
from matmul.harness import roofline
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error
from matmul.measure.timing import interleaved_ms
from matmul.quant import linear as quant_linear

WEIGHTS = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))
TOKENS = (1, 16)
FALLBACK_TOKENS = (64, 128, 256)  # V8 against the widened path where the call switches
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def v8_bytes(m, n, k, itemsize=2):
    n_pad = -(-n // 64) * 64
    return n_pad * k // 2 + (k // 128) * n_pad * itemsize + m * k * itemsize + m * n * itemsize


def torch_int4(x, qw):
    """torch's tinygemm int4 kernel with the same q and scales (bf16 only): q + 8 unsigned, zero 0."""
    if x.dtype != torch.bfloat16 or not hasattr(torch, "_weight_int4pack_mm"):
        return None
    q = (qw.q().to(torch.int32) + 8).contiguous()
    n, k = q.shape
    try:
        as_uint8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        packed = torch._convert_weight_to_int4pack(as_uint8, 8)
        scales = qw.group_scales().T.contiguous()  # [K / 128, N]
        scales_and_zeros = torch.stack([scales, torch.zeros_like(scales)], dim=-1).contiguous()

        def fn():
            return torch._weight_int4pack_mm(x, packed, 128, scales_and_zeros)

        error = relative_error(fn(), x.float() @ qw.dequantize().float().T)
        return fn, error
    except Exception as e:  # noqa: BLE001 (reported, the rest still runs)
        print(f"torch int4: {type(e).__name__}: {e}", flush=True)
        return None


def measure(m, n, k, dtype, floor, space):
    x = torch.empty(m, k, dtype=dtype, device="cuda").uniform_(-1, 1)
    w = torch.empty(n, k, dtype=dtype, device="cuda").normal_(0, 0.05)
    qw = matmul.quantize(w)
    ref = x.float() @ qw.dequantize().float().T
    c16 = torch.empty(m, n, dtype=dtype, device="cuda")

    def cublas():
        return torch.matmul(x, w.T, out=c16)

    row = {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "configs": []}
    best = None
    for config in roofline.candidates(None, m, space):
        out = poisoned_output(m, n, dtype)
        entry = {"config": config}
        row["configs"].append(entry)
        try:
            quant_linear.v8(x, qw, out, config)
        except Exception as e:  # noqa: BLE001
            entry.update(failed=True, error=f"{type(e).__name__}: {str(e)[-300:]}")
            continue
        entry["error"] = relative_error(out, ref)
        if not entry["error"] <= TOLERANCE[dtype]:
            entry["failed"] = True
            continue
        v8_ms, cublas_ms = interleaved_ms([lambda c=config, o=out: quant_linear.v8(x, qw, o, c), cublas], 10, 40)
        entry["v8_us"], entry["ratio"] = v8_ms * 1e3, cublas_ms / v8_ms
        if best is None or entry["ratio"] > best["ratio"]:
            best = entry
    if best is None:
        row["failed"] = True
        return row
    out = poisoned_output(m, n, dtype)
    fns = [
        lambda: quant_linear.v8(x, qw, out, best["config"]),
        cublas,
        lambda: quant_linear.widened(x, qw),
    ]
    int4 = torch_int4(x, qw)
    if int4 is not None:
        fns.append(int4[0])
        row["torch_int4_error"] = int4[1]
    times = interleaved_ms(fns, 100, 200)
    attainable_ms = v8_bytes(m, n, k) / (floor["copy_tb_per_s"] * 1e12) * 1e3 + floor["empty_ms"]
    row.update(
        config=best["config"],
        v8_us=times[0] * 1e3,
        cublas_us=times[1] * 1e3,
        widened_us=times[2] * 1e3,
        attainable_us=attainable_ms * 1e3,
        share_of_floor=attainable_ms / times[0],
        ratio=times[1] / times[0],
        final_error=relative_error(out, ref),
    )
    if int4 is not None:
        row["torch_int4_us"] = times[3] * 1e3
    print(json.dumps({k_: v for k_, v in row.items() if k_ != "configs"}), flush=True)
    return row


def fallback_rows(space):
    """V8 (its call's configuration, and the best of the space) against the widened path at the
    largest token counts V8 takes, where the call decides between them."""
    rows = []
    for n, k in ((4096, 4096), (28672, 4096)):
        for m in FALLBACK_TOKENS:
            x = torch.empty(m, k, dtype=torch.float16, device="cuda").uniform_(-1, 1)
            qw = matmul.quantize(torch.empty(n, k, dtype=torch.float16, device="cuda").normal_(0, 0.05))
            out = torch.empty(m, n, dtype=torch.float16, device="cuda")
            configs = roofline.candidates(None, m, space)
            fns = [lambda c=c, x=x, qw=qw, out=out: quant_linear.v8(x, qw, out, c) for c in configs]
            times = interleaved_ms([*fns, lambda x=x, qw=qw: quant_linear.widened(x, qw)], 20, 60)
            row = {
                "m": m,
                "n": n,
                "k": k,
                "call_config": quant_linear.config_for(m),
                "configs": [{"config": c, "us": t * 1e3} for c, t in zip(configs, times)],
                "widened_us": times[-1] * 1e3,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def table(results) -> str:
    f = results["floor"]
    lines = [
        f"{results['device']}; copy bandwidth {f['copy_tb_per_s']:.2f} TB/s (512 MiB, L2 flushed by reading), "
        f"empty kernel {f['empty_ms'] * 1e3:.1f} us",
        "",
        "| dtype | M | N x K | V8 us | cuBLAS fp16 us | V8 floor us | V8 % floor | V8 / cuBLAS | widened+cuBLAS us "
        "| torch int4 us | V8 config |",
        "|" + " --- |" * 11,
    ]
    for r in results["rows"]:
        if r.get("failed"):
            lines.append(f"| {r['dtype']} | {r['m']} | {r['n']} x {r['k']} | FAILED |" + " |" * 7)
            continue
        cfg = "/".join(str(r["config"][key]) for key in ("block_m", "warpgroups", "split", "stages", "chunk"))
        t4 = f"{r['torch_int4_us']:.1f}" if "torch_int4_us" in r else "-"
        lines.append(
            f"| {r['dtype']} | {r['m']} | {r['n']} x {r['k']} | {r['v8_us']:.1f} | {r['cublas_us']:.1f} "
            f"| {r['attainable_us']:.1f} | {100 * r['share_of_floor']:.0f}% | {r['ratio']:.2f} "
            f"| {r['widened_us']:.1f} | {t4} | {cfg} |"
        )
    lines.append("")
    lines.append("V8 config: tokens per tile / warpgroups / split (CTAs a cluster) / stages / K columns a wgmma group")
    for dtype in DTYPES:
        done = [r for r in results["rows"] if r["dtype"] == dtype and not r.get("failed")]
        if done:
            lines.append(
                f"{dtype}: geomean V8 / cuBLAS {statistics.geometric_mean(r['ratio'] for r in done):.2f}x over "
                f"{len(done)} shapes; V8 at {100 * min(r['share_of_floor'] for r in done):.0f}-"
                f"{100 * max(r['share_of_floor'] for r in done):.0f}% of its floor"
            )
    return "\n".join(lines)


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    module = versions.load("sm_90a", "v8")
    space = versions.space(module)
    roofline.prebuild(module, space, list(DTYPES.values()))
    floor = {
        "copy_tb_per_s": roofline.copy_tb_per_s(512 << 20, 100, 200),
        "empty_ms": roofline.empty_kernel_ms(100, 200),
    }
    print(json.dumps(floor), flush=True)
    rows = [measure(m, n, k, dtype, floor, space) for dtype in DTYPES.values() for n, k in WEIGHTS for m in TOKENS]
    results = {"device": torch.cuda.get_device_name(), "floor": floor, "rows": rows, "command": " ".join(sys.argv)}
    (out_dir / "bench.json").write_text(json.dumps(results, indent=1))
    (out_dir / "bench.md").write_text(table(results) + "\n")
    print(table(results), flush=True)
    results["fallback"] = fallback_rows(space)
    (out_dir / "bench.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
