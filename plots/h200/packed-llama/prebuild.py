"""Build, on the CPU machine, the V8 kernels the drop-in Llama switched with packed weights runs
(``python -m matmul drop-in --parts llama-<format>``): the call's configuration of every product of
the model at its decode and prefill token counts, and the widening kernel its longer prefills take,
into ``$MATMUL_CACHE_DIR``, as the call's build child builds them, so that a GPU run loads them:
    MATMUL_CACHE_DIR=$PWD/.cache/pl python plots/h200/packed-llama/prebuild.py --formats int6,fp8_e4m3 --dtypes float16
"""

import argparse
import sys
import time
from pathlib import Path

import torch

from matmul.build import parallel
from matmul.harness import drop_in
from matmul.quant import linear as quant_linear

sys.path.insert(0, str(Path(__file__).parents[1] / "v8-scale-after"))
import prebuild  # noqa: E402 (its build: one kernel as the call's build child builds it)

# the drop-in Llama's products, [N, K] (q, k and v fused), and the token counts its rows reach V8 with
HIDDEN, INTERMEDIATE, VOCAB, KV = 4096, 14336, 128256, 1024
PRODUCTS = (
    (HIDDEN + 2 * KV, HIDDEN),
    (HIDDEN, HIDDEN),
    (INTERMEDIATE, HIDDEN),
    (HIDDEN, INTERMEDIATE),
    (VOCAB, HIDDEN),
)
TOKENS = sorted({*drop_in.DECODE_BATCHES, *(b * t for b, t in drop_in.PACKED_PREFILL)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", default=",".join(drop_in.PACKED_FORMATS))
    parser.add_argument("--dtypes", default="float16,bfloat16")
    args = parser.parse_args()
    jobs = set()
    for fmt in args.formats.split(","):
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            jobs.add(("widen", dtype, fmt, ()))
            for m in TOKENS:
                for n, k in PRODUCTS:
                    if m <= quant_linear.max_tokens(fmt):
                        key = quant_linear.kernel_key(dtype, fmt, quant_linear.config_for(m, n, k, fmt))
                        jobs.add(("v8", *key))
    jobs = sorted(jobs, key=str)
    print(f"{len(jobs)} kernels", *jobs, sep="\n", flush=True)
    start = time.time()
    parallel.in_forked_processes(prebuild.build, jobs)
    print(f"built in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
