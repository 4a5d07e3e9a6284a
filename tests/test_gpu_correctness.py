"""Every version of the series that matches this machine's GPU computes C = A @ B^T right.

Fresh random operands for each call (never zeros), the output poisoned with NaN before the call,
shapes that are not multiples of any tile, both dtypes; compared with a float32 reference.
"""

import itertools

import pytest
import torch
from conftest import gpu_arch

from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error

SIZES = (1, 17, 1000, 4095)
SHAPES = list(itertools.product(SIZES, SIZES, SIZES)) + [(8191, 1000, 17), (17, 8191, 1000), (1000, 17, 8191)]
DTYPES = (torch.float16, torch.bfloat16)

ARCH = gpu_arch()
HERE = versions.available(ARCH) if ARCH else []
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(ARCH is None, reason="needs a Hopper or Blackwell GPU"),
]


def supported(module, m, n, k):
    """A version may declare the shapes it is made for (``supports``); the others are not its job."""
    return getattr(module, "supports", lambda *shape: True)(m, n, k)


def check(module, m, n, k, dtype, config=None):
    a, b = random_operands(m, n, k, dtype)
    out = poisoned_output(m, n, dtype)
    versions.run(module, a, b, out, config=config)
    error = relative_error(out, reference(a, b))
    assert error <= TOLERANCE[dtype], f"{module.__name__} {m}x{n}x{k} {dtype}: relative error {error:.3g}"
    return error


@pytest.mark.parametrize("version", HERE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_shape(version, dtype):
    module = versions.load(ARCH, version)
    for m, n, k in SHAPES:
        if supported(module, m, n, k):
            check(module, m, n, k, dtype, config=module.REPRESENTATIVE)


@pytest.mark.parametrize("version", HERE)
def test_every_configuration_of_the_space(version):
    module = versions.load(ARCH, version)
    for config in versions.space(module):
        for m, n, k in ((1000, 4095, 17), (333, 257, 1031), (17, 4095, 1000)):
            if supported(module, m, n, k):
                check(module, m, n, k, torch.float16, config=config)


def narrow_configs(module) -> list[dict]:
    """V5's or V6's narrow tiles (96 and 224 columns, rasterization group 16), and V6's pair along N."""
    configs = [c for c in versions.space(module) if c["block_n"] % 64 and c["group"] == 16]
    return configs + ([module.PAIR_N_NARROW] if hasattr(module, "PAIR_N_NARROW") else [])


@pytest.mark.skipif(ARCH != "sm_90a", reason="Hopper V5's and V6's narrow tiles")
@pytest.mark.parametrize("version", ("v5", "v6"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hopper_narrow_tiles(version, dtype):
    """V5's and V6's narrow tiles, 96 and 224 columns wide (one wgmma as wide as the tile, C staged in
    narrower blocks; V6: each CTA of the pair multicasting 48 or 112 rows of B, or, paired along N,
    64 rows of A), on ragged shapes (N = 257: three 96-column tiles, the second pair's second tile
    past N) and on qkv and gate-up at 256 tokens (M = 255: the pair's second tile clipped), in both
    dtypes."""
    module = versions.load(ARCH, version)
    for config in narrow_configs(module):
        for m, n, k in ((1000, 4095, 17), (333, 257, 1031), (17, 4095, 1000), (256, 6144, 4096), (255, 28672, 4096)):
            check(module, m, n, k, dtype, config=config)


@pytest.mark.parametrize("version", HERE)
def test_autotuned_call_and_errors_are_stable(version):
    # the autotuned kernel, run twice on the same operands, gives the same bits (no race)
    module = versions.load(ARCH, version)
    if not supported(module, 2048, 1536, 1024):
        pytest.skip(f"{version} is not made for 2048 x 1536 x 1024")
    a, b = random_operands(2048, 1536, 1024, torch.float16)
    first = versions.run(module, a, b, poisoned_output(2048, 1536, torch.float16))
    second = versions.run(module, a, b, poisoned_output(2048, 1536, torch.float16))
    assert torch.equal(first, second)
    assert relative_error(first, reference(a, b)) <= TOLERANCE[torch.float16]
