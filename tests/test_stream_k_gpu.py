"""Hopper V5 with its stream-K option (``v5.STREAM_K``: the last, partial wave of tiles dealt out by
K blocks, partial sums handed over through a global workspace) computes C = A @ B^T right on the
GPU. The shapes are chosen for the tail they give on the 132 SMs of an H100 (tiles of 128 x 256,
K blocks of 64): whole waves and a tail (4096^3: 512 tiles, a tail of 116 tiles split among all
CTAs; 4095 x 4097 x 1031: a tail of 16 tiles of 17 K blocks), every tile in the tail (fewer tiles
than SMs: 1000 x 1000 x 100 gives 32 tiles of 2 K blocks, so most CTAs have an empty range;
17 x 1000 x 4095, 4 tiles of 64 K blocks, each cut among some 33 CTAs), one K block (8191 x
1000 x 17) and one element. Both dtypes, fresh random operands, the output poisoned with NaN first,
against a float32 reference; the same bits twice (the partials are added in a fixed order, and a
flag left up by one launch would let the next read a stale partial); a fused epilogue (bias + gelu,
applied by the finisher after the sum) and torch's b [K, N] read in place."""

import pytest
import torch
from conftest import gpu_arch

from matmul.kernels import variant as variants
from matmul.kernels import versions
from matmul.measure.correctness import (
    TOLERANCE,
    poisoned_output,
    random_operands,
    reference,
    relative_error,
)

ARCH = "sm_90a"
DTYPES = (torch.float16, torch.bfloat16)
SHAPES = (
    (4096, 4096, 4096),
    (4095, 4097, 1031),
    (1000, 1000, 100),
    (17, 1000, 4095),
    (8191, 1000, 17),
    (3001, 5003, 2049),
    (1, 1, 1),
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(gpu_arch() != ARCH, reason="needs a Hopper GPU (sm_90a)"),
]


def v5():
    return versions.load(ARCH, "v5")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_stream_k_on_ragged_shapes(shape, dtype):
    m, n, k = shape
    module = v5()
    a, b = random_operands(m, n, k, dtype)
    out = poisoned_output(m, n, dtype)
    versions.run(module, a, b, out, config=module.STREAM_K)
    error = relative_error(out, reference(a, b))
    assert error <= TOLERANCE[dtype], f"stream-K {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("shape", ((4096, 4096, 4096), (17, 1000, 4095)), ids=lambda s: "x".join(map(str, s)))
def test_stream_k_gives_the_same_bits_every_launch(shape):
    m, n, k = shape
    module, dtype = v5(), torch.float16
    a, b = random_operands(m, n, k, dtype)
    first = versions.run(module, a, b, poisoned_output(m, n, dtype), config=module.STREAM_K)
    for _ in range(3):
        again = versions.run(module, a, b, poisoned_output(m, n, dtype), config=module.STREAM_K)
        assert torch.equal(first, again)
    assert relative_error(first, reference(a, b)) <= TOLERANCE[dtype]


def test_stream_k_applies_the_fused_epilogue_after_the_sum():
    module, dtype = v5(), torch.float16
    m, n, k = 4095, 4097, 1031
    a, b = random_operands(m, n, k, dtype)
    bias = torch.randn(n, dtype=dtype, device="cuda")
    out = poisoned_output(m, n, dtype)
    variant = variants.Variant(bias=True, activation="gelu_tanh")
    kernel = versions.kernel(module, dtype, module.STREAM_K, variant)
    kernel(*versions.launch_args(a, b, out, bias=bias))
    expected = torch.nn.functional.gelu(reference(a, b) + bias.float(), approximate="tanh")
    error = relative_error(out, expected)
    assert error <= TOLERANCE[dtype], f"stream-K bias+gelu_tanh: relative error {error:.3g}"


def test_stream_k_reads_b_in_place_as_k_by_n():
    module, dtype = v5(), torch.float16
    m, n, k = 4095, 4096, 1031
    a, b = random_operands(m, n, k, dtype)
    b_kn = b.T.contiguous()
    out = poisoned_output(m, n, dtype)
    kernel = versions.kernel(module, dtype, module.STREAM_K, variants.Variant(b_layout="kn"))
    kernel(*versions.launch_args(a, b_kn, out, b_layout="kn"))
    error = relative_error(out, reference(a, b))
    assert error <= TOLERANCE[dtype], f"stream-K b [K, N]: relative error {error:.3g}"
