"""Every version the tuner may pick reads torch's own b [K, N] in place (variant ``b_layout="kn"``).

Built for their architecture without a GPU: each V3-V7 of both families builds its "kn" variant,
and the MMA of that build reads B's tiles MN-major (N contiguous, as TMA writes boxes of b's rows):
Hopper's wgmma with its trans-b immediate 1 (V7, whose weight is the MMA's A side: trans-a 1),
Blackwell's tcgen05.mma with the transpose-B bit of its instruction descriptor (V7: transpose-A),
and the descriptor of the MN-major tile strides over its 64-column boxes. The "nk" builds keep
their K-major reads (``python -m matmul compile --compare`` shows them unchanged).
"""

import re

import pytest
import tilus

from matmul import build
from matmul.kernels import variant, versions

VERSIONS = ("v3", "v4", "v5", "v6", "v7")
CASES = [(arch, version) for arch in ("sm_90a", "sm_100a") for version in VERSIONS]
KN = variant.Variant(b_layout="kn")
# which MMA operand is the weight, i.e. B's tiles: A for V7 (swap-AB), B elsewhere
WEIGHT_SIDE = {"v7": "a"}

# the wgmma operands: desc-a, desc-b, scale-d, imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b
WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.(?:f16|bf16)\.(?:f16|bf16) \{[^}]*\}, (.*);")
# tcgen05 instruction descriptor (kind::f16), a literal after the two shared matrix descriptors of
# each tcgen05.mma call in source.cu: bit 15 transposes A (MN-major), bit 16 transposes B
TCGEN05_IDESC = re.compile(r"a_desc\w*, b_desc\w*, (\d+)u?,")
TRANSPOSE_A, TRANSPOSE_B = 1 << 15, 1 << 16
# a shared matrix descriptor as source.cu encodes it: address, then LBO and SBO in 16-byte units
DESCRIPTOR = re.compile(
    r"encode_smem_descriptor\(\(\(uint32_t\)\(\(+(?:shared|uniform)_addr(?:_\d+)?[^,]*, "
    r"uint32_t\((\d+)u\), uint32_t\((\d+)u\)"
)


def build_kn(arch, version, config=None, dtype=tilus.float16, b_layout="kn"):
    module = versions.load(arch, version)
    config = dict(module.REPRESENTATIVE if config is None else config)
    return build.build_script(module.Kernel, arch, {"dtype": dtype, **config, "b_layout": b_layout}, version=version)


def wgmma_transpose_flags(ptx: str) -> set[tuple[int, int]]:
    """(trans-a, trans-b) of every wgmma in the PTX."""
    flags = set()
    for operands in WGMMA.findall(ptx):
        *_, trans_a, trans_b = (x.strip() for x in operands.split(","))
        flags.add((int(trans_a), int(trans_b)))
    return flags


def tcgen05_transposes(source: str) -> set[tuple[bool, bool]]:
    """(transpose A, transpose B) of every tcgen05.mma instruction descriptor of the kernel."""
    return {(bool(int(d) & TRANSPOSE_A), bool(int(d) & TRANSPOSE_B)) for d in TCGEN05_IDESC.findall(source)}


def check_reads_weight_mn_major(result, arch, version, mn_major=True):
    assert result.ok, result.error
    source = (result.program_dir / "module" / "source.cu").read_text()
    weight_is_a = WEIGHT_SIDE.get(version) == "a"
    expected = (mn_major and weight_is_a, mn_major and not weight_is_a)
    if arch == "sm_90a":
        assert wgmma_transpose_flags(result.ptx()) == {tuple(int(x) for x in expected)}
    else:
        assert tcgen05_transposes(source) == {expected}
    if mn_major:
        # 16-bit MN-major tile, 128-byte swizzle: 64 columns (one TMA box, 128 bytes) by 8 rows of K
        # make a 1 KiB atom; SBO steps 8 rows of K (1 KiB), LBO the next box: 64 x block_k elements
        lbo_sbo = {(int(lbo) * 16, int(sbo) * 16) for lbo, sbo in DESCRIPTOR.findall(source)}
        assert (64 * 64 * 2, 1024) in lbo_sbo or (version == "v7" and arch == "sm_90a"), lbo_sbo


@pytest.mark.parametrize("arch, version", CASES, ids=[f"{a}-{v}" for a, v in CASES])
def test_version_declares_kn(arch, version):
    assert variant.supported(versions.load(arch, version), KN)


@pytest.mark.parametrize("arch, version", CASES, ids=[f"{a}-{v}" for a, v in CASES])
def test_kn_variant_builds_with_a_transposed_mma(arch, version):
    result = build_kn(arch, version)
    check_reads_weight_mn_major(result, arch, version)
    ptx = result.ptx()
    module = versions.load(arch, version)
    missing = [marker for marker in module.PTX_MARKERS if marker not in ptx]
    assert not missing, missing


@pytest.mark.parametrize("arch", ("sm_90a", "sm_100a"))
def test_nk_variant_reads_k_major(arch):
    check_reads_weight_mn_major(build_kn(arch, "v3", b_layout="nk"), arch, "v3", mn_major=False)


def test_kn_builds_for_bfloat16():
    check_reads_weight_mn_major(build_kn("sm_90a", "v5", dtype=tilus.bfloat16), "sm_90a", "v5")


@pytest.mark.full_space
@pytest.mark.parametrize("arch, version", CASES, ids=[f"{a}-{v}" for a, v in CASES])
def test_every_configuration_builds_kn(arch, version):
    for config in versions.build_configs(versions.load(arch, version)):
        check_reads_weight_mn_major(build_kn(arch, version, config), arch, version)
