"""Every Hopper/Blackwell V3-V7 "kn" variant (torch's b [K, N] read in place) computes a @ b right.

As ``test_gpu_correctness``: fresh random operands, the output poisoned with NaN first, shapes that
are no multiple of any tile (TMA clips the boxes of b at K and at N), both dtypes, a float32
reference. b [K, N] is row-major with its rows padded to 16 bytes (the TMA contract).
"""

import pytest
import torch
from conftest import gpu_arch

from matmul.contract import aligned_row_length
from matmul.kernels import variant, versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error

VERSIONS = ("v3", "v4", "v5", "v6", "v7")
# ragged everywhere; N = 17 and K = 17 clip inside one 64-column box of b; M = 1 and 16: V7's shapes
SHAPES = ((1000, 1000, 1000), (333, 257, 1031), (1000, 17, 4095), (17, 4095, 1000), (1, 4096, 4096), (16, 1000, 17))
DTYPES = (torch.float16, torch.bfloat16)
KN = variant.Variant(b_layout="kn")

ARCH = gpu_arch()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(ARCH is None, reason="needs a Hopper or Blackwell GPU"),
]


def kn_copy(b: torch.Tensor) -> torch.Tensor:
    """b [K, N] row-major (rows padded to 16 bytes) holding B^T for B [N, K]."""
    n, k = b.shape
    out = torch.empty((k, aligned_row_length(n, b.dtype)), dtype=b.dtype, device=b.device)
    out.uniform_(-1, 1)  # the padding holds noise: it must not be read
    out = out[:, :n]
    out.copy_(b.T)
    return out


def run_kn(module, a, b_kn, out, config):
    kernel = versions.kernel(module, a.dtype, config, KN)
    with torch.cuda.device(a.device):
        kernel(*versions.launch_args(a, b_kn, out, b_layout="kn"))
    return out


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kn_variant(version, dtype):
    module = versions.load(ARCH, version)
    assert variant.supported(module, KN)
    for m, n, k in SHAPES:
        if not getattr(module, "supports", lambda *shape: True)(m, n, k):
            continue
        a, b = random_operands(m, n, k, dtype)
        out = run_kn(module, a, kn_copy(b), poisoned_output(m, n, dtype), module.REPRESENTATIVE)
        error = relative_error(out, reference(a, b))
        assert error <= TOLERANCE[dtype], f"{module.__name__} kn {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("version", VERSIONS)
def test_kn_every_configuration(version):
    module = versions.load(ARCH, version)
    for config in versions.space(module, KN):  # the points that build for b [K, N]
        for m, n, k in ((1000, 4095, 17), (17, 1000, 4095)):
            if getattr(module, "supports", lambda *shape: True)(m, n, k):
                a, b = random_operands(m, n, k, torch.float16)
                out = run_kn(module, a, kn_copy(b), poisoned_output(m, n, torch.float16), config)
                error = relative_error(out, reference(a, b))
                assert error <= TOLERANCE[torch.float16], f"{module.__name__} {config} kn {m}x{n}x{k}: {error:.3g}"
