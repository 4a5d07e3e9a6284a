"""The roofline's rows for Hopper V8 (int4 weights), without a GPU: the quantized bytes floor is
the bytes ``matmul.quantize`` actually stores, V8's committed results turn into rows whose floors
are those its own run computed, and the committed table and figure are what the command makes."""

import json
from pathlib import Path

import pytest
import torch

import matmul
from matmul.harness import roofline

ROOT = Path(__file__).resolve().parent.parent
# a results file of the quantized call's benchmark in its first form (V8's fastest configuration per shape)
V8_RESULTS = ROOT / "tests" / "data" / "v8-bench-first-form.json"
V7_RESULTS = ROOT / "plots" / "h100" / "skinny" / "roofline.json"
SKINNY = ROOT / "plots" / "h100" / "skinny"
COMMITTED_V8 = ROOT / "plots" / "h100" / "v8" / "bench.json"


@pytest.mark.parametrize("format", ["int4", "int4_channel", "int6", "fp8_e4m3"])
@pytest.mark.parametrize("n", [64, 100, 200])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantized_floor_is_what_quantize_stores(format, n, dtype):
    """Packed weight and scales as matmul.quantize stores them (rows padded to 64), plus A and C."""
    k, m = 384, 5
    qw = matmul.quantize(torch.randn(n, k).to(dtype), format=format)
    stored = qw.packed.numel() * qw.packed.element_size() + qw.scales.numel() * qw.scales.element_size()
    expected = stored + (m * k + m * n) * dtype.itemsize
    assert roofline.quantized_bytes_floor(m, n, k, dtype.itemsize, format) == expected


def test_quantized_floor_against_the_16_bit_one():
    # 4096 x 4096 at M = 1: 8 MiB of int4, 32 groups x 4096 scales of 2 bytes, A and C
    assert roofline.quantized_bytes_floor(1, 4096, 4096, 2) == 4096 * 4096 // 2 + 32 * 4096 * 2 + 2 * 4096 * 2
    dense = roofline.bytes_floor(16, 4096, 14336, 2)
    assert 3.5 < dense / roofline.quantized_bytes_floor(16, 4096, 14336, 2) < 4


@pytest.mark.parametrize("v8_results", [V8_RESULTS, COMMITTED_V8], ids=["first-form", "committed"])
def test_v8_rows_reproduce_the_runs_floors(v8_results):
    """The rows' V8 floors are the ones the quantized benchmark computed in its run (its own bytes
    count): the two counts agree on every measured shape."""
    v8, v7 = json.loads(v8_results.read_text()), json.loads(V7_RESULTS.read_text())
    rows = roofline.quantized_rows(v8, v7)
    sources = [r for r in v8["rows"] if "m" in r and r.get("path", "V8") == "V8"]
    measured = [r for r in sources if not r.get("failed")]
    assert len(rows) == len(sources) and measured
    for row, source in zip(rows, sources):
        if source.get("failed"):
            continue
        # the benchmark's floor: "attainable_us" (its first form), or "floor_us", the larger of the
        # memory floor and a compute floor (its later form)
        theirs = source["attainable_us"] if "attainable_us" in source else source["floor_us"]
        assert row["attainable_us"] == pytest.approx(theirs, rel=1e-9) or row["attainable_us"] < theirs
        assert row["v8_share"] == pytest.approx(row["attainable_us"] / source["v8_us"], rel=1e-9)
        assert row["ratio"] == pytest.approx(source["cublas_us"] / source["v8_us"], rel=1e-9)
        assert row["dense_attainable_us"] > 1.5 * row["attainable_us"]  # the point of fewer bits
        if source["m"] in (1, 16) and source.get("format", "int4") == "int4":
            assert "v7_us" in row, f"no V7 row for {row['m']} x {row['n']} x {row['k']} {row['dtype']}"


def test_v8_table_and_figure(tmp_path):
    v8 = json.loads(V8_RESULTS.read_text())
    rows = roofline.quantized_rows(v8, json.loads(V7_RESULTS.read_text()))
    rows.append({"format": "int4", "dtype": "float16", "m": 3, "n": 64, "k": 128, "label": "", "failed": True})
    text = roofline.quantized_table(rows, v8, "the command")
    assert "NVIDIA H100 80GB HBM3" in text and "the command" in text
    assert text.count("| int4 | float16 |") == 9 and "| int4 | float16 | 3 | 64 x 128 | FAILED |" in text
    assert "int4, float16: geomean V8 / cuBLAS 1.89x over 8 shapes" in text
    paths = roofline.plot_quantized(rows, v8["device"], tmp_path)
    assert all(p.exists() and p.stat().st_size > 10_000 for p in paths)


def test_v8_rows_of_every_format():
    """A results file of the quantized benchmark's later form: rows of several formats, each floor from its own
    format's bytes; the widened path's rows and unsupported formats are not V8 rows."""
    floor = {"copy_tb_per_s": 3.0, "empty_ms": 0.004}
    base = {"dtype": "float16", "m": 16, "n": 4096, "k": 4096, "cublas_us": 19.0, "v8_us": 10.0, "path": "V8"}
    v8 = {
        "device": "a GPU",
        "floor": floor,
        "rows": [
            {**base, "format": "int4", "config": {"block_m": 16}},
            {**base, "format": "fp8_e4m3", "config": {"block_m": 16}},
            {**base, "format": "int6", "failed": True},
            {**base, "format": "int4", "m": 1024, "path": "widen + cuBLAS"},
            {"format": "int2", "unsupported": "not a format of matmul.quant"},
        ],
    }
    rows = roofline.quantized_rows(v8)
    assert [(r["format"], r.get("failed", False)) for r in rows] == [
        ("int4", False),
        ("fp8_e4m3", False),
        ("int6", True),
    ]
    assert rows[1]["bytes"] == roofline.quantized_bytes_floor(16, 4096, 4096, 2, "fp8_e4m3") > rows[0]["bytes"]
    expected_us = (rows[1]["bytes"] / 3e12 + 4e-6) * 1e6
    assert rows[1]["attainable_us"] == pytest.approx(expected_us)
    text = roofline.quantized_table(rows, v8)
    assert "| fp8_e4m3 | float16 | 16 | 4096 x 4096 | 10.0 | 19.0 |" in text and "| int6 | float16 |" in text


def test_committed_roofline_has_the_v8_rows(tmp_path):
    """plots/h100/skinny/roofline.md is what its command writes from the committed results."""
    command = (SKINNY / "roofline.md").read_text().split("Made by `")[-1].split("`")[0]
    assert command.startswith("python -m matmul.harness.roofline --plot ") and "--v8 " in command
    args = command.split()[3:] + ["--out", str(tmp_path)]
    import contextlib
    import io
    import os

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            roofline.main(args)
    finally:
        os.chdir(cwd)
    assert (tmp_path / "roofline.md").read_text() == (SKINNY / "roofline.md").read_text()
    assert (SKINNY / "roofline-v8-sm_90a.png").exists()
