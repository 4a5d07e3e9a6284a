"""The Blackwell series V2-V6 and V8: each version's PTX holds what its step is about.

The kernels are built for sm_100a and inspected, never run (no Blackwell GPU here). Each test reads
the representative build (cached once per session by ``conftest.representative_build``); only the
4-CTA cluster configuration of V6 is built on top (``four_cta_build``).
"""

import functools
import inspect
import re

import pytest
from conftest import representative_build, widened_int4

import pipeline
from matmul import build
from matmul.kernels import versions

ARCH = "sm_100a"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cta.global"


def ptx_of(version: str) -> str:
    result = representative_build(ARCH, version)
    assert result.ok, result.error[-3000:]
    return result.ptx()


def test_v2_keeps_several_stages_in_flight():
    stages = versions.load(ARCH, "v2").REPRESENTATIVE["stages"]
    ptx, v1 = ptx_of("v2"), ptx_of("v1")
    # every stage's loads are issued before the first MMA (V1 issues exactly one stage's worth)
    assert ptx[: ptx.index("tcgen05.mma")].count(TMA_LOAD) >= 2 * stages
    assert v1[: v1.index("tcgen05.mma")].count(TMA_LOAD) == 2
    # a "full" and an "empty" barrier per stage, and one for the finished accumulator
    assert ptx.count("mbarrier.init") >= 2 * stages + 1
    # each MMA's completion is committed to the barrier of the stage it read
    assert ptx.count("tcgen05.commit") >= 2


def test_v3_gives_loads_mmas_and_epilogue_their_own_warps():
    ptx, v2 = ptx_of("v3"), ptx_of("v2")
    # the TMA warp's loop and the MMA warp's loop are separate branches: every TMA load of the
    # kernel comes before its first MMA (in V2 one warp interleaves refills with the MMAs)
    assert ptx.count(TMA_LOAD) >= 2 and ptx.rindex(TMA_LOAD) < ptx.index("tcgen05.mma")
    assert v2.rindex(TMA_LOAD) > v2.index("tcgen05.mma")
    # the epilogue warpgroup synchronizes on its own named barrier (128 threads), not the whole CTA
    assert re.search(r"bar(\.cta)?\.sync\s+1,\s*128;", ptx)
    assert representative_build(ARCH, "v3").threads == 6 * 32


def test_v4_rasterizes_a_one_dimensional_grid_in_groups():
    group = versions.load(ARCH, "v4").REPRESENTATIVE["group"]
    ptx, v3 = ptx_of("v4"), ptx_of("v3")
    # one linear block index, mapped to (m tile, n tile) by TileRasterizer
    assert "%ctaid.y" in v3 and "%ctaid.y" not in ptx
    assert "div.s32" in ptx  # linear index -> group of tile rows
    assert re.search(rf"min\.s32\s+%r\d+, %r\d+, {group};", ptx)  # the last group may be shorter


def test_v4_to_v6_use_the_shared_pipeline_code():
    for version in ("v4", "v5", "v6"):
        if version not in versions.available(ARCH):
            continue
        module = versions.load(ARCH, version)
        source = inspect.getsource(module)
        assert module.Pipeline is pipeline.Pipeline
        assert "class Pipeline" not in source and "mbarrier.alloc" not in source, version


def tmem_columns_allocated(ptx: str) -> list[int]:
    """The column counts of the kernel's tcgen05.alloc instructions (moved into a register first)."""
    counts = []
    for match in re.finditer(r"tcgen05\.alloc\.[^\n]*\[%r\d+\], (%r\d+);", ptx):
        mov = re.findall(rf"mov\.b32\s+{match.group(1)}, (\d+);", ptx[: match.start()])
        counts.append(int(mov[-1]))
    return counts


def test_v5_is_persistent_with_clc_and_drains_an_accumulator_ring():
    config = versions.load(ARCH, "v5").REPRESENTATIVE
    ptx = ptx_of("v5")
    # one scheduler warp asks to cancel a not yet launched cluster; every role decodes the responses
    assert re.search(r"clusterlaunchcontrol\.try_cancel\.async\.shared::cta\.mbarrier::complete_tx::bytes\.b128", ptx)
    assert ptx.count("clusterlaunchcontrol.query_cancel.is_canceled") >= 4  # TMA, MMA, scheduler, epilogue
    # the accumulator is a ring of acc_stages TMEM buffers
    assert tmem_columns_allocated(ptx) == [config["acc_stages"] * config["block_n"]]
    # the epilogue stores sub-tiles with TMA and keeps stores in flight while it fills the next buffer
    assert re.search(r"cp\.async\.bulk\.wait_group\.read [1-3];", ptx)
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") >= 2
    assert "clusterlaunchcontrol" not in ptx_of("v4")


@functools.cache
def four_cta_build() -> build.BuildResult:
    """V6 as a 4-CTA cluster (two CTA pairs sharing the B tile): the representative, cluster_ctas=4,
    which V6 keeps out of its autotune space (``FOUR_CTA``) but builds on purpose."""
    module = versions.load(ARCH, "v6")
    config = dict(module.REPRESENTATIVE, cluster_ctas=4)
    assert config == module.FOUR_CTA and config not in versions.space(module)
    result = build.build_config(module, ARCH, config)
    assert result.ok, result.error[-3000:]
    return result


def test_v6_pairs_two_ctas_on_one_256_row_tile():
    result = representative_build(ARCH, "v6")
    ptx = ptx_of("v6")
    assert result.cluster == (2, 1, 1)
    # the pair's TMEM, MMA and commits are 2-CTA operations; no 1-CTA MMA is left
    assert "tcgen05.alloc.cta_group::2" in ptx and "tcgen05.mma.cta_group::2" in ptx
    assert "tcgen05.mma.cta_group::1" not in ptx
    # every commit is multicast to the barriers of both CTAs
    commits = re.findall(r"tcgen05\.commit\.[^\s]*", ptx)
    multicast_commit = "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64"
    assert commits and set(commits) == {multicast_commit}
    # both CTAs' TMA loads complete on the leader's barrier (named through mapa in the odd CTA)
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.[^\s]*\.cta_group::2 ", ptx)
    assert "mapa.shared::cluster" in ptx
    # the CLC response is multicast to both CTAs
    assert (
        "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.multicast::cluster::all.b128"
    ) in ptx
    # consumers arrive on the leader's barriers in the peer CTA (ordered at CTA scope:
    # test_blackwell_generated_code.py)
    assert "mbarrier.arrive.expect_tx.release.cta.shared::cluster.b64" in ptx
    # a cluster barrier after the barriers are set up, and another before TMEM is freed
    assert ptx.count("barrier.cluster.arrive") >= 2 and ptx.count("barrier.cluster.wait") >= 2
    assert ptx.rindex("barrier.cluster.wait") < ptx.index("tcgen05.dealloc.cta_group::2")


def test_v6_four_cta_cluster_multicasts_the_shared_operand():
    result = four_cta_build()
    ptx = result.ptx()
    assert result.cluster == (4, 1, 1)
    assert result.spill_bytes == 0 and result.shared_bytes <= build.SHARED_MEMORY_LIMIT[ARCH]
    # the MMA is still a pair's (there is no 4-CTA tcgen05.mma); the B half is loaded once per
    # cluster and multicast into both pairs
    assert "tcgen05.mma.cta_group::2" in ptx
    assert re.search(
        r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
        r"\.multicast::cluster\.cta_group::2 "
        r"\[%r\d+\], \[%rd\d+, \{%r\d+, %r\d+\}\], \[%r\d+\], %rs\d+;",
        ptx,
    )
    # commits reach all four CTAs (mask 0b1111), and the 2-CTA build has no multicast TMA load
    assert re.search(r"mov\.b16\s+%rs\d+, 15;", ptx)
    assert "multicast::cluster.cta_group::2" not in ptx_of("v6")


def pair_mma_shapes(source: str) -> list[tuple[int, int]]:
    """(M, N) of every 16-bit cta_group::2 MMA in a build's CUDA source, decoded from its instruction
    descriptor (PTX ISA, "Instruction descriptor": N >> 3 in bits 17-22, M >> 4 in bits 24-28)."""
    call = r"tcgen05_mma_cta_group_cta_group_2_kind_f16_a_shared\(.*?, (\d+), "
    return [(((d >> 24) & 0x1F) << 4, ((d >> 17) & 0x3F) << 3) for d in map(int, re.findall(call, source))]


@pytest.mark.parametrize("name, width", [("NARROW", 96), ("NARROW_WIDE", 224)])
def test_v6_narrow_tiles_are_one_pair_mma_as_wide_as_the_tile(name, width):
    """Hopper's narrow tiles for a few hundred tokens, as Blackwell V6 pairs: the pair's MMA is one
    cta_group::2 instruction per 16-deep K step, as wide as the tile, each CTA loading half of B (for
    B [N, K] only: a half of 48 rows is no whole box of torch's b [K, N]). Built, not in the space."""
    module = versions.load(ARCH, "v6")
    config = getattr(module, name)
    assert config in module.EXTRA_CONFIGS and config not in versions.space(module)
    result = build.build_config(module, ARCH, config)
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0 and result.shared_bytes <= build.SHARED_MEMORY_LIMIT[ARCH]
    shapes = pair_mma_shapes((result.program_dir / "module" / "source.cu").read_text())
    assert shapes == [(256, width)] * 4  # a 64-deep K block: four K steps of one instruction each
    refused = build.build_config(module, ARCH, config, variant=versions.Variant(b_layout="kn"))
    assert not refused.ok and f"a B tile of {width // 2} rows is no multiple of 64" in refused.error


def test_sass_of_v2_to_v6_when_a_disassembler_is_installed():
    import pytest

    from matmul.tilus_fixes import disassembler

    if disassembler() is None:
        pytest.skip("cuobjdump/nvdisasm not installed (pip install '.[sass]')")
    for version in ("v1", "v2", "v3", "v4", "v5", "v6"):
        sass = representative_build(ARCH, version).sass()
        assert "UTCHMMA" in sass and "UTMALDG" in sass, version
        assert "LDL" not in sass and "STL" not in sass, version  # no local-memory traffic
    sass = representative_build(ARCH, "v6").sass()
    # the pair's MMA, its multicast commit, its 2-CTA TMA loads and the cluster barrier in machine code
    for op in ("UTCHMMA.2CTA", "UTCBAR.2CTA.MULTICAST", "UTMALDG.2D.2CTA", "UCGABAR_ARV", "UCGABAR_WAIT"):
        assert op in sass, op


# -- V8: int4 weights widened by a warpgroup into tensor memory, the MMA's A operand ----------------


def v8_reads(words, n_pad: int, k: int):
    """q [N_pad, K] as Blackwell V8's widening threads read the packed words (v8.py's docstring): each
    thread's 16 words through the kernel's view of a stage (tilus's own layout operations), widened as
    ``pipeline.widen.int4_pairs`` does (emulated from its steps), each 16-bit register placed by the
    register layout the widened tile has (``WIDE``), which tcgen05.st writes row by row into the TMEM
    lanes."""
    import torch
    from tilus.ir.layout.ops.shared_ops import shared_permute, shared_reshape, shared_row_major

    v8 = versions.load(ARCH, "v8")
    view = shared_reshape(shared_permute(shared_row_major(*v8.WORD_SPLIT), v8.WORD_ORDER), [v8.ROWS, 16])
    offset = [[int(view(t, i).value) for i in range(16)] for t in range(128)]
    place = [
        [tuple(int(x) for x in v8.WIDE.get_global(spatial_index=t, local_index=i)) for i in range(128)]
        for t in range(128)
    ]
    q = torch.empty(n_pad, k, dtype=torch.int8)
    flat = words.view(torch.int32)
    rows, cols = v8.PACKED_BOX
    for tile in range(-(-n_pad // 128)):
        for b in range(k // 128):
            box = torch.zeros(rows, cols, dtype=torch.int32)  # TMA fills rows past the matrix with zeros
            part = flat[rows * tile : rows * tile + rows, cols * b : cols * b + cols]
            box[: part.shape[0]] = part
            box = box.reshape(-1)
            for t in range(128):
                assert t // 32 == place[t][0][0] // 32  # a warp writes only the 32 TMEM lanes it may access
                values = widened_int4(box[offset[t]]).reshape(128).to(torch.int8)  # its registers in order
                for i in range(128):
                    row, col = place[t][i]
                    if 128 * tile + row < n_pad:
                        q[128 * tile + row, 128 * b + col] = values[i]
    return q


def test_v8_reads_hopper_v8_packed_weight():
    import torch

    from matmul.quant import int4

    g = torch.Generator().manual_seed(3)
    q = torch.randint(-8, 8, (150, 256), generator=g, dtype=torch.int8)  # N_pad 192: a half-empty last tile
    read = v8_reads(int4.pack(q), 192, 256)
    assert torch.equal(read[:150], q)
    assert (read[150:] == 0).all()


def test_v8_widened_tile_is_tcgen05_st_16x128b_registers():
    """Two 16-bit values a 32-bit register, consecutive K columns of one row: one TMEM column each."""
    v8 = versions.load(ARCH, "v8")
    for t in range(128):
        for i in range(0, 128, 2):
            (r0, c0), (r1, c1) = (v8.WIDE.get_global(spatial_index=t, local_index=j) for j in (i, i + 1))
            assert (int(r0), int(c0) + 1) == (int(r1), int(c1)) and int(c0) % 2 == 0


def test_v8_widens_int4_into_tensor_memory_for_an_mma_reading_a_there():
    v8 = versions.load(ARCH, "v8")
    result = representative_build(ARCH, "v8")
    assert result.ok, result.error[-3000:]
    ptx = result.ptx()
    assert all(build.markers_found(result, v8.PTX_MARKERS).values())
    assert result.spill_bytes == 0 and 0 <= result.shared_bytes - v8.shared_bytes(**v8.REPRESENTATIVE) < 1024
    # A from tensor memory: [d], [a], b-descriptor, instruction descriptor; no shared-memory A (V7's)
    mmas = re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16 (\[%r\d+\]), (\S+), %rd\d+, %r\d+, p;", ptx)
    assert mmas and all(a.startswith("[%r") for _, a in mmas), mmas[:2]
    assert len(mmas) == ptx.count("tcgen05.mma")
    # the accumulator and the widened tiles: two TMEM allocations, 64 columns a widened 128 x 128 tile
    config = v8.REPRESENTATIVE
    assert sorted(tmem_columns_allocated(ptx)) == sorted([config["block_m"], 64 * config["wide_stages"]])
    # a thread's 64 packed bytes in four 16-byte loads; 128 widened values stored to TMEM by two
    # 16x128b.x16 stores (the lanes 32 w ... 32 w + 15 and 32 w + 16 ... 32 w + 31 of its warp)
    assert ptx.count("ld.shared.v4") == 4
    assert ptx.count("tcgen05.st.sync.aligned.16x128b.x16.b32") == 2
    # the int4 -> float16 conversion (Hopper V8's, pipeline.widen.int4_pairs): of a thread's 16 words,
    # a lop3 with the 0x64086408 magic number and sign offset (1678271496) and one sub.f16x2 or
    # fma.rn.f16x2 a pair of values, no prmt
    assert (ptx.count("lop3.b32"), ptx.count("sub.f16x2"), ptx.count("fma.rn.f16x2")) == (64, 32, 32)
    assert "prmt" not in ptx
    assert "1678271496u" in (result.program_dir / "module" / "source.cu").read_text()
    # from the packed words to the TMEM stores nothing is written to shared memory
    widening = ptx[ptx.index("ld.shared.v4") : ptx.rindex("tcgen05.st.")]
    assert "st.shared" not in widening


def test_v8_space_fits_shared_and_tensor_memory():
    v8 = versions.load(ARCH, "v8")
    for config in versions.space(v8):
        assert v8.shared_bytes(**config) <= build.SHARED_MEMORY_LIMIT[ARCH] - 1024, config
        # TMEM is the SM's (512 columns), shared by the CTAs resident on it: one CTA must fit
        assert v8.tmem_columns(config["block_m"], config["wide_stages"]) <= 512, config
    assert v8.REPRESENTATIVE in versions.space(v8)


@pytest.mark.full_space
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_v8_every_configuration_builds(dtype):
    import tilus

    v8 = versions.load(ARCH, "v8")
    for config in versions.space(v8):
        result = build.build_config(v8, ARCH, config, getattr(tilus, dtype))
        assert result.ok, (config, result.error[-3000:])
        assert result.spill_bytes == 0 and result.within_shared_limit, config
        # the widening and the A-in-TMEM MMA in every configuration (split 1 has no cluster exchange)
        widening = [m for m in v8.PTX_MARKERS if "cluster" not in m]
        assert all(build.markers_found(result, widening).values()), config
