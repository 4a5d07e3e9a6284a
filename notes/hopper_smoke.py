"""First look at one Hopper version on the H100 before the full tests: its representative
configuration on a few shapes (ragged, tall, square), both dtypes, poisoned outputs, one process per
version so that a hang or an illegal instruction stops only that version (run it under `timeout`);
then a rough time of that configuration against cuBLAS at 4096^3 and 8192^3 (fp16; the bench,
``python -m matmul bench``, is the measurement to report).

    python notes/hopper_smoke.py v5 [config as key=value ...]
"""

import sys
import time

import torch

from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from matmul.measure.timing import median_ms, tflops

SHAPES = [(1000, 4095, 17), (17, 1000, 4095), (1, 17, 1), (8191, 1000, 17), (4096, 4096, 4096), (2048, 1536, 1024)]


def main(version: str, config: dict) -> int:
    module = versions.load("sm_90a", version)
    config = {**module.REPRESENTATIVE, **config}
    worst, failed = 0.0, []
    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in SHAPES:
            a, b = random_operands(m, n, k, dtype)
            out = poisoned_output(m, n, dtype)
            start = time.time()
            versions.run(module, a, b, out, config=config)
            torch.cuda.synchronize()
            seconds = time.time() - start
            error = relative_error(out, reference(a, b))
            ok = error <= TOLERANCE[dtype]
            worst = max(worst, error)
            print(f"{version} {str(dtype)[6:]} {m}x{n}x{k}: error {error:.3g} {'ok' if ok else 'FAIL'} "
                  f"({seconds:.1f} s with the build)", flush=True)
            if not ok:
                failed.append((dtype, m, n, k))
    print(f"{version} {config}: {'FAILED ' + str(failed) if failed else 'all ok'}, worst error {worst:.3g}",
          flush=True)
    if failed:
        return 1
    for size in (4096, 8192):
        a, b = random_operands(size, size, size, torch.float16)
        out = poisoned_output(size, size, torch.float16)
        ms = median_ms(lambda: versions.run(module, a, b, out, config=config))
        cublas_ms = median_ms(lambda: torch.matmul(a, b.T))
        print(f"{version} {size}^3 fp16: {tflops(size, size, size, ms):.0f} TFLOPS, cuBLAS "
              f"{tflops(size, size, size, cublas_ms):.0f}: {cublas_ms / ms:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], {k: int(v) for k, v in (arg.split("=") for arg in sys.argv[2:])}))
