"""The harness commands that were probes under plots/ (``quantized``, ``v8-configs``, ``options``,
``shipped-table``; ``skinny`` in tests/test_skinny.py), on the CPU: each remakes from the committed
results what a run of it wrote, and each committed results folder's command parses."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest

from matmul.harness import figures

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "plots"
V8_RUNS = sorted(PLOTS.glob("*/v8/**/bench.json"))


def table_rows(text: str) -> list[str]:
    """A Markdown table's body rows, each cut to its first 12 cells (the columns every form of the
    quantized benchmark's table has)."""
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| format")]
    return ["|".join(line.split("|")[:13]) for line in rows]


@pytest.mark.parametrize("path", V8_RUNS, ids=[str(p.parent.relative_to(PLOTS)) for p in V8_RUNS])
def test_the_quantized_table_is_what_the_command_makes_of_its_results(path):
    """``quantized.table`` of a committed bench.json is that run's bench.md, row for row."""
    from matmul.harness import quantized

    mine = table_rows(quantized.table(json.loads(path.read_text())))
    assert mine and mine == table_rows(path.with_suffix(".md").read_text())


def test_the_shipped_table_kernels_are_what_the_command_lists(capsys):
    """``python -m matmul shipped-table --list-kernels`` against the shipped H100 table prints the
    committed list (plots/h100/shipped-table/table-kernels.txt), in any order."""
    from matmul import cli

    assert cli.main(["shipped-table", "--list-kernels", "--gpu", "NVIDIA H100 80GB HBM3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    committed = (PLOTS / "h100" / "shipped-table" / "table-kernels.txt").read_text().splitlines()
    assert sorted(printed) == sorted(committed) and len(committed) == 60


def test_shipped_table_commands_are_tune_commands():
    """The three narrowed tunings, both dtypes, on the buckets of the README's models."""
    from matmul import cli

    commands = cli.shipped_table_commands()
    assert [c[0] for c in commands] == ["--model", "--shapes", "--shapes"]
    assert all("--narrow" in c and "float16,bfloat16" in c for c in commands)
    assert commands[1][commands[1].index("--variant") + 1] == "swiglu"
    assert commands[2][commands[2].index("--variant") + 1] == "kn"


def parser_of(module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser


PROBES = sorted(p for folder in PLOTS.glob("*/v8-configs") for p in folder.rglob("*.json") if p.name != "about.json")


@pytest.mark.parametrize("path", PROBES, ids=[str(p.relative_to(PLOTS)) for p in PROBES])
def test_each_v8_configs_file_has_a_command_that_times_its_configurations(path):
    """The command its folder's README gives it parses, names every configuration the file timed
    (each fitting the shapes it ran on) and every shape."""
    from matmul.harness import v8_configs

    rows = json.loads(path.read_text())
    command = figures.v8_configs_command(path, rows)
    args = parser_of(v8_configs).parse_args(shlex.split(command)[4:])
    named = [dict(zip(v8_configs.CONFIG_KEYS, map(int, c.split("/")))) for c in args.configs.split(",")]
    timed = {figures.config_text(r["config"]) for r in rows} - {"cublas", "widen + cuBLAS"}
    assert {figures.config_text({"interleave": 1, **c}) for c in named} == timed
    assert set(args.shapes) == {(r["m"], r["n"], r["k"]) for r in rows}
    assert args.widened == any(r["config"] == "widen + cuBLAS" for r in rows)
    for r in rows:
        if isinstance(r["config"], dict):
            config = {"interleave": 1, **r["config"]}
            assert v8_configs.fitting([config], r["m"], r["k"], named=True) == [config]


def test_v8_configs_fitting():
    from matmul.harness import v8_configs

    tile = {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64}
    assert v8_configs.fitting([tile], 1, 4096) == [tile]
    assert v8_configs.fitting([dict(tile, block_m=128)], 16, 4096) == []  # a tile far larger than M
    assert v8_configs.fitting([dict(tile, block_m=128)], 16, 4096, named=True) != []
    assert v8_configs.fitting([dict(tile, split=64)], 1, 4096) == []  # more splits than K's blocks
    assert v8_configs.shape_list("1x4096x4096,16x28672x4096") == [(1, 4096, 4096), (16, 28672, 4096)]


def test_the_options_run_names_its_kernels():
    """The committed run's kernels are the command's names, each a version and a configuration."""
    from matmul.harness import options

    run = json.loads((PLOTS / "h100" / "pingpong" / "pingpong.json").read_text())
    kernels = run["args"]["kernels"].split(",")
    assert set(kernels) <= set(options.KERNELS)
    configs = options.configs()
    assert set(configs) == set(options.KERNELS)
    assert all(version in ("v5", "v6") and isinstance(config, dict) for version, config in configs.values())
    args = parser_of(options).parse_args(["--out", "x", "--kernels", run["args"]["kernels"], "--rounds", "6"])
    assert args.kernels == run["args"]["kernels"]
