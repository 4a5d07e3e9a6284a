"""Time every configuration of the Hopper versions' autotune spaces against cuBLAS (fp16, square
shapes), each checked against the float32 reference first: to see what a space should hold.
Rough numbers for choosing; the bench (``python -m matmul bench``) is the measurement to report.

    python notes/hopper_configs.py [v1 v2 ...] [--sizes 4096,8192]
"""

import sys

import torch

from matmul import versions
from matmul.check import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from matmul.timing import median_ms, tflops


def main(names, sizes):
    for size in sizes:
        a, b = random_operands(size, size, size, torch.float16)
        ref = reference(a, b)
        out = poisoned_output(size, size, torch.float16)
        cublas = [median_ms(lambda: torch.matmul(a, b.T))]
        rows = []
        for name in names:
            module = versions.load("sm_90a", name)
            for config in versions.space(module):
                out.fill_(float("nan"))
                versions.run(module, a, b, out, config=config)
                error = relative_error(out, ref)
                ms = median_ms(lambda: versions.run(module, a, b, out, config=config)) \
                    if error <= TOLERANCE[torch.float16] else float("nan")
                rows.append((name, config, ms, error))
                print(f"{size}^3 {name} {config}: {tflops(size, size, size, ms):.0f} TFLOPS (error {error:.2g})",
                      flush=True)
        cublas.append(median_ms(lambda: torch.matmul(a, b.T)))
        base = sum(cublas) / 2
        print(f"{size}^3 cuBLAS {tflops(size, size, size, base):.0f} TFLOPS ({cublas[0]:.4f} / {cublas[1]:.4f} ms)")
        for name in names:
            best = min((r for r in rows if r[0] == name), key=lambda r: r[2])
            print(f"BEST {size}^3 {name}: {tflops(size, size, size, best[2]):.0f} TFLOPS = {base / best[2]:.3f}x "
                  f"cuBLAS {best[1]}", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sizes = [4096, 8192]
    for a in sys.argv[1:]:
        if a.startswith("--sizes="):
            sizes = [int(x) for x in a.split("=", 1)[1].split(",")]
    main(args or [f"v{i}" for i in range(1, 7)], sizes)
