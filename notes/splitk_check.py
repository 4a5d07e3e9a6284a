"""Split-K on the GPU, piece by piece.

    python notes/splitk_check.py shapes          # every test shape x every configuration, synchronized
    python notes/splitk_check.py one M N K SPLITS  # one launch (e.g. under compute-sanitizer)
    python notes/splitk_check.py time            # every configuration vs cuBLAS on the skinny LLM shapes
"""

import sys

import torch

from matmul import autotune, versions
from matmul.check import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from matmul.timing import median_ms

sys.path.insert(0, "tests")
from test_gpu_correctness import SHAPES  # noqa: E402

module = versions.load("sm_90a", "splitk")


def one(m, n, k, config):
    print(f"{m}x{n}x{k} {config}", end=" ", flush=True)
    a, b = random_operands(m, n, k, torch.float16)
    out = versions.run(module, a, b, poisoned_output(m, n, torch.float16), config=config)
    torch.cuda.synchronize()
    error = relative_error(out, reference(a, b))
    print(f"error {error:.3g}", "OK" if error <= TOLERANCE[torch.float16] else "WRONG", flush=True)


what = sys.argv[1]
if what == "shapes":
    for m, n, k in SHAPES:
        for config in versions.space(module):
            one(m, n, k, config)
elif what == "one":
    m, n, k, splits = map(int, sys.argv[2:6])
    one(m, n, k, {**module.REPRESENTATIVE, "splits": splits})
elif what == "time":
    for m, n, k in ((128, 4096, 4096), (128, 1024, 4096), (128, 14336, 4096), (128, 4096, 14336), (1024, 1024, 4096)):
        a, b = random_operands(m, n, k, torch.float16)
        out = poisoned_output(m, n, torch.float16)
        cublas = median_ms(lambda: torch.matmul(a, b.T))
        for config in versions.space(module):
            script = versions.kernel(module, torch.float16, config)
            args = autotune.launch_args(a, b, out)
            script(*args)  # built and launched once, then timed without the per-call Python of versions.run
            ms = median_ms(lambda: script(*args))
            print(f"{m}x{n}x{k} {config}: {ms * 1000:.1f} us = {cublas / ms:.3f}x cuBLAS ({cublas * 1000:.1f} us)",
                  flush=True)
elif what == "profile":  # one launch per configuration, for ncu
    m, n, k = map(int, sys.argv[2:5])
    a, b = random_operands(m, n, k, torch.float16)
    out = poisoned_output(m, n, torch.float16)
    for config in versions.space(module):
        versions.run(module, a, b, out, config=config)
    torch.matmul(a, b.T)
    torch.cuda.synchronize()
