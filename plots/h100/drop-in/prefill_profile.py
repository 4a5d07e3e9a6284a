"""Where the switched Llama's prefill spends its time: one forward of each model (the drop-in's
two-layer Llama, ``matmul.nn.convert(fuse_gate_up=True)`` against the unswitched copy) under torch's
profiler, once the background tuning of the first forwards has finished and the plans of the calls
are derived; the GPU time per kernel name of each, side by side, the totals, and the forward's wall
time back to back (``harness.model.compare``, the drop-in's row). With ``--gaps``, also where the
GPU waits inside one forward of each: the idle time between consecutive kernels (the longest
gaps, with the kernels around them), the host's CUDA API calls by name (count and time), and
the host's time to issue the forward against the GPU's time to run it.

    python plots/h100/drop-in/prefill_profile.py OUT_DIR [--shapes 1x2048,4x2048] [--rounds 3] [--gaps]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_profile import kernel_times  # noqa: E402

from matmul.harness import drop_in  # noqa: E402
from matmul.harness import model as model_bench  # noqa: E402


def gaps(fn, longest: int = 12) -> tuple[dict, list[str]]:
    """Where the GPU idles inside one call of ``fn`` (after two warm-up calls): its kernels' timeline
    under torch's profiler, the host's CUDA API calls, and the host's issue time (module doc)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    fn()
    issued = time.perf_counter() - begin
    torch.cuda.synchronize()
    ran = time.perf_counter() - begin
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = sorted(
        (e for e in events if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.time_range.start
    )
    idle = [
        (later.time_range.start - earlier.time_range.end, earlier.name[:60], later.name[:60])
        for earlier, later in zip(kernels, kernels[1:])
    ]
    api: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith(("cuda", "cu")):
            api[e.name][0] += 1
            api[e.name][1] += e.cpu_time_total
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    busy = sum(k.time_range.end - k.time_range.start for k in kernels)
    summary = {
        "host_issue_ms": issued * 1e3,
        "host_until_done_ms": ran * 1e3,
        "gpu_span_us": span,
        "gpu_busy_us": busy,
        "gpu_idle_us": sum(max(g, 0) for g, _, _ in idle),
        "longest_gaps": sorted(idle, reverse=True)[:longest],
        "api_calls": {name: {"count": c, "us": t} for name, (c, t) in sorted(api.items(), key=lambda i: -i[1][1])},
    }
    lines = [
        f"host issues it in {issued * 1e3:.3f} ms, done after {ran * 1e3:.3f} ms; GPU span {span:.1f} us,"
        f" busy {busy:.1f} us, idle between kernels {summary['gpu_idle_us']:.1f} us"
    ]
    lines += [f"  gap {g:8.1f} us after {a} before {b}" for g, a, b in summary["longest_gaps"]]
    calls = list(summary["api_calls"].items())[:12]
    lines += [f"  {name:40s} x{v['count']:5d} {v['us']:10.1f} us" for name, v in calls]
    return summary, lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--shapes", default="1x2048,4x2048", help="batch x tokens, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gaps", action="store_true", help="also where the GPU idles in one forward of each")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    reference, switched, _ = drop_in.llama_pair(torch.float16)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    results, lines = {}, []
    with torch.inference_mode():
        forwards = {}
        for batch, tokens in shapes:
            ids = torch.randint(0, reference.config.vocab_size, (batch, tokens), device="cuda")
            forwards[(batch, tokens)] = {
                "ours": lambda ids=ids: switched(input_ids=ids, use_cache=False).logits,
                "theirs": lambda ids=ids: reference(input_ids=ids, use_cache=False).logits,
            }
            forwards[(batch, tokens)]["ours"]()  # each bucket's instant choice; its tuning starts
        print("settle:", drop_in.settle(), flush=True)
        for (batch, tokens), fns in forwards.items():
            error = drop_in._relative(model_bench.settled_result(fns["ours"]), fns["theirs"]())
            timed = model_bench.compare(fns["ours"], fns["theirs"], args.rounds)
            profiled = {name: kernel_times(fns[name]) for name in ("theirs", "ours")}
            key = f"{batch}x{tokens}"
            results[key] = {
                "logits_error": error,
                "ratio": timed["ratio"],
                "matmul_ms": timed["matmul_ms"],
                "torch_ms": timed["torch_ms"],
                **{name: {"total_us": total, "kernels": per_name} for name, (per_name, total) in profiled.items()},
            }
            ours, theirs = profiled["ours"][0], profiled["theirs"][0]
            names = sorted(set(ours) | set(theirs), key=lambda n: -max(ours.get(n, 0.0), theirs.get(n, 0.0)))
            lines.append(
                f"prefill {key}: wall {timed['matmul_ms']:.3f} ms (ours) / {timed['torch_ms']:.3f} ms (torch) ="
                f" {timed['ratio']:.3f}x, logits error {error:.2e}"
            )
            lines.append(f"{'kernel':90s} {'ours us':>10s} {'theirs us':>10s}")
            lines += [f"{n:90s} {ours.get(n, 0.0):10.1f} {theirs.get(n, 0.0):10.1f}" for n in names[:25]]
            lines.append(f"{'GPU total':90s} {profiled['ours'][1]:10.1f} {profiled['theirs'][1]:10.1f}")
            lines.append("")
            print("\n".join(lines[-29:]), flush=True)
            if args.gaps:
                for name in ("theirs", "ours"):
                    summary, text = gaps(fns[name])
                    results[key][name]["gaps"] = summary
                    lines += [f"prefill {key}, {name}: where the GPU waits"] + text + [""]
                    print("\n".join(lines[-len(text) - 2 :]), flush=True)
    (args.out / "prefill_profile.txt").write_text("\n".join(lines) + "\n")
    (args.out / "prefill_profile.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
