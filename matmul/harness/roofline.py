"""Skinny GEMMs against the memory roofline: Hopper V7 and cuBLAS on the decode preset.

At small M a projection's time is bounded below by reading its bytes once from HBM, (M K + N K +
M N) x itemsize at the copy bandwidth; a launch costs something even when it moves nothing, so the
attainable floor is that bytes floor plus an empty kernel's time, both measured in the same run:

* the flush (``timing.L2Flush``): a 256 MiB buffer read through L2 before each timed launch, as a
  model's other layers leave L2 for this one. Every figure is taken again with the flush that writes
  the buffer (the ``write`` columns): dirty lines the timed kernel writes back, for every kernel
  alike, the floor's copy included;
* copy bandwidth: a device-to-device copy (read + write counted) of 32 MiB and of 512 MiB, L2 flushed;
  the larger one's rate is the floors';
* empty kernel: ``torch.cuda._sleep(0)``, timed like every kernel here;
* V7 and cuBLAS: every V7 configuration worth timing at M (``candidates``) is checked, then timed in
  one window with cuBLAS; the fastest again in a longer window under each flush, whose medians are
  the table's times;
* a control: ``torch.amax`` of the weight alone (a kernel that only reads the N x K bytes);
* back to back, as a model calls them: each launched ``--calls`` times between one pair of events,
  no flush, host time included.

Hopper V8 (low-precision weights) gets rows beside V7's from ``python -m matmul quantized``'s
results: its time and cuBLAS's on the unquantized weight against two floors at that run's copy
bandwidth and empty kernel: its own (``quantized_bytes_floor``) and the 16-bit one (``bytes_floor``),
which no kernel reading a 16-bit weight can pass.

    python -m matmul.harness.roofline --out DIR [--dtypes float16,bfloat16] [--shapes decode]
    python -m matmul.harness.roofline --plot DIR/roofline.json   # table + figure (no GPU needed)
    python -m matmul.harness.roofline --plot DIR/roofline.json --v8 V8DIR/bench.json   # and V8's rows
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ..kernels import versions
from ..measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from ..measure.timing import interleaved_ms
from ..quant import FORMATS
from ..quant.int4 import padded_rows
from . import presets
from .model import window_ms
from .plot import save as save_figure
from .results import DTYPES

ARCH = "sm_90a"
# the bar: these weights, these token counts
BAR_SHAPES = ((4096, 4096), (6144, 4096), (4096, 14336))
BAR_TOKENS = (1, 16, 64, 128)


def bytes_floor(m: int, n: int, k: int, itemsize: int) -> int:
    """The bytes a C = A @ B^T must move at least: read A and B once, write C once."""
    return (m * k + n * k + m * n) * itemsize


def quantized_bytes_floor(m: int, n: int, k: int, itemsize: int, format: str = "int4") -> int:
    """The bytes a C = A @ W^T with W in a ``matmul.quant`` format must move at least: the packed
    weight as ``matmul.quantize`` stores it (rows padded to 64, ``bits`` a value), its scales (one
    per row and group of K columns in the activations' dtype; fp8_e4m3: one float32 a row), A read
    and C written in the activations' dtype (``itemsize`` bytes)."""
    bits, group = FORMATS[format]
    n_pad = padded_rows(n)
    scales = n_pad * 4 if group is None else (k // group) * n_pad * itemsize
    return n_pad * k * bits // 8 + scales + (m * k + m * n) * itemsize


def copy_tb_per_s(nbytes: int, warmup_ms: float, repeat_ms: float, flush: str = "read") -> float:
    """Device-to-device copy rate of ``nbytes`` (read + write), L2 flushed before each launch."""
    src = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda").random_()
    dst = torch.empty_like(src)
    (ms,) = interleaved_ms([lambda: dst.copy_(src)], warmup_ms, repeat_ms, flush)
    return 2 * nbytes / (ms * 1e-3) / 1e12


def empty_kernel_ms(warmup_ms: float, repeat_ms: float, flush: str = "read") -> float:
    return interleaved_ms([lambda: torch.cuda._sleep(0)], warmup_ms, repeat_ms, flush)[0]


# each flush (``timing.L2Flush``) and the prefix of its keys in the floor and in a row
FLUSHES = (("read", ""), ("write", "write_"))


def floors(warmup_ms: float, repeat_ms: float) -> dict:
    """The copy rates and the empty kernel's time under each flush of ``FLUSHES``."""
    found = {}
    for flush, prefix in FLUSHES:
        found[prefix + "copy_32mib_tb_per_s"] = copy_tb_per_s(32 << 20, warmup_ms, repeat_ms, flush)
        found[prefix + "copy_tb_per_s"] = copy_tb_per_s(512 << 20, warmup_ms, repeat_ms, flush)
        found[prefix + "empty_ms"] = empty_kernel_ms(warmup_ms, repeat_ms, flush)
    return found


def back_to_back_ms(fn, calls: int) -> float:
    """Time of one call of ``fn`` launched ``calls`` times in a row (``model.window_ms``), after ten untimed."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    return window_ms(fn, calls)


def parse_configs(text: str) -> list[dict]:
    """``"16/1/2/12,64/2/2/6"`` (block_m/warpgroups/split/stages) -> configuration dicts."""
    keys = ("block_m", "warpgroups", "split", "stages")
    return [dict(zip(keys, (int(v) for v in item.split("/")))) for item in text.split(",") if item.strip()]


def prebuild(module, configs: list[dict], dtypes: list[torch.dtype]) -> None:
    """Build every (configuration, dtype) in parallel processes before anything runs: tilus
    caches each program on disk, where the launches find it."""
    from ..build import parallel

    jobs = [(module.__name__, config, str(dtype).removeprefix("torch.")) for config in configs for dtype in dtypes]
    parallel.in_forked_processes(_build, jobs)


def _build(module_name: str, config: dict, dtype: str) -> str:
    import importlib

    from ..build import compiler

    module = importlib.import_module(module_name)
    result = compiler.build_config(module, ARCH, config, versions.TILUS_DTYPES[DTYPES[dtype]])
    return "" if result.ok else result.error


def candidates(module, m: int, space: list[dict] | None = None) -> list[dict]:
    """The configurations (of V7's space, or of ``space``) worth timing at M tokens: token tiles no
    wider than the narrowest that holds all M, and at most two of them (a weight tile re-read by
    more token tiles than that loses; a 128-token tile twice can beat one of 256). The widest tile's
    configurations come first, in the space's order."""
    space = space or versions.space(module)
    widths = sorted({c["block_m"] for c in space})
    widest = next((w for w in widths if w >= m), widths[-1])
    found = [c for c in space if c["block_m"] <= widest and -(-m // c["block_m"]) <= 2]
    return sorted(found, key=lambda c: -c["block_m"])


def launcher(module, a, b, out, config):
    """The V7 launch with everything but the call derived once (operands validated once)."""
    script = versions.kernel(module, a.dtype, config)
    args = versions.launch_args(a, b, out)
    return lambda: script(*args)


def measure_shape(module, shape: presets.Shape, dtype: torch.dtype, args, floor: dict) -> dict:
    m, n, k = shape.mnk
    a, b = random_operands(m, n, k, dtype)
    ref = reference(a, b)
    cublas_out = torch.empty(m, n, dtype=dtype, device=a.device)

    def cublas():
        return torch.matmul(a, b.T, out=cublas_out)

    row = {
        "m": m,
        "n": n,
        "k": k,
        "label": shape.label,
        "dtype": str(dtype).removeprefix("torch."),
        "bytes": bytes_floor(m, n, k, dtype.itemsize),
        "configs": [],
    }
    best = None
    for config in candidates(module, m, args.space):
        out = poisoned_output(m, n, dtype)
        entry = {"config": config}
        row["configs"].append(entry)
        try:
            versions.run(module, a, b, out, config=config)
        except Exception as e:  # a configuration that does not build is reported, the others still run
            entry.update(failed=True, error=f"{type(e).__name__}: {str(e)[-300:]}")
            continue
        error = entry["error"] = relative_error(out, ref)
        if not error <= TOLERANCE[dtype]:
            entry["failed"] = True
            continue
        v7_ms, cublas_ms = interleaved_ms(
            [launcher(module, a, b, out, config), cublas], args.select_warmup_ms, args.select_repeat_ms
        )
        entry["ratio"] = cublas_ms / v7_ms
        entry["v7_us"] = v7_ms * 1e3
        print(f"  {m}x{n}x{k} {config}: {v7_ms * 1e3:.1f} us, {entry['ratio']:.3f}x cuBLAS", flush=True)
        if best is None or entry["ratio"] > best["ratio"]:
            best = entry
    if best is None:
        row["failed"] = True
        return row
    out = poisoned_output(m, n, dtype)
    fn = launcher(module, a, b, out, best["config"])
    for flush, prefix in FLUSHES:
        v7_ms, cublas_ms = interleaved_ms([fn, cublas], args.warmup_ms, args.repeat_ms, flush)
        attainable_ms = row["bytes"] / (floor[prefix + "copy_tb_per_s"] * 1e12) * 1e3 + floor[prefix + "empty_ms"]
        row[prefix + "v7_us"] = v7_ms * 1e3
        row[prefix + "cublas_us"] = cublas_ms * 1e3
        row[prefix + "attainable_us"] = attainable_ms * 1e3
        row[prefix + "v7_share"] = attainable_ms / v7_ms
        row[prefix + "cublas_share"] = attainable_ms / cublas_ms
        row[prefix + "ratio"] = cublas_ms / v7_ms

    weight_read_ms = interleaved_ms([lambda: torch.amax(b)], args.select_warmup_ms, args.select_repeat_ms)[0]
    row.update(
        config=best["config"],
        v7_tb_per_s=row["bytes"] / (row["v7_us"] * 1e-6) / 1e12,
        weight_read_us=weight_read_ms * 1e3,
        b2b_v7_us=back_to_back_ms(fn, args.calls) * 1e3,
        b2b_cublas_us=back_to_back_ms(cublas, args.calls) * 1e3,
    )
    row["b2b_ratio"] = row["b2b_cublas_us"] / row["b2b_v7_us"]
    row["final_error"] = relative_error(out, ref)  # the timed launches wrote the same result
    if not row["final_error"] <= TOLERANCE[dtype]:
        row["failed"] = True
    return row


def geomean(values) -> float:
    """The geometric mean, NaN for no values (a table of shapes that all failed)."""
    values = list(values)
    return statistics.geometric_mean(values) if values else float("nan")


def summary(rows: list[dict]) -> dict:
    """Per dtype: the issue's bar (geomean of V7 / cuBLAS and the worst share of the attainable
    floor over its 12 shapes), and the same over every shape."""
    found = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        done = [r for r in rows if r["dtype"] == dtype and not r.get("failed")]
        bar = [r for r in done if (r["n"], r["k"]) in BAR_SHAPES and r["m"] in BAR_TOKENS]
        found[dtype] = {
            "bar_shapes": len(bar),
            "bar_geomean_vs_cublas": geomean(r["ratio"] for r in bar),
            "bar_min_share_of_floor": min((r["v7_share"] for r in bar), default=float("nan")),
            # the same under the flush that writes (the method), where a results file has it
            "write_bar_geomean_vs_cublas": geomean(r["write_ratio"] for r in bar if "write_ratio" in r),
            "write_bar_min_share_of_floor": min(
                (r["write_v7_share"] for r in bar if "write_v7_share" in r), default=float("nan")
            ),
            "all_geomean_vs_cublas": geomean(r["ratio"] for r in done),
            "all_geomean_b2b_vs_cublas": geomean(r["b2b_ratio"] for r in done),
            "failed": [f"{r['m']}x{r['n']}x{r['k']}" for r in rows if r["dtype"] == dtype and r.get("failed")],
        }
    return found


def table(results: dict) -> str:
    floor = results["floor"]
    copy_32 = floor["copy_32mib_tb_per_s"]
    lines = [
        f"L2 flushed by reading: copy bandwidth {floor['copy_tb_per_s']:.2f} TB/s (512 MiB; 32 MiB: {copy_32:.2f}), "
        f"empty kernel {floor['empty_ms'] * 1e3:.1f} us",
    ]
    if "write_copy_tb_per_s" in floor:  # results files before the reading flush have only the writing one
        lines.append(
            f"L2 flushed by writing: copy bandwidth {floor['write_copy_tb_per_s']:.2f} TB/s (512 MiB; 32 MiB: "
            f"{floor['write_copy_32mib_tb_per_s']:.2f}), empty kernel {floor['write_empty_ms'] * 1e3:.1f} us"
        )
    lines.append("")
    header = (
        "| dtype | M | N x K | V7 us | cuBLAS us | floor us | V7 % floor | cuBLAS % floor | V7 / cuBLAS "
        "| write: V7 % floor | write: cuBLAS % floor | write: V7 / cuBLAS "
        "| read B us | b2b V7 us | b2b cuBLAS us | b2b V7 / cuBLAS | V7 config |"
    )
    lines += [header, "|" + " --- |" * 17]
    for r in results["rows"]:
        shape = f"{r['n']} x {r['k']}" + (f" ({r['label']})" if r["label"] and "x" not in r["label"] else "")
        if r.get("failed") and "v7_us" not in r:
            lines.append(f"| {r['dtype']} | {r['m']} | {shape} | FAILED |" + " |" * 13)
            continue
        config = "/".join(str(r["config"][key]) for key in ("block_m", "warpgroups", "split", "stages"))
        read = f"{r['weight_read_us']:.1f}" if "weight_read_us" in r else "-"  # a results file without the control
        write = "- | - | -"  # a results file from before the reading flush
        if "write_ratio" in r:
            write = f"{100 * r['write_v7_share']:.0f}% | {100 * r['write_cublas_share']:.0f}% | {r['write_ratio']:.2f}"
        lines.append(
            f"| {r['dtype']} | {r['m']} | {shape} | {r['v7_us']:.1f} | {r['cublas_us']:.1f} | {r['attainable_us']:.1f} "
            f"| {100 * r['v7_share']:.0f}% | {100 * r['cublas_share']:.0f}% | {r['ratio']:.2f}"
            f"{' FAILED' if r.get('failed') else ''} | {write} | {read} "
            f"| {r['b2b_v7_us']:.1f} | {r['b2b_cublas_us']:.1f} | {r['b2b_ratio']:.2f} | {config} |"
        )
    lines.append("")
    lines.append(
        "V7 config: tokens per tile / consumer warpgroups / split (CTAs of a cluster) / stages; "
        "write: the same kernels and floor with L2 flushed by writing; "
        "read B: torch.amax of the weight alone, L2 flushed by reading"
    )
    for dtype, s in results["summary"].items():
        written = ""  # a results file from before the reading flush has no writing-flush figures
        if not math.isnan(s.get("write_bar_geomean_vs_cublas", float("nan"))):
            written = (
                f" (flushed by writing: {s['write_bar_geomean_vs_cublas']:.3f}x, "
                f"{100 * s['write_bar_min_share_of_floor']:.0f}%)"
            )
        lines.append(
            f"{dtype}: bar shapes ({s['bar_shapes']}): geomean {s['bar_geomean_vs_cublas']:.3f}x cuBLAS, "
            f"worst {100 * s['bar_min_share_of_floor']:.0f}% of the attainable floor{written}; all shapes: "
            f"{s['all_geomean_vs_cublas']:.3f}x flushed, {s['all_geomean_b2b_vs_cublas']:.3f}x back to back"
            + (f"; FAILED: {', '.join(s['failed'])}" if s["failed"] else "")
        )
    return "\n".join(lines)


def plot(results: dict, out_dir: Path) -> list[Path]:
    """Share of the attainable floor of V7 and cuBLAS per shape, one panel per dtype."""
    dtypes = sorted({r["dtype"] for r in results["rows"]})
    fig = Figure(figsize=(13, 4.2 * len(dtypes)))
    axes = fig.subplots(len(dtypes), 1, squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes):
        rows = [r for r in results["rows"] if r["dtype"] == dtype and "v7_us" in r]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [100 * r["cublas_share"] for r in rows], 0.4, label="cuBLAS", color="#999999")
        ax.bar([i + 0.2 for i in x], [100 * r["v7_share"] for r in rows], 0.4, label="V7", color="#1f77b4")
        for i, r in zip(x, rows):
            ax.text(i + 0.2, 100 * r["v7_share"] + 1, f"{r['ratio']:.2f}x", ha="center", fontsize=6, rotation=90)
        ax.axhline(85, color="#d62728", lw=0.8, ls="--", label="85% of the attainable floor")
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"M={r['m']}  {r['n']}x{r['k']}" for r in rows], fontsize=6, rotation=90)
        ax.set_ylabel("% of attainable floor")
        ax.set_ylim(0, 115)
        ax.set_title(
            f"{results.get('device', 'GPU')}, {dtype}: attainable floor (bytes / copy bandwidth + empty kernel) "
            "over measured time, "
            "L2 flushed by reading; labels: V7 / cuBLAS",
            fontsize=9,
        )
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return save_figure(fig, out_dir / "skinny-sm_90a")


# -- Hopper V8: int4 weights against their own floor and the 16-bit one ----------------------------

V8_CONFIG_KEYS = ("block_m", "warpgroups", "split", "stages", "chunk")


def quantized_rows(v8: dict, v7: dict | None = None) -> list[dict]:
    """V8's rows from a results file of ``python -m matmul quantized`` (``v8``): its time and
    cuBLAS's on the unquantized weight (one window), with the two attainable floors at that run's
    copy bandwidth and empty kernel: its own (``quantized_bytes_floor`` of the row's format, int4
    where the file names none) and the 16-bit one (``bytes_floor``). Rows of another path (the
    weight widened for cuBLAS above V8's token range) and formats the file lists as unsupported are
    left out. ``v7``: a results file of this harness; where it has the same shape and dtype, V7's
    time and share of its floor (measured in its own run) come along."""
    floor = v8["floor"]

    def attainable_us(nbytes: int) -> float:
        return (nbytes / (floor["copy_tb_per_s"] * 1e12) + floor["empty_ms"] * 1e-3) * 1e6

    v7_rows = {(r["dtype"], r["m"], r["n"], r["k"]): r for r in (v7 or {}).get("rows", []) if "v7_us" in r}
    rows = []
    for r in v8["rows"]:
        if "m" not in r or r.get("path", "V8") != "V8":
            continue
        key = (r["dtype"], r["m"], r["n"], r["k"])
        same = v7_rows.get(key, {})
        fmt = r.get("format", "int4")
        row = {
            "format": fmt,
            "dtype": r["dtype"],
            "m": r["m"],
            "n": r["n"],
            "k": r["k"],
            "label": same.get("label", ""),
        }
        rows.append(row)
        if r.get("failed") or "v8_us" not in r:
            row["failed"] = True
            continue
        itemsize = DTYPES[r["dtype"]].itemsize
        row["bytes"] = quantized_bytes_floor(r["m"], r["n"], r["k"], itemsize, fmt)
        row["dense_bytes"] = bytes_floor(r["m"], r["n"], r["k"], itemsize)
        row["attainable_us"] = attainable_us(row["bytes"])
        row["dense_attainable_us"] = attainable_us(row["dense_bytes"])
        row.update(v8_us=r["v8_us"], cublas_us=r["cublas_us"], config=r.get("config", {}))
        row["v8_share"] = row["attainable_us"] / r["v8_us"]  # of its own floor
        row["v8_over_dense_floor"] = row["dense_attainable_us"] / r["v8_us"]  # > 1: faster than 16 bits allow
        row["cublas_share"] = row["dense_attainable_us"] / r["cublas_us"]
        row["ratio"] = r["cublas_us"] / r["v8_us"]
        if "v7_us" in same:
            row.update(v7_us=same["v7_us"], v7_share=same["v7_share"], v8_over_v7=same["v7_us"] / r["v8_us"])
    return rows


def quantized_table(rows: list[dict], v8: dict, command: str = "") -> str:
    """The Markdown section of V8's rows (``quantized_rows``), with the run's floor and a summary."""
    floor = v8["floor"]
    lines = [
        "## Hopper V8: low-precision weights",
        "",
        f"{v8.get('device', 'GPU')}; V8's own run: copy bandwidth {floor['copy_tb_per_s']:.2f} TB/s (512 MiB, "
        f"L2 flushed by reading), empty kernel {floor['empty_ms'] * 1e3:.1f} us; the floors below use them. "
        "V8 and cuBLAS (on the unquantized 16-bit weight) timed in one window; V7 from the table above "
        "(its own run).",
        "",
        "| format | dtype | M | N x K | V8 us | cuBLAS us | V8 floor us | 16-bit floor us | V8 % of its floor "
        "| 16-bit floor / V8 | cuBLAS % 16-bit floor | V8 / cuBLAS | V7 us | V8 / V7 | V8 config |",
        "|" + " --- |" * 15,
    ]
    for r in rows:
        shape = f"{r['n']} x {r['k']}" + (f" ({r['label']})" if r["label"] and "x" not in r["label"] else "")
        if r.get("failed"):
            lines.append(f"| {r['format']} | {r['dtype']} | {r['m']} | {shape} | FAILED |" + " |" * 10)
            continue
        v7 = f"{r['v7_us']:.1f} | {r['v8_over_v7']:.2f}" if "v7_us" in r else "- | -"
        config = "/".join(str(r["config"][key]) for key in V8_CONFIG_KEYS if key in r["config"])
        lines.append(
            f"| {r['format']} | {r['dtype']} | {r['m']} | {shape} | {r['v8_us']:.1f} | {r['cublas_us']:.1f} "
            f"| {r['attainable_us']:.1f} | {r['dense_attainable_us']:.1f} | {100 * r['v8_share']:.0f}% "
            f"| {r['v8_over_dense_floor']:.2f} | {100 * r['cublas_share']:.0f}% | {r['ratio']:.2f} | {v7} | {config} |"
        )
    lines += [
        "",
        "V8 floor: (packed weight + scales + activations + output) bytes at the copy bandwidth, plus the "
        "empty kernel; 16-bit floor: the same with the 16-bit weight (what bounds cuBLAS and V7). "
        "16-bit floor / V8 above 1: V8 is faster than any kernel that reads the 16-bit weight could be. "
        "V8 config: tokens per tile / warpgroups / split (CTAs of a cluster) / stages / K columns a wgmma group.",
    ]
    for fmt, dtype in sorted({(r["format"], r["dtype"]) for r in rows}):
        done = [r for r in rows if (r["format"], r["dtype"]) == (fmt, dtype) and not r.get("failed")]
        if not done:
            continue
        lines.append(
            f"{fmt}, {dtype}: geomean V8 / cuBLAS {geomean(r['ratio'] for r in done):.2f}x over {len(done)} shapes; "
            f"V8 at {100 * min(r['v8_share'] for r in done):.0f}-{100 * max(r['v8_share'] for r in done):.0f}% "
            f"of its floor and {min(r['v8_over_dense_floor'] for r in done):.2f}-"
            f"{max(r['v8_over_dense_floor'] for r in done):.2f}x the 16-bit floor's speed"
        )
    if command:
        lines += ["", f"Made by `{command}`."]
    return "\n".join(lines)


def plot_quantized(rows: list[dict], device: str, out_dir: Path) -> list[Path]:
    """Speed against the 16-bit attainable floor (floor / time) of cuBLAS, V7 and V8 per shape,
    with V8's own floor marked: one panel per dtype. Above the 16-bit floor's line, a kernel beats
    every kernel that reads the 16-bit weight."""
    panels = sorted({(r["format"], r["dtype"]) for r in rows if not r.get("failed")})
    fig = Figure(figsize=(11, 4.2 * len(panels)))
    axes = fig.subplots(len(panels), 1, squeeze=False)
    for ax, (fmt, dtype) in zip(axes[:, 0], panels):
        done = [r for r in rows if (r["format"], r["dtype"]) == (fmt, dtype) and not r.get("failed")]
        x = list(range(len(done)))
        ax.bar([i - 0.27 for i in x], [100 * r["cublas_share"] for r in done], 0.27, label="cuBLAS (16-bit weight)",
               color="#999999")  # fmt: skip
        ax.bar([i for i in x], [100 * r.get("v7_share", float("nan")) for r in done], 0.27,
               label="V7 (16-bit weight, its own run)", color="#1f77b4")  # fmt: skip
        ax.bar([i + 0.27 for i in x], [100 * r["v8_over_dense_floor"] for r in done], 0.27, label=f"V8 ({fmt} weight)",
               color="#d62728")  # fmt: skip
        ceiling = [100 * r["dense_attainable_us"] / r["attainable_us"] for r in done]
        ax.scatter([i + 0.27 for i in x], ceiling, marker="_", s=300, color="black", label="V8's own floor")
        for i, r in zip(x, done):
            ax.text(i + 0.27, 100 * r["v8_over_dense_floor"] + 4, f"{r['ratio']:.2f}x", ha="center", fontsize=7)
        ax.axhline(100, color="black", lw=0.8, ls="--", label="16-bit floor: no 16-bit kernel above it")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['m']} x {r['n']}\nx {r['k']}" for r in done], fontsize=7)
        ax.set_xlabel("M x N x K (M tokens, weight N x K)", fontsize=8)
        ax.set_ylabel("16-bit attainable floor / time (%)")
        ax.set_ylim(0, max(ceiling) * 1.12)
        ax.set_title(
            f"{device}, {fmt} weight, {dtype}: speed against the 16-bit floor (bytes / copy bandwidth + empty kernel), "
            "L2 flushed by reading; labels: V8 / cuBLAS",
            fontsize=9,
        )
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    return save_figure(fig, out_dir / "roofline-v8-sm_90a")


def run(args) -> dict:
    if versions.local_arch() != ARCH:
        raise SystemExit(
            f"the roofline run needs a Hopper GPU ({ARCH}); this machine has "
            f"{versions.local_arch() or 'none'}. Without one, --plot JSON redraws a results file."
        )
    module = versions.load(ARCH, "v7")
    shapes = presets.unique(presets.parse(args.shapes))
    unsupported = [s.text for s in shapes if not module.supports(*s.mnk)]
    if unsupported:
        raise SystemExit(f"V7 does not support {', '.join(unsupported)} (M <= {module.MAX_M})")
    dtypes = [DTYPES[name] for name in args.dtypes.split(",")]
    prebuild(module, args.space or versions.space(module), dtypes)
    floor = floors(args.warmup_ms, args.repeat_ms)
    print(json.dumps(floor), flush=True)
    rows = []
    for name in args.dtypes.split(","):
        for shape in shapes:
            row = measure_shape(module, shape, DTYPES[name], args, floor)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "configs"}), flush=True)
    return {
        "device": torch.cuda.get_device_name(),
        "floor": floor,
        "rows": rows,
        "summary": summary(rows),
        "command": " ".join(sys.argv),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m matmul.harness.roofline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="decode")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--out", type=Path, help="folder for roofline.json, roofline.md and the figure")
    parser.add_argument("--plot", type=Path, metavar="JSON", help="only write the table and figure of a results file")
    parser.add_argument("--warmup-ms", type=float, default=100.0)
    parser.add_argument("--repeat-ms", type=float, default=200.0)
    parser.add_argument("--select-warmup-ms", type=float, default=20.0)
    parser.add_argument("--select-repeat-ms", type=float, default=50.0)
    parser.add_argument(
        "--configs",
        type=parse_configs,
        dest="space",
        default=None,
        help="V7 configurations to choose from instead of its space: block_m/warpgroups/split/stages,...",
    )
    parser.add_argument("--calls", type=int, default=200, help="launches between the back-to-back events")
    parser.add_argument(
        "--v8",
        type=Path,
        metavar="JSON",
        help="add Hopper V8's rows from this results file of `python -m matmul quantized` (its bench.json)",
    )
    args = parser.parse_args(argv)
    if args.plot:
        results = json.loads(args.plot.read_text())
        out_dir = args.out or args.plot.parent
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        if args.out is None:
            parser.error("--out is required")
        args.out.mkdir(parents=True, exist_ok=True)
        results = run(args)
        out_dir = args.out
        (out_dir / "roofline.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    if args.v8:
        v8 = json.loads(args.v8.read_text())
        rows = quantized_rows(v8, results)
        source = args.plot or out_dir / "roofline.json"
        command = f"python -m matmul.harness.roofline --plot {source} --v8 {args.v8}"
        text += "\n\n" + quantized_table(rows, v8, command)
        plot_quantized(rows, v8.get("device", "GPU"), out_dir)
    (out_dir / "roofline.md").write_text(text + "\n")
    print(text)
    plot(results, out_dir)


if __name__ == "__main__":
    main()
