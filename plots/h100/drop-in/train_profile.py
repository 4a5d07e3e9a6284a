"""Where the switched Llama's training step loses time: one step of each model (the drop-in's
two-layer Llama, ``matmul.nn.convert(fuse_gate_up=True)`` against the unswitched copy) under
torch's profiler, once the background tuning its first step started has finished; the GPU time
per kernel name of each, side by side, and the step's total.

    python plots/h100/drop-in/train_profile.py OUT_DIR [--no-fuse] [--ratio ROUNDS]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

from matmul.harness import drop_in
from matmul.kernels import swiglu


def kernel_times(step) -> tuple[dict[str, float], float]:
    """GPU microseconds per kernel name over one call of ``step`` (after two warm-up calls)."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    per_name: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_name[event.name[:90]] += event.device_time
    return dict(per_name), sum(per_name.values())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--no-fuse", action="store_true", help="convert without fusing gate and up")
    parser.add_argument("--ratio", type=int, default=0, help="then the drop-in's training row, this many rounds")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import matmul

    reference, switched, conversion = drop_in.llama_pair(torch.float16)
    if args.no_fuse:  # every projection its own linear: the activation's split is torch's own
        conversion.undo()
        matmul.nn.convert(switched, fuse_gate_up=False)
    ids = torch.randint(0, reference.config.vocab_size, drop_in.TRAIN, device="cuda")
    steps = drop_in.training_steps({"ours": switched, "theirs": reference}, ids)
    switched(input_ids=ids, labels=ids).loss.backward()  # the step's shapes, first seen here: tuned in the background
    switched.zero_grad(set_to_none=True)
    print("settle:", drop_in.settle(), flush=True)
    print("swiglu kernels built:", swiglu.wait_until_built(torch.float16), flush=True)
    if args.ratio:  # the drop-in's row (steps back to back; one step's gradients against float32's)
        row = drop_in.training(reference, switched, conversion, args.ratio)
        print(json.dumps({k: v for k, v in row.items() if k != "ratios"}), flush=True)
        (args.out / "train_ratio.json").write_text(json.dumps(row, indent=1))
    results = {}
    for name in ("theirs", "ours", "theirs", "ours"):
        per_name, total = kernel_times(steps[name])
        results[name] = {"total_us": total, "kernels": per_name}
        print(f"{name}: {total / 1e3:.2f} ms of GPU time", flush=True)
    names = sorted(set(results["ours"]["kernels"]) | set(results["theirs"]["kernels"]))
    rows = sorted(
        ((n, results["ours"]["kernels"].get(n, 0.0), results["theirs"]["kernels"].get(n, 0.0)) for n in names),
        key=lambda r: -abs(r[1] - r[2]),
    )
    lines = [f"{'kernel':90s} {'ours us':>10s} {'theirs us':>10s}"]
    lines += [f"{n:90s} {o:10.1f} {t:10.1f}" for n, o, t in rows[:40]]
    lines.append(f"{'total':90s} {results['ours']['total_us']:10.1f} {results['theirs']['total_us']:10.1f}")
    table = "\n".join(lines)
    print(table, flush=True)
    (args.out / "train_profile.txt").write_text(table + "\n")
    (args.out / "train_profile.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
