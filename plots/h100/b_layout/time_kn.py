"""Time a "kn" variant (torch's b [K, N] read in place) against the same version's "nk" variant
(B [N, K]) and torch.matmul(a, b) on b [K, N], interleaved in one window (H100).

    python plots/h100/b_layout/time_kn.py OUT.json
"""

import functools
import json
import sys

import torch

from matmul.contract import empty_padded
from matmul.kernels import variant, versions
from matmul.measure.timing import interleaved_ms, tflops

CASES = (("v5", 4096, 4096, 4096), ("v7", 16, 4096, 4096))


def main(path):
    torch.manual_seed(0)
    rows = []
    for version, m, n, k in CASES:
        module = versions.load("sm_90a", version)
        config = module.REPRESENTATIVE
        a = torch.randn(m, k, dtype=torch.float16, device="cuda")
        b = torch.randn(k, n, dtype=torch.float16, device="cuda")  # torch's b [K, N]
        bt = b.T.contiguous()  # the nk variant's B [N, K]
        out_kn, out_nk = empty_padded(m, n, a.dtype, a.device), empty_padded(m, n, a.dtype, a.device)
        kn = versions.kernel(module, a.dtype, config, variant.Variant(b_layout="kn"))
        nk = versions.kernel(module, a.dtype, config)
        args_kn = versions.launch_args(a, b, out_kn, b_layout="kn")
        args_nk = versions.launch_args(a, bt, out_nk)
        fns = [functools.partial(kn, *args_kn), functools.partial(nk, *args_nk), functools.partial(torch.matmul, a, b)]
        ms = interleaved_ms(fns)
        ref = torch.matmul(a, b)
        row = dict(
            gpu=torch.cuda.get_device_name(),
            version=version,
            config=config,
            shape=[m, n, k],
            dtype="float16",
            ms_kn=ms[0],
            ms_nk=ms[1],
            ms_torch=ms[2],
            kn_over_torch=ms[2] / ms[0],
            nk_over_torch=ms[2] / ms[1],
            tflops_kn=tflops(m, n, k, ms[0]),
            max_abs_diff_kn=(out_kn.float() - ref.float()).abs().max().item(),
        )
        print(json.dumps(row))
        rows.append(row)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
