"""The consumer's K loop in SASS, with and without the tilus fix ``wgmma_uniform_descriptors``: for
each kernel, the instructions from the loop's head to its backward branch (``compiler.mma_loop``),
and how many of them are moves to uniform registers (R2UR). Builds with sm_90a's compiler, no GPU
needed; each side in a tilus cache of its own.

    python plots/h200/uniform-descriptors/sass_probe.py [OUT_DIR] [--versions v7,v8]  # sass-probe.txt, .json

Needs ``cuobjdump`` and ``nvdisasm`` (PATH or NVIDIA's wheels, as ``tilus_fixes.keep_ptx`` finds them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from matmul.build.compiler import mma_loop

# the kernels whose loops the rows run: V5/V6's 7-stage narrow tile, V6's square tile and its
# ping-pong, V7's winners at 64-256 tokens
KERNELS = [
    ("v5", dict(block_m=128, block_n=96, block_k=64, stages=7, group=16)),
    ("v6", dict(block_m=128, block_n=256, block_k=64, stages=4, group=8)),
    ("v6", dict(block_m=128, block_n=128, block_k=64, stages=6, group=8, pingpong=True)),
    ("v7", dict(block_m=128, warpgroups=1, split=1, stages=8, multicast=2)),
    ("v7", dict(block_m=64, warpgroups=1, split=1, stages=13, multicast=2)),
    ("v7", dict(block_m=128, warpgroups=1, split=2, stages=6, multicast=1)),
    ("v7", dict(block_m=64, warpgroups=2, split=1, stages=8, multicast=1)),
    # V8 (int4 weights widened into wgmma's A registers: the A-in-registers form) at 1 and 16 tokens
    ("v8", dict(block_m=8, warpgroups=1, split=2, stages=4, chunk=64, interleave=1)),
    ("v8", dict(block_m=16, warpgroups=1, split=2, stages=4, chunk=64, interleave=1)),
]


def build(kernels, with_fix: bool, cache: str) -> list[dict]:
    """Runs in a child process (the fix must be applied before tilus builds anything there)."""
    code = f"""
import contextlib, json
import tilus
from matmul import tilus_fixes
from matmul.build import compiler
from matmul.kernels import versions
out = []
with contextlib.nullcontext() if {with_fix} else tilus_fixes.disabled("wgmma_uniform_descriptors"):
    for version, config in {kernels!r}:
        result = compiler.build_config(versions.load("sm_90a", version), "sm_90a", config, tilus.float16)
        out.append(dict(ok=result.ok, error=result.error[-400:], dir=str(result.program_dir),
                        registers=result.registers))
print(json.dumps(out))
"""
    env = dict(os.environ, MATMUL_CACHE_DIR=cache)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("OUT", "/tmp"), type=Path)
    parser.add_argument("--versions", default="", help="only these versions' kernels (comma-separated)")
    args = parser.parse_args()
    out_dir = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    kernels = [k for k in KERNELS if not args.versions or k[0] in args.versions.split(",")]
    rows, lines = [], []
    sides = {}
    for with_fix in (False, True):
        sides[with_fix] = build(kernels, with_fix, tempfile.mkdtemp(prefix="uniform-desc-"))
    for (version, config), before, after in zip(kernels, sides[False], sides[True]):
        row = {"version": version, "config": config}
        for name, built in (("before", before), ("after", after)):
            if not built["ok"]:
                row[name] = {"error": built["error"]}
                continue
            loop = mma_loop((Path(built["dir"]) / "module" / "source.sass").read_text())
            row[name] = {
                "instructions": len(loop),
                "r2ur": sum(t.split()[0] == "R2UR" or t.split()[-1:] == ["R2UR"] for t in loop),
                "shfl": sum("SHFL" in t for t in loop),
                "registers": built["registers"],
            }
        rows.append(row)
        knobs = ",".join(f"{k}={v}" for k, v in config.items())
        lines.append(f"{version}:{knobs}  before {row['before']}  after {row['after']}")
        print(lines[-1], flush=True)
    (out_dir / "sass-probe.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "sass-probe.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
