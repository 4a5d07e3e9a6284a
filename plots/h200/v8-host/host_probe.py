"""The host's time to issue one int4 projection, as a model without CUDA graphs issues it, beside
torch's fp16 call: ``matmul.linear(x, qw)`` (a signature seen before: the kept launch,
``quant_linear._launches``), the same with ``out=`` (the full path on every call), V8's launch
function alone (what no Python path can go below), and ``torch.matmul(x, w.T)`` / ``F.linear`` on
the unquantized weight. Each a loop of calls with the GPU running them (``harness.model.host_us``).

    python plots/h200/v8-host/host_probe.py OUT_DIR [--shapes 4096x4096,28672x4096] [--tokens 1,16]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import matmul
from matmul.harness.model import host_us
from matmul.measure.correctness import TOLERANCE, relative_error
from matmul.quant import linear as quant_linear


def probe(m: int, n: int, k: int, dtype) -> dict:
    x = torch.empty(m, k, dtype=dtype, device="cuda").uniform_(-1, 1)
    w = torch.empty(n, k, dtype=dtype, device="cuda").normal_(0, 0.05)
    qw = matmul.quantize(w, format="int4")
    config = quant_linear.config_for(m, n, k, "int4")
    row = {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "config": config}
    row["v8_built"] = quant_linear.wait_until_built(dtype, "int4", config)
    y = matmul.linear(x, qw)  # the full path, which keeps the launch
    row["kept"] = (x.shape, x.stride(), x.dtype, x.device) in quant_linear._launches.get(qw, {})
    row["error"] = relative_error(matmul.linear(x, qw), x.float() @ qw.dequantize().float().T)
    row["correct"] = row["error"] <= TOLERANCE[dtype] and y.shape == (m, n)
    out = torch.empty(m, n, dtype=dtype, device="cuda")
    kernel = quant_linear.built_kernel(x, qw)
    row["host_us"] = {
        "matmul.linear(x, qw)": host_us(lambda: matmul.linear(x, qw)),
        "quant_linear.linear(x, qw, out=out)": host_us(lambda: quant_linear.linear(x, qw, out=out)),
        "torch.matmul(x, w.T)": host_us(lambda: torch.matmul(x, w.T)),
        "F.linear(x, w)": host_us(lambda: torch.nn.functional.linear(x, w)),
    }
    if kernel is not None:
        args = (m, n, k, x, qw.packed, out, k, qw.packed.stride(0), n, 0, qw.scales)
        row["host_us"]["V8's launch function alone"] = host_us(lambda: kernel(*args))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--shapes", default="4096x4096,28672x4096")
    parser.add_argument("--tokens", default="1,16")
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for m in (int(t) for t in args.tokens.split(",")):
            rows.append(probe(m, n, k, dtype))
            print(json.dumps(rows[-1], default=str), flush=True)
            (args.out / "host_probe.json").write_text(json.dumps(rows, indent=1, default=str))
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
