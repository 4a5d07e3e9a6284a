"""Hopper V7 with the weight tile multicast across a cluster against V7 without it and cuBLAS, at
M in {64, 128, 256} on the five decode weights, both dtypes. Fixed configurations, no tuning: per M,
those of V7 the roofline harness would time there (``roofline.candidates``), split into "old" (no
multicast), "mc" (multicast, no split of K) and "both" (a cluster of split x multicast CTAs); the
last two only where no CTA of a cluster gets a token tile wholly past M. Each is checked first;
then cuBLAS and every configuration are timed in ``--rounds`` windows (``timing.interleaved_ms``,
the order reversed every other window), each kernel's median kept. Prints a line per shape and the
geomean ratios; writes ``OUT/multicast.json``. ``--others`` times V5's and V6's spaces at group 16
in the same windows and reports the best of the series per row ("best"), ending with it as a
markdown table (rows M, columns the weights); ``--table FILE`` prints that table from a saved
multicast.json, without a GPU. ``--prebuild`` only builds the kernels into tilus's cache.

    python -m matmul skinny --out DIR [--dtypes float16,bfloat16] [--others] [--rounds 3]
"""

import argparse
import json
import os
import statistics

import torch

from ..kernels import versions
from ..measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from ..measure.timing import interleaved_ms
from . import presets
from .results import DTYPES
from .roofline import candidates, geomean, launcher, prebuild

TOKENS = (64, 128, 256)


def name(config: dict) -> str:
    """block_m/warpgroups/split/stages/multicast"""
    return "/".join(str(config.get(key, 1)) for key in ("block_m", "warpgroups", "split", "stages", "multicast"))


KINDS = ("old", "mc", "both")
OTHERS = ("v5", "v6")  # --others: the big-tile versions, each over its space at group 16


def other_kernels() -> list[tuple]:
    """(module, config, name) of each point of V5's and V6's spaces with rasterization group 16."""
    found = []
    for version in OTHERS:
        module = versions.load("sm_90a", version)
        for config in versions.space(module):
            if config.get("group") == 16:
                found.append((module, config, f"{version} {config['block_m']}x{config['block_n']}"))
    return found


def configs_at(module, m: int) -> tuple[list[dict], list[dict], list[dict]]:
    """(old, mc, both): the configurations worth timing at M without multicast, with it alone, and
    with it and a split of K."""
    found = candidates(module, m)
    old = [c for c in found if c.get("multicast", 1) == 1]
    shared = [
        c
        for c in versions.build_configs(module)  # the combined configurations are EXTRA_CONFIGS
        if c.get("multicast", 1) > 1 and c["block_m"] * (c["multicast"] - 1) < m  # no idle CTA in a cluster
    ]
    mc = [c for c in shared if c["split"] == 1]
    both = [c for c in shared if c["split"] > 1]
    return old, mc, both


def timed_windows(fns, names, rounds: int, window=lambda fns: interleaved_ms(fns, 20.0, 100.0)) -> list[dict]:
    """``rounds`` windows of ``window`` (each function's time in ms, launched in turn), the launch
    order reversed every other window; per window, microseconds by name."""
    windows = []
    for r in range(rounds):
        order = list(range(len(fns))) if r % 2 == 0 else list(range(len(fns)))[::-1]
        times = window([fns[i] for i in order])
        windows.append({names[i]: ms * 1e3 for i, ms in zip(order, times)})
    return windows


def measure(module, m, n, k, dtype, label, others=(), rounds=3):
    a, b = random_operands(m, n, k, dtype)
    ref = reference(a, b)
    cublas_out = torch.empty(m, n, dtype=dtype, device="cuda")
    fns, names = [lambda: torch.matmul(a, b.T, out=cublas_out)], ["cublas"]
    kinds, failed = {}, {}
    kernels = [
        (kind, module, config, name(config))
        for kind, configs in zip(KINDS, configs_at(module, m))
        for config in configs
    ]
    kernels += [("others", other, config, label_of) for other, config, label_of in others]
    for kind, owner, config, called in kernels:
        out = poisoned_output(m, n, dtype)
        fn = launcher(owner, a, b, out, config)
        fn()
        torch.cuda.synchronize()
        error = relative_error(out, ref)
        if not error <= TOLERANCE[dtype]:
            failed[called] = error
            continue
        fns.append(fn)
        names.append(called)
        kinds[called] = kind
    del ref
    windows = timed_windows(fns, names, rounds)
    us = {x: statistics.median(w[x] for w in windows) for x in names}
    row = {"label": label, "m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "us": us}
    row["failed"] = failed
    for kind in (*KINDS, "others", "best"):
        mine = [x for x in names[1:] if kinds[x] == kind or kind == "best"]
        if mine:
            best = min(mine, key=us.get)
            ratios = [w["cublas"] / w[best] for w in windows]  # the chosen kernel's ratio in each window
            row[kind] = {"config": best, "us": us[best], "vs_cublas": us["cublas"] / us[best], "windows": ratios}
    for kind in ("mc", "both"):
        if "old" in row and kind in row:
            row[f"{kind}_vs_old"] = row["old"]["us"] / row[kind]["us"]
    return row


def line(row) -> str:
    def part(kind):
        r = row.get(kind)
        return f"{kind} {r['config']:>14} {r['us']:8.1f} us {r['vs_cublas']:.3f}x" if r else f"{kind} -"

    text = f"{row['label']:>12} M={row['m']:<3} {row['dtype']:>8}  cuBLAS {row['us']['cublas']:8.1f} us  "
    text += f"{part('old')}  {part('mc')}  {part('both')}  mc/old {row.get('mc_vs_old', float('nan')):.3f}"
    text += f"  both/old {row.get('both_vs_old', float('nan')):.3f}"
    if "others" in row:
        text += f"  {part('others')}  {part('best')}"
    if row["failed"]:
        text += f"  FAILED CHECK: {row['failed']}"
    return text


def kernel_of(config_name: str) -> str:
    """The version a row's best kernel belongs to, as the table names it: "V5 96" for V5's 128 x 96
    tile, "V7" or "V7 mc" (with the weight multicast) for V7's ``name`` strings."""
    if config_name.startswith("v"):  # other_kernels' labels: "v5 128x96"
        version, tile = config_name.split()
        return f"{version.upper()} {tile.split('x')[1]}"
    return "V7 mc" if config_name.split("/")[-1] != "1" else "V7"


def best_table(rows: list[dict]) -> str:
    """The best of the series x cuBLAS per (M, weight) as a markdown table, both dtypes in a cell,
    and the geometric mean (and the lowest row) per M and dtype."""
    dtypes = sorted({r["dtype"] for r in rows}, key=lambda d: d != "float16")  # float16 first
    labels = list(dict.fromkeys(r["label"] for r in rows))
    found = {(r["m"], r["label"], r["dtype"]): r["best"] for r in rows if "best" in r}
    lines = [
        "| M | " + " | ".join(labels) + " | geometric mean (lowest) |",
        "| ---: |" + " ---: |" * (len(labels) + 1),
    ]
    for m in sorted({r["m"] for r in rows}):
        cells = []
        for label in labels:
            best = [found.get((m, label, d)) for d in dtypes]
            ratios = " / ".join(f"{b['vs_cublas']:.3f}" if b else "-" for b in best)
            kernels = sorted({kernel_of(b["config"]) for b in best if b})
            cells.append(f"{ratios} ({', '.join(kernels)})")
        means = []
        for d in dtypes:
            mine = [b["vs_cublas"] for (bm, _, bd), b in found.items() if bm == m and bd == d]
            means.append(f"{geomean(mine):.3f} ({min(mine):.3f})" if mine else "-")
        lines.append(f"| {m} | " + " | ".join(cells) + " | " + " / ".join(means) + " |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments (``python -m matmul skinny``)."""
    parser.add_argument("--out", help="directory for multicast.json (default: the current directory)")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated (default: both)")
    parser.add_argument("--others", action="store_true", help="V5's and V6's spaces in the same windows")
    parser.add_argument("--table", metavar="FILE", help="only print the best-of-series table of a saved multicast.json")
    parser.add_argument("--prebuild", action="store_true", help="only build the kernels (no GPU needed), then stop")
    parser.add_argument(
        "--rounds", type=int, default=3, help="windows per row, the median time of each kernel kept (default 3)"
    )


def run(args) -> None:
    if args.table:
        with open(args.table) as f:
            print(best_table(json.load(f)))
        return
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    module = versions.load("sm_90a", "v7")
    used = {name(c): c for m in TOKENS for group in configs_at(module, m) for c in group}
    prebuild(module, list(used.values()), dtypes)
    others = other_kernels() if args.others else []
    for other in {id(o): o for o, _, _ in others}.values():
        prebuild(other, [c for o, c, _ in others if o is other], dtypes)
    if args.prebuild:
        return
    rows = []
    for dtype in dtypes:
        for label, (n, k) in presets.DECODE_PROJECTIONS.items():
            for m in TOKENS:
                rows.append(measure(module, m, n, k, dtype, label, others, args.rounds))
                print(line(rows[-1]), flush=True)
                torch.cuda.empty_cache()
    print(
        "\ngeomean over the five weights (x cuBLAS: old = best V7 without multicast, mc = best with it "
        "and no split, both = best with it and a split)"
    )
    for dtype in dtypes:
        for m in TOKENS:
            mine = [r for r in rows if r["m"] == m and r["dtype"] == str(dtype).removeprefix("torch.")]
            ratio = {kind: geomean(r[kind]["vs_cublas"] for r in mine if kind in r) for kind in KINDS}
            gain = {
                kind: geomean(r[f"{kind}_vs_old"] for r in mine if f"{kind}_vs_old" in r) for kind in ("mc", "both")
            }
            text = "  ".join(f"{kind} {ratio[kind]:.3f}x" for kind in KINDS)
            if others:  # the best of the series per row, and the lowest row
                best = [r["best"]["vs_cublas"] for r in mine]
                text += f"  others {geomean(r['others']['vs_cublas'] for r in mine):.3f}x"
                text += f"  BEST {geomean(best):.3f}x (lowest {min(best):.3f}x)"
            print(f"{str(dtype):>15} M={m:<3}  {text}  mc/old {gain['mc']:.3f}  both/old {gain['both']:.3f}")
    if others:
        print("\nbest of the series x cuBLAS (" + " / ".join(str(d).removeprefix("torch.") for d in dtypes) + ")")
        print(best_table(rows))
    out = args.out or "."
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "multicast.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\nwrote {path}")
