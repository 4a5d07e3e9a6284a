"""Hopper V8 for a few tokens (``matmul/kernels/hopper/v8_gemv.py``) computes C = A @ dequantize(W)^T
on the H100: fresh random operands, the output poisoned with NaN before the call, M from one token
to the kernel's eight, N a multiple of no tile (and fewer rows than a packed tile), K a multiple of
the group, both dtypes, every configuration of its space, against a float32 reference from
``qw.dequantize()``; two planted bugs (the nibbles of the wrong rows, the scales of the wrong group)
are shown caught by the same check.

The kernel is launched here directly, built once per dtype and configuration (or found in tilus's
cache)."""

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

GEMV = importlib.import_module("matmul.kernels.hopper.v8_gemv")
TOKENS = (1, 3, 8)
WEIGHTS = ((4095, 1024), (1000, 4096), (200, 384), (31, 128))
DTYPES = (torch.float16, torch.bfloat16)
CONFIGS = versions.space(GEMV)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(gpu_arch() != "sm_90a", reason="needs a Hopper GPU (sm_90a)"),
]


@functools.cache
def program(dtype, config):
    with target("sm_90a"):
        script = versions.fixed_script(GEMV.Kernel, dict(config), dtype, name="v8_gemv")
        return tilus_autotune.load(tilus_autotune.build(script))


def run(x, qw, config):
    m, k = x.shape
    n = qw.shape[0]
    out = poisoned_output(m, n, x.dtype)
    program(x.dtype, tuple(sorted(config.items())))(
        m, n, k, x, qw.packed, out, x.stride(0), qw.packed.stride(0), out.stride(0), 0, qw.scales
    )
    return out


def operands(m, n, k, dtype):
    x = torch.empty(m, k, dtype=dtype, device="cuda").uniform_(-1, 1)
    w = torch.empty(n, k, dtype=dtype, device="cuda").normal_(0, 0.05)
    return x, matmul.quantize(w, format="int4")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ragged_shapes(dtype, config):
    for m in TOKENS:
        for n, k in WEIGHTS:
            x, qw = operands(m, n, k, dtype)
            error = relative_error(run(x, qw, config), x.float() @ qw.dequantize().float().T)
            assert error <= TOLERANCE[dtype], f"{m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("bug", ["nibble order", "scale group"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_planted_bugs_are_caught(bug, dtype):
    x, qw = operands(5, 1000, 1024, dtype)
    reference = x.float() @ qw.dequantize().float().T
    config = dict(GEMV.REPRESENTATIVE)
    assert relative_error(run(x, qw, config), reference) <= TOLERANCE[dtype]
    assert relative_error(run(x, planted(qw, bug), config), reference) > TOLERANCE[dtype]
