"""Where the switched Llama's training step spends the time that makes it 0.99x torch's.

The drop-in's training row (``python -m matmul drop-in``, ``matmul.harness.drop_in.training``) on
the same pair of models (``drop_in.llama_pair``: random weights, fp16, two layers, switched with
``matmul.nn.convert(..., fuse_gate_up=True, fuse_qkv=True)``), one step of each model under
``torch.profiler``: the GPU kernels of each step by name (time, count), their sum, and the step's
wall time; and the same steps timed back to back (``model.compare``) in the same process.

    python plots/h200/train-profile/profile_train.py OUT [--dtype float16] [--rounds 6]

Writes OUT/train-profile-<dtype>.json (per kernel: name, calls, total us, for each model) and
OUT/train-profile-<dtype>.txt (torch.profiler's tables).
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from matmul.harness import drop_in
from matmul.harness import model as model_bench


def kernels(prof) -> list[dict]:
    """The profile's GPU kernels by name: calls and total microseconds, longest first."""
    rows = {}
    for event in prof.events():
        if event.device_type.name != "CUDA":
            continue
        row = rows.setdefault(event.name, {"name": event.name, "calls": 0, "us": 0.0})
        row["calls"] += 1
        row["us"] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    return sorted(rows.values(), key=lambda r: -r["us"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    reference, switched, _ = drop_in.llama_pair(dtype)
    ids = torch.randint(0, reference.config.vocab_size, drop_in.TRAIN, device="cuda")
    steps = drop_in.training_steps({"ours": switched, "theirs": reference}, ids)
    for step in steps.values():  # the first calls, and the tuning they start
        step()
    torch.cuda.synchronize()
    settled = drop_in.settle_and_say("train")
    result = {"dtype": args.dtype, "shape": list(drop_in.TRAIN), "settled": settled, "profiles": {}}
    tables = []
    for name, step in steps.items():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        rows = kernels(prof)
        result["profiles"][name] = {"kernel_us": sum(r["us"] for r in rows), "kernels": rows}
        tables.append(f"== {name}\n" + prof.key_averages().table(sort_by="cuda_time_total", row_limit=40))
        print(
            f"{name}: {len(rows)} kernel names, {sum(r['calls'] for r in rows)} launches, "
            f"{sum(r['us'] for r in rows) / 1e3:.2f} ms of kernels",
            flush=True,
        )
    result["compare"] = model_bench.compare(steps["ours"], steps["theirs"], args.rounds)
    print(
        f"step: ours {result['compare']['matmul_ms']:.2f} ms, torch {result['compare']['torch_ms']:.2f} ms,"
        f" ratio {result['compare']['ratio']:.3f}",
        flush=True,
    )
    (args.out / f"train-profile-{args.dtype}.json").write_text(json.dumps(result, indent=1, default=str))
    (args.out / f"train-profile-{args.dtype}.txt").write_text("\n\n".join(tables))


if __name__ == "__main__":
    sys.exit(main())
