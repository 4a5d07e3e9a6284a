"""Every version of both series builds for its architecture on this machine (GPU or not), and its
PTX shows the step it is about."""

import re

import pytest
from conftest import representative_build

from matmul import build
from matmul.kernels import versions

CASES = [(arch, v) for arch in versions.ARCHS for v in versions.available(arch)]


def test_both_series_start_at_v0_and_v1():
    for arch in versions.ARCHS:
        assert versions.available(arch)[:2] == ["v0", "v1"]


@pytest.mark.parametrize("arch, version", CASES)
def test_representative_configuration_builds_clean(arch, version):
    module = versions.load(arch, version)
    assert module.REPRESENTATIVE in versions.space(module), "REPRESENTATIVE must be a point of the autotune space"
    result = representative_build(arch, version)
    assert result.ok, result.error[-3000:]
    assert f".target {arch}" in result.ptx()
    assert result.spill_bytes == 0, f"{result.spill_bytes} bytes of register spills"
    assert 0 < result.shared_bytes <= build.SHARED_MEMORY_LIMIT[arch]


@pytest.mark.parametrize("arch, version", CASES)
def test_ptx_shows_the_step(arch, version):
    module = versions.load(arch, version)
    found = build.markers_found(representative_build(arch, version), module.PTX_MARKERS)
    assert all(found.values()), f"missing from the PTX: {[m for m, ok in found.items() if not ok]}"


@pytest.mark.parametrize("arch", list(versions.ARCHS))
def test_v0_uses_the_tensor_core_without_tma_and_v1_adds_tma(arch):
    v0, v1 = representative_build(arch, "v0").ptx(), representative_build(arch, "v1").ptx()
    mma = "tcgen05.mma" if arch == "sm_100a" else "wgmma.mma_async"
    assert mma in v0 and mma in v1
    assert "cp.async.bulk.tensor" not in v0
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", v1)  # TMA load
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", v1)  # TMA store


def test_hopper_ptx_has_no_blackwell_only_qualifiers():
    for version in versions.available("sm_90a"):
        ptx = representative_build("sm_90a", version).ptx()
        assert "cta_group" not in ptx and "tcgen05" not in ptx


@pytest.mark.parametrize("arch", list(versions.ARCHS))
def test_sass_when_a_disassembler_is_installed(arch):
    from matmul.tilus_fixes import disassembler

    if disassembler() is None:
        pytest.skip("cuobjdump/nvdisasm not installed (pip install '.[sass]')")
    sass = representative_build(arch, "v1").sass()
    assert "UTMALDG" in sass  # the TMA load in machine code
    assert ("UTCHMMA" if arch == "sm_100a" else "HGMMA") in sass
    assert "LDL" not in sass and "STL" not in sass  # no local-memory traffic


@pytest.mark.full_space
@pytest.mark.parametrize("arch, version", CASES)
def test_every_configuration_builds_clean(arch, version):
    results = build.build_version(versions.load(arch, version), arch, all_configs=True)
    failed = [(r.config, r.error[-1500:]) for r in results if not r.ok]
    assert not failed, failed
    assert [r.config for r in results if r.spill_bytes] == []
    assert [r.config for r in results if not r.within_shared_limit] == []


def _job_that_fails_on_odd(index: int, label: str) -> str:
    import os

    return f"{label} {index} failed in {os.getpid()}" if index % 2 else ""


def test_builds_in_forked_processes_report_each_failure_in_order(capsys):
    import os

    from matmul.build import parallel

    errors = parallel.in_forked_processes(_job_that_fails_on_odd, [(i, "job") for i in range(5)], workers=2)
    assert [bool(e) for e in errors] == [False, True, False, True, False]
    assert all(str(os.getpid()) not in e for e in errors if e)  # each ran in a child, not here
    printed = capsys.readouterr().out
    assert "build failed: (1, 'job'): job 1 failed" in printed and "(3, 'job')" in printed
    assert "(0, 'job')" not in printed
    assert parallel.in_forked_processes(_job_that_fails_on_odd, []) == []
