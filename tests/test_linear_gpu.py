"""The call outside ``x @ w.T`` on the GPU: torch.matmul's shapes, b [K, N] read in place, ``linear``
with every epilogue, and its backward, through the launch path with each version fixed as the choice
(no tuning: the kernels themselves are what is checked), against float32 references on NaN-poisoned
outputs where the call takes ``out``, ragged shapes. Skipped without a Hopper or Blackwell GPU.
"""

import pytest
import torch
from conftest import QKVAttention, gpu_arch

import matmul
from matmul.call.launch import SeriesPlan
from matmul.kernels import variant as variants
from matmul.kernels import versions
from matmul.kernels.variant import Variant
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error

ARCH = gpu_arch()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(ARCH is None, reason="needs a Hopper or Blackwell GPU"),
]
DTYPES = (torch.float16, torch.bfloat16)


def ran_a_version(plans) -> bool:
    return any(isinstance(plan, SeriesPlan) for plan in plans.plans.values())


def randn(*shape, dtype):
    return torch.randn(*shape, device="cuda", dtype=dtype)


# tokens x hidden: ragged everywhere; few enough tokens that V7 takes them too
SHAPES = [(3, 37, 1000), (2, 50, 1000)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch, seq, k", SHAPES)
@pytest.mark.parametrize("fixed", ["v5", "v7"], indirect=True)
def test_leading_dimensions_and_both_layouts_of_b(fixed, batch, seq, k, dtype):
    n = 1000
    x = randn(batch, seq, k, dtype=dtype)
    w = randn(n, k, dtype=dtype) / k**0.5
    expected = x.float() @ w.float().T
    for b in (w.T, w.T.contiguous()):  # b = w.T read as w; b [K, N] row-major read as it is
        out = poisoned_output(batch * seq, n, dtype).view(batch, seq, n)
        assert matmul.matmul(x, b, out=out) is out
        assert relative_error(out, expected) <= TOLERANCE[dtype]
        assert relative_error(matmul.matmul(x, b), expected) <= TOLERANCE[dtype]
    kn = [runs for *_, variant, runs in fixed.chooser.asked if variant.b_layout == "kn"]
    assert kn  # the [K, N] layout was asked for as its own variant


# each epilogue once through the call on a version that runs it (every version and activation is
# checked kernel by kernel in tests/test_fused_epilogue_gpu.py); both dtypes, both kinds of kernel
EPILOGUES = [
    ("v3", True, None, torch.float16),
    ("v4", False, "relu", torch.bfloat16),
    ("v5", True, "gelu_tanh", torch.float16),
    ("v6", False, "gelu_erf", torch.bfloat16),
    ("v7", True, "silu", torch.float16),
    ("v7", True, "gelu_tanh", torch.bfloat16),
]


@pytest.mark.parametrize("fixed, with_bias, activation, dtype", EPILOGUES, indirect=["fixed"])
def test_linear_epilogues(fixed, activation, with_bias, dtype):
    m, n, k = 100, 1000, 1000
    x, w = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype) / k**0.5
    bias = randn(n, dtype=dtype) if with_bias else None
    expected = variants.torch_epilogue(x.float() @ w.float().T, None if bias is None else bias.float(), activation)
    y = matmul.linear(x, w, bias, activation)
    assert y.shape == (m, n) and torch.isfinite(y).all()
    assert relative_error(y, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize(
    "fixed, with_bias, dtype", [("v5", False, torch.float16), ("v7", True, torch.bfloat16)], indirect=["fixed"]
)
def test_swiglu(fixed, with_bias, dtype):
    m, i, k = 100, 1000, 1000
    x = randn(m, k, dtype=dtype)
    gate, up = randn(i, k, dtype=dtype) / k**0.5, randn(i, k, dtype=dtype) / k**0.5
    fused = matmul.gate_up(gate, up)
    bias = randn(fused.shape[0], dtype=dtype) if with_bias else None
    z = x.float() @ fused.float().T + (0 if bias is None else bias.float())
    g, u = variants.split_gate_up_columns(z)
    expected = torch.nn.functional.silu(g) * u
    y = matmul.linear(x, fused, bias, "swiglu")
    assert y.shape == (m, i) and relative_error(y, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize("fixed, activation", [("v5", None), ("v7", "silu")], indirect=["fixed"])
def test_linear_backward_against_torch(fixed, activation):
    dtype = torch.float16
    x = randn(2, 50, 1000, dtype=dtype).requires_grad_()
    w = (randn(1000, 1000, dtype=dtype) / 1000**0.5).requires_grad_()
    bias = randn(1000, dtype=dtype).requires_grad_()
    y = matmul.linear(x, w, bias, activation)
    grad = randn(*y.shape, dtype=dtype)
    y.backward(grad)
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, bias))
    variants.activate(torch.nn.functional.linear(xr, wr, br), activation).backward(grad.float())
    for ours, theirs in ((x.grad, xr.grad), (w.grad, wr.grad), (bias.grad, br.grad)):
        assert relative_error(ours, theirs) <= 2 * TOLERANCE[dtype]


@pytest.mark.parametrize("fixed", ["v5"], indirect=True)
def test_a_linear_model_converted_and_undone(fixed):
    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.GELU(), torch.nn.Linear(1000, 333)).cuda().half()
    x = randn(4, 25, 1000, dtype=torch.float16)
    with torch.no_grad():
        expected = model(x).float()
        conversion = matmul.nn.convert(model)
        assert len(conversion.swapped) == 2
        assert relative_error(model(x), expected) <= TOLERANCE[torch.float16]
        conversion.undo()
        assert type(model[0]) is torch.nn.Linear


@pytest.mark.parametrize("fixed", ["v3", "v7"], indirect=True)
def test_the_fixed_version_is_what_ran(fixed):
    x, w = randn(64, 512, dtype=torch.float16), randn(512, 512, dtype=torch.float16)
    matmul.linear(x, w, None, "relu")
    module = versions.load(ARCH, fixed.chooser.version)
    assert variants.supported(module, Variant("nk", False, "relu")) and ran_a_version(fixed)


@pytest.mark.parametrize("fixed", ["v5", "v7"], indirect=True)
def test_fused_qkv_self_and_cross_attention_and_gradients(fixed):
    """``convert(fuse_qkv=True)``: one product of the stacked weight (its columns as k and v), each
    projection's own rows of it where k and v read another input (a weight that starts inside the
    fused one), and the gradients of the fused weight and bias, against float32."""
    dtype = torch.float16
    model = QKVAttention(1000, 200).cuda().to(dtype)
    reference = [(layer.weight.detach().float(), layer.bias.detach().float()) for layer in model.children()]
    x, memory = randn(3, 41, 1000, dtype=dtype), randn(2, 17, 1000, dtype=dtype)
    matmul.nn.convert(model, fuse_qkv=True)
    for source in (None, memory):  # self-attention, then cross-attention (which stops the sharing)
        with torch.no_grad():
            outputs = model(x, source)
        sources = (x, x if source is None else source, x if source is None else source)
        for output, read, (w, b) in zip(outputs, sources, reference):
            assert relative_error(output, torch.nn.functional.linear(read.float(), w, b)) <= TOLERANCE[dtype]
    assert ran_a_version(fixed)
    model = QKVAttention(1000, 200).cuda().to(dtype)
    reference = [(layer.weight.detach().float(), layer.bias.detach().float()) for layer in model.children()]
    matmul.nn.convert(model, fuse_qkv=True)
    xr = x.detach().float().requires_grad_()
    grads = [randn(*shape, dtype=dtype) for shape in ((3, 41, 1000), (3, 41, 200), (3, 41, 200))]
    torch.autograd.backward(model(x), grads)
    params = [tuple(t.clone().requires_grad_() for t in pair) for pair in reference]
    torch.autograd.backward([torch.nn.functional.linear(xr, w, b) for w, b in params], [g.float() for g in grads])
    expected_weight, expected_bias = (torch.cat([pair[i].grad for pair in params]) for i in (0, 1))
    assert relative_error(model.qkv_weight.grad, expected_weight) <= 2 * TOLERANCE[dtype]
    assert relative_error(model.qkv_bias.grad, expected_bias) <= 2 * TOLERANCE[dtype]
