"""The figures drawn from a small results file: what they show, not only that files appear."""

import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.container import BarContainer

from matmul.harness import plot
from matmul.harness import results as results_file
from matmul.harness.results import CUBLAS

FIXTURE = Path(__file__).parent / "data" / "bench_small.json"


@pytest.fixture(scope="module")
def results():
    return results_file.load(FIXTURE)


def row(results, kernel, m, n, k):
    return next(r for r in results["rows"] if (r["kernel"], r["m"], r["n"], r["k"]) == (kernel, m, n, k))


def assert_title_says_what_was_measured(fig):
    title = fig.get_suptitle()
    assert "NVIDIA H100 80GB HBM3" in title and "sm_90a" in title and "float16" in title


def test_progression_has_one_bar_per_version_and_baseline(results):
    fig = plot.progression(results)
    assert_title_says_what_was_measured(fig)
    [ax] = [a for a in fig.axes if a.get_title()]  # the share-of-cuBLAS axis is a secondary one
    assert ax.get_title() == "M = N = K = 4096"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["V0", "V1", "Triton", "cuBLAS"]
    heights = [p.get_height() for p in ax.patches]
    assert heights == [row(results, k, 4096, 4096, 4096)["tflops"] for k in ("v0", "v1", "Triton", "cuBLAS")]
    assert [t.get_text() for t in ax.texts] == ["30.0%", "60.0%", "80.0%", "100.0%"]
    assert "TFLOPS" in ax.get_ylabel()


def test_ksweep_has_a_line_per_kernel_against_k(results):
    fig = plot.ksweep(results)
    assert_title_says_what_was_measured(fig)
    assert "M = 8192, N = 8192" in fig.get_suptitle()
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"V0", "V1", "Triton", "matmul()", "cuBLAS"}
    assert list(lines["cuBLAS"].get_xdata()) == [512, 2048, 8192] and lines["cuBLAS"].get_linestyle() == "--"
    assert list(lines["V1"].get_ydata()) == [300.0, 450.0, 470.0]
    assert list(lines["V0"].get_xdata()) == [2048, 8192]  # V0 failed its check at K = 512: no point
    assert ax.get_xscale() == "log" and ax.get_xlabel().startswith("K")


def test_llm_shows_ratios_to_cublas_with_the_bars_of_the_issue(results):
    fig = plot.llm(results)
    assert_title_says_what_was_measured(fig)
    ax = fig.axes[0]
    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    ratios = {c.get_label().split(":")[0]: [p.get_height() for p in c] for c in containers}
    shapes = [(128, 4096, 4096), (128, 14336, 4096), (1024, 4096, 14336)]
    assert ratios["matmul()"] == pytest.approx([row(results, "matmul()", *s)["vs_cublas"] for s in shapes])
    assert ratios["Triton"] == pytest.approx([row(results, "Triton", *s)["vs_cublas"] for s in shapes])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "matmul(): geomean 1.01x, worst 0.93x" in labels and "0.8x floor" in labels
    assert sorted(line.get_ydata()[0] for line in ax.get_lines()) == [0.8, 1.0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[1].startswith("gate, up\nM=128") and "K=14336" in ticks[2]


def test_figures_are_written_reproducibly(results, tmp_path):
    written = plot.draw_all(results, tmp_path)
    names = sorted(p.name for p in written)
    kinds = ("progression", "ksweep", "llm")
    assert names == sorted(f"{n}-sm_90a-float16.{ext}" for n in kinds for ext in ("png", "svg"))
    first = {p.name: p.read_bytes() for p in written}
    plot.draw_all(results, tmp_path)
    assert first == {p.name: p.read_bytes() for p in written}  # redrawing unchanged results changes no file
    assert first["llm-sm_90a-float16.png"].startswith(b"\x89PNG") and b"<svg" in first["llm-sm_90a-float16.svg"]


def test_presets_missing_from_the_results_give_no_figure(results):
    only_llm = {**results, "presets": {"llm": results["presets"]["llm"]}}
    assert plot.progression(only_llm) is None and plot.ksweep(only_llm) is None and plot.llm(only_llm) is not None


def test_plot_command(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "matmul", "plot", str(FIXTURE), "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ksweep-sm_90a-float16.svg").exists() and "progression-sm_90a-float16.png" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "matmul", "plot", str(tmp_path / "nothing.json")], capture_output=True, text=True
    )
    assert bad.returncode != 0


def test_llm_marks_the_shapes_where_matmul_picked_cublas(results):
    import copy

    picked = copy.deepcopy(results)
    target = row(picked, "matmul()", 128, 4096, 4096)
    target["config"] = {"version": CUBLAS}
    ax = plot.llm(picked).axes[0]
    bars = next(c for c in ax.containers if c.get_label().startswith("matmul()"))
    assert [bool(p.get_hatch()) for p in bars] == [True, False, False]
    texts = [t.get_text() for t in ax.texts]
    assert any(t.endswith("cuBLAS") for t in texts)
    assert any(t.endswith("\nV1") for t in texts)  # the other bars name the version it ran


def test_results_written_before_cublas_had_one_name_read_as_cublas(tmp_path):
    """Older results files call matmul()'s choice of the vendor library "cublas": loading them
    gives the one name the tuner and the figures use."""
    import json

    raw = json.loads(FIXTURE.read_text())
    autotuned = next(r for r in raw["rows"] if r["kernel"] == "matmul()")
    autotuned["config"] = {"version": "cublas"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw))
    loaded = next(r for r in results_file.load(path)["rows"] if r["kernel"] == "matmul()")
    assert loaded["config"] == {"version": CUBLAS}
