"""The shared building blocks: grouped rasterization and the Pipeline ring, in Python, compiled,
and (on a Hopper GPU) run by kernels that record what they were given."""

import pytest
import tilus
import torch
from conftest import require_gpu
from tilus import int32, void_p

from matmul import build
from pipeline import Pipeline, TileRasterizer, grouped_tile, grouped_tile_order
from pipeline.cluster_reduce import partial_layout

GRIDS = [(1, 1, 8), (7, 5, 8), (8, 8, 8), (13, 3, 4), (3, 13, 4), (9, 17, 16), (33, 1, 8), (1, 33, 8), (16, 16, 1)]


@pytest.mark.parametrize("num_m, num_n, group", GRIDS)
def test_grouped_order_visits_every_tile_once(num_m, num_n, group):
    order = grouped_tile_order(num_m, num_n, group)
    assert sorted(order) == [(m, n) for m in range(num_m) for n in range(num_n)]


def test_grouped_order_walks_group_rows_column_by_column():
    # 5 tile rows, groups of 2: rows {0,1} column by column, then {2,3}, then the short group {4}
    order = grouped_tile_order(5, 3, 2)
    assert order[:6] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert order[-3:] == [(4, 0), (4, 1), (4, 2)]
    assert grouped_tile(7, 5, 3, 2) == (3, 0)


class RecordTiles(tilus.Script):
    """Each CTA writes the (m, n) tile the rasterizer gives its block index."""

    def __init__(self, group: int):
        super().__init__()
        self.group = group

    def __call__(self, num_m: int32, num_n: int32, out_ptr: void_p):
        self.attrs.blocks = num_m * num_n
        self.attrs.warps = 1
        raster = TileRasterizer(num_m, num_n, self.group)
        m_tile, n_tile = raster.tile(self.blockIdx.x)
        g_out = self.global_view(out_ptr, dtype=int32, shape=[num_m * num_n, 2])
        record = self.register_tensor(dtype=int32, shape=[1, 2], init=lambda i, j: m_tile if j == 0 else n_tile)
        self.store_global(g_out, record, offsets=[self.blockIdx.x, 0])


class RingCopy(tilus.Script):
    """Moves a [rows, 64] matrix through a Pipeline ring: a TMA producer warp fills the stages, a
    consumer warpgroup copies each stage to the output. With ``cluster=True`` it runs as 2-CTA
    clusters whose consumers release every stage in both CTAs (the cluster path of Pipeline)."""

    def __init__(self, stages: int, cluster: bool):
        super().__init__()
        self.stages = stages
        self.two_ctas = cluster

    def __call__(self, rows: int32, src_ptr: void_p, dst_ptr: void_p):
        block = 32
        ctas = 2 if self.two_ctas else 1
        self.attrs.blocks = ctas
        self.attrs.cluster_blocks = ctas
        self.attrs.warps = 5
        # 2-D views: tilus 0.2.0 gets the TMA coordinates wrong for a slice (dims=...) of a 3-D view
        g_src = self.global_view(src_ptr, dtype=tilus.float16, shape=[ctas * rows, 64])
        g_dst = self.global_view(dst_ptr, dtype=tilus.float16, shape=[ctas * rows, 64])
        s_ring = self.shared_tensor(dtype=tilus.float16, shape=[self.stages, block, 64])
        ring = Pipeline(
            self.stages,
            consumer_arrivals=128 * ctas,
            scope="cluster" if self.two_ctas else "cta",
            release_to=0b11 if self.two_ctas else 0,
        )
        cta = self.blockIdx.x
        if self.two_ctas:
            self.cluster.sync()
        else:
            self.sync()
        with self.single_warp(4):
            for offset in range(0, rows, block):
                ring.producer_acquire()
                with self.single_thread():
                    self.mbarrier.arrive_and_expect_tx(ring.producer_barrier(), transaction_bytes=s_ring[0].nbytes)
                self.tma.global_to_shared(
                    src=g_src,
                    dst=s_ring[ring.producer_stage],
                    offsets=[cta * rows + offset, 0],
                    mbarrier=ring.producer_barrier(),
                )
                ring.producer_advance()
        with self.warp_group(warp_begin=0, num_warps=4):
            for offset in range(0, rows, block):
                ring.consumer_acquire()
                tile = self.load_shared(s_ring[ring.consumer_stage])
                self.store_global(g_dst, tile, offsets=[cta * rows + offset, 0])
                self.sync()
                ring.consumer_release()
                ring.consumer_advance()
        if self.two_ctas:
            self.cluster.sync()  # no CTA exits while its peer may still arrive on its barriers


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_rasterizer_kernel_builds(arch):
    result = build.build_script(RecordTiles, arch, dict(group=8))
    assert result.ok, result.error[-3000:]


@pytest.mark.parametrize("stages, cluster", [(4, False), (3, True), (7, False)])
def test_pipeline_ring_kernel_builds(stages, cluster):
    result = build.build_script(RingCopy, "sm_90a", dict(stages=stages, cluster=cluster))
    assert result.ok, result.error[-3000:]
    ptx = result.ptx()
    assert "mbarrier.try_wait" in ptx and "cp.async.bulk.tensor" in ptx
    # the position moves on by a compare and a select: a remainder by a depth that is no power of
    # two is a multiply-high chain on the consumer's way from one wgmma group to the next
    source = (result.program_dir / "module" / "source.cu").read_text()
    assert f"% {stages})" not in source
    if cluster:
        assert result.cluster == (2, 1, 1)
        assert "mapa.shared::cluster" in ptx and "mbarrier.arrive.expect_tx" in ptx and "shared::cluster" in ptx


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_m, num_n, group", GRIDS)
def test_rasterizer_kernel_gives_every_tile_once(num_m, num_n, group):
    require_gpu("sm_90a")
    out = torch.full((num_m * num_n, 2), -1, dtype=torch.int32, device="cuda")
    RecordTiles(group=group)(num_m, num_n, out)
    got = [tuple(t) for t in out.tolist()]
    assert got == grouped_tile_order(num_m, num_n, group)  # the kernel and the Python rule agree
    assert sorted(got) == [(m, n) for m in range(num_m) for n in range(num_n)]


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stages, cluster", [(2, False), (4, False), (3, True), (7, False)])
def test_pipeline_ring_delivers_every_stage_in_order(stages, cluster):
    require_gpu("sm_90a")
    ctas, rows = (2 if cluster else 1), 32 * 37
    src = torch.randn(ctas, rows, 64, device="cuda").half()
    dst = torch.full_like(src, float("nan"))
    RingCopy(stages=stages, cluster=cluster)(rows, src, dst)
    torch.testing.assert_close(dst, src, rtol=0, atol=0)


def _wavefronts(words) -> int:
    """Shared-memory wavefronts one warp's access takes: the most distinct 4-byte words that fall
    in one of the 32 banks (a word read or written by several lanes is one)."""
    per_bank = {}
    for word in set(int(w) for w in words):
        per_bank.setdefault(word % 32, set()).add(word)
    return max(len(ws) for ws in per_bank.values())


@pytest.mark.parametrize("slice_rows, cols", [(64, 128), (32, 128), (32, 64), (64, 16), (8, 8)])
def test_split_k_exchange_tiles_keep_a_warps_stores_and_loads_free_of_bank_conflicts(slice_rows, cols):
    """``ClusterSplitKReduce``'s partial tile, float32 (one element a 4-byte word), as the kernels
    touch it: a wgmma accumulator stored 8 bytes a lane (8 rows x 4 column pairs a warp), read
    back by ``ldmatrix`` (8 rows x 16 bytes a matrix), and a tcgen05 accumulator (a row a lane).
    Row-major, the rows of a 128-column tile share their banks and every such access takes 8
    wavefronts or more."""
    grid = partial_layout([1, 2, slice_rows, cols]).as_numpy_grid()[0, 1]  # the second slice
    for row in range(0, slice_rows, 8):
        for col in range(0, cols, 8):  # wgmma fragment: lane l at row l // 4, columns 2 (l % 4) + {0, 1}
            words = [grid[row + lane // 4, col + 2 * (lane % 4) + e] for lane in range(32) for e in (0, 1)]
            assert _wavefronts(words) <= 2  # 256 bytes: two wavefronts at best
        for col in range(0, cols, 4):  # ldmatrix: 8 rows of 16 bytes
            words = [grid[row + r, col + e] for r in range(8) for e in range(4)]
            assert _wavefronts(words) == 1
    for row in range(0, slice_rows - 31, 32):  # tcgen05: lane l holds row l, 16 bytes a store
        for col in range(0, cols, 4):
            words = [grid[row + lane, col + e] for lane in range(32) for e in range(4)]
            assert _wavefronts(words) <= 4  # 512 bytes: four at best
