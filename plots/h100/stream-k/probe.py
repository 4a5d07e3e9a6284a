"""Hopper V5 against its stream-K option (``v5.STREAM_K``), timed with cuBLAS in one window and not
checked, so that a build with a piece of the fixup cut out (wrong results by design) can be timed
too: the ablations of ``README.md`` are this script run on a tree where ``pipeline/stream_k.py``
was edited as that file says.

    source .gpu/env.sh && python plots/h100/stream-k/probe.py LABEL 4096x4096x4096,8192x8192x2048

float16; one window per shape (``timing.interleaved_ms``: the three launched in turn, L2 flushed by
reading before each launch, 200 ms of warm-up, then 300 ms); medians of each one's times."""

import functools
import sys

import torch

from matmul.kernels import versions
from matmul.measure.correctness import poisoned_output, random_operands
from matmul.measure.timing import interleaved_ms


def main():
    label, shapes = sys.argv[1], sys.argv[2].split(",")
    v5 = versions.load("sm_90a", "v5")
    for shape in shapes:
        m, n, k = map(int, shape.split("x"))
        a, b = random_operands(m, n, k, torch.float16)
        out = poisoned_output(m, n, torch.float16)
        runs = [
            functools.partial(torch.matmul, a, b.T),
            functools.partial(versions.run, v5, a, b, out, config=v5.REPRESENTATIVE),
            functools.partial(versions.run, v5, a, b, out, config=v5.STREAM_K),
        ]
        cublas, plain, stream_k = (t * 1e3 for t in interleaved_ms(runs, warmup_ms=200, repeat_ms=300))
        print(
            f"{label:>12} {shape:>16}: cuBLAS {cublas:7.1f} us  V5 {plain:7.1f} us  "
            f"stream-K {stream_k:7.1f} us ({plain / stream_k:.3f}x V5)",
            flush=True,
        )


if __name__ == "__main__":
    main()
