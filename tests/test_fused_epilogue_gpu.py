"""Every Hopper version with a fused epilogue (V3-V7) computes C = act(A @ B^T + bias) right on the
GPU: bias alone, each activation, bias with silu, swiglu on a ``gate_up`` weight with and without a
(fused-width) bias; both dtypes; ragged shapes (no size a multiple of any tile, swiglu's I not a
multiple of 8); the output poisoned with NaN first; against ``variant.torch_epilogue`` on the float32
product.

Building 80 kernels one after another would take most of a GPU session, so the kernels are built
and run first by a pool of processes (one per CPU core, sharing the GPU), each returning its
outputs; the tests then compare them, in this process, with references computed from the same
seeded operands.
"""

import concurrent.futures
import multiprocessing
import os
import zlib

import pytest
import torch
from conftest import gpu_arch

from matmul.kernels import variant as variants
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error

ARCH = "sm_90a"
VERSIONS = ("v3", "v4", "v5", "v6", "v7")
KEYS = ("bias", "relu", "gelu_tanh", "gelu_erf", "silu", "bias+silu", "swiglu", "bias+swiglu")
DTYPES = (torch.float16, torch.bfloat16)
# (M, N, K): N weight rows; swiglu: gate and up of N / 2 = 500 rows each (C: 504 columns, I rounded up to 8)
SHAPES = {"v7": ((1, 1000, 1000), (17, 1000, 1000), (100, 1000, 1000))}  # V7: M <= 256 (its supports())
DEFAULT_SHAPES = ((1000, 1000, 1000),)
# configurations beside the representative: V5's and V6's narrow tiles, whose widths are no multiple
# of the 64-column blocks their epilogue stages (swiglu's gate-up pairs cross them)
EXTRA = {version: ("bias+gelu_tanh", "swiglu", "bias+swiglu") for version in ("v5", "v6")}

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(gpu_arch() != ARCH, reason="needs a Hopper GPU (sm_90a)"),
]


def operands(m: int, n: int, k: int, dtype: torch.dtype, var: variants.Variant, seed: int):
    """A [M, K], the weight B (``gate_up`` of gate and up [n / 2, K] for swiglu: I = n / 2 is padded
    to a multiple of 8), the bias or None; seeded, so that two processes make the same ones."""
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def uniform(*shape):
        return torch.empty(shape, dtype=dtype, device="cuda").uniform_(-1, 1, generator=generator)

    a = uniform(m, k)
    if var.activation == "swiglu":
        weight = variants.gate_up(uniform(n // 2, k), uniform(n // 2, k))
    else:
        weight = uniform(n, k)
    bias = uniform(weight.shape[0]) if var.bias else None
    return a, weight, bias


def cases():
    for version in VERSIONS:
        for dtype in DTYPES:
            for key in KEYS:
                for shape in SHAPES.get(version, DEFAULT_SHAPES):
                    yield version, dtype, key, shape, None
    for version, keys in EXTRA.items():
        narrow = [c for c in versions.space(versions.load(ARCH, version)) if c["block_n"] % 64 and c["group"] == 16]
        for config in narrow:
            for key in keys:
                yield version, torch.bfloat16, key, DEFAULT_SHAPES[0], tuple(sorted(config.items()))


def case_id(case) -> str:
    version, dtype, key, shape, config = case
    named = f"{version}-{str(dtype)[6:]}-{key}-{'x'.join(map(str, shape))}"
    return named + (f"-block_n{dict(config)['block_n']}" if config else "")


def seed_of(case) -> int:
    return zlib.crc32(repr(case).encode())  # the same in every process (hash() of a str is not)


def run_case(case):
    """In a pool process: the kernel's output for ``case`` (on the CPU), or the error it raised."""
    version, dtype, key, (m, n, k), config = case
    try:
        module = versions.load(ARCH, version)
        var = variants.Variant.parse(key)
        assert variants.supported(module, var)
        a, weight, bias = operands(m, n, k, dtype, var, seed_of(case))
        out = poisoned_output(m, var.out_columns(weight.shape[0]), dtype)
        kernel = versions.kernel(module, dtype, dict(config) if config else module.REPRESENTATIVE, var)
        kernel(*versions.launch_args(a, weight, out, bias))
        torch.cuda.synchronize()
        return out.cpu()
    except Exception as e:  # reported by the test of this case
        return f"{type(e).__name__}: {e}"


@pytest.fixture(scope="module")
def outputs(request):
    """The outputs of the cases this session runs (``-k`` may select a few)."""
    params = [getattr(item, "callspec", None) for item in request.session.items]
    selected = [p.params["case"] for p in params if p is not None and "case" in p.params]
    workers = max(1, min(len(selected), os.cpu_count() or 1))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        return dict(zip(selected, pool.map(run_case, selected)))


@pytest.mark.parametrize("case", list(cases()), ids=case_id)
def test_fused_epilogue(outputs, case):
    version, dtype, key, (m, n, k), _ = case
    out = outputs[case]
    assert not isinstance(out, str), out
    var = variants.Variant.parse(key)
    a, weight, bias = operands(m, n, k, dtype, var, seed_of(case))
    product = a.float() @ weight.float().T
    expected = variants.torch_epilogue(product, None if bias is None else bias.float(), var.activation)
    assert out.shape == expected.shape
    error = relative_error(out.cuda(), expected)
    assert error <= TOLERANCE[dtype], f"{version} {key} {m}x{n}x{k} {dtype}: relative error {error:.3g}"
