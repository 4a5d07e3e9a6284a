"""Narrower B tiles in V5 and V6 at 64-256 tokens: as many CTAs as SMs where V7's 64-row weight
tiles leave a third of the SMs idle (#26).

At 128 tokens the qkv weight (6144 x 4096) makes 96 of V7's 64-row weight tiles, 96 CTAs on 132
SMs; V5's 128 x 96 tiles make 64. A 128 x 48 tile of V5 (the tokens as wgmma's M, the weight rows as
its N) makes 128, each CTA a quarter less work than V7's. The same for the 4096-row weights at 128
tokens in 128 x 32 tiles (128 CTAs against V7's 64, or 128 with a split). The question is whether
the narrow wgmma (n = 48 or 32) and the token tile each CTA re-reads cost more than the SMs gained.

Each configuration is built outside the tuned space (``versions.kernel`` takes any point), checked
against float32 (fresh random operands, output poisoned), then timed with cuBLAS and the series'
best of the after-loop table (``plots/h200/after-loop/``) in ``--rounds`` windows
(``timing.interleaved_ms``, L2 flushed by reading before each launch), each kernel's median kept.
Writes $OUT/narrow.json and prints a table: x cuBLAS, float16 / bfloat16.

    python plots/h200/narrow-tiles/narrow_probe.py OUT --build-only     # on the CPU machine
    source .gpu/env.sh && python plots/h200/narrow-tiles/narrow_probe.py OUT --rounds 3
"""

import argparse
import json
import os
import statistics

import torch

from matmul.harness.roofline import launcher, prebuild
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from matmul.measure.timing import interleaved_ms

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def v5(block_n, stages, group=16):
    return ("v5", dict(block_m=128, block_n=block_n, block_k=64, stages=stages, group=group))


def v6n(block_n, stages, group=8):
    return ("v6", dict(block_m=128, block_n=block_n, block_k=64, stages=stages, group=group, pair="n"))


def v7(text):
    keys = ("block_m", "warpgroups", "split", "stages", "multicast")
    return ("v7", dict(zip(keys, (int(v) for v in text.split("/")))))


# (M, N, K) -> candidates; the last V7 or V5/V6 entry of each row is the after-loop table's best
ROWS = {
    (128, 6144, 4096): [v5(48, 9), v5(48, 6), v6n(48, 9), v5(64, 8), v7("128/1/1/8/1")],
    (64, 6144, 4096): [v5(48, 9), v6n(48, 9), v7("64/1/2/5/1")],
    (128, 4096, 4096): [v5(32, 10), v6n(32, 10), v7("128/1/2/6/1")],
    (128, 4096, 14336): [v5(32, 10), v6n(32, 10), v7("128/1/2/6/1")],
    (256, 4096, 14336): [v5(64, 8), v5(32, 10), v7("128/1/1/8/2")],
    (256, 6144, 4096): [v5(48, 9), v5(64, 8), ("v6", dict(block_m=128, block_n=96, block_k=64, stages=7, group=16))],
}


def label(version, config):
    if version == "v7":
        return "v7 " + "/".join(
            str(config.get(k, 1)) for k in ("block_m", "warpgroups", "split", "stages", "multicast")
        )
    pair = " pair-n" if config.get("pair") == "n" else ""
    return f"{version}{pair} 128x{config['block_n']} s{config['stages']}"


def all_builds():
    found = {}
    for cands in ROWS.values():
        for version, config in cands:
            found[label(version, config)] = (version, config)
    return found


def build(dtypes):
    by_version = {}
    for version, config in all_builds().values():
        by_version.setdefault(version, []).append(config)
    for version, configs in by_version.items():
        prebuild(versions.load("sm_90a", version), configs, [DTYPES[d] for d in dtypes])


def measure(m, n, k, dtype, cands, rounds):
    a, b = random_operands(m, n, k, dtype)
    ref = reference(a, b)
    cublas_out = torch.empty(m, n, dtype=dtype, device=a.device)
    fns, names, errors = [lambda: torch.matmul(a, b.T, out=cublas_out)], ["cublas"], {}
    for version, config in cands:
        name = label(version, config)
        out = poisoned_output(m, n, dtype)
        try:
            fn = launcher(versions.load("sm_90a", version), a, b, out, config)
            fn()
            torch.cuda.synchronize()
        except Exception as error:  # a configuration that does not build or launch is reported, not timed
            errors[name] = f"{type(error).__name__}: {error}"[:300]
            continue
        errors[name] = relative_error(out, ref)
        if not errors[name] <= TOLERANCE[dtype]:
            continue
        fns.append(fn)
        names.append(name)
    windows = [interleaved_ms(fns, 20.0, 100.0) for _ in range(rounds)]
    us = {name: statistics.median(w[i] for w in windows) * 1e3 for i, name in enumerate(names)}
    return {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "us": us, "errors": errors}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--no-prebuild", action="store_true", help="the kernels are in the cache already")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    os.makedirs(args.out, exist_ok=True)
    if not args.no_prebuild:
        build(dtypes)
    if args.build_only:
        return
    rows = []
    for (m, n, k), cands in ROWS.items():
        for dtype in dtypes:
            rows.append(measure(m, n, k, DTYPES[dtype], cands, args.rounds))
            print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(args.out, "narrow.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}; x cuBLAS (its time over the kernel's), median of {args.rounds} windows")
    for (m, n, k), cands in ROWS.items():
        print(f"\n{m} x {n} x {k}")
        for version, config in cands:
            name = label(version, config)
            cells = []
            for row in rows:
                if (row["m"], row["n"], row["k"]) == (m, n, k):
                    us = row["us"]
                    cells.append(f"{us['cublas'] / us[name]:.3f}" if name in us else f"({row['errors'].get(name)})")
            print(f"  {name:28s} {' / '.join(cells)}")


if __name__ == "__main__":
    main()
