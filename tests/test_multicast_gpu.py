"""Hopper V7 with the weight tile multicast to the token tiles of a cluster computes C = A @ B^T right.

Every multicast configuration V7 builds (its space, and the ones that also split K over the cluster,
in ``EXTRA_CONFIGS`` until they are measured), M
from 64 to 256 (64, 100, 128, 200, 256: a cluster's last token tile ragged, or wholly past M),
weights whose N and K are multiples of no tile (K = 63 is one K block: only the first CTA of a
weight group loads a weight tile, and with a split of 2 the second K range is empty, one block
wholly past K; K = 130 is three blocks and K = 1087 seventeen, so with a split of 2 the K ranges are
uneven, 2 and 1 or 9 and 8 blocks, and so are the turns within them), both dtypes, both layouts of
B; fresh random operands, the output poisoned with NaN first, compared with a float32 reference
(``test_skinny_gpu`` runs the space's at M in {1, 17, 255}).
"""

import pytest
import torch
from conftest import gpu_arch

from matmul.kernels import variant, versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error

ARCH = "sm_90a"
MODULE = versions.load(ARCH, "v7")
MULTICAST = [c for c in versions.build_configs(MODULE) if c.get("multicast", 1) > 1]  # the combined ones: EXTRA_CONFIGS
TOKENS = (64, 100, 128, 200, 256)
WEIGHTS = ((4095, 1087), (1023, 4095), (31, 63), (200, 130))
DTYPES = (torch.float16, torch.bfloat16)
KN = variant.Variant(b_layout="kn")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(gpu_arch() != ARCH, reason="needs a Hopper GPU (sm_90a)"),
]


def config_id(config: dict) -> str:
    return "/".join(str(v) for v in config.values())


def check(out, a, b, what):
    assert not out.isnan().any(), f"{what}: elements left unwritten (NaN)"
    error = relative_error(out, reference(a, b))
    assert error <= TOLERANCE[a.dtype], f"{what}: relative error {error:.3g}"


def test_the_space_has_multicast_configurations():
    # with and without a split of K: both kinds of cluster run below
    assert {c["split"] > 1 for c in MULTICAST} == {False, True}


@pytest.mark.parametrize("config", MULTICAST, ids=config_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_multicast_on_ragged_shapes(config, dtype):
    for m in TOKENS:
        for n, k in WEIGHTS:
            a, b = random_operands(m, n, k, dtype)
            out = poisoned_output(m, n, dtype)
            versions.run(MODULE, a, b, out, config=config)
            check(out, a, b, f"V7 {config} {m}x{n}x{k} {dtype}")


def kn_copy(b: torch.Tensor) -> torch.Tensor:
    """b [K, N] row-major (rows padded to 16 bytes, the padding noise) holding B^T for B [N, K]."""
    from matmul.contract import aligned_row_length

    n, k = b.shape
    out = torch.empty((k, aligned_row_length(n, b.dtype)), dtype=b.dtype, device=b.device).uniform_(-1, 1)
    out = out[:, :n]
    out.copy_(b.T)
    return out


@pytest.mark.parametrize("config", MULTICAST, ids=config_id)
def test_multicast_reads_b_kn_in_place(config):
    # the multicast weight tile as MN-major boxes of b [K, N]
    dtype = torch.bfloat16
    kernel = versions.kernel(MODULE, dtype, config, KN)
    for m, (n, k) in ((100, (1023, 4095)), (256, (200, 130)), (128, (4095, 1087))):
        a, b = random_operands(m, n, k, dtype)
        out = poisoned_output(m, n, dtype)
        with torch.cuda.device(a.device):
            kernel(*versions.launch_args(a, kn_copy(b), out, b_layout="kn"))
        check(out, a, b, f"V7 kn {config} {m}x{n}x{k}")
