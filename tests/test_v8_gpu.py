"""Hopper V8 (int4 weights) computes C = A @ dequantize(W)^T right on ragged shapes, in every
configuration, and the call ``matmul.matmul(x, qw.T)`` takes it (or widens the weight for cuBLAS).

Fresh random operands for each call, the output poisoned with NaN before the call, M in {1, 3, 17,
100, 255}, N a multiple of no tile, K a multiple of the group (128) but of no split (K = 128 is a
single K block: the other CTA of a cluster reads only zeros past K), both dtypes, compared with a
float32 reference computed from ``qw.dequantize()``. Planted bugs (the nibbles of the wrong rows,
the scales of the wrong group) are shown caught by the same check.
"""

import dataclasses

import pytest
import torch
from conftest import gpu_arch

import matmul
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error
from matmul.quant import int4
from matmul.quant import linear as quant_linear

ARCH = "sm_90a"
TOKENS = (1, 3, 17, 100, 255)
WEIGHTS = ((4095, 1024), (1000, 4096), (31, 128), (200, 384))
DTYPES = (torch.float16, torch.bfloat16)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(gpu_arch() != ARCH, reason="needs a Hopper GPU (sm_90a)"),
]


def operands(m, n, k, dtype):
    x = torch.empty(m, k, dtype=dtype, device="cuda").uniform_(-1, 1)
    w = torch.empty(n, k, dtype=dtype, device="cuda").normal_(0, 0.05)
    return x, matmul.quantize(w)


def reference(x, qw):
    return x.float() @ qw.dequantize().float().T


def v8_error(x, qw, config=None, ref=None):
    out = poisoned_output(x.shape[0], qw.shape[0], x.dtype)
    quant_linear.v8(x, qw, out, config)
    return relative_error(out, reference(x, qw) if ref is None else ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ragged_shapes(dtype):
    for m in TOKENS:
        for n, k in WEIGHTS:
            x, qw = operands(m, n, k, dtype)
            config = quant_linear.config_for(m)
            error = v8_error(x, qw, config)
            assert error <= TOLERANCE[dtype], f"V8 {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize(
    "config", versions.space(versions.load(ARCH, "v8")), ids=lambda c: "-".join(f"{v}" for v in c.values())
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_configuration(config, dtype):
    for m in (1, 17, 255):
        for n, k in ((1000, 4096), (31, 128)):
            x, qw = operands(m, n, k, dtype)
            error = v8_error(x, qw, config)
            assert error <= TOLERANCE[dtype], f"V8 {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_call(dtype):
    for m in (1, 16, 300):  # V8 up to 256 tokens, the widened weight and cuBLAS above
        x, qw = operands(m, 1000, 1024, dtype)
        ref = reference(x, qw)
        for y in (matmul.matmul(x, qw.T), matmul.linear(x, qw)):
            assert y.shape == (m, 1000) and y.dtype == dtype
            assert relative_error(y, ref) <= TOLERANCE[dtype]
    x, qw = operands(16, 1000, 1024, dtype)
    x3 = x.view(2, 8, 1024)
    bias = torch.randn(1000, dtype=dtype, device="cuda")
    y = matmul.linear(x3, qw, bias, "silu")
    expected = torch.nn.functional.silu(reference(x, qw) + bias.float()).view(2, 8, 1000)
    assert relative_error(y.float().view(16, 1000), expected.view(16, 1000)) <= TOLERANCE[dtype]


def planted(qw, bug):
    """``qw`` with a bug planted in what the kernel reads."""
    if bug == "nibble order":  # the two rows of a word's nibble pairs swapped (g <-> g + 8)
        q = qw.q()
        n_pad = int4.padded_rows(qw.shape[0])
        full = q.new_zeros((n_pad, q.shape[1]))
        full[: q.shape[0]] = q
        swapped = full.view(n_pad // 64, 4, 2, 8, -1).flip(2).reshape(n_pad, -1)
        return dataclasses.replace(qw, packed=int4.pack(swapped)[: qw.packed.shape[0]])
    if bug == "scale group":  # each group's scales taken from the next group
        return dataclasses.replace(qw, scales=qw.scales.roll(1, dims=0).contiguous())
    raise ValueError(bug)


@pytest.mark.parametrize("bug", ["nibble order", "scale group"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_planted_bugs_are_caught(bug, dtype):
    x, qw = operands(16, 1000, 1024, dtype)
    ref = reference(x, qw)
    assert v8_error(x, qw, ref=ref) <= TOLERANCE[dtype]
    error = v8_error(x, planted(qw, bug), ref=ref)
    assert error > TOLERANCE[dtype], f"planted {bug}: relative error {error:.3g} passes"
