"""The interleaved swiglu kernels (``matmul.kernels.swiglu``) on the GPU: forward and backward against
float64 references on ragged shapes (rows and column groups multiples of no tile), both dtypes, the
output poisoned with NaN first; the check shown to catch gate and up swapped; and a training step
of ``linear(..., "swiglu")`` through them against torch's gradients."""

import pytest
import torch
from conftest import gpu_arch

import matmul
from matmul.call import activation, api
from matmul.kernels import swiglu
from matmul.kernels import variant as variants
from matmul.measure.correctness import TOLERANCE

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(gpu_arch() != swiglu.ARCH, reason="needs a Hopper GPU (sm_90a)"),
]

DTYPES = (torch.float16, torch.bfloat16)
SHAPES = ((1, 8), (3, 24), (17, 1000), (1000, 4104), (2, 7, 136))  # [..., I']: I' = 8 x groups


def relative(x, y):
    return float((x.double() - y.double()).norm() / y.double().norm())


def interleaved(shape, dtype):
    *lead, half = shape
    return torch.randn(*lead, 2 * half, device="cuda", dtype=dtype) * 3


KERNELS = {}  # (dtype, backward): the launch function the call's chooser built


@pytest.fixture(scope="module", autouse=True)
def built():
    """Both kernels of each dtype built by the call's build children and opened here (until then the
    call runs torch's operators, which would pass)."""
    for dtype in DTYPES:
        kernels = activation.swiglu_kernels(dtype)
        assert all(api._chooser.build_now(kernels, progress=False)), "the swiglu kernels did not build"
        for arch, _, entry, variant in kernels:
            KERNELS[(dtype, entry["config"]["backward"])] = api._chooser.kernel(arch, dtype, entry, variant)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward(shape, dtype):
    y = interleaved(shape, dtype)
    out = torch.full((*shape[:-1], shape[-1]), float("nan"), device="cuda", dtype=dtype)
    swiglu.forward(y, out, KERNELS[(dtype, False)])
    expected = variants.activate(y.double(), "swiglu")
    assert relative(out, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_backward(shape, dtype):
    y = interleaved(shape, dtype)
    grad = torch.randn(*shape, device="cuda", dtype=dtype)
    dy = torch.full_like(y, float("nan"))
    swiglu.backward(y, grad, dy, KERNELS[(dtype, True)])
    reference = y.double().requires_grad_()
    variants.activate(reference, "swiglu").backward(grad.double())
    assert relative(dy, reference.grad) <= TOLERANCE[dtype]


def test_the_check_catches_gate_and_up_swapped():
    y = interleaved((64, 256), torch.float16)
    swapped = y.unflatten(-1, (-1, 2, 8)).flip(-2).flatten(-3).contiguous()
    out = swiglu.forward(swapped, kernel=KERNELS[(torch.float16, False)])
    assert relative(out, variants.activate(y.double(), "swiglu")) > TOLERANCE[torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_training_step_of_linear_swiglu(dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 33, 256, device="cuda", dtype=dtype).requires_grad_()
    gate, up = (torch.randn(200, 256, device="cuda", dtype=dtype) / 16 for _ in range(2))
    fused = matmul.gate_up(gate, up).requires_grad_()
    y = matmul.linear(x, fused, activation="swiglu")
    grad = torch.randn_like(y)
    y.backward(grad)
    xr, gr, ur = (t.detach().double().requires_grad_() for t in (x, gate, up))
    (torch.nn.functional.silu(xr @ gr.T) * (xr @ ur.T)).backward(grad.double())
    assert relative(x.grad, xr.grad) <= TOLERANCE[dtype]
    d_gate, d_up = variants.split_gate_up(fused.grad, 200)
    assert relative(d_gate, gr.grad) <= TOLERANCE[dtype]
    assert relative(d_up, ur.grad) <= TOLERANCE[dtype]
