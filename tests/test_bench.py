"""The harness without a GPU: presets, the check-then-time loop with stand-in kernels, results files."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from matmul.harness import bench, plot, presets, triton_baseline
from matmul.harness import results as results_file
from matmul.harness.bench import Contender
from matmul.harness.presets import Shape
from matmul.harness.results import CUBLAS
from matmul.measure.correctness import reference

FIXTURE = Path(__file__).parent / "data" / "bench_small.json"


def test_presets():
    chosen = presets.parse("series, ksweep,llm,1000x4095x17")
    assert list(chosen) == ["series", "ksweep", "llm", "custom"]
    assert [s.k for s in chosen["ksweep"]] == [512, 1024, 2048, 4096, 8192, 16384]
    assert {(s.m, s.n) for s in chosen["ksweep"]} == {(8192, 8192)}
    llm = chosen["llm"]
    assert len(llm) == 12 and {s.m for s in llm} == {128, 1024, 8192}
    assert {(s.label, s.n, s.k) for s in llm} == {
        ("q, o", 4096, 4096),
        ("k, v", 1024, 4096),
        ("gate, up", 14336, 4096),
        ("down", 4096, 14336),
    }
    assert chosen["custom"] == [Shape(1000, 4095, 17)]
    assert len(presets.unique(chosen)) == 2 + 6 + 12 + 1 - 1  # 8192^3 is in series and ksweep
    for bad in ("squares", "12x34", "0x8x8", ""):
        with pytest.raises(ValueError):
            presets.parse(bad)


def stand_ins(a, b, dtype):
    """cuBLAS and versions on the CPU: right, wrong, half-written (NaN left) and failing."""

    def writer(out, fn):
        return lambda: out.copy_(fn())

    right = lambda: (a.float() @ b.float().T).to(dtype)  # noqa: E731
    outs = {name: torch.empty(a.shape[0], b.shape[0], dtype=dtype) for name in (CUBLAS, "v0", "v1", "v2", "v3")}

    def partial():
        outs["v2"][:-1] = right()[:-1]  # the last row never written: still NaN from the poisoning

    def failing():
        raise RuntimeError("no configuration built")

    return [
        Contender(CUBLAS, "baseline", writer(outs[CUBLAS], right), outs[CUBLAS]),
        Contender("v0", "version", writer(outs["v0"], right), outs["v0"], lambda: {"block_m": 64}),
        Contender("v1", "version", writer(outs["v1"], lambda: torch.zeros_like(right())), outs["v1"]),
        Contender("v2", "version", partial, outs["v2"]),
        Contender("v3", "version", failing, outs["v3"]),
    ]


def test_every_kernel_is_checked_before_it_is_timed_against_cublas():
    shape, dtype = Shape(48, 40, 24, "test"), torch.bfloat16
    a, b = torch.randn(48, 24).to(dtype), torch.randn(40, 24).to(dtype)
    found = stand_ins(a, b, dtype)
    ms = {id(c.run): t for c, t in zip(found, (2.0, 4.0, 1.0, 1.0, 1.0))}
    windows = []

    def timer(fns):
        windows.append([next(c.name for c in found if c.run is fn) for fn in fns])
        return [ms[id(fn)] for fn in fns]

    rows = {r["kernel"]: r for r in bench.measure(shape, found, reference(a, b), dtype, timer, rounds=3)}
    assert windows == [["v0", CUBLAS]] * 3  # only the correct kernel, each round in a window with cuBLAS
    good = rows["v0"]
    assert good["ok"] and good["config"] == {"block_m": 64} and good["ms_rounds"] == [4.0] * 3
    assert good["vs_cublas"] == pytest.approx(0.5) and good["tflops"] == pytest.approx(2 * 48 * 40 * 24 / 4e-3 / 1e12)
    assert rows[CUBLAS]["vs_cublas"] == 1.0 and rows[CUBLAS]["ms"] == 2.0 and rows[CUBLAS]["label"] == "test"
    assert not rows["v1"]["ok"] and rows["v1"]["error"] == pytest.approx(1.0) and "ms" not in rows["v1"]
    assert not rows["v2"]["ok"] and math.isinf(rows["v2"]["error"])  # a NaN left in the output
    assert not rows["v3"]["ok"] and "no configuration built" in rows["v3"]["message"]


def test_results_file_round_trip_summary_and_table(tmp_path):
    results = results_file.load(FIXTURE)
    path = tmp_path / results_file.results_name("sm_90a", "float16", results["presets"])
    assert path.name == "results-sm_90a-float16-series_ksweep_llm.json"
    results_file.write(results, path)
    assert results_file.load(path) == results
    summary = results_file.summary(results)
    # matmul() at the fixture's three LLM shapes: 1.05, 0.9333 and 1.05 of cuBLAS
    assert summary["llm"]["shapes"] == 3
    assert summary["llm"]["matmul_vs_cublas_min"] == pytest.approx(420 / 450)
    assert summary["llm"]["matmul_vs_cublas_geomean"] == pytest.approx((1.05 * 1.05 * 420 / 450) ** (1 / 3))
    text = results_file.table(results)
    assert "FAILED" in text and "matmul()" in text and "block_k=64" in text


def test_load_refuses_other_files(tmp_path):
    other = tmp_path / "results-other.json"
    other.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a results file"):
        results_file.load(other)


def test_triton_baseline_is_optional():
    if triton_baseline.available():
        pytest.skip("Triton is installed here")
    assert triton_baseline.best_config() is None
    with pytest.raises(RuntimeError, match="pip install triton"):
        triton_baseline.matmul_abt(torch.ones(8, 8).half(), torch.ones(8, 8).half(), torch.empty(8, 8).half())


def test_bench_without_a_gpu_compiles_and_redraws_the_committed_results(tmp_path):
    committed = tmp_path / "plots" / "h100"
    committed.mkdir(parents=True)
    (committed / "results-sm_90a-float16-series_ksweep_llm.json").write_text(FIXTURE.read_text())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "matmul",
            "bench",
            "--arch",
            "sm_90a",
            "--versions",
            "v0",
            "--redraw-from",
            str(tmp_path / "plots"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "No GPU of the sm_90a series here" in proc.stdout
    assert any(line.startswith("sm_90a") and "v0" in line for line in proc.stdout.splitlines())  # the compile report
    for name in ("progression", "ksweep", "llm"):
        for ext in ("png", "svg"):
            assert (committed / f"{name}-sm_90a-float16.{ext}").exists()
    assert "measured on NVIDIA H100 80GB HBM3" in proc.stdout


def test_bench_without_a_gpu_says_when_nothing_is_committed(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "matmul",
            "bench",
            "--arch",
            "sm_90a",
            "--versions",
            "v0",
            "--redraw-from",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"No results under {tmp_path} yet" in proc.stdout


def test_a_whole_run_with_stand_in_kernels_on_the_cpu(monkeypatch, tmp_path):
    """bench.run's plumbing without a GPU: operands, contenders, check, timing, results, figures."""
    import functools

    from stand_ins import install

    from matmul.harness import plot
    from matmul.measure import correctness as check
    from matmul.measure import timing

    install(monkeypatch, wrong=("v0",))
    cpu = functools.partial(check.random_operands, device="cpu")
    monkeypatch.setattr(bench, "random_operands", lambda m, n, k, dtype: cpu(m, n, k, dtype))
    monkeypatch.setattr(check, "poisoned_output", functools.partial(check.poisoned_output, device="cpu"))
    monkeypatch.setattr(bench, "machine", lambda: {"gpu": "stand-in GPU", "sms": 1})
    monkeypatch.setattr(timing, "interleaved_ms", lambda fns, warmup_ms, repeat_ms: [(fn(), 1.0)[1] for fn in fns])
    saved = []
    chosen = presets.parse("series,40x24x17")
    chosen["series"] = [Shape(64, 48, 32)]  # small stand-ins for the preset's sizes
    results = bench.run(
        "sm_90a",
        ["v0", "v1"],
        chosen,
        torch.float16,
        rounds=2,
        triton=False,
        autotuned=False,
        save=lambda r: saved.append(len(r["rows"])),
    )
    assert saved == [3, 6]  # written after each shape
    rows = {(r["kernel"], r["m"]): r for r in results["rows"]}
    assert set(rows) == {(k, m) for k in (CUBLAS, "v0", "v1") for m in (64, 40)}
    assert rows[("v1", 40)]["ok"] and rows[("v1", 40)]["config"] == {"block_m": 128, "block_n": 128, "block_k": 64}
    assert rows[("v1", 40)]["vs_cublas"] == 1.0 and rows[("v1", 40)]["ms_rounds"] == [1.0, 1.0]
    assert rows[(CUBLAS, 40)]["ms_rounds"] == [1.0, 1.0]  # from v1's windows (v0 is wrong, not timed)
    assert not rows[("v0", 64)]["ok"] and "ms" not in rows[("v0", 64)]
    assert results["presets"]["custom"] == [{"m": 40, "n": 24, "k": 17, "label": ""}]
    results_file.write(results, tmp_path / "results.json")
    again = results_file.load(tmp_path / "results.json")
    fig = plot.progression(again)
    assert [a.get_title() for a in fig.axes if a.get_title()] == ["M x N x K = 64 x 48 x 32"]


def correct_stand_ins():
    """A 48 x 40 x 24 shape, its reference, and a maker of contenders that write it (always right)."""
    shape, dtype = Shape(48, 40, 24, "test"), torch.float16
    a, b = torch.randn(48, 24).to(dtype), torch.randn(40, 24).to(dtype)
    ref = reference(a, b)

    def contender(name, kind):
        out = torch.empty(48, 40, dtype=dtype)
        return bench.Contender(name, kind, lambda: out.copy_(ref), out)

    return shape, dtype, ref, contender


def test_each_ratio_comes_from_one_window_so_a_drifting_clock_cancels():
    shape, dtype, ref, contender = correct_stand_ins()
    found = [
        contender(CUBLAS, "baseline"),
        contender("v0", "version"),
        contender("v1", "version"),
        contender(results_file.AUTOTUNED, "autotuned"),
    ]
    speed = {CUBLAS: 1.0, "v0": 2.0, "v1": 1.25, results_file.AUTOTUNED: 1.0}  # ms on a steady clock
    windows = []

    def timer(fns):  # the GPU slows down window after window: 10% each
        names = [next(c.name for c in found if c.run is fn) for fn in fns]
        windows.append(names[0])
        return [speed[name] * 1.1 ** len(windows) for name in names]

    rows = {r["kernel"]: r for r in bench.measure(shape, found, ref, dtype, timer, rounds=2)}
    assert windows == [
        "v0",
        "v1",
        results_file.AUTOTUNED,
        results_file.AUTOTUNED,
        "v1",
        "v0",
    ]  # reversed every other round
    assert rows["v0"]["vs_cublas"] == pytest.approx(0.5) and rows["v1"]["vs_cublas"] == pytest.approx(0.8)
    assert rows[results_file.AUTOTUNED]["vs_cublas"] == pytest.approx(1.0)  # cuBLAS against itself: no position effect
    assert rows["v0"]["ms_rounds"] == pytest.approx([2.0 * 1.1, 2.0 * 1.1**6])  # the raw window times
    assert rows["v0"]["ms"] == pytest.approx(2 * rows[CUBLAS]["ms"])  # at cuBLAS's median clock
    assert len(rows[CUBLAS]["ms_rounds"]) == 6  # cuBLAS's time: from every window
    assert list(rows) == [CUBLAS, "v0", "v1", results_file.AUTOTUNED]  # the table keeps its order


def test_sustained_windows_time_every_kernel_alone_and_keep_its_clock():
    shape, dtype, ref, contender = correct_stand_ins()
    found = [contender(CUBLAS, "baseline"), contender("v0", "version"), contender("v1", "version")]
    speed = {CUBLAS: 1.0, "v0": 2.0, "v1": 0.8}  # ms
    clock = {CUBLAS: 1300.0, "v0": 1500.0, "v1": 1400.0}  # MHz: a kernel's own power draw sets its clock

    class Timer:
        last_window: dict = {}

        def __call__(self, fns):
            assert len(fns) == 1  # alone: never in turn with cuBLAS
            name = next(c.name for c in found if c.run is fns[0])
            self.last_window = {"clock_mhz": clock[name], "power_w": 700.0}
            return [speed[name]]

    rows = {r["kernel"]: r for r in bench.measure(shape, found, ref, dtype, Timer(), rounds=2, paired=False)}
    assert rows[CUBLAS]["ms_rounds"] == [1.0, 1.0] and rows[CUBLAS]["vs_cublas"] == 1.0
    assert rows["v0"]["vs_cublas"] == pytest.approx(0.5) and rows["v1"]["vs_cublas"] == pytest.approx(1.25)
    assert rows["v1"]["ms"] == pytest.approx(0.8) and "cublas_ms_rounds" not in rows["v1"]
    assert rows["v0"]["clock_mhz_rounds"] == [1500.0, 1500.0] and rows["v0"]["power_w_rounds"] == [700.0, 700.0]
    assert "MHz" in results_file.table({"rows": list(rows.values())})


def test_sustained_results_have_their_own_file_and_figures(tmp_path):
    results = results_file.load(FIXTURE)
    results["timing"] = {"mode": "sustained", "seconds": 3.0, "rounds": 4}
    assert results_file.is_sustained(results) and not results_file.is_sustained(results_file.load(FIXTURE))
    assert (
        results_file.results_name("sm_90a", "float16", {"series": []}, sustained=True)
        == "results-sm_90a-float16-series-sustained.json"
    )
    written = plot.draw_all(results, tmp_path)
    assert written and all(p.stem.endswith("-sustained") for p in written)
    assert "back to back, 3 s a window" in plot.progression(results)._suptitle.get_text()
