"""Hopper V8 for many tokens (``matmul/kernels/hopper/v8_prefill.py``) computes C = A @ dequantize(W)^T
on the H100: fresh random operands, the output poisoned with NaN before the call, M from one token
to several tiles of 128 (none a multiple of it but 256), N a multiple of no tile, K a multiple of the
group (128), both dtypes, against a float32 reference from ``qw.dequantize()``; three planted bugs
(the nibbles of the wrong rows, a word's nibbles in the fragment's order instead of the widening's
pairs, the scales of the wrong group) are shown caught by the same check.

The kernel is not the call's (``matmul.call.quantized`` widens the weight for cuBLAS above 256
tokens): it is launched here directly, built once per dtype (or found in tilus's cache)."""

import functools
import importlib

import pytest
import torch
from conftest import gpu_arch
from test_v8_gpu import planted

import matmul
from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error

PREFILL = importlib.import_module("matmul.kernels.hopper.v8_prefill")
TOKENS = (1, 100, 256, 300, 1000, 1537)
WEIGHTS = ((4095, 1024), (1000, 4096), (200, 384), (31, 128))
DTYPES = (torch.float16, torch.bfloat16)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(gpu_arch() != "sm_90a", reason="needs a Hopper GPU (sm_90a)"),
]


@functools.cache
def program(dtype):
    with target("sm_90a"):
        script = versions.fixed_script(PREFILL.Kernel, dict(PREFILL.REPRESENTATIVE), dtype, name="v8_prefill")
        return tilus_autotune.load(tilus_autotune.build(script))


def run(x, qw):
    m, k = x.shape
    n = qw.shape[0]
    out = poisoned_output(m, n, x.dtype)
    program(x.dtype)(m, n, k, x, qw.packed, out, x.stride(0), qw.packed.stride(0), out.stride(0), 0, qw.scales)
    return out


def operands(m, n, k, dtype):
    x = torch.empty(m, k, dtype=dtype, device="cuda").uniform_(-1, 1)
    w = torch.empty(n, k, dtype=dtype, device="cuda").normal_(0, 0.05)
    return x, matmul.quantize(w, format="int4")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ragged_shapes(dtype):
    for m in TOKENS:
        for n, k in WEIGHTS:
            x, qw = operands(m, n, k, dtype)
            error = relative_error(run(x, qw), x.float() @ qw.dequantize().float().T)
            assert error <= TOLERANCE[dtype], f"{m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("bug", ["nibble order", "pair order", "scale group"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_planted_bugs_are_caught(bug, dtype):
    x, qw = operands(300, 1000, 1024, dtype)
    reference = x.float() @ qw.dequantize().float().T
    assert relative_error(run(x, qw), reference) <= TOLERANCE[dtype]
    assert relative_error(run(x, planted(qw, bug)), reference) > TOLERANCE[dtype]
