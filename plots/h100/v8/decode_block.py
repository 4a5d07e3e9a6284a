"""A transformer block's decode step with int4 weights, as a serving engine runs it: one Llama
decoder layer of Llama-3-8B's widths (hidden 4096, MLP 14336, 32 heads, 8 key/value heads; the
``transformers`` model of the drop-in bench with one layer, its embedding and final norm, no LM
head), a static KV cache holding 1024 tokens, batch 1 and 16, each step captured in a CUDA graph.

* ours: the copy switched by ``matmul.nn.convert(model, weights="int4")``: every projection's
  weight packed by ``matmul.quantize`` (one scale per 128 columns) and run by ``matmul.linear(x, qw)``
  (V8 at these token counts, each of its kernels built by the call's build child and waited for
  before the step runs and is captured: ``v8_built`` says whether all were);
* theirs: the same block in float16 through torch (cuBLAS), unquantized.

Both steps are timed in back-to-back windows of graph replays, alternating (``harness.model.compare``:
the ratio is theirs over ours), and again eager (``eager_*``: each projection's host time to issue
its call counts there, as in a model run without graphs), and one replay of each under torch's
profiler splits its GPU time into the projections and the rest. The output (the block's last
hidden state) is compared three ways: ours against the same block with the dequantized weights
run by torch (the kernel's own error), ours against the float16 block, and the dequantized block
against the float16 block (the quantization's own error, which the second should match).

    python plots/h100/v8/decode_block.py OUT_DIR [--rounds 10] [--batches 1,16] [--dtype float16]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

import matmul
from matmul.harness import drop_in
from matmul.harness import model as model_bench
from matmul.quant import linear as quant_linear

CONTEXT = 1024  # tokens in the KV cache before the timed step


def swap_linears(model: torch.nn.Module, make) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, make(child))
                count += 1
    return count


def dequantized(layer: torch.nn.Linear) -> torch.nn.Linear:
    """The layer with the weight its int4 form stands for (``qw.dequantize()``), run by torch."""
    with torch.no_grad():
        layer.weight.copy_(matmul.quantize(layer.weight, format="int4").dequantize())
    return layer


def wait_for_v8(model: torch.nn.Module, batch: int) -> bool:
    """Wait until V8's kernel for each quantized projection of ``model`` at ``batch`` tokens is built
    (by the call's build child, in parallel): until then the call widens the weight for cuBLAS, and
    a graph captured meanwhile would keep that path. Whether every one was built."""
    keys = set()
    for layer in model.modules():
        if isinstance(layer, matmul.nn.QuantizedLinear):
            qw = layer.weight
            keys.add(quant_linear.kernel_key(qw.dtype, qw.format, quant_linear.config_for(batch, *qw.shape, qw.format)))
    return all(quant_linear.wait_until_all_built((dtype, fmt, dict(config)) for dtype, fmt, config in keys))


def relative(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.float(), y.float()
    return float((x - y).norm() / y.norm())


def decode_step(model, batch: int, dtype):
    """A function running one decode step of ``model`` (a ``LlamaModel``) after a 1024-token prompt
    held in a static cache; the cache's prompt is written once, by a prefill."""
    from transformers import StaticCache

    cache = StaticCache(model.config, batch_size=batch, max_cache_len=CONTEXT + 8, device="cuda", dtype=dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (batch, CONTEXT), device="cuda", generator=gen)
    token = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda", generator=gen)
    model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(CONTEXT, device="cuda"))
    position = torch.full((1,), CONTEXT, device="cuda")
    return lambda: model(input_ids=token, past_key_values=cache, cache_position=position).last_hidden_state


def gpu_time_by_kind(step) -> dict[str, float]:
    """GPU microseconds of one call of ``step`` (a graph replay) by kind of kernel: the projections
    (tilus's kernels; cuBLAS's GEMM/GEMV kernels) and everything else (attention, norms, rotary
    embedding, the cache update, elementwise)."""
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kinds = {"projections": 0.0, "other": 0.0}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name.lower()
            projection = "tilus" in name or "gemm" in name or "gemv" in name or "nvjet" in name
            kinds["projections" if projection else "other"] += event.device_time
    return kinds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    from transformers import LlamaModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        reference = LlamaModel(drop_in.llama_config(layers=1)).to(dtype).eval()
    ours = copy.deepcopy(reference)
    conversion = matmul.nn.convert(ours, weights="int4")  # the README's one line
    swapped = len(conversion.swapped)
    widened = copy.deepcopy(reference)
    swap_linears(widened, dequantized)
    rows = []
    with torch.inference_mode():
        for batch in (int(b) for b in args.batches.split(",")):
            v8_built = wait_for_v8(ours, batch)  # before the eager outputs and the capture
            steps = {
                name: decode_step(model, batch, dtype)
                for name, model in (("ours", ours), ("theirs", reference), ("widened", widened))
            }
            outputs = {name: step().clone() for name, step in steps.items()}
            graphed = {name: drop_in._graphed(steps[name]) for name in ("ours", "theirs")}
            replayed = graphed["ours"]().clone()
            result = model_bench.compare(graphed["ours"], graphed["theirs"], args.rounds)
            eager = model_bench.compare(steps["ours"], steps["theirs"], args.rounds)  # the host's pace too
            row = {
                "batch": batch,
                "context": CONTEXT,
                "dtype": args.dtype,
                "linears_int4": swapped,
                "v8_built": v8_built,
                "int4_us": result["matmul_ms"] * 1e3,
                "fp16_us": result["torch_ms"] * 1e3,
                "ratio": result["ratio"],
                "ratios": result["ratios"],
                "eager_int4_us": eager["matmul_ms"] * 1e3,
                "eager_fp16_us": eager["torch_ms"] * 1e3,
                "eager_ratio": eager["ratio"],
                "error_vs_dequantized_block": relative(outputs["ours"], outputs["widened"]),
                "error_vs_fp16_block": relative(outputs["ours"], outputs["theirs"]),
                "quantization_error": relative(outputs["widened"], outputs["theirs"]),
                "graph_replay_vs_eager": relative(replayed, outputs["ours"]),
                "int4_gpu_us": gpu_time_by_kind(graphed["ours"]),
                "fp16_gpu_us": gpu_time_by_kind(graphed["theirs"]),
            }
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "ratios"}), flush=True)
            (args.out / "decode_block.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
