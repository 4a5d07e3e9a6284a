"""Hopper V6's ping-pong option without a GPU: it is built and checked but not tuned (off in V6's
autotune space, in its EXTRA_CONFIGS, in both tile shapes); it builds for sm_90a without spills or
serialized wgmma; its PTX shows whole 128 x 128 tiles per warpgroup and the turn hand-over; and its
epilogue's shared-memory stores are free of bank conflicts, read from the layout tilus built. Its
synchronization is checked by tests/test_protocol.py (``protocol.configs_to_check`` includes it;
planted bugs in tests/protocol_mutants.py); on the H100 it runs in tests/test_pingpong_gpu.py."""

import functools
import re

import numpy as np
import pytest

from matmul import build, protocol
from matmul.kernels import versions

ARCH = "sm_90a"
V6 = versions.load(ARCH, "v6")


PINGPONGS = {"128x128": V6.PINGPONG, "64x256": V6.PINGPONG_WIDE}


@functools.cache
def pingpong_build(tile: str = "128x128") -> build.BuildResult:
    return build.build_config(V6, ARCH, PINGPONGS[tile])


@functools.cache
def plain_build() -> build.BuildResult:
    return build.build_config(V6, ARCH, V6.REPRESENTATIVE)


def test_pingpong_is_built_and_checked_but_not_tuned():
    space = versions.space(V6)
    assert V6.REPRESENTATIVE in space and not any(c.get("pingpong") for c in space)  # matmul() never picks it
    assert V6.PINGPONG in versions.build_configs(V6) and V6.PINGPONG_WIDE in versions.build_configs(V6)
    for config in PINGPONGS.values():
        assert protocol.consumers_take_turns(V6, config)
    assert not protocol.consumers_take_turns(V6, V6.REPRESENTATIVE)
    # the synchronization checker runs it beside the representative
    assert V6.PINGPONG in protocol.configs_to_check(V6, ARCH)


@pytest.mark.parametrize("tile", list(PINGPONGS))
def test_pingpong_builds_clean(tile):
    result = pingpong_build(tile)
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0 and result.stack_bytes == 0
    assert result.threads == 288 and result.cluster == (2, 1, 1)  # V6's CTA and pair
    assert result.within_shared_limit
    report = (result.program_dir / "module" / "nvcc_output.txt").read_text()
    # a wgmma whose accumulator registers are touched between issue and wait is serialized by ptxas
    assert not re.search(r"C7515|C7520|serialized", report), report


@pytest.mark.parametrize("tile", list(PINGPONGS))
def test_each_warpgroup_multiplies_a_whole_tile_and_hands_the_turn_over(tile):
    config = PINGPONGS[tile]
    text, plain = pingpong_build(tile).ptx(), plain_build().ptx()
    if tile == "128x128":  # two rows of m64n128k16 (without the option: 64 rows of 256 columns)
        assert "wgmma.mma_async.sync.aligned.m64n128k16" in text and "m64n256k16" not in text
        assert "m64n128k16" not in plain
    else:  # V6's instruction, one row of it
        assert "wgmma.mma_async.sync.aligned.m64n256k16" in text
    # the pair still shares B by multicast and the leader's tile broadcast
    assert ".multicast::cluster" in text and "st.async.shared::cluster.mbarrier::complete_tx::bytes" in text
    # the turn: a plain CTA-local arrival (the hand-over), which V6 without the option never makes
    hand_over = "mbarrier.arrive.release.cta.shared::cta.b64"
    assert text.count(hand_over) == 2 and hand_over not in plain  # one per warpgroup
    # full and empty per stage, filled and drained per broadcast slot, and the two turn barriers
    inits = text.count("mbarrier.init.shared::cta.b64")
    assert inits == 2 * config["stages"] + 2 * 2 + 2
    assert plain.count("mbarrier.init.shared::cta.b64") == 2 * V6.REPRESENTATIVE["stages"] + 2 * 2
    assert "stmatrix.sync.aligned" in text and "cp.async.bulk.wait_group.read 1" in text  # V5's epilogue


def bank_conflicts(offsets: np.ndarray, nbytes: int = 2) -> int:
    """The worst number of ``stmatrix`` rows that share a group of 4 banks (one 16-byte chunk of
    the 128 bytes a wavefront serves), over every 8 x 8 matrix (8 consecutive rows, 8 consecutive
    columns) of a 16-bit tile whose element offsets are ``offsets`` [rows, cols]: 1 means every
    matrix is stored in one wavefront."""
    rows, cols = offsets.shape
    worst = 0
    for r0 in range(0, rows, 8):
        for c0 in range(0, cols, 8):
            chunk = offsets[r0 : r0 + 8, c0 : c0 + 8]
            # each row of a matrix is 16 contiguous bytes (one stmatrix address)
            assert (chunk - chunk[:, :1] == np.arange(8)).all()
            groups = (chunk[:, 0] * nbytes // 16) % 8
            worst = max(worst, int(np.bincount(groups).max()))
    return worst


def test_bank_conflicts_counts_what_a_row_major_wide_tile_costs():
    """The control: a whole 128 x 128 tile staged row-major (256-byte rows) puts the 8 rows of every
    matrix in the same banks; 64 columns (128-byte rows) without a swizzle as well."""
    assert bank_conflicts(np.arange(128 * 128).reshape(128, 128)) == 8
    assert bank_conflicts(np.arange(64 * 64).reshape(64, 64)) == 8


@pytest.mark.parametrize("tile", list(PINGPONGS))
def test_the_epilogue_stores_into_shared_memory_without_bank_conflicts(tile):
    from tilus.ir.tools.instruction_collector import collect_instructions

    function = protocol.transpile(V6, ARCH, PINGPONGS[tile])
    stores = [inst for inst in collect_instructions(function) if type(inst).__name__ == "StoreSharedInst"]
    assert stores, "no shared-memory store in the ping-pong build"
    for inst in stores:  # the staging buffers of the epilogue, one 64 x 64 block each
        layout = inst.inputs[0].layout
        assert list(layout.shape) == [64, 64]
        assert bank_conflicts(layout.as_numpy_grid()) == 1, layout


@pytest.mark.parametrize("config", [V6.REPRESENTATIVE, *PINGPONGS.values()], ids=["plain", *PINGPONGS])
def test_the_synchronization_checker_passes_it(config):
    report = protocol.check(ARCH, "v6", config, seeds=8)
    assert report.ok, f"{report.label}: {report.verdict}\n{report.trace()}"
