"""V7 configurations for M >= 64, some outside its space (no split, 64- or 128-token tiles), against
cuBLAS, L2 flushed by reading, each launched in turn with the others (H100, float16). Writes
$OUT/cfg.json.

    source .gpu/env.sh && python plots/h100/skinny/configs_m64_256.py
"""

import json
import os

import torch

from matmul.harness.roofline import launcher, prebuild
from matmul.kernels import versions
from matmul.measure.correctness import poisoned_output, random_operands, reference, relative_error
from matmul.measure.timing import interleaved_ms

KEYS = ("block_m", "warpgroups", "split", "stages")


def parse(text):
    return [tuple(int(v) for v in item.split("/")) for item in text.split()]


CONFIGS = {
    1: parse("16/1/2/8 16/1/1/16 16/1/1/13 16/1/2/12"),
    16: parse("16/1/2/8 16/1/1/13"),
    64: parse("64/1/2/10 64/1/2/12 16/1/1/13 16/1/2/8 64/1/1/13"),
    128: parse("128/1/2/6 64/1/1/13 64/1/1/12 64/1/2/12 128/1/1/8"),
    256: parse("256/1/2/3 64/1/1/13 128/1/1/8 128/1/2/6"),
}


def measure(module, m, n, k):
    a, b = random_operands(m, n, k, torch.float16)
    ref = reference(a, b)
    cublas_out = torch.empty(m, n, dtype=torch.float16, device="cuda")
    fns, names, errors = [lambda: torch.matmul(a, b.T, out=cublas_out)], ["cublas"], {}
    for c in CONFIGS[m]:
        out, name = poisoned_output(m, n, torch.float16), "/".join(map(str, c))
        fn = launcher(module, a, b, out, dict(zip(KEYS, c)))
        fn()
        torch.cuda.synchronize()
        errors[name] = relative_error(out, ref)
        fns.append(fn)
        names.append(name)
    us = dict(zip(names, (ms * 1e3 for ms in interleaved_ms(fns, 20.0, 100.0))))
    best = min(names[1:], key=us.get)
    return {"m": m, "n": n, "k": k, "us": us, "err": errors, "best": best, "ratio": us["cublas"] / us[best]}


def main():
    module = versions.load("sm_90a", "v7")
    prebuild(module, [dict(zip(KEYS, c)) for c in {c for cs in CONFIGS.values() for c in cs}], [torch.float16])
    rows = []
    for n, k in ((4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096)):
        for m in (1, 16, 64, 128, 256):
            if n == 28672 and m < 64:
                continue
            rows.append(measure(module, m, n, k))
            print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "cfg.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
