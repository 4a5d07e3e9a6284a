"""Hopper V7 with the weight tile multicast across a cluster against V7 without it and cuBLAS, at
M in {64, 128, 256} on the five decode weights, both dtypes (H100). Fixed configurations, no
tuning: per M, the configurations of V7's space the roofline harness would time there
(``roofline.candidates``), split into those without multicast ("old") and those with it ("mc";
only where no CTA of a cluster gets a token tile wholly past M). Each configuration is first
checked against a float32 reference (fresh random operands, output poisoned with NaN); those that
fail are reported and left out. Then cuBLAS and every configuration are timed in one window
(``timing.interleaved_ms``: launched in turn, L2 flushed by reading 256 MiB before each launch).
Prints one line per shape and the geomean ratios; writes $OUT/multicast.json.

    source .gpu/env.sh && python plots/h100/skinny/multicast_bench.py [--dtypes float16,bfloat16]
"""

import argparse
import json
import math
import os

import torch

from matmul.harness import presets
from matmul.harness.roofline import candidates, launcher, prebuild
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from matmul.measure.timing import interleaved_ms

TOKENS = (64, 128, 256)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def name(config: dict) -> str:
    """block_m/warpgroups/split/stages/multicast"""
    return "/".join(str(config.get(key, 1)) for key in ("block_m", "warpgroups", "split", "stages", "multicast"))


def configs_at(module, m: int) -> tuple[list[dict], list[dict]]:
    """(old, mc): the configurations worth timing at M without and with multicast."""
    found = candidates(module, m)
    old = [c for c in found if c.get("multicast", 1) == 1]
    mc = [
        c
        for c in versions.space(module)
        if c.get("multicast", 1) > 1 and c["block_m"] * (c["multicast"] - 1) < m  # no idle CTA in a cluster
    ]
    return old, mc


def measure(module, m, n, k, dtype, label):
    a, b = random_operands(m, n, k, dtype)
    ref = reference(a, b)
    cublas_out = torch.empty(m, n, dtype=dtype, device="cuda")
    fns, names = [lambda: torch.matmul(a, b.T, out=cublas_out)], ["cublas"]
    old, mc = configs_at(module, m)
    kinds, failed = {}, {}
    for kind, configs in (("old", old), ("mc", mc)):
        for config in configs:
            out = poisoned_output(m, n, dtype)
            fn = launcher(module, a, b, out, config)
            fn()
            torch.cuda.synchronize()
            error = relative_error(out, ref)
            if not error <= TOLERANCE[dtype]:
                failed[name(config)] = error
                continue
            fns.append(fn)
            names.append(name(config))
            kinds[name(config)] = kind
    del ref
    us = dict(zip(names, (ms * 1e3 for ms in interleaved_ms(fns, 20.0, 100.0))))
    row = {"label": label, "m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "us": us}
    row["failed"] = failed
    for kind in ("old", "mc"):
        mine = [x for x in names[1:] if kinds[x] == kind]
        if mine:
            best = min(mine, key=us.get)
            row[kind] = {"config": best, "us": us[best], "vs_cublas": us["cublas"] / us[best]}
    if "old" in row and "mc" in row:
        row["mc_vs_old"] = row["old"]["us"] / row["mc"]["us"]
    return row


def line(row) -> str:
    def part(kind):
        r = row.get(kind)
        return f"{kind} {r['config']:>14} {r['us']:8.1f} us {r['vs_cublas']:.3f}x" if r else f"{kind} -"

    text = f"{row['label']:>12} M={row['m']:<3} {row['dtype']:>8}  cuBLAS {row['us']['cublas']:8.1f} us  "
    text += f"{part('old')}  {part('mc')}  mc/old {row.get('mc_vs_old', float('nan')):.3f}"
    if row["failed"]:
        text += f"  FAILED CHECK: {row['failed']}"
    return text


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float16,bfloat16")
    args = parser.parse_args()
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    module = versions.load("sm_90a", "v7")
    used = {name(c): c for m in TOKENS for group in configs_at(module, m) for c in group}
    prebuild(module, list(used.values()), dtypes)
    rows = []
    for dtype in dtypes:
        for label, (n, k) in presets.DECODE_PROJECTIONS.items():
            for m in TOKENS:
                rows.append(measure(module, m, n, k, dtype, label))
                print(line(rows[-1]), flush=True)
                torch.cuda.empty_cache()
    print("\ngeomean over the five weights (x cuBLAS: old = best V7 without multicast, mc = best with it)")
    for dtype in dtypes:
        for m in TOKENS:
            mine = [r for r in rows if r["m"] == m and r["dtype"] == str(dtype).removeprefix("torch.")]
            old = geomean(r["old"]["vs_cublas"] for r in mine if "old" in r)
            mc = geomean(r["mc"]["vs_cublas"] for r in mine if "mc" in r)
            gain = geomean(r["mc_vs_old"] for r in mine if "mc_vs_old" in r)
            print(f"{str(dtype):>15} M={m:<3}  old {old:.3f}x  mc {mc:.3f}x  mc/old {gain:.3f}")
    path = os.path.join(os.environ.get("OUT", "/tmp"), "multicast.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
