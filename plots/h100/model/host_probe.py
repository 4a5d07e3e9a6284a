"""Host time per call of torch's entry points and of matmul()'s cuBLAS path (its plan forced to
cuBLAS, so that no tuning runs): through the native entry (``matmul()``, the builtin where it is
built) and through the Python function it hands unseen calls to; best of 5 loops of 2000 calls
after a sync. Prints one JSON line per shape (host_probe.txt).

    source .gpu/env.sh && python plots/h100/model/host_probe.py
"""

import json

import torch
import torch.nn.functional as F

from matmul.call import api, launch
from matmul.harness.model import host_us  # best of 5 loops of 2000 calls, the GPU drained first


def probe(m, n, k):
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    b = w.T
    plan = launch.VendorPlan(a, b, None)
    api._plans.keep(plan, a, b)  # cuBLAS for this signature, untuned
    fns = {
        "torch.matmul": lambda: torch.matmul(a, b),
        "torch.mm": lambda: torch.mm(a, b),
        "F.linear": lambda: F.linear(a, w),
        "a @ b": lambda: a @ b,
        "matmul() vendor": lambda: api.matmul(a, b),
        "python_matmul() vendor": lambda: api.python_matmul(a, b),
        "Plans.launch": lambda: api._plans.launch(a, b),
        "VendorPlan": lambda: plan(a, b, None),
        "signature": lambda: launch.signature(a, b, None),
    }
    forward = {name: host_us(fn) for name, fn in fns.items()}
    backward = {name: host_us(fn) for name, fn in reversed(fns.items())}  # both orders: the host drifts
    return {name: round(min(forward[name], backward[name]), 2) for name in fns}


if __name__ == "__main__":
    print("native entry:", api.matmul is not api.python_matmul, flush=True)
    for shape in ((16, 256, 256), (128, 4096, 4096)):
        print(*shape, json.dumps(probe(*shape)), flush=True)
