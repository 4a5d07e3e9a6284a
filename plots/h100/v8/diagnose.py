"""Which weight values V8 reads: x = one-hot rows (token m selects column k_m of the weight), so
out[m, n] must be dequantize()[n, k_m]. Prints, per selected column, whether it matches and, where
it does not, which column of the weight (if any) it matches instead. Also the error of a random call.

    python plots/h100/v8/diagnose.py
"""

import torch

import matmul
from matmul.measure.correctness import poisoned_output, relative_error
from matmul.quant import linear as quant_linear

CONFIG = {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 8}

for dtype in (torch.float16, torch.bfloat16):
    # built by the call's build child; until then v8() runs the widened path: torch's unpacking, not V8's
    assert quant_linear.wait_until_built(dtype, "int4", CONFIG), f"V8 {CONFIG} {dtype} did not build"
    n, k = 128, 256
    w = torch.randn(n, k, dtype=dtype, device="cuda") * 0.05
    qw = matmul.quantize(w)
    wd = qw.dequantize().float()
    cols = [0, 1, 2, 7, 8, 9, 15, 16, 31, 63, 64, 100, 127, 128, 200, 255]
    x = torch.zeros(len(cols), k, dtype=dtype, device="cuda")
    for i, c in enumerate(cols):
        x[i, c] = 1
    out = poisoned_output(len(cols), n, dtype)
    quant_linear.v8(x, qw, out, CONFIG)
    got = out.float()
    for i, c in enumerate(cols):
        ok = torch.allclose(got[i], wd[:, c], atol=1e-3, rtol=1e-2)
        line = f"{dtype} column {c}: {'ok' if ok else 'WRONG'}"
        if not ok:
            match = [j for j in range(k) if torch.allclose(got[i], wd[:, j], atol=1e-3, rtol=1e-2)]
            line += f" matches columns {match[:5]}; rows 0-3 got {got[i, :4].tolist()} want {wd[:4, c].tolist()}"
            if torch.isnan(got[i]).any():
                line += " (NaN)"
        print(line, flush=True)
    xr = torch.randn(16, k, dtype=dtype, device="cuda")
    out = poisoned_output(16, n, dtype)
    quant_linear.v8(xr, qw, out, CONFIG)
    print(dtype, "random relative error", relative_error(out, xr.float() @ wd.T), flush=True)
