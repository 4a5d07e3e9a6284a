"""Does V8's (or V7's) time at decode sizes depend on the tokens' count with the kernel and grid fixed?

One configuration of V8 (a token tile of ``block_m``; with ``--configs v7:...`` V7 on the 16-bit
weight), one weight, L2 flushed by reading, every
variant of a weight in one window (``interleaved_ms``), each output checked against float32 first:

- ``rows M``: x is [M, K] (as the call passes it): the tokens' TMA boxes hold M rows and the rest
  of the tile lies past the tensor (TMA fills zeros), the output's rows past M are masked;
- ``zero rows``: x is [block_m, K] with rows M.. zero: the same products, every box whole;
- ``all rows``: x is [block_m, K], every row random;
- ``all zero``: x is [block_m, K] of zeros (the tensor core's operands without switching).

    # on the CPU machine, then on the GPU
    MATMUL_CACHE_DIR=DIR python plots/h100/v8/probe_configs.py /tmp/p --build-only \
        --configs 16/1/2/4/64,8/1/2/4/64 --shapes 16x4096x4096
    MATMUL_CACHE_DIR=DIR python plots/h200/v8-tokens/probe_tokens.py OUT
    # V7: its kernels listed (--list) and built by `python -m matmul compile --arch sm_90a --kernels FILE`
    MATMUL_CACHE_DIR=DIR python plots/h200/v8-tokens/probe_tokens.py OUT --configs v7:32/1/2/12/1,64/1/2/12/2
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

import matmul
from matmul.kernels import versions
from matmul.measure.correctness import poisoned_output, relative_error
from matmul.measure.timing import interleaved_ms
from matmul.quant import linear as quant_linear

CONFIG_KEYS = ("block_m", "warpgroups", "split", "stages", "chunk", "interleave")
V7_KEYS = ("block_m", "warpgroups", "split", "stages", "multicast")


def config_list(text: str) -> list[dict]:
    """``block_m/warpgroups/split/stages/chunk[/interleave]``, comma-separated, as ``probe_configs.py``
    (with ``--version v7``: ``block_m/warpgroups/split/stages/multicast``)."""
    if text.startswith("v7:"):
        return [dict(zip(V7_KEYS, map(int, c.split("/")))) for c in text[3:].split(",")]
    return [{"interleave": 1, **dict(zip(CONFIG_KEYS, map(int, c.split("/"))))} for c in text.split(",")]


def v7_launch(w: torch.Tensor, config: dict):
    """V7 (fp16 weight ``w`` [N, K]) in ``config``, as a function of (x, out)."""
    n, k = w.shape
    script = versions.kernel(versions.load("sm_90a", "v7"), w.dtype, config)
    return lambda x, out: script(x.shape[0], n, k, x, w, out, k, k, n, 0)  # noqa: E731 (a launch)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--weights", default="28672x4096,4096x4096")
    parser.add_argument("--tokens", default="1,2,4,8")
    parser.add_argument("--configs", type=config_list, default=config_list("16/1/2/4/64,8/1/2/4/64"))
    parser.add_argument("--list", action="store_true", help="print V7's kernels for `matmul compile --kernels`")
    args = parser.parse_args(argv)
    v7 = "multicast" in args.configs[0]  # V7 on the 16-bit weight, else V8 on int4
    if args.list:
        for config in args.configs:
            print(f"v7|{json.dumps(config, sort_keys=True)}|float16")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = torch.float16
    rows = []
    assert v7 or all(quant_linear.wait_until_all_built((dtype, "int4", c) for c in args.configs))
    for weight in args.weights.split(","):
        n, k = map(int, weight.split("x"))
        gen = torch.Generator().manual_seed(0)
        w16 = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda()
        qw = matmul.quantize(w16)
        w32 = w16.float() if v7 else qw.dequantize().float()
        for config in args.configs:
            if v7:
                launch = v7_launch(w16, config)
            else:
                launch = functools.partial(quant_linear.v8, weight=qw, config=config)
            block_m = config["block_m"]
            fns, names = [], []
            full = torch.randn(block_m, k, generator=gen).to(dtype).cuda()
            variants = {"all rows": full, "all zero": torch.zeros_like(full)}
            for m in (int(t) for t in args.tokens.split(",")):
                if m < block_m:
                    variants[f"rows {m}"] = full[:m].clone()
                    zero_rows = full.clone()
                    zero_rows[m:] = 0
                    variants[f"zero rows {m}"] = zero_rows
            for name, x in variants.items():
                out = poisoned_output(x.shape[0], n, dtype)
                launch(x, out=out)
                error = relative_error(out, x.float() @ w32.T) if x.abs().sum() else out.abs().max().item()
                assert error < 1e-2, (name, error)
                fns.append(functools.partial(launch, x, out=out))
                names.append(name)
            for name, ms in zip(names, interleaved_ms(fns, 50, 400)):
                row = dict(n=n, k=k, config=config, x=name, us=ms * 1e3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "probe_tokens.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
