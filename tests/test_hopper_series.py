"""The Hopper series V2-V6 without a GPU: each version builds for sm_90a and its PTX (and, where a
disassembler is installed, its SASS) shows the one step it adds over the previous version, and
none of them makes ptxas serialize its wgmma. The shared pieces they are built from are checked
in plain Python (tile schedules, the accumulator's column blocks). On the H100 they are run by
tests/test_gpu_correctness.py."""

import inspect
import re

import pytest
from conftest import representative_build

from matmul.kernels import versions
from pipeline import grouped_tile_order
from pipeline.schedulers import DEFAULT_SM_COUNT, static_tiles

ARCH = "sm_90a"
SERIES = ["v2", "v3", "v4", "v5", "v6"]


def ptx(version: str) -> str:
    return representative_build(ARCH, version).ptx()


def ptxas_report(version: str) -> str:
    return (representative_build(ARCH, version).program_dir / "module" / "nvcc_output.txt").read_text()


def source(version: str) -> str:
    return (representative_build(ARCH, version).program_dir / "module" / "source.cu").read_text()


def test_the_series_is_complete():
    assert versions.available(ARCH) == [f"v{i}" for i in range(8)]
    for version in SERIES:
        module = versions.load(ARCH, version)
        assert module.IDEA and module.PTX_MARKERS and module.__doc__.startswith(f"Hopper V{version[1]}:")
        assert "Synchronization" in module.__doc__  # the docstring states its barrier invariants


@pytest.mark.parametrize("version", SERIES)
def test_builds_clean_for_sm90a(version):
    result = representative_build(ARCH, version)
    assert result.ok, result.error[-3000:]
    assert ".target sm_90a" in ptx(version)
    assert result.spill_bytes == 0 and result.stack_bytes == 0
    assert "cta_group" not in ptx(version) and "tcgen05" not in ptx(version)
    # a wgmma whose accumulator registers are touched between issue and wait is serialized by ptxas
    assert not re.search(r"C7515|C7520|serialized", ptxas_report(version)), ptxas_report(version)


@pytest.mark.parametrize("version", SERIES)
def test_every_version_multiplies_with_wgmma_from_tma_loaded_tiles(version):
    text = ptx(version)
    assert "wgmma.mma_async.sync.aligned" in text
    assert "cp.async.bulk.tensor.2d.shared::cta.global" in text or ".multicast::cluster" in text
    assert "wgmma.wait_group.sync.aligned 1" in text  # one wgmma group stays in flight


def test_v2_is_a_ring_of_stages_issued_by_the_multiplying_warps():
    result = representative_build(ARCH, "v2")
    assert result.threads == 128  # one warpgroup does everything
    stages = versions.load(ARCH, "v2").REPRESENTATIVE["stages"]
    barriers = re.findall(r"mbarrier_init_shared\(\(?barriers", source("v2"))
    assert len(barriers) == stages  # one barrier per slot, no "empty" barriers
    assert "mbarrier.arrive.release" not in ptx("v2")  # nobody hands slots back: a bar.sync does


def test_v3_specializes_a_producer_warp_feeding_two_consumer_warpgroups():
    result = representative_build(ARCH, "v3")
    assert result.threads == 288  # 2 consumer warpgroups + 1 producer warp
    text = ptx("v3")
    assert "wgmma.mma_async.sync.aligned.m64n256k16" in text  # each warpgroup: 64 rows of the 128 x 256 tile
    assert "mbarrier.arrive.release.cta.shared::cta.b64" in text  # a consumer releases a slot
    assert "bar.cta.sync 1, 128" in text and "bar.cta.sync 2, 128" in text  # each warpgroup's own barrier
    barriers = re.findall(r"mbarrier_init_shared\(\(?barriers", source("v3"))
    assert len(barriers) == 2 * versions.load(ARCH, "v3").REPRESENTATIVE["stages"]  # full and empty
    launch = re.search(r"<<<dim3\((.*?)\), dim3\(288", source("v3")).group(1)
    assert not launch.endswith(", 1, 1")  # a two-dimensional grid, launched in index order


def test_v4_rasterizes_a_one_dimensional_grid_through_the_shared_pipeline():
    result = representative_build(ARCH, "v4")
    assert result.threads == 288  # V3's CTA
    launch = re.search(r"<<<dim3\((.*?)\), dim3\(288", source("v4")).group(1)
    assert launch.endswith(", 1, 1")  # tiles are numbered along x only; the rasterizer maps them
    # V3's hand-written slot and parity arithmetic is gone: the Pipeline keeps stage and phase
    v3, v4 = (inspect.getsource(versions.load(ARCH, v).Kernel) for v in ("v3", "v4"))
    assert "% self.stages" in v3 and "% self.stages" not in v4 and "Pipeline(" in v4


def test_v5_is_persistent_with_an_asynchronous_subtiled_epilogue():
    launch = re.search(r"<<<dim3\((.*?)\), dim3\(288", source("v5")).group(1)
    assert str(DEFAULT_SM_COUNT) in launch  # at most one CTA per SM
    text = ptx("v5")
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in text  # TMA store
    assert "cp.async.bulk.wait_group.read 1" in text  # a staging buffer is reused once read
    assert "stmatrix.sync.aligned" in text
    assert "barrier.cluster" not in text


@pytest.mark.parametrize("version", ("v5", "v6"))
def test_narrow_tiles_stage_c_in_blocks_their_width_divides(version):
    """V5's and V6's narrow tiles (96 and 224 columns) stage C in the widest block of 64, 32, 16, 8
    columns whose product columns divide the tile (swiglu: two product columns a column of C), and
    refuse torch's b [K, N], whose MN-major tiles come in boxes of 64 columns (V6: each CTA loads half
    the tile, 48 or 112 rows): for that variant, and for a batch of products, they are no points of
    the space (``takes``), and the autotuned kernel searches the others only."""
    import torch

    from matmul.call.tuner import space_config

    module = versions.load("sm_90a", version)
    narrow = [c for c in versions.space(module) if c["block_n"] % 64]
    assert sorted(c["block_n"] for c in narrow) == [96, 96, 224, 224]  # x the two groups
    kn, batched = versions.Variant(b_layout="kn"), versions.Variant(batches=4)
    for variant in (kn, batched):
        assert versions.space(module, variant) == [c for c in versions.space(module) if c not in narrow]
        assert space_config(module, narrow[0], variant) is None
        ((names, points),) = versions.kernel(module, torch.float16, None, variant).space.items()
        searched = [dict(zip((n.strip() for n in names.split(",")), point)) for point in points]
        assert sorted(point["block_n"] for point in searched) == [256, 256]  # what tilus searches
    assert space_config(module, narrow[0], versions.Variant.parse("swiglu")) == narrow[0]
    assert versions.kernel(module, torch.float16).space == module.Kernel._autotune_space
    widths = {(n, act): module.staging_columns(n, act) for n in (256, 96, 224) for act in ("", "swiglu")}
    assert widths == {
        (256, ""): 64,
        (256, "swiglu"): 64,
        (96, ""): 32,
        (96, "swiglu"): 16,
        (224, ""): 32,
        (224, "swiglu"): 16,
    }
    from matmul import build

    refused = build.build_config(module, "sm_90a", narrow[0], variant=kn)
    rows = 96 if version == "v5" else 48
    assert not refused.ok and f"a B tile of {rows} rows is no multiple of 64" in refused.error
    built = build.build_config(module, "sm_90a", narrow[0])  # B [N, K]: one wgmma as wide as the tile
    assert built.ok, built.error
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", built.ptx())) == {"m64n96k16"}
    if version == "v6":  # each CTA's 48 rows of B land in both CTAs of the pair
        assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.\S*multicast::cluster", built.ptx())


def test_v6_multicasts_b_within_a_2cta_cluster_and_the_leader_sends_the_tiles():
    result = representative_build(ARCH, "v6")
    assert result.cluster == (2, 1, 1)
    text = ptx("v6")
    # the B half each CTA loads lands in both CTAs' shared memory, counted on both CTAs' barriers
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.\S*multicast::cluster", text)
    # stages are released in both CTAs' barriers, ordered at CTA scope (module doc of V6)
    assert "mbarrier.arrive.expect_tx.release.cta.shared::cluster.b64" in text
    assert "mapa.shared::cluster" in text
    # the leader writes the next tile into both CTAs' shared memory, counted on their barriers:
    # no wait in the kernel acquires at cluster scope (each would invalidate the SM's L1)
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32" in text
    assert "mbarrier.try_wait.parity.acquire.cluster" not in text
    assert "barrier.cluster.arrive" in text and "barrier.cluster.wait" in text


def test_sass_of_the_series_when_a_disassembler_is_installed():
    from matmul.tilus_fixes import disassembler

    if disassembler() is None:
        pytest.skip("cuobjdump/nvdisasm not installed (pip install '.[sass]')")
    for version in SERIES:
        sass = representative_build(ARCH, version).sass()
        config = versions.load(ARCH, version).REPRESENTATIVE
        assert f"HGMMA.64x{config['block_n']}x16.F32" in sass, version
        assert "UTMALDG.2D" in sass, version
        assert not re.search(r"\b(LDL|STL)\b", sass), version  # nothing in local memory
    assert "UTMALDG.2D.MULTICAST" in representative_build(ARCH, "v6").sass()
    assert "UTMASTG.2D" in representative_build(ARCH, "v5").sass()


@pytest.mark.parametrize("num_tiles, workers", [(1, 132), (131, 132), (512, 132), (2048, 132), (1024, 66), (7, 3)])
def test_static_schedule_gives_every_tile_to_exactly_one_worker(num_tiles, workers):
    seen = [t for w in range(workers) for t in static_tiles(num_tiles, w, workers)]
    assert sorted(seen) == list(range(num_tiles))
    counts = [len(static_tiles(num_tiles, w, workers)) for w in range(workers)]
    assert max(counts) - min(counts) <= 1  # balanced to one tile


def test_cluster_tiles_cover_the_matrix_once():
    # V6: a cluster tile is two M tiles stacked; the pair (2p, 2p + 1) shares the B tile of column n
    num_m_tiles, num_n_tiles, group = 7, 5, 4
    pairs = (num_m_tiles + 1) // 2
    covered = sorted((2 * p + rank, n) for p, n in grouped_tile_order(pairs, num_n_tiles, group) for rank in (0, 1))
    assert [t for t in covered if t[0] < num_m_tiles] == [
        (m, n) for m in range(num_m_tiles) for n in range(num_n_tiles)
    ]


@pytest.mark.parametrize("cols", [64, 128, 256])
def test_column_blocks_of_the_accumulator_are_the_same_registers(cols):
    from pipeline.epilogue import SUB_COLS, wgmma_fragment, wgmma_fragment_blocks

    full, blocks = wgmma_fragment(64, cols), wgmma_fragment_blocks(64, cols)
    assert full.local_size == blocks.local_size and full.spatial_size == blocks.spatial_size
    for thread in range(0, 128, 5):
        for local in range(full.local_size):
            row, col = (int(x) for x in full.get_global(spatial_index=thread, local_index=local))
            j, block_row, block_col = (int(x) for x in blocks.get_global(spatial_index=thread, local_index=local))
            assert (row, col) == (block_row, j * SUB_COLS + block_col)


@pytest.mark.parametrize("rows, cols, sub_cols", [(64, 256, 64), (128, 128, 64), (128, 128, 32)])
def test_the_accumulator_grid_of_a_tall_tile_is_the_same_registers(rows, cols, sub_cols):
    from pipeline.epilogue import wgmma_fragment, wgmma_fragment_grid

    full, grid = wgmma_fragment(rows, cols), wgmma_fragment_grid(rows, cols, sub_cols)
    assert full.local_size == grid.local_size and full.spatial_size == grid.spatial_size
    for thread in range(0, 128, 5):
        for local in range(full.local_size):
            row, col = (int(x) for x in full.get_global(spatial_index=thread, local_index=local))
            i, j, r, c = (int(x) for x in grid.get_global(spatial_index=thread, local_index=local))
            assert (row, col) == (64 * i + r, j * sub_cols + c)


@pytest.mark.parametrize("version", ["v2", "v3", "v4"])
def test_the_output_tile_is_staged_in_the_idle_ring(version):
    config = versions.load(ARCH, version).REPRESENTATIVE
    ring = config["stages"] * (config["block_m"] + config["block_n"]) * config["block_k"] * 2
    assert ring <= representative_build(ARCH, version).shared_bytes < ring + 1024  # + the mbarriers
    assert "stmatrix.sync.aligned" in ptx(version)  # the accumulator written into the swizzled slots
