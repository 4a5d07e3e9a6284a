"""Hopper V6 with ping-pong consumer warpgroups (``v6.PINGPONG``, 128 x 128 tiles a warpgroup, and
``v6.PINGPONG_WIDE``, 64 x 256) computes C = A @ B^T right on the GPU: ragged shapes (no size a
multiple of any tile, from less than one tile to several tiles per warpgroup, and a CTA with a
single tile, whose second warpgroup gets none), both dtypes, fresh random operands, the output
poisoned with NaN first, against a float32 reference. Also: the same bits twice (no race between the
warpgroups' turns), B read in place as torch's b [K, N], and the fused epilogues (bias with an
activation, swiglu)."""

import pytest
import torch
from conftest import gpu_arch

from matmul.contract import check_operands
from matmul.kernels import variant as variants
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error

ARCH = "sm_90a"
DTYPES = (torch.float16, torch.bfloat16)
# 132 SMs make 66 pairs: 4095^2 gives each pair ~8 tiles (4 a warpgroup); 8191 x 1000 x 17 one K
# block; 200 x 300 one pair tile, so a CTA's second warpgroup has nothing to do
SHAPES = (
    (1, 1, 1),
    (17, 1000, 4095),
    (1000, 4095, 17),
    (200, 300, 1031),
    (4095, 4095, 1000),
    (8191, 1000, 17),
    (3001, 5003, 2049),
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(gpu_arch() != ARCH, reason="needs a Hopper GPU (sm_90a)"),
]


TILES = ("PINGPONG", "PINGPONG_WIDE")


def v6():
    return versions.load(ARCH, "v6")


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pingpong_on_ragged_shapes(shape, dtype, tile):
    m, n, k = shape
    module = v6()
    a, b = random_operands(m, n, k, dtype)
    out = poisoned_output(m, n, dtype)
    versions.run(module, a, b, out, config=getattr(module, tile))
    error = relative_error(out, reference(a, b))
    assert error <= TOLERANCE[dtype], f"ping-pong {tile} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pingpong_gives_the_same_bits_twice(dtype, tile):
    module, config = v6(), getattr(v6(), tile)
    a, b = random_operands(4095, 4097, 1031, dtype)
    first = versions.run(module, a, b, poisoned_output(4095, 4097, dtype), config=config)
    second = versions.run(module, a, b, poisoned_output(4095, 4097, dtype), config=config)
    assert torch.equal(first, second)
    assert relative_error(first, reference(a, b)) <= TOLERANCE[dtype]


def test_pingpong_reads_b_in_place_as_k_by_n():
    module, dtype = v6(), torch.float16
    m, n, k = 1000, 4095, 1031
    a, b = random_operands(m, n, k, dtype)
    # b [K, N] with rows padded to 16 bytes (TMA's rule), as torch's b of a plain a @ b
    b_kn = torch.empty(k, -(-n // 8) * 8, dtype=dtype, device="cuda")[:, :n]
    b_kn.copy_(b.T)
    out = poisoned_output(m, n, dtype)
    kernel = versions.kernel(module, dtype, module.PINGPONG, variants.Variant(b_layout="kn"))
    kernel(*versions.launch_args(a, b_kn, out, b_layout="kn"))
    error = relative_error(out, reference(a, b))
    assert error <= TOLERANCE[dtype], f"ping-pong kn: relative error {error:.3g}"


FUSED = ("bias+gelu_tanh", "swiglu")


@pytest.mark.parametrize("key", FUSED)
def test_pingpong_with_a_fused_epilogue(key):
    module, dtype = v6(), torch.float16
    var = variants.Variant.parse(key)
    # K = 1000: a ragged last K block, rows of 2000 bytes (the kernel is launched directly here,
    # so the operands are validated by the contract first: a row stride TMA refuses faults)
    m, n, k = 1000, 1000, 1000
    generator = torch.Generator(device="cuda").manual_seed(7)

    def uniform(*shape):
        return torch.empty(shape, dtype=dtype, device="cuda").uniform_(-1, 1, generator=generator)

    a = uniform(m, k)
    weight = variants.gate_up(uniform(n // 2, k), uniform(n // 2, k)) if var.activation == "swiglu" else uniform(n, k)
    bias = uniform(weight.shape[0]) if var.bias else None
    out = poisoned_output(m, var.out_columns(weight.shape[0]), dtype)
    check_operands(a, weight, out, columns=out.shape[1])
    kernel = versions.kernel(module, dtype, module.PINGPONG, var)
    kernel(*versions.launch_args(a, weight, out, bias))
    product = a.float() @ weight.float().T
    expected = variants.torch_epilogue(product, None if bias is None else bias.float(), var.activation)
    assert out.shape == expected.shape
    error = relative_error(out, expected)
    assert error <= TOLERANCE[dtype], f"ping-pong {key}: relative error {error:.3g}"
