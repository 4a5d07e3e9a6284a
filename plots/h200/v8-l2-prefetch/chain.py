"""V8's weight prefetch into L2 in a decode-like chain: 16 dependent int4 projections N x N at M
tokens (each output the next input; 16 weights more than L2 holds), each chain captured in a CUDA
graph and replayed back to back, per V8 configuration, beside cuBLAS's float16 chain on the
dequantized weights, in one process. Each chain's last output is checked against float32 first.

    # on the CPU machine (kernels into a cache; configurations as probe_configs.py names them)
    MATMUL_CACHE_DIR=$PWD/.cache/l2p python plots/h200/v8-l2-prefetch/chain.py --build-only
    # on the GPU, the cache carried
    MATMUL_CACHE_DIR=$PWD/.cache/l2p python plots/h200/v8-l2-prefetch/chain.py --out chain.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "h100" / "v8"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "v8-fixed-cost"))
import pdl_probe  # noqa: E402
import probe_configs  # noqa: E402

CONFIGS = "8/1/2/4/64/1,8/1/2/4/64/1/4,8/1/2/4/64/1/8,16/1/2/4/64/1,16/1/2/4/64/1/4"


def parse(text: str) -> list[dict]:
    """Configurations as probe_configs.py names them; a seventh field (the prefetch distance) only
    where the kernel has that knob (at 171f613, README.md): refused, not dropped, elsewhere."""
    configs = []
    for c in text.split(","):
        values = list(map(int, c.split("/")))
        if len(values) > len(probe_configs.CONFIG_KEYS):
            raise SystemExit(f"{c}: V8 here takes {'/'.join(probe_configs.CONFIG_KEYS)} (its prefetch knob is gone)")
        configs.append({"interleave": 1, **dict(zip(probe_configs.CONFIG_KEYS, values))})
    return configs


def config_name(config: dict) -> str:
    return "/".join(str(config[k]) for k in probe_configs.CONFIG_KEYS if k in config)


def chains(m: int, n: int, links: int, configs: list[dict], rounds: int) -> dict:
    import matmul
    from matmul.measure.correctness import relative_error
    from matmul.quant import linear as quant_linear

    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(n, n, generator=gen) / n**0.5).half().cuda() for _ in range(links)]
    packed = [matmul.quantize(w) for w in weights]
    dequantized = [qw.dequantize() for qw in packed]
    x = torch.randn(m, n, generator=gen).half().cuda()
    exact = x.float()
    for w in dequantized:
        exact = exact @ w.float().T
    built = quant_linear.wait_until_all_built([(torch.float16, "int4", c) for c in configs])
    runs = {"cublas": None, **{config_name(c): c for c, ok in zip(configs, built) if ok}}
    graphs, errors = {}, {}
    for name, config in runs.items():
        acts = [x] + [torch.empty(m, n, dtype=torch.float16, device="cuda") for _ in range(links)]
        if config is None:
            steps = [functools.partial(torch.matmul, acts[i], w.T, out=acts[i + 1]) for i, w in enumerate(dequantized)]
        else:
            steps = [
                functools.partial(quant_linear.v8, acts[i], qw, acts[i + 1], config) for i, qw in enumerate(packed)
            ]
        graphs[name] = pdl_probe.captured(steps, acts[-1])
        errors[name] = relative_error(acts[-1], exact)
    times = pdl_probe.replay_rounds(graphs, rounds, links)
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    return {
        "m": m,
        "n": n,
        "links": links,
        "errors": errors,
        "us_per_link": median,
        "x_cublas": {name: median["cublas"] / us for name, us in median.items()},
        "rounds_us": times,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=CONFIGS)
    parser.add_argument("--sizes", default="1x4096,16x4096", help="MxN chains")
    parser.add_argument("--links", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    configs = parse(args.configs)
    sizes = [tuple(map(int, s.split("x"))) for s in args.sizes.split(",")]
    if args.build_only:
        probe_configs.build_all(torch.float16, "int4", [(m, n, n) for m, n in sizes], configs)
        return 0
    results = []
    for m, n in sizes:
        fitting = probe_configs.fitting(configs, m, n)
        result = chains(m, n, args.links, fitting, args.rounds)
        print(json.dumps({k: v for k, v in result.items() if k != "rounds_us"}), flush=True)
        results.append({"gpu": torch.cuda.get_device_name(), **result})
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
