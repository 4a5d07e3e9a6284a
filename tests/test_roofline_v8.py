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
V8_RESULTS = ROOT / "plots" / "h100" / "v8" / "bench.json"
V7_RESULTS = ROOT / "plots" / "h100" / "skinny" / "roofline.json"
SKINNY = ROOT / "plots" / "h100" / "skinny"


@pytest.mark.parametrize("format", ["int4", "int6", "fp8_e4m3"])
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


def test_v8_rows_reproduce_the_runs_floors():
    """The rows' V8 floors are the ones bench_v8.py computed in its run (its own bytes count):
    the two counts agree on every measured shape."""
    v8, v7 = json.loads(V8_RESULTS.read_text()), json.loads(V7_RESULTS.read_text())
    rows = roofline.quantized_rows(v8, v7)
    measured = [r for r in v8["rows"] if not r.get("failed")]
    assert len(rows) == len(v8["rows"]) and measured
    for row, source in zip(rows, v8["rows"]):
        if source.get("failed"):
            continue
        assert row["attainable_us"] == pytest.approx(source["attainable_us"], rel=1e-9)
        assert row["v8_share"] == pytest.approx(source["share_of_floor"], rel=1e-9)
        assert row["ratio"] == pytest.approx(source["ratio"], rel=1e-9)
        assert row["dense_attainable_us"] > 2 * row["attainable_us"]  # the point of 4 bits
        assert "v7_us" in row, f"no V7 row for {row['m']} x {row['n']} x {row['k']} {row['dtype']}"


def test_v8_table_and_figure(tmp_path):
    v8 = json.loads(V8_RESULTS.read_text())
    rows = roofline.quantized_rows(v8, json.loads(V7_RESULTS.read_text()))
    rows.append({"dtype": "float16", "m": 3, "n": 64, "k": 128, "label": "", "failed": True})
    text = roofline.quantized_table(rows, v8, "the command")
    assert "NVIDIA H100 80GB HBM3" in text and "the command" in text
    assert text.count("| float16 |") == 9 and "| float16 | 3 | 64 x 128 | FAILED |" in text
    assert "float16: geomean V8 / cuBLAS 1.89x over 8 shapes" in text
    paths = roofline.plot_quantized(rows, v8["device"], tmp_path)
    assert all(p.exists() and p.stat().st_size > 10_000 for p in paths)


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
