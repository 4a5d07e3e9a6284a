"""Batched matmul on the GPU: the batched V5 of this machine's series launched directly (NaN-poisoned
output, fresh random operands, ragged M, N, K, B in {1, 3, 7}, float16 and bfloat16, both B layouts,
a shared A) against a float32 reference, and ``matmul(a, b)`` with a batched b through the chooser
with V5 fixed as the choice. Skipped without a Hopper or Blackwell GPU (Blackwell's batched V5 has
never run anywhere).
"""

import pytest
import torch
from conftest import gpu_arch, require_gpu

import matmul
from matmul.call import api, batched
from matmul.kernels import versions
from matmul.kernels.variant import PLAIN, Variant, batch_bucket
from matmul.measure.correctness import TOLERANCE

ARCH = gpu_arch()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(ARCH is None, reason="needs a Hopper or Blackwell GPU"),
]
DTYPES = (torch.float16, torch.bfloat16)
SHAPES = [(1, 200, 300, 72), (3, 129, 257, 100), (7, 300, 130, 520), (3, 64, 8, 8)]


def reference(a3, operand, b_layout):
    b_nk = operand if b_layout == "nk" else operand.transpose(1, 2)
    return torch.matmul(a3.float(), b_nk.float().transpose(1, 2))


def check(out, ref):
    assert torch.isfinite(out).all(), "an element was never written (NaN poison) or overflowed"
    error = ((out.float() - ref).norm() / ref.norm()).item()
    assert error <= TOLERANCE[out.dtype], error


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
@pytest.mark.parametrize("batches, m, n, k", SHAPES)
def test_batched_v5_direct(dtype, b_layout, batches, m, n, k):
    require_gpu(ARCH)
    module = versions.load(ARCH, "v5")
    a, operand, ref = batched.random_operands(batches, m, n, k, dtype, "cuda", b_layout)
    variant = Variant(b_layout, batches=batch_bucket(batches))
    f = batched.Form(a, operand, b_layout, batches, (batches, m, n))
    out = batched.allocate(f)
    out.fill_(float("nan"))
    versions.kernel(module, dtype, module.REPRESENTATIVE, variant)(
        *versions.batched_launch_args(a, operand, out, b_layout)
    )
    torch.cuda.synchronize()
    check(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batches", [1, 3, 7])
def test_batched_v5_shared_a(dtype, batches):
    """a [M, K] shared by every product (batch extent 1): the kernel's batch % 1."""
    require_gpu(ARCH)
    module = versions.load(ARCH, "v5")
    m, n, k = 131, 200, 136
    a, operand, _ = batched.random_operands(batches, m, n, k, dtype, "cuda", "nk")
    a = a[:1]
    ref = reference(a.expand(batches, -1, -1), operand, "nk")
    out = batched.allocate(batched.Form(a, operand, "nk", batches, (batches, m, n)))
    out.fill_(float("nan"))
    variant = Variant("nk", batches=batch_bucket(batches))
    versions.kernel(module, dtype, module.REPRESENTATIVE, variant)(*versions.batched_launch_args(a, operand, out, "nk"))
    torch.cuda.synchronize()
    check(out, ref)


class FixedChooser:
    """Every bucket runs V5 (its representative configuration) where it supports the variant."""

    mode = "blocking"  # every call runs its plan: no unseen call is deferred to torch's ops

    def __init__(self):
        self.asked = []

    def get(self, device, dtype, m, n, k, variant=PLAIN):
        self.asked.append((m, n, k, variant))
        return ARCH, {"version": "v5", "config": dict(versions.load(ARCH, "v5").REPRESENTATIVE)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("batches", [1, 3, 7])
def test_matmul_call_batched(dtype, layout, batches, monkeypatch):
    require_gpu(ARCH)
    chooser = FixedChooser()
    monkeypatch.setattr(api, "_chooser", chooser)
    # kn: b's rows must suit TMA (16 bytes: N a multiple of 8) for the kernel to read b in place; a
    # ragged N there runs torch.matmul (below: the fallback). The direct tests above cover ragged N.
    m, n, k = 150, 264 if layout == "kn" else 260, 200
    a = torch.randn(batches, m, k, device="cuda").to(dtype)
    if layout == "kn":
        b = torch.randn(batches, k, n, device="cuda").to(dtype)
    else:
        b = torch.randn(batches, n, k, device="cuda").to(dtype).transpose(-1, -2)
    y = matmul.matmul(a, b)
    assert chooser.asked and chooser.asked[-1][3] == Variant(layout, batches=batch_bucket(batches))
    assert y.shape == (batches, m, n)
    check(y, torch.matmul(a.float(), b.float()))
    # a 2-D a broadcast across the batch, and 4-D batch dimensions that flatten
    check(matmul.matmul(a[0], b), torch.matmul(a[0].float(), b.float()))
    a4, b4 = a.unsqueeze(0).expand(2, -1, -1, -1).contiguous(), b.unsqueeze(0).expand(2, -1, -1, -1)
    if layout == "kn":
        b4 = b4.contiguous()
    else:
        b4 = b4.transpose(-1, -2).contiguous().transpose(-1, -2)
    check(matmul.matmul(a4, b4), torch.matmul(a4.float(), b4.float()))
    # what the kernels cannot take runs torch.matmul and still gives the right result
    odd = a.transpose(1, 2).contiguous().transpose(1, 2)
    assert "row-major" in matmul.choice(odd, b)["reason"]
    check(matmul.matmul(odd, b), torch.matmul(odd.float(), b.float()))
