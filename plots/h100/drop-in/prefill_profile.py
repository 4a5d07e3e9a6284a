"""Where the switched Llama's prefill spends its time: one forward of each model (the drop-in's
two-layer Llama, ``matmul.nn.convert(fuse_gate_up=True)`` against the unswitched copy) under torch's
profiler, once the background tuning of the first forwards has finished and the plans of the calls
are derived; the GPU time per kernel name of each, side by side, the totals, and the forward's wall
time back to back (``harness.model.compare``, the drop-in's row).

    python plots/h100/drop-in/prefill_profile.py OUT_DIR [--shapes 1x2048,4x2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_profile import kernel_times  # noqa: E402

from matmul.harness import drop_in  # noqa: E402
from matmul.harness import model as model_bench  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--shapes", default="1x2048,4x2048", help="batch x tokens, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
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
    (args.out / "prefill_profile.txt").write_text("\n".join(lines) + "\n")
    (args.out / "prefill_profile.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
