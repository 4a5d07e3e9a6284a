"""The Llama of ``python -m matmul drop-in`` switched two ways in one process, timed against each
other: ``convert(fuse_gate_up=True)`` and ``convert(fuse_gate_up=True, fuse_qkv=True)``; what the
q, k, v fusion alone changes, on the same kernel choices (and torch's unswitched model beside them).

    python plots/h200/qkv/qkv_probe.py OUT [--rounds 5]     # OUT/qkv_probe.json

Run with ``MATMUL_TUNE=off`` where every bucket's instant choice should stay fixed through the run
(a fresh machine: cuBLAS for every product but the swiglu, whose kernel is the project's)."""

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    dtype = torch.float16
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    with torch.device("cuda"):
        torch_model = LlamaForCausalLM(drop_in.llama_config()).to(dtype)
    separate, fused = copy.deepcopy(torch_model), copy.deepcopy(torch_model)
    matmul.nn.convert(separate, fuse_gate_up=True)
    matmul.nn.convert(fused, fuse_gate_up=True, fuse_qkv=True)
    vocab = torch_model.config.vocab_size
    rows = []

    def row(kind, shape, with_qkv, without_qkv, unswitched=None):
        entry = {"kind": kind, "shape": shape, "logits_error": drop_in._relative(with_qkv(), without_qkv())}
        entry["qkv_over_separate"] = model_bench.compare(with_qkv, without_qkv, args.rounds)
        if unswitched is not None:
            entry["qkv_over_torch"] = model_bench.compare(with_qkv, unswitched, args.rounds)
        rows.append(entry)
        print(
            f"{kind} {shape}: fused qkv {entry['qkv_over_separate']['ratio']:.3f}x the separate projections"
            + (f", {entry['qkv_over_torch']['ratio']:.3f}x torch" if unswitched is not None else ""),
            flush=True,
        )

    with torch.inference_mode():
        for batch, tokens in drop_in.PREFILL:
            ids = torch.randint(0, vocab, (batch, tokens), device="cuda")
            runs = [
                lambda m=m, ids=ids: m(input_ids=ids, use_cache=False).logits for m in (fused, separate, torch_model)
            ]
            row("prefill", [batch, tokens], *runs)
        for batch in drop_in.DECODE_BATCHES:
            prompt, token = drop_in._decode_inputs(vocab, batch)
            with_qkv, without_qkv = drop_in._decode_steps(fused, separate, prompt, token, dtype)
            row("decode eager", [batch, 1], with_qkv, without_qkv)
            row("decode graph", [batch, 1], drop_in._graphed(with_qkv), drop_in._graphed(without_qkv))
    ids = torch.randint(0, vocab, drop_in.TRAIN, device="cuda")
    steps = drop_in.training_steps({"fused": fused, "separate": separate}, ids)
    entry = {"kind": "train", "shape": list(drop_in.TRAIN)}
    entry["qkv_over_separate"] = model_bench.compare(steps["fused"], steps["separate"], max(3, args.rounds // 2))
    rows.append(entry)
    print(f"train {drop_in.TRAIN}: fused qkv {entry['qkv_over_separate']['ratio']:.3f}x the separate projections")
    args.out.mkdir(parents=True, exist_ok=True)
    machine = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "argv": sys.argv}
    (args.out / "qkv_probe.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
