"""What the L2 flush does to the time of a kernel that streams its weight (H100, float16).

cuBLAS, Hopper V7 and ``torch.amax`` of the weight at M in {1, 16, 64, 128} on the three bar
weights, each timed three ways: after a flush that writes 256 MiB ("dirty"), after one that reads
256 MiB ("clean"), and back to back over enough distinct copies of the operands to overflow L2,
replayed from one CUDA graph ("rotating": no launch gaps, no flush). Also a 32 MiB and a 512 MiB
copy and an empty kernel under both flushes. Writes $OUT/probe.json.

    source .gpu/env.sh && python plots/h100/skinny/flush_methods.py
"""

import json
import os
import statistics

import torch

from matmul.harness.roofline import launcher, prebuild
from matmul.kernels import versions
from matmul.measure.correctness import poisoned_output, random_operands, reference, relative_error
from matmul.measure.timing import L2Flush

KEYS = ("block_m", "warpgroups", "split", "stages")
CONFIGS = {
    1: [(16, 1, 2, 8)],
    16: [(16, 1, 2, 8)],
    64: [(64, 1, 2, 10), (64, 2, 2, 6)],
    128: [(128, 1, 2, 6), (128, 2, 2, 3)],
}


def timed(fn, flush, turns=60):
    """Median of ``turns`` launches (the first 10 left out), each after ``flush``, in microseconds."""
    fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(turns)]
    for begin, end in events:
        flush()
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(b.elapsed_time(e) * 1e3 for b, e in events[10:])


def rotating(fns, replays=20):
    """Microseconds per launch of ``fns`` (one per copy of the operands) captured in one CUDA graph."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    for _ in range(3):
        graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1e3 / (replays * len(fns))


def three_ways(make, copies, flushes):
    return {name: timed(make(0), flush) for name, flush in flushes.items()} | {
        "rotating": rotating([make(i) for i in range(copies)])
    }


def measure(module, m, n, k, flushes):
    copies = max(4, (384 << 20) // (n * k * 2) + 1)  # more than L2 holds, many times over
    ops = [random_operands(m, n, k, torch.float16) for _ in range(copies)]
    outs = [poisoned_output(m, n, torch.float16) for _ in range(copies)]
    row = {"m": m, "n": n, "k": k, "copies": copies}
    row["cublas"] = three_ways(lambda i: lambda: torch.matmul(ops[i][0], ops[i][1].T, out=outs[i]), copies, flushes)
    row["amax"] = three_ways(lambda i: lambda: torch.amax(ops[i][1]), copies, flushes)
    for c in CONFIGS[m]:
        config = dict(zip(KEYS, c))
        entry = three_ways(lambda i: launcher(module, ops[i][0], ops[i][1], outs[i], config), copies, flushes)  # noqa: B023
        entry["err"] = relative_error(outs[0], reference(*ops[0]))
        row["v7 " + "/".join(map(str, c))] = entry
    return row


def main():
    module = versions.load("sm_90a", "v7")
    prebuild(module, [dict(zip(KEYS, c)) for c in {c for cs in CONFIGS.values() for c in cs}], [torch.float16])
    flushes = {"dirty": L2Flush("write"), "clean": L2Flush("read")}
    rows = []
    for nbytes in (32 << 20, 512 << 20):
        src = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda").random_()
        dst = torch.empty_like(src)
        us = {name: timed(lambda: dst.copy_(src), flush) for name, flush in flushes.items()}  # noqa: B023
        rows.append(
            {"what": f"copy {nbytes >> 20} MiB", **us, **{f"{k}_tbs": 2 * nbytes / v / 1e6 for k, v in us.items()}}
        )
    rows.append({"what": "empty", **{name: timed(lambda: torch.cuda._sleep(0), f) for name, f in flushes.items()}})
    for n, k in ((4096, 4096), (6144, 4096), (4096, 14336)):
        for m in (1, 16, 64, 128):
            rows.append(measure(module, m, n, k, flushes))
            print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
