"""Does the host slow down as a process takes on this project? torch.matmul's host time per call
(best of 5 loops of 2000 calls after a sync) at each stage: torch alone, after importing matmul and
tilus, with a cuBLAS plan kept, after tuning five shapes and after running their chosen kernels;
with the cost of matmul()'s lookup keys and the process's thread count. Prints one JSON line per
stage (process_probe.txt, run at 6d50f9e, when it also timed the Python lookup key ``call_key`` that
the native entry has since replaced).

    source .gpu/env.sh && export MATMUL_CACHE_DIR=/tmp/mc && python plots/h100/model/process_probe.py
"""

import gc
import importlib
import json
import os
import time

import torch

SHAPES = [(16, 4096, 4096), (128, 4096, 4096), (16, 256, 256), (128, 1024, 4096), (16, 6144, 4096)]


def host_us(fn, calls=2000, loops=5):
    # matmul.harness.model.host_us's loop, written out: importing it would import matmul before
    # the first stage, which times torch alone
    best = float("inf")
    for _ in range(loops):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def operands(m, n, k):
    return torch.randn(m, k, device="cuda", dtype=torch.float16), torch.randn(n, k, device="cuda", dtype=torch.float16)


def stage(name, small, large, extra=None):
    (x, w), (x2, w2) = small, large
    row = {
        "stage": name,
        "threads": len(os.listdir("/proc/self/task")),
        "torch.matmul 16x256x256": round(host_us(lambda: torch.matmul(x, w.T)), 2),
        "torch.mm 16x256x256": round(host_us(lambda: torch.mm(x, w.T)), 2),
        "torch.matmul 128x4096x4096": round(host_us(lambda: torch.matmul(x2, w2.T)), 2),
        "gc objects": len(gc.get_objects()),
    }
    row.update({key: round(measure(), 2) for key, measure in (extra or {}).items()})
    print(json.dumps(row), flush=True)


def main():
    small, large = operands(16, 256, 256), operands(128, 4096, 4096)
    stage("torch only", small, large)
    matmul = importlib.import_module("matmul")
    from matmul.call import api, launch

    stage("import matmul", small, large)
    importlib.import_module("tilus")
    stage("import tilus", small, large)
    x2, w2 = large
    api._plans.keep(launch.VendorPlan(x2, w2.T, None), x2, w2.T)
    extra = {
        "matmul() cuBLAS 128x4096x4096": lambda: host_us(lambda: matmul.matmul(x2, w2.T)),
        "signature": lambda: host_us(lambda: launch.signature(x2, w2.T, None)),
    }
    stage("cuBLAS route kept", small, large, extra)
    began = time.time()
    matmul.tune(SHAPES)
    print("tune s", time.time() - began, flush=True)
    stage("after tune (cached or tuned in a child)", small, large, extra)
    for m, n, k in SHAPES:
        a, b = operands(m, n, k)
        for _ in range(3):
            matmul.matmul(a, b.T)
        ours = host_us(lambda a=a, b=b: matmul.matmul(a, b.T))
        theirs = host_us(lambda a=a, b=b: torch.matmul(a, b.T))
        print(m, n, k, api.choice(a, b.T)["version"], round(ours, 2), round(theirs, 2), flush=True)
    torch.cuda.synchronize()
    stage("after the chosen kernels ran", small, large, extra)
    gc.collect()
    gc.freeze()
    stage("gc.freeze", small, large, extra)


if __name__ == "__main__":
    main()
