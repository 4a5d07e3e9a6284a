"""One build of Hopper V6 (a configuration by name: PINGPONG, PINGPONG_WIDE, REPRESENTATIVE) with one
variant (a ``Variant`` key: "bias+gelu_tanh", "swiglu", "kn", "" ...), run once on a ragged problem
and compared with the float32 reference; prints one line. Meant to run in a process of its own per
case, so that a fault in one build does not poison the next:

    source .gpu/env.sh && CUDA_LAUNCH_BLOCKING=1 python plots/h100/pingpong/fused_probe.py PINGPONG bias+gelu_tanh
"""

import sys

import torch

from matmul.contract import check_operands, empty_padded
from matmul.kernels import variant as variants
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error


def main():
    name, key = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.float16
    m, n, k = (int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "1000x1000x1000").split("x"))
    module = versions.load("sm_90a", "v6")
    var = variants.Variant.parse(key)
    generator = torch.Generator(device="cuda").manual_seed(7)

    def uniform(*shape):  # rows padded to 16 bytes, as the TMA contract needs (a vector as it is)
        if len(shape) == 1:
            return torch.empty(shape, dtype=dtype, device="cuda").uniform_(-1, 1, generator=generator)
        return empty_padded(*shape, dtype, "cuda").uniform_(-1, 1, generator=generator)

    a = uniform(m, k)
    weight = variants.gate_up(uniform(n // 2, k), uniform(n // 2, k)) if var.activation == "swiglu" else uniform(n, k)
    bias = uniform(weight.shape[0]) if var.bias else None
    out = poisoned_output(m, var.out_columns(weight.shape[0]), dtype)
    b = weight
    if var.b_layout == "kn":  # b [K, N], rows padded to 16 bytes
        b = torch.empty(k, -(-n // 8) * 8, dtype=dtype, device="cuda")[:, :n]
        b.copy_(weight.T)
    # launched directly, not through versions.run: validate first (tilus does not check the tensor map)
    check_operands(a, b, out, b_layout=var.b_layout, columns=out.shape[1])
    torch.cuda.synchronize()
    label = f"{name} {key or 'plain'} {str(dtype)[6:]} {m}x{n}x{k}"
    try:
        kernel = versions.kernel(module, dtype, getattr(module, name), var)
        kernel(*versions.launch_args(a, b, out, bias, b_layout=var.b_layout))
        torch.cuda.synchronize()
    except Exception as e:
        print(f"PROBE {label}: FAULT {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        return 1
    product = a.float() @ weight.float().T
    expected = variants.torch_epilogue(product, None if bias is None else bias.float(), var.activation)
    error = relative_error(out, expected)
    verdict = "ok" if error <= TOLERANCE[dtype] else "WRONG"
    print(f"PROBE {label}: {verdict} (relative error {error:.3g})", flush=True)
    return 0 if verdict == "ok" else 2


if __name__ == "__main__":
    sys.exit(main())
