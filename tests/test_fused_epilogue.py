"""The fused epilogue (``pipeline.fused_epilogue``) without a GPU: the register layouts its swiglu
views rest on, which versions declare it, and that each V3-V7 of both families builds with it and
shows its math in the PTX. On the H100 the Hopper versions are run by
tests/test_fused_epilogue_gpu.py; the Blackwell ones are compiled and inspected only.

By default each version is built with one fused variant per family (bias + gelu_tanh in one, swiglu
in the other, alternating, so that every version meets both); ``-m full_space`` builds every
version of both families with every activation."""

import itertools
import re

import pytest
from tilus.ir.layout.ops.register_ops import compose, local, reshape, unsqueeze

from matmul.build import compiler
from matmul.kernels import variant as variants
from matmul.kernels import versions
from pipeline import fused_epilogue
from pipeline.fused_epilogue import in_column_groups

ARCHS = ("sm_90a", "sm_100a")
FUSED = ("v3", "v4", "v5", "v6", "v7")
KEYS = ("bias+gelu_tanh", "swiglu")
DEFAULT = [(arch, version, KEYS[(i + j) % 2]) for i, arch in enumerate(ARCHS) for j, version in enumerate(FUSED)] + [
    ("sm_90a", "v7", "bias+swiglu"),
    ("sm_100a", "v7", "bias+swiglu"),
]
FULL = [
    (arch, version, key)
    for arch, version in itertools.product(ARCHS, FUSED)
    for key in ("bias", "relu", "gelu_tanh", "gelu_erf", "silu", "bias+silu", "swiglu", "bias+swiglu")
]


def test_every_tile_the_versions_fuse_is_its_column_groups_one_after_the_other():
    # Hopper: a warpgroup's 64-row wgmma accumulator, in 64-column blocks (128 for swiglu)
    assert all(in_column_groups("wgmma", 64, cols) for cols in (64, 128, 256))
    # Blackwell: a tcgen05.load of 128 lanes, e_block_n or 64 columns
    assert all(in_column_groups("tcgen05", 128, cols) for cols in (16, 32, 64, 128))
    # V7: the transposed split-K slice, tokens x (weight rows / split)
    assert all(in_column_groups("split_k", tokens, rows) for tokens in (16, 32, 64, 128, 256) for rows in (16, 32, 64))


@pytest.mark.parametrize("tokens", (8, 16, 32, 64, 128, 256))
def test_a_transposed_wgmma_slab_holds_each_gate_up_pair_in_one_thread(tokens):
    # V7 without a split (epilogue.SwappedSlabStore): the slab's 64 columns lie across threads, and
    # swiglu reads its pairs through swiglu_blocks: [j, h, t, 8 q + i] must be row 8 j + t and
    # column 16 q + 8 h + i, (j, h) a thread's outermost registers, and each output element in the
    # thread that holds its pair
    tile = fused_epilogue.fragment_layout("wgmma_t", tokens, 64)
    view, block = fused_epilogue.swiglu_blocks(tokens, 64)
    blocks = tokens // 8
    outermost = compose(local(blocks, 2, 1, 1), unsqueeze(block, [0, 1]))
    out = reshape(compose(local(blocks, 1, 1), unsqueeze(block, [0])), [tokens, 32])
    for layout in (view, outermost, out):
        assert (layout.spatial_size, layout.local_size * (2 if layout is out else 1)) == (
            tile.spatial_size,
            tile.local_size,
        )
    for thread in range(tile.spatial_size):
        for i in range(tile.local_size):
            j, h, t, c = (int(x) for x in view.get_global(spatial_index=thread, local_index=i))
            assert tuple(int(x) for x in outermost.get_global(spatial_index=thread, local_index=i)) == (j, h, t, c)
            expected = (8 * j + t, 16 * (c // 8) + 8 * h + c % 8)
            assert tuple(int(x) for x in tile.get_global(spatial_index=thread, local_index=i)) == expected
            if h == 0:  # the output element of this pair: its row, column 8 q + i, in this thread
                k = i % block.local_size + j * block.local_size
                assert tuple(int(x) for x in out.get_global(spatial_index=thread, local_index=k)) == (8 * j + t, c)
    # the tile is the transpose of the accumulator's own layout, as SwappedSlabStore sees it
    acc = fused_epilogue.fragment_layout("wgmma", 64, tokens)
    for thread in range(acc.spatial_size):
        for i in range(acc.local_size):
            r, c = (int(x) for x in acc.get_global(spatial_index=thread, local_index=i))
            assert tuple(int(x) for x in tile.get_global(spatial_index=thread, local_index=i)) == (c, r)


def test_v3_to_v7_declare_the_fused_epilogue_and_earlier_versions_do_not():
    fused = variants.Variant(bias=True, activation="swiglu")
    for arch in ARCHS:
        for version in versions.available(arch):
            module = versions.load(arch, version)
            assert variants.supported(module, fused) == (version in FUSED), (arch, version)
            assert variants.supported(module, variants.PLAIN)


def check_build(arch: str, version: str, key: str):
    module = versions.load(arch, version)
    var = variants.Variant.parse(key)
    result = compiler.build_config(module, arch, module.REPRESENTATIVE, variant=var)
    assert result.ok, result.error[-3000:]
    ptx = result.ptx()
    assert ".f64" not in ptx  # the epilogue's constants are float32, not double
    if var.activation not in (None, "relu"):
        assert "ex2.approx" in ptx  # exp of silu, gelu's tanh form or erfc
    if var.activation == "relu":
        assert "max.f32" in ptx or "selp.f32" in ptx
    if var.bias:
        assert "ld.global" in ptx  # the bias slice (the operands come by TMA)
    if arch == "sm_90a":
        assert result.spill_bytes == 0 and result.stack_bytes == 0
        report = (result.program_dir / "module" / "nvcc_output.txt").read_text()
        assert not re.search(r"C7515|C7520|serialized", report), report  # the main loop's wgmma are untouched
    for marker in module.PTX_MARKERS:
        assert marker in ptx, marker  # the version's own step is still there


@pytest.mark.parametrize("arch, version, key", DEFAULT)
def test_builds_with_a_fused_epilogue(arch, version, key):
    check_build(arch, version, key)


@pytest.mark.full_space
@pytest.mark.parametrize("arch, version, key", FULL)
def test_every_activation_builds(arch, version, key):
    check_build(arch, version, key)
