"""V7 (skinny GEMMs) of both series, without a GPU: every configuration fits in shared memory, the
kernels build, and their PTX shows the design: swap-AB (the tokens are the MMA's N side), TMA
rings, and the split-K exchange by bulk copies into the cluster peers' shared memory. Also the
roofline harness's arithmetic and the ``supports`` contract."""

import re

import pytest
from conftest import representative_build

from matmul import build
from matmul.harness import presets, roofline
from matmul.kernels import versions

HOPPER = versions.load("sm_90a", "v7")
BLACKWELL = versions.load("sm_100a", "v7")


def test_v7_is_a_version_of_both_series():
    assert "v7" in versions.available("sm_90a") and "v7" in versions.available("sm_100a")


@pytest.mark.parametrize("module", [HOPPER, BLACKWELL], ids=["hopper", "blackwell"])
def test_supports_at_most_256_tokens(module):
    assert module.supports(1, 1, 1) and module.supports(256, 128256, 14336)
    assert not module.supports(257, 4096, 4096)
    assert not module.supports(0, 4096, 4096)


@pytest.mark.parametrize("module", [HOPPER, BLACKWELL], ids=["hopper", "blackwell"])
def test_every_configuration_fits_in_shared_memory(module):
    for config in versions.space(module):
        assert module.shared_bytes(**config) <= build.SHARED_MEMORY_LIMIT["sm_90a"] - 1024, config


@pytest.mark.parametrize(
    "arch, config",
    [
        ("sm_90a", HOPPER.REPRESENTATIVE),
        ("sm_90a", {"block_m": 64, "warpgroups": 2, "split": 2, "stages": 6}),  # two consumer warpgroups
        ("sm_90a", {"block_m": 16, "warpgroups": 1, "split": 1, "stages": 16}),  # no cluster exchange
        ("sm_90a", HOPPER.MULTICAST_REPRESENTATIVE),  # the weight multicast to two token tiles: 224 KiB
        ("sm_90a", HOPPER.COMBINED_REPRESENTATIVE),  # both: a cluster of 2 x 2, 216 KiB
        ("sm_100a", BLACKWELL.REPRESENTATIVE),
        ("sm_100a", {"block_m": 128, "split": 2, "stages": 4}),  # the fullest: 226 KiB
    ],
)
def test_builds_with_the_shared_memory_it_was_sized_for(arch, config):
    module = versions.load(arch, "v7")
    result = build.build_config(module, arch, config)
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0
    # the ring and the exchange are all the shared memory V7 takes (plus its mbarriers)
    assert 0 <= result.shared_bytes - module.shared_bytes(**config) < 1024
    assert result.cluster == (config["split"] * config.get("multicast", 1), 1, 1)
    ptx = result.ptx()
    if config["split"] > 1:
        assert ptx.count("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes") >= 1
    else:
        assert "cp.async.bulk.shared::cluster" not in ptx


MULTICAST_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"


EXCHANGE_COPY = "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"


def check_multicast_ptx(ptx: str, config: dict):
    """The weight tile is TMA-multicast (and the token tile loaded plainly), every stage is released
    in every CTA of the weight group by one arrival per CTA, and the partials are exchanged by bulk
    copies into the cluster peers where K is split, nothing otherwise."""
    assert MULTICAST_LOAD in ptx
    assert "cp.async.bulk.tensor.2d.shared::cta.global" in ptx  # the CTA's own token tile
    assert "mbarrier.arrive.expect_tx.release.cta.shared::cluster.b64" in ptx  # a release into a peer
    assert "mapa.shared::cluster" in ptx
    assert (EXCHANGE_COPY in ptx) == (config["split"] > 1)  # the split-K exchange
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    assert shapes == {f"m64n{config['block_m']}k16"}


def test_hopper_multicasts_the_weight_tile():
    config = HOPPER.MULTICAST_REPRESENTATIVE
    result = build.build_config(HOPPER, "sm_90a", config)
    assert result.ok, result.error[-3000:]
    check_multicast_ptx(result.ptx(), config)
    assert config in versions.space(HOPPER) and config["split"] == 1 and config["multicast"] == 2
    report = (result.program_dir / "module" / "nvcc_output.txt").read_text()
    assert not re.search(r"C7515|C7520|serialized", report), report
    # no multicast without it: the representative (split-K) loads every tile into its own CTA only
    assert MULTICAST_LOAD not in representative_build("sm_90a", "v7").ptx()


def release_masks(result) -> set[int]:
    """The rank masks of the ring's multicast releases (tilus writes each instruction above its code)."""
    source = (result.program_dir / "module" / "source.cu").read_text()
    return {int(m) for m in re.findall(r"ArriveExpectTxMulticastBarrier\(.*?multicast=(\d+),", source)}


COMBINED = [c for c in versions.build_configs(HOPPER) if c["split"] > 1 and c["multicast"] > 1]


@pytest.mark.parametrize(
    "config, b_layout",
    [(HOPPER.COMBINED_REPRESENTATIVE, "nk"), (HOPPER.COMBINED_REPRESENTATIVE, "kn")]
    + [(c, "nk") for c in COMBINED if c != HOPPER.COMBINED_REPRESENTATIVE],
    ids=lambda x: x if isinstance(x, str) else "/".join(str(v) for v in x.values()),
)
def test_hopper_combines_split_k_with_multicast(config, b_layout):
    # a cluster of split x multicast CTAs: the weight tile multicast within each K range's group,
    # the partials exchanged within each token tile's group
    from matmul.kernels.variant import Variant

    split, multicast = config["split"], config["multicast"]
    result = build.build_config(HOPPER, "sm_90a", config, variant=Variant(b_layout=b_layout))
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0
    assert result.cluster == (split * multicast, 1, 1)
    assert 0 <= result.shared_bytes - HOPPER.shared_bytes(**config) < 1024
    check_multicast_ptx(result.ptx(), config)
    report = (result.program_dir / "module" / "nvcc_output.txt").read_text()
    assert not re.search(r"C7515|C7520|serialized", report), report
    # the releases reach the CTAs of one K range, ranks k_rank + split * j: one mask per k_rank
    group = sum(1 << (split * j) for j in range(multicast))
    assert release_masks(result) == {group << k_rank for k_rank in range(split)}


def test_hopper_builds_but_does_not_tune_the_combined_configurations():
    # built and checked (EXTRA_CONFIGS), not in the autotune space until they have run on a GPU
    assert HOPPER.COMBINED_REPRESENTATIVE in COMBINED and COMBINED == [
        c for c in COMBINED if c["split"] * c["multicast"] <= HOPPER.MAX_CLUSTER
    ]
    assert {c["split"] * c["multicast"] for c in COMBINED} == {4, 8}
    assert not [c for c in versions.space(HOPPER) if c["split"] > 1 and c["multicast"] > 1]


@pytest.mark.parametrize(
    "config, message",
    [
        ({"split": 4, "multicast": 4}, "at most 8"),  # a cluster of 16 CTAs
        ({"split": 8, "multicast": 2}, "at most 8"),
        ({"split": 3, "multicast": 2}, "do not cut into 3 slices"),  # 64 rows: slices of 21 1/3
        ({"split": 16, "multicast": 1, "warpgroups": 2}, "at most 8"),
        ({"split": 2, "multicast": 3}, "1, 2 or 4 CTAs"),
    ],
    ids=lambda x: x if isinstance(x, str) else "x".join(f"{k}{v}" for k, v in x.items()),
)
def test_hopper_refuses_clusters_it_cannot_build(config, message):
    result = build.build_config(HOPPER, "sm_90a", {**HOPPER.COMBINED_REPRESENTATIVE, "stages": 4, **config})
    assert not result.ok and message in result.error, result.error[-1000:]


def test_hopper_space_covers_64_to_256_tokens_with_multicast():
    # at every M from 64 to 256 some multicast configuration's cluster covers all tokens at once
    multicast = [c for c in versions.space(HOPPER) if c["multicast"] > 1]
    for m in range(64, 257):
        assert any(c["block_m"] * c["multicast"] >= m for c in multicast), m
    assert {c["multicast"] for c in multicast} == {2, 4}


@pytest.mark.full_space
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_hopper_every_multicast_configuration_builds(b_layout):
    from matmul.kernels.variant import Variant

    variant = Variant(b_layout=b_layout)
    for config in versions.build_configs(HOPPER):
        if config["multicast"] > 1:
            result = build.build_config(HOPPER, "sm_90a", config, variant=variant)
            assert result.ok, (config, result.error[-3000:])
            assert result.spill_bytes == 0 and result.cluster == (config["split"] * config["multicast"], 1, 1)
            check_multicast_ptx(result.ptx(), config)
            report = (result.program_dir / "module" / "nvcc_output.txt").read_text()
            assert not re.search(r"C7515|C7520|serialized", report), (config, report)


def test_hopper_swaps_a_and_b():
    # the weight's rows are the wgmma's M (64), the 16 tokens its N: m64n16, not m64n64 of padding
    ptx = representative_build("sm_90a", "v7").ptx()
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    assert shapes == {"m64n16k16"}


def test_hopper_wgmma_is_not_serialized():
    report = (representative_build("sm_90a", "v7").program_dir / "module" / "nvcc_output.txt").read_text()
    assert not re.search(r"C7515|C7520|serialized", report), report


def test_hopper_split_group_does_not_wait_for_the_cluster_before_its_main_loop():
    # without multicast the opening cluster barrier is split: a relaxed arrival at the start, its
    # wait only before the exchange, so the first wgmma comes before any barrier.cluster.wait; and
    # no arrival has release semantics (the exit barrier is relaxed too)
    ptx = representative_build("sm_90a", "v7").ptx()
    assert HOPPER.REPRESENTATIVE["split"] > 1 and HOPPER.REPRESENTATIVE["multicast"] == 1
    arrivals = re.findall(r"barrier\.cluster\.arrive\S*", ptx)
    assert arrivals and all(".relaxed" in a for a in arrivals), arrivals
    assert ptx.index("wgmma.mma_async") < ptx.index("barrier.cluster.wait")
    assert ptx.index("barrier.cluster.arrive") < ptx.index("wgmma.mma_async")


def test_blackwell_swaps_a_and_b():
    # the accumulator is 128 weight rows (TMEM lanes) x the 32 tokens of the tile: 32 TMEM columns
    result = representative_build("sm_100a", "v7")
    assert result.ok, result.error[-3000:]
    assert "tcgen05.mma.cta_group::1.kind::f16" in result.ptx()
    source = (result.program_dir / "module" / "source.cu").read_text()
    assert re.findall(r"tcgen05_alloc\w*\(\w+, uint32_t\((\d+)u\)\)", source) == ["32"]


def test_the_decode_preset():
    shapes = presets.PRESETS["decode"]
    assert len(shapes) == 25
    assert {s.m for s in shapes} == {1, 16, 64, 128, 256}
    assert {(s.n, s.k) for s in shapes} == {(4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096), (128256, 4096)}
    assert all(HOPPER.supports(*s.mnk) for s in shapes)


def test_roofline_arithmetic():
    assert roofline.bytes_floor(1, 4096, 4096, 2) == (4096 + 4096 * 4096 + 4096) * 2
    assert roofline.parse_configs("16/1/2/8, 64/2/2/6") == [
        {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 8},
        {"block_m": 64, "warpgroups": 2, "split": 2, "stages": 6},
    ]
    # token tiles no wider than the narrowest that holds M, and at most two of them
    # (the 32-token tiles are multicast ones: two of them cover 64 tokens)
    for m, widths in ((1, {16}), (16, {16}), (17, {16, 32}), (64, {32, 64}), (100, {64, 128}), (256, {128, 256})):
        found = roofline.candidates(HOPPER, m)
        assert {c["block_m"] for c in found} == widths and found[0]["block_m"] == max(widths)


def test_roofline_summary_takes_the_bar_shapes():
    def row(m, n, k, ratio, share):
        return {"m": m, "n": n, "k": k, "dtype": "float16", "ratio": ratio, "v7_share": share, "b2b_ratio": 1.0}

    rows = [row(m, n, k, 1.2, 0.9) for m in (1, 16, 64, 128) for n, k in roofline.BAR_SHAPES]
    rows.append(row(256, 4096, 4096, 0.5, 0.4))  # not a bar shape
    rows[0]["v7_share"] = 0.8
    s = roofline.summary(rows)["float16"]
    assert s["bar_shapes"] == 12
    assert s["bar_geomean_vs_cublas"] == pytest.approx(1.2)
    assert s["bar_min_share_of_floor"] == pytest.approx(0.8)
    assert s["all_geomean_vs_cublas"] < 1.2


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_split_k_protocol_on_the_cpu(arch):
    # the barriers, the bulk copies between the CTAs of a cluster and the coverage of every output
    # element (each K block summed once) on a model of the machine, over seeded interleavings; K is
    # at least two blocks, so no CTA of a pair reads past K (the model counts such a block as foreign)
    from matmul.protocol import check_function, transpile
    from matmul.protocol.machine import Problem

    module = versions.load(arch, "v7")
    problems = [Problem(m=17, n=200, k=1064), Problem(m=3, n=130, k=520)]
    report = check_function(transpile(module, arch, module.REPRESENTATIVE), problems, seeds=10)
    assert report.finding is None, f"{report.finding.kind}: {report.finding.message}\n{report.trace()}"


def test_roofline_checks_each_configuration_then_times_the_best(monkeypatch):
    # V7 as CPU stand-ins: one configuration writes zeros (must be left out), the others are timed
    # against cuBLAS and the fastest is kept; no GPU, fake clocks
    import functools

    import torch
    from stand_ins import StandInKernel

    from matmul.harness import roofline as harness
    from matmul.measure import correctness

    launched = []

    class Recorded(StandInKernel):
        def __call__(self, *args):
            launched.append(self.config)
            super().__call__(*args)

    wrong = {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 8, "multicast": 1}
    fast = {"block_m": 16, "warpgroups": 2, "split": 2, "stages": 8, "multicast": 1}
    monkeypatch.setattr(
        versions,
        "kernel",
        lambda module, dtype, config=None: Recorded("v7", config, wrong=config == wrong, dtype=dtype),
    )

    def fake_ms(fns, warmup_ms, repeat_ms, flush="read"):
        times = []
        for fn in fns:
            launched.clear()
            fn()
            times.append(0.010 if not launched else 0.008 if launched[0] == fast else 0.012)  # cuBLAS: 10 us
        if flush == "write":  # the dirty lines cost every kernel the same 5 us
            times = [t + 0.005 for t in times]
        return times

    # versions.run without its CUDA-only operand check: the same launch
    monkeypatch.setattr(
        versions,
        "run",
        lambda module, a, b, out, config=None: versions.kernel(module, a.dtype, config)(
            *versions.launch_args(a, b, out)
        ),
    )
    monkeypatch.setattr(harness, "random_operands", functools.partial(correctness.random_operands, device="cpu"))
    monkeypatch.setattr(harness, "poisoned_output", functools.partial(correctness.poisoned_output, device="cpu"))
    monkeypatch.setattr(harness, "interleaved_ms", fake_ms)
    monkeypatch.setattr(harness, "back_to_back_ms", lambda fn, calls: (fn(), 0.005)[1])
    args = type(
        "Args",
        (),
        {"space": None, "select_warmup_ms": 1, "select_repeat_ms": 1, "warmup_ms": 1, "repeat_ms": 1, "calls": 2},
    )()
    floor = {"copy_tb_per_s": 3.0, "empty_ms": 0.004, "write_copy_tb_per_s": 2.5, "write_empty_ms": 0.004}
    row = harness.measure_shape(HOPPER, presets.Shape(3, 72, 100), torch.float16, args, floor)

    assert {c["config"]["block_m"] for c in row["configs"]} == {16}  # every 16-token tile (holds M = 3)
    assert [c for c in row["configs"] if c.get("failed")] == [c for c in row["configs"] if c["config"] == wrong]
    assert row["config"] == fast and not row.get("failed")
    assert row["ratio"] == pytest.approx(10 / 8)
    assert row["attainable_us"] == pytest.approx(harness.bytes_floor(3, 72, 100, 2) / 3e12 * 1e6 + 4)
    assert row["b2b_ratio"] == pytest.approx(1.0)
    assert row["write_ratio"] == pytest.approx(15 / 13)
    assert row["write_attainable_us"] == pytest.approx(harness.bytes_floor(3, 72, 100, 2) / 2.5e12 * 1e6 + 4)
    # the table shows both flushes; a results file from before the reading flush still renders
    row["label"] = ""
    results = {"floor": {**floor, "copy_32mib_tb_per_s": 2.9, "write_copy_32mib_tb_per_s": 2.4}, "rows": [row]}
    results["summary"] = harness.summary([row])
    text = harness.table(results)
    assert "L2 flushed by writing" in text and "| 1.15 |" in text
    old = {k: v for k, v in row.items() if not k.startswith("write_")}
    legacy = {"floor": {"copy_tb_per_s": 3.0, "empty_ms": 0.004, "copy_32mib_tb_per_s": 2.4}, "rows": [old]}
    legacy["summary"] = harness.summary([old])
    assert "| - | - | - |" in harness.table(legacy)


def test_the_flush_methods_are_named():
    from matmul.measure.timing import L2Flush

    with pytest.raises(ValueError, match="read, write"):
        L2Flush("clean")


@pytest.mark.parametrize("key", ["", "bias+gelu_tanh", "bias+swiglu"], ids=["plain", "bias+gelu_tanh", "bias+swiglu"])
def test_hopper_slabs_go_out_by_tma_store_without_serializing_the_wgmma(key):
    # without a split each warpgroup writes its slab (pipeline.epilogue.SwappedSlabStore): a TMA
    # store from a staging buffer written with stmatrix.trans, no float32 tile, no exchange; the
    # accumulator never read under a branch, so ptxas serializes no wgmma (its note C7514)
    from matmul.kernels.variant import Variant

    config = {"block_m": 128, "warpgroups": 2, "split": 1, "stages": 6, "multicast": 1}
    result = build.build_config(HOPPER, "sm_90a", config, variant=Variant.parse(key))
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0
    assert result.shared_bytes - HOPPER.shared_bytes(**config) < 1024  # swiglu's buffers are half as wide
    ptx = result.ptx()
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx  # the TMA store of C
    assert "stmatrix.sync.aligned" in ptx and ".trans" in ptx
    assert "cp.async.bulk.shared::cluster" not in ptx and "st.global" not in ptx
    report = (result.program_dir / "module" / "nvcc_output.txt").read_text()
    assert not re.search(r"C7514|C7515|C7520|serialized", report), report


def test_refit_carries_a_configuration_to_the_token_tile_that_holds_m():
    """A narrowed tuning times V7 at one configuration, taken from a neighbouring M bucket
    (``chooser.narrowed``): ``refit`` gives the point with the same warpgroups, split and multicast
    whose cluster holds M tokens with the fewest to spare, so that 32 tokens are timed with the
    32-token tile, not as two 16-token tiles."""
    space = versions.space(HOPPER)

    def point(block_m, warpgroups, split, stages, multicast):
        config = dict(block_m=block_m, warpgroups=warpgroups, split=split, stages=stages, multicast=multicast)
        assert config in space
        return config

    sixteen = point(16, 1, 2, 8, 1)
    assert HOPPER.refit(space, sixteen, 32) == point(32, 1, 2, 12, 1)
    assert HOPPER.refit(space, sixteen, 1) == sixteen and HOPPER.refit(space, sixteen, 16) == sixteen
    assert HOPPER.refit(space, sixteen, 64) == point(64, 1, 2, 10, 1)  # the first such point of the space
    assert HOPPER.refit(space, point(64, 1, 2, 10, 1), 16) == sixteen  # down as well as up
    # a multicast cluster's tokens are its tiles together; no point holds 256 with two warpgroups, no split
    assert HOPPER.refit(space, point(64, 1, 1, 13, 2), 256) == point(128, 1, 1, 8, 2)
    assert HOPPER.refit(space, point(128, 2, 1, 6, 1), 256) == point(128, 2, 1, 6, 1)


def test_the_skinny_best_of_series_table_of_the_committed_results():
    """``python -m matmul skinny --table`` of the committed H100 results (plots/h100/skinny/multicast.json,
    #26's measure): every row names the kernel that won there, and the table follows the results."""
    import json
    from pathlib import Path

    from matmul.harness import skinny

    path = Path(__file__).resolve().parents[1] / "plots" / "h100" / "skinny" / "multicast.json"
    rows = json.loads(path.read_text())
    table = skinny.best_table(rows)
    # each row's cells name the kernel that won there: a row whose best is lost would read "-"
    assert table.count("(V") == 15 and " - " not in table
    worse = [dict(row, best=dict(row["best"], vs_cublas=0.5)) if i == 0 else row for i, row in enumerate(rows)]
    assert skinny.best_table(worse) != table


def test_the_skinny_tables_windows_keep_each_kernels_own_time_when_the_order_is_reversed():
    """``skinny.timed_windows``: every other window launches the kernels in reverse order, and each
    time must still be filed under its own kernel's name."""
    from matmul.harness import skinny as bench

    fns = [lambda: 1.0, lambda: 2.0, lambda: 3.0]  # each "kernel" says its own time in ms
    orders = []

    def window(ordered):
        orders.append([fn() for fn in ordered])
        return [fn() for fn in ordered]

    windows = bench.timed_windows(fns, ["cublas", "a", "b"], 3, window)
    assert orders == [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [1.0, 2.0, 3.0]]
    assert windows == [{"cublas": 1000.0, "a": 2000.0, "b": 3000.0}] * 3
