"""One source for the committed results' index: ``python -m matmul figures`` writes ``plots/README.md``
(every results folder per GPU, its figures and its headline numbers, read from its results files)
and each results folder's ``README.md`` (what was measured, on which GPU, when, at which commit, and
the package command that remakes it). ``--check`` writes nothing and fails where a file differs
from what the command would write (``tests/test_figures.py`` does the same).

It also holds the rule that a figure quoted in prose is backed by a results file
(``unbacked_figures``). A *figure* is a measured number with its unit, as prose quotes it:

* a ratio: a number with a decimal point followed by ``x`` (``1.07x``; ``2x`` or ``4096 x 4096``
  are sizes, not figures);
* a percentage: ``63%``;
* a time: ``12.3 us`` (or ``µs``), ``1.47 ms``;
* a rate: ``750 TFLOP/s`` (or ``TFLOPS``), ``3.02 TB/s``, ``35 GB/s``.

A range (``1.5-2.6x``, ``52-71%``) is two figures of its unit. Text in code (fenced blocks and
inline code spans) is not prose. A figure is backed when a results file in a results folder the
document cites (``plots/<gpu>/<folder>`` anywhere in it, a notebook's outputs too:
``cited_folders``) holds a number of the same unit that rounds to it at the figure's own decimals
(``1.07x`` is backed by any ratio in [1.065, 1.075]; ``63%`` by any percentage in [62.5, 63.5]).
What a results file holds, by unit: in its text (``.md``, ``.txt``, ``.log``, ``.csv``), the figures
written there (the same pattern, integer ratios too) and the cells of Markdown tables under a header
that names the unit (``us``, ``%``, ``/`` or ``x`` for ratios); in its JSON (``.json``,
``.json.gz``), each number by its key (``*_us``/``us``: a time in us; ``*_ms``/``ms*``: a time in
ms, also in us; ``*tflops*``; ``*tb_per_s*``; a ratio under a key that names one: ``ratio``, ``x_``,
``vs_``, ``geomean``, ``share``, ``over``, ``min``, ``max``, ``speedup``), a ratio standing also for
its percentage; a JSON list of plain numbers is a measurement's samples (windows, rounds), not its
figures.
"""

from __future__ import annotations

import bisect
import difflib
import gzip
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLOTS = ROOT / "plots"
COMMAND = "python -m matmul figures"
GPUS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}
RESULT_SUFFIXES = (".json", ".gz", ".md", ".txt", ".log", ".csv", ".png", ".svg")
FIGURE_SUFFIXES = (".png",)
GENERATED = "made by `python -m matmul figures` (matmul/harness/figures.py): edit that, not this file"


@dataclass(frozen=True)
class Folder:
    """A results folder under ``plots/``: what it measured, when (the date its results were
    committed), at which commit (the one that committed them; ``code``: the code that ran, where it
    differs) and the package commands that remake its files."""

    path: str  # "h100/series"
    what: str
    date: str
    commit: str
    commands: tuple[str, ...]
    code: str = ""


QUANTIZED = "python -m matmul quantized --out DIR"
V8_CONFIGS = "python -m matmul v8-configs --out DIR"

FOLDERS = (
    Folder(
        "h100/series",
        "The tutorial's series (Hopper V0-V6, cuBLAS, Triton and the autotuned `matmul()`), float16: "
        "paired windows on the square series and the K sweep, the LLM shapes, and sustained windows; "
        "`ncu-per-launch.csv`: one launch each under Nsight Compute (SM cycles, DRAM and L2 bytes).",
        "2026-11-22",
        "7fbb5e4",
        (
            "python -m matmul bench --shapes series,ksweep --rounds 10 --repeat-ms 100 --warmup-ms 300 --out DIR",
            "python -m matmul bench --shapes llm --rounds 6 --repeat-ms 100 --warmup-ms 300 --out DIR",
            "python -m matmul bench --shapes series --sustained 3 --rounds 4 --out DIR",
            "python -m matmul bench --arch sm_90a --versions v0 --redraw-from plots   # no GPU: the figures again",
        ),
        code="77043ce (paired, LLM), 8e30926 (sustained)",
    ),
    Folder(
        "h100/model",
        "Llama-3-8B's matmuls (seven weights at 1-8192 tokens, float16): `matmul()` with the shipped "
        "table against `torch.matmul`, back to back and one weight at a time.",
        "2026-11-27",
        "f240215",
        ("python -m matmul model --out DIR",),
        code="c8c16c2",
    ),
    Folder(
        "h100/drop-in",
        "A Hugging Face Llama with its linears switched by `matmul.nn.convert` (prefill, decode eager and "
        "in a CUDA graph, a training step) against torch; the training step's `kn` products; "
        "`nn.Linear` with fused epilogues.",
        "2026-11-27",
        "f240215",
        (
            "python -m matmul drop-in --parts llama --rounds 5 --out DIR    # llama-c8c16c2.*",
            "python -m matmul drop-in --parts kn --rounds 4 --out DIR       # kn-f5d0422.*",
            "MATMUL_TUNE=blocking python -m matmul drop-in --parts linear --rounds 5 --out DIR   # linear-b00835b.*",
        ),
        code="c8c16c2, f5d0422, b00835b (the files' suffixes)",
    ),
    Folder(
        "h100/first-calls",
        "The first calls of a fresh process: 300 first matmuls of a Llama trace, `matmul()` and torch "
        "processes alternating on one GPU (events, stream and device time of each call).",
        "2026-11-27",
        "e5a1111",
        ("python -m matmul trace --parts alternating --repeats 7 --matmul-env MATMUL_TUNE=off --out DIR",),
        code="a0d386d",
    ),
    Folder(
        "h100/pingpong",
        "Options outside the tuned space: Hopper V6 with ping-pong consumer warpgroups (two tile "
        "shapes) against V6 and cuBLAS on 4096^3, 8192^3 and 8192 x 8192 x 2048, both dtypes.",
        "2026-11-25",
        "70f2274",
        ("python -m matmul options --out DIR --rounds 6 --kernels plain-g8,pingpong-g8,pingpong64x256-g8",),
    ),
    Folder(
        "h100/stream-k",
        "Hopper V5's stream-K option (the last, partial wave's tiles split over CTAs, partial sums "
        "through global memory) against V5 as its space holds it, V6 and cuBLAS on 4096^3, 8192^3 and "
        "8192 x 8192 x 2048, both dtypes; its GPU tests.",
        "2026-11-27",
        "fe663ea",
        (
            "python -m matmul options --out DIR --rounds 6 --kernels v5-plain,v5-stream-k,plain-g8 "
            "--json stream-k.json",
            "python -m pytest -q -m gpu tests/test_stream_k_gpu.py -rA   # gpu-tests.txt",
        ),
    ),
    Folder(
        "h100/shipped-table",
        "The logs of the narrowed tunings that made `matmul/call/shipped/h100.json`, and the kernels "
        "those tunings build first (`table-kernels.txt`).",
        "2026-11-27",
        "c8c16c2",
        (
            "python -m matmul shipped-table --table matmul/call/shipped/h100.json",
            "python -m matmul shipped-table --list-kernels --gpu 'NVIDIA H100 80GB HBM3'   # table-kernels.txt",
        ),
        code="5e58810",
    ),
    Folder(
        "h100/skinny",
        "Decode and small-prefill sizes (1-256 tokens on Llama's weights): Hopper V7 against cuBLAS and "
        "the attainable floor (`roofline.*`), V8's low-precision rows beside it (`roofline-v8-*`), and "
        "V7 with multicast against the best of the series (`multicast.json`, `skinny-*`).",
        "2026-11-27",
        "5e58810",
        (
            "python -m matmul.harness.roofline --out DIR   # roofline.json",
            "python -m matmul skinny --out DIR --others --rounds 3   # multicast.json, skinny-log.txt",
            "python -m matmul.harness.roofline --plot plots/h100/skinny/roofline.json --v8 plots/h100/v8/bench.json"
            "   # roofline.md and the figures, no GPU needed",
        ),
        code="5fe6788 (roofline.json), 5e58810 (multicast.json)",
    ),
    Folder(
        "h100/v8",
        "The quantized call `matmul.linear(x, qw)` (Hopper V8, or the widened weight and cuBLAS past 256 "
        "tokens) against cuBLAS on the 16-bit weight: int4 and fp8 at 1-4096 tokens on four Llama weights, "
        "both dtypes; `int6/`: int6 at the same sizes.",
        "2026-11-27",
        "87897b1",
        (f"{QUANTIZED}", f"{QUANTIZED} --formats int6   # int6/"),
        code="1556570 (bench.*), 44fb55d (int6/)",
    ),
    Folder(
        "h100/v8-configs",
        "V8's configurations timed against cuBLAS outside the call's choice, one folder a question: "
        "`int4/` (its space at decode sizes, the narrow tiles), `interleave/` (two consumers a slab), "
        "`fp8/` (fp8 at decode sizes).",
        "2026-11-27",
        "8021d77",
        (f"{V8_CONFIGS} --format FORMAT --configs CONFIGS --shapes SHAPES   # each file's own below",),
        code="21569d7 (int4), 650f062 (interleave), 8021d77 (fp8)",
    ),
    Folder(
        "h200/drop-in",
        "The drop-in Llama (float16) on a fresh machine with the completed H200 table: prefill, decode "
        "eager and in a CUDA graph, a training step, against torch.",
        "2026-11-29",
        "b72cadb",
        ("python -m matmul drop-in --parts llama --rounds 5 --out DIR",),
    ),
    Folder(
        "h200/gpu-tests",
        "Every GPU test file at one commit on the H200, each file's log named below (`a/`, `c/`, `d/`: "
        "the session's parts, each under a time limit; a log ending in `exit 124` was cut by it).",
        "2026-11-30",
        "3d0bed9",
        (
            "python -m pytest -q -m gpu tests/test_gpu_correctness.py   # correctness.txt",
            "python -m pytest -q -m gpu tests/test_pipeline.py   # ring.txt",
            "python -m pytest -q -m gpu tests/test_skinny_gpu.py tests/test_multicast_gpu.py   # skinny-multicast.txt",
            "python -m pytest -q -m gpu tests/test_pingpong_gpu.py tests/test_stream_k_gpu.py  # pingpong-stream-k.txt",
            "python -m pytest -q -m gpu tests/test_native_entry.py   # native-entry.txt",
            "python -m pytest -q -m gpu tests/test_b_layout_gpu.py tests/test_fused_epilogue_gpu.py "
            "tests/test_swiglu_gpu.py   # b-layout-epilogue-swiglu.txt",
            "python -m pytest -q -m gpu tests/test_batched_gpu.py tests/test_building_gpu.py   # batched-building.txt",
            "python -m pytest -q -m gpu tests/test_api_gpu.py tests/test_linear_gpu.py   # api-linear.txt",
            "python -m pytest -q -m gpu tests/test_odd_inputs_gpu.py   # odd-inputs.txt",
            "python -m pytest -q -m gpu tests/test_v8_gpu.py   # v8-gpu.txt",
            "python -m pytest -q -m gpu tests/test_v8_prefill_gpu.py   # v8-prefill-gpu.txt",
        ),
    ),
    Folder(
        "h200/model",
        "Llama-3-8B's matmuls (seven weights at 1-8192 tokens) in float16 and bfloat16: `matmul()` with "
        "the H200 table against `torch.matmul`.",
        "2026-11-29",
        "bd08ea3",
        ("python -m matmul model --out DIR", "python -m matmul model --dtype bfloat16 --out DIR"),
        code="8fb8ffb (bfloat16), bd08ea3 (float16)",
    ),
    Folder(
        "h200/packed-llama",
        "The drop-in Llama with its weights packed (int4, int6, fp8_e4m3; float16 activations): the "
        "quantized call against torch on the 16-bit model.",
        "2026-11-30",
        "3e644fb",
        (
            "python -m matmul drop-in --parts llama-FORMAT --rounds 5 --dtype float16 --out DIR"
            "   # FORMAT: int4, int6, fp8_e4m3",
        ),
    ),
    Folder(
        "h200/shipped-table",
        "The logs of the narrowed tunings that made `matmul/call/shipped/h200.json` (154 entries).",
        "2026-11-29",
        "b72cadb",
        ("python -m matmul shipped-table --table matmul/call/shipped/h200.json",),
    ),
    Folder(
        "h200/skinny",
        "V7 with multicast against V7 without it, the rest of the series and cuBLAS at 64-256 tokens on "
        "Llama's weights, both dtypes.",
        "2026-11-28",
        "eb76b75",
        ("python -m matmul skinny --out DIR --others --rounds 3",),
    ),
    Folder(
        "h200/v8",
        "The quantized call against cuBLAS on the 16-bit weight, one folder a run: int4 (both dtypes) and "
        "fp8 at 1-4096 tokens, int4 with a scale per row (`int4-channel/`), int6 at decode sizes, fp8 and "
        "int6 at 33-64 tokens (`mid-tokens/`); `gpu-tests.txt`: V8's GPU tests of the first run.",
        "2026-11-30",
        "6d0b3d5",
        (f"{QUANTIZED} --formats FORMATS --dtypes DTYPES --tokens TOKENS   # each run's own below",),
        code="6d0b3d5, 596b8df (int4-channel), 3e644fb (int6-decode), 450b789 (mid-tokens)",
    ),
    Folder(
        "h200/v8-configs",
        "V8's configurations timed against cuBLAS (and the widened path past 256 tokens) outside the "
        "call's choice, one folder a question the call's rules (`matmul/quant/linear.py`) answer.",
        "2026-11-30",
        "04e287d",
        (f"{V8_CONFIGS} --format FORMAT --configs CONFIGS --shapes SHAPES   # each file's own below",),
    ),
)


# -- reading results ---------------------------------------------------------------------------------


def load_json(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def result_files(folder: Path) -> list[Path]:
    """The results files of a folder and its subfolders (its README aside)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in RESULT_SUFFIXES and p.name != "README.md")


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def span(values, digits: int = 2, unit: str = "x") -> str:
    values = sorted(values)
    lo, hi = f"{values[0]:.{digits}f}", f"{values[-1]:.{digits}f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def config_text(config) -> str:
    if isinstance(config, str):
        return config
    keys = ("block_m", "warpgroups", "split", "stages", "chunk")
    text = "/".join(str(config[k]) for k in keys)
    return text + (f"/{config['interleave']}" if config.get("interleave", 1) != 1 else "")


def v8_format(name: str) -> str:
    return "fp8_e4m3" if "fp8" in name else "int6" if "int6" in name else "int4"


def v8_configs_command(path: Path, rows: list[dict]) -> str:
    """The ``v8-configs`` command that times this file's configurations on its shapes again."""
    configs = []
    for row in rows:
        text = config_text(row["config"])
        if text not in ("cublas", "widen + cuBLAS") and text not in configs:
            configs.append(text)
    shapes = list(dict.fromkeys(f"{r['m']}x{r['n']}x{r['k']}" for r in rows))
    words = [V8_CONFIGS, "--format", v8_format("/".join(path.parts[-2:]))]
    if "bfloat16" in path.name or "bf16" in path.name:
        words += ["--dtype", "bfloat16"]
    if any(r["config"] == "widen + cuBLAS" for r in rows):
        words.append("--widened")
    return " ".join([*words, "--configs", ",".join(configs), "--shapes", ",".join(shapes)])


def quantized_command(results: dict) -> str:
    """``python -m matmul quantized`` with the arguments a V8 run recorded (its script's then)."""
    words = results.get("command", "").split()
    rest = [w for i, w in enumerate(words[2:]) if w != "--no-prebuild"] if len(words) > 1 else []
    return " ".join([QUANTIZED, *rest])


def headlines(path: Path) -> list[str]:
    """What one results file says in a line or a few, computed from it (empty where it has no number
    to headline: logs, figures)."""
    name = path.name
    if path.suffix not in (".json", ".gz"):
        if path.suffix == ".txt" and ("gpu-tests" in str(path) or path.name.startswith("v8-")):
            lines = path.read_text().splitlines()
            return [line.strip().strip("=").strip() for line in lines if _PYTEST.search(line)]
        return []
    data = load_json(path)
    if isinstance(data, dict) and data.get("format") == "tilus-matmul-bench/1":
        s = data["summary"]["all"]
        return [
            f"`matmul()` / cuBLAS geomean {s['matmul_vs_cublas_geomean']:.3f}x, worst {s['matmul_vs_cublas_min']:.3f}x "
            f"over {s['shapes']} shapes"
        ]
    if isinstance(data, dict) and data.get("format", "").startswith("tilus-matmul-model/"):
        b, o = data["back_to_back_summary"], data["one_weight_summary"]
        return [
            f"{data['dtype']}: `matmul()` / torch.matmul back to back geomean {b['geomean']:.3f}x (worst "
            f"{b['min']:.3f}x), one weight at a time {o['geomean']:.3f}x (worst {o['min']:.3f}x), {b['shapes']} shapes"
        ]
    if isinstance(data, dict) and data.get("format") == "tilus-matmul-drop-in/1":
        by_kind: dict[str, list[float]] = {}
        for r in data["results"]:
            if "ratio" in r:
                by_kind.setdefault(r.get("kind", "products"), []).append(r["ratio"])
        parts = ", ".join(f"{kind} {span(v)}" for kind, v in by_kind.items())
        return [f"{data['part']}, {data['dtype']}: torch's time / ours, {parts}"] if parts else []
    if isinstance(data, dict) and "floor" in data and "rows" in data and name == "bench.json":
        lines = []
        groups: dict[tuple, list[dict]] = {}
        for r in data["rows"]:
            if "m" in r and not r.get("failed") and "x_cublas" in r:
                groups.setdefault((r["format"], r["dtype"], r.get("path", "V8")), []).append(r)
        for (fmt, dtype, route), rows in groups.items():
            tokens = sorted({r["m"] for r in rows})
            at = f"{tokens[0]}-{tokens[-1]}" if len(tokens) > 1 else f"{tokens[0]}"
            lines.append(
                f"{fmt} {dtype} ({route}, {at} tokens): cuBLAS / the call "
                f"{span(r['x_cublas'] for r in rows)}, {span((100 * r['share_of_floor'] for r in rows), 0, '%')} "
                "of its floor"
            )
        return lines
    if isinstance(data, dict) and name == "roofline.json":
        return [
            f"{dtype}: V7 / cuBLAS geomean {s['bar_geomean_vs_cublas']:.3f}x on the {s['bar_shapes']} bar shapes, "
            f"worst {100 * s['bar_min_share_of_floor']:.0f}% of the floor"
            for dtype, s in data["summary"].items()
        ]
    if isinstance(data, list) and data and "best" in data[0]:
        lines = []
        for dtype in dict.fromkeys(r["dtype"] for r in data):
            best = [r["best"]["vs_cublas"] for r in data if r["dtype"] == dtype and r.get("best")]
            lines.append(f"{dtype}: the best of the series / cuBLAS {span(best)}, geomean {geomean(best):.3f}x")
        return lines
    if isinstance(data, dict) and "args" in data and data.get("rows") and "kernel" in data["rows"][0]:
        kernels: dict[str, list[float]] = {}
        for r in data["rows"]:
            if r.get("vs_cublas") and r["kernel"] != "cuBLAS":
                kernels.setdefault(r["kernel"], []).append(r["vs_cublas"])
        return [f"{k} / cuBLAS {span(v, 3)}" for k, v in kernels.items()]
    if isinstance(data, dict) and "across_processes" in data:
        s = data["across_processes"]["event"]["median_against_median"]
        return [
            f"{s['calls']} first calls: worst {s['worst_ratio']:.2f}x torch's, {s['over_1.5x']} over 1.5x, "
            f"total {s['total_ratio']:.3f}x"
        ]
    if isinstance(data, list) and data and "x_cublas" in data[0]:
        timed = [r for r in data if r["config"] not in ("cublas",)]
        best = max(r["x_cublas"] for r in timed)
        configs = {config_text(r["config"]) for r in timed}
        shapes = {(r["m"], r["n"], r["k"]) for r in data}
        return [f"{len(configs)} configurations on {len(shapes)} shapes; the fastest: cuBLAS / it {best:.2f}x"]
    return []


_PYTEST = re.compile(r"\b\d+ (passed|failed)\b")


# -- the files this command writes -------------------------------------------------------------------


def folder_readme(folder: Folder, plots: Path) -> str:
    here = plots / folder.path
    gpu = GPUS[folder.path.split("/")[0]]
    lines = [
        f"# plots/{folder.path}",
        "",
        folder.what,
        "",
        f"- GPU: {gpu}",
        f"- date: {folder.date}",
        f"- commit: {folder.commit} (the results committed)"
        + (f"; code that ran: {folder.code}" if folder.code else ""),
        "",
        "Remade by (on the GPU, from the checkout's root; DIR a folder of your choice):",
        "",
        *(f"    {c}" for c in folder.commands),
    ]
    probes = [p for p in result_files(here) if p.suffix == ".json" and _is_probe(p)]
    if probes:
        lines += ["", "Each file's own command:", ""]
        for p in probes:
            lines += [f"- `{p.relative_to(here)}`: `{v8_configs_command(p, load_json(p))}`"]
    runs = [p for p in result_files(here) if p.name == "bench.json" and p.parent != here]
    if runs and "FORMATS" in " ".join(folder.commands):
        lines += ["", "Each run's own command:", ""]
        lines += [f"- `{p.parent.relative_to(here)}/`: `{quantized_command(load_json(p))}`" for p in runs]
    lines += ["", f"<!-- {GENERATED} -->", ""]
    return "\n".join(lines)


def _is_probe(path: Path) -> bool:
    data = load_json(path)
    return isinstance(data, list) and bool(data) and "x_cublas" in data[0] and "config" in data[0]


def index(plots: Path) -> str:
    lines = [
        "# Results",
        "",
        f"Made by `{COMMAND}` from the results files below (`matmul/harness/figures.py`); "
        f"`{COMMAND} --check` and `tests/test_figures.py` fail when this file or a folder's README.md "
        "is not what it makes. Each folder's README.md says what was measured, on which GPU, when, at "
        "which commit, and the command that remakes its files. Every number here is computed from "
        "those files.",
    ]
    for gpu, device in GPUS.items():
        lines += ["", f"## {gpu.upper()} ({device})"]
        for folder in FOLDERS:
            if not folder.path.startswith(gpu + "/"):
                continue
            here = plots / folder.path
            lines += ["", f"### [{folder.path}]({folder.path}/) ({folder.date}, {folder.commit})", "", folder.what]
            figures = [p for p in result_files(here) if p.suffix in FIGURE_SUFFIXES]
            if figures:
                links = ", ".join(f"[{p.relative_to(here)}]({p.relative_to(plots)})" for p in figures)
                lines += ["", f"Figures: {links}"]
            numbers = [(p, h) for p in result_files(here) for h in headlines(p)]
            if numbers:
                lines.append("")
                lines += [f"- `{p.relative_to(here)}`: {h}" for p, h in numbers]
    lines += ["", f"<!-- {GENERATED} -->", ""]
    return "\n".join(lines)


def expected_files(plots: Path) -> dict[Path, str]:
    files = {plots / "README.md": index(plots)}
    for folder in FOLDERS:
        files[plots / folder.path / "README.md"] = folder_readme(folder, plots)
    return files


def unregistered_folders(plots: Path) -> list[str]:
    """Folders under ``plots/<gpu>/`` with results files that no ``Folder`` describes."""
    known = {f.path for f in FOLDERS}
    found = set()
    for path in result_files(plots):
        parts = path.relative_to(plots).parts
        if len(parts) >= 3:
            found.add("/".join(parts[:2]))
        else:
            found.add(str(path.relative_to(plots)))
    return sorted(found - known)


def main(plots: Path | None = None, check: bool = False) -> int:
    plots = Path(plots or PLOTS)
    status = 0
    stray = unregistered_folders(plots)
    if stray:
        print(f"results with no Folder in matmul/harness/figures.py: {', '.join(stray)}", file=sys.stderr)
        status = 1
    for path, text in expected_files(plots).items():
        old = path.read_text() if path.exists() else ""
        if old == text:
            continue
        if check:
            status = 1
            diff = difflib.unified_diff(old.splitlines(), text.splitlines(), str(path), "expected", lineterm="")
            print("\n".join(list(diff)[:40]), file=sys.stderr)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return status


# -- figures quoted in prose -------------------------------------------------------------------------

NUMBER = r"\d+(?:\.\d+)?"
UNIT = r"x|×|%|\s?(?:us|µs|ms|TFLOP/s|TFLOPS|TB/s|GB/s)"
FIGURE = re.compile(rf"(?<![\w.\-/])({NUMBER})(?:\s?(?:-|–|to)\s?({NUMBER}))?({UNIT})(?![\w/])")
UNITS = {"x": "x", "×": "x", "%": "%", "us": "us", "µs": "us", "ms": "ms", "TFLOP/s": "tflops", "TFLOPS": "tflops"}
UNITS.update({"TB/s": "tb/s", "GB/s": "gb/s"})
RATIO_KEYS = ("ratio", "x_", "vs_", "_vs", "geomean", "share", "over", "min", "max", "speedup")


@dataclass(frozen=True)
class Figure:
    text: str  # the number as written
    unit: str  # x, %, us, ms, tflops, tb/s, gb/s
    where: str  # the quote around it

    @property
    def value(self) -> float:
        return float(self.text)

    @property
    def half_step(self) -> float:
        decimals = len(self.text.split(".")[1]) if "." in self.text else 0
        return 0.5 * 10**-decimals


def prose(text: str) -> str:
    """Markdown without its code: fenced blocks and inline code spans."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", " ", text)


def quoted_figures(text: str, integer_ratios: bool = False) -> list[Figure]:
    figures = []
    for match in FIGURE.finditer(text):
        unit = UNITS[match.group(3).strip()]
        where = text[max(0, match.start() - 40) : match.end() + 10].replace("\n", " ")
        for number in filter(None, match.group(1, 2)):
            if unit == "x" and "." not in number and not integer_ratios:
                continue
            figures.append(Figure(number, unit, where))
    return figures


def cited_folders(text: str, plots: Path | None = None) -> list[str]:
    """The results folders (``h100/series``, ...) that ``text`` names by a ``plots/`` path."""
    plots = Path(plots or PLOTS)
    named = {m.group(1) for m in re.finditer(r"plots/(h[0-9]+/[\w-]+)", text)}
    return sorted(name for name in named if (plots / name).is_dir())


class Backing:
    """Every number the results files under ``plots/`` hold (of the ``folders`` named, if any), by
    unit (the module's docstring)."""

    def __init__(self, plots: Path | None = None, folders: list[str] | None = None):
        plots = Path(plots or PLOTS)
        self.numbers: dict[str, list[float]] = {}
        roots = [plots / f for f in folders] if folders is not None else [plots]
        for path in (p for root in roots for p in result_files(root)):
            if path.suffix in (".json", ".gz"):
                self._walk(load_json(path), "")
            elif path.suffix in (".md", ".txt", ".log", ".csv"):
                self._text(path.read_text(errors="replace"))
        for values in self.numbers.values():
            values.sort()

    def add(self, unit: str, value: float) -> None:
        self.numbers.setdefault(unit, []).append(value)
        if unit == "ms":
            self.numbers.setdefault("us", []).append(value * 1e3)
        if unit == "x":
            self.numbers.setdefault("%", []).append(value * 100)

    def _walk(self, data, key: str) -> None:
        if isinstance(data, dict):
            for k, v in data.items():
                self._walk(v, str(k))
        elif isinstance(data, list):
            if all(isinstance(v, (int, float)) for v in data):
                return  # the samples of a measurement (windows, rounds), not its figures
            for v in data:
                self._walk(v, key)
        elif isinstance(data, (int, float)) and not isinstance(data, bool) and math.isfinite(data):
            unit = json_unit(key)
            if unit:
                self.add(unit, float(data))

    def _text(self, text: str) -> None:
        for figure in quoted_figures(text, integer_ratios=True):
            self.add(figure.unit, figure.value)
        header_units: list[str | None] = []
        for line in text.splitlines():
            if not line.startswith("|"):
                header_units = []
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not header_units:
                header_units = [header_unit(c) for c in cells] or [None]
                continue
            for unit, cell in zip(header_units, cells):
                for number in re.findall(NUMBER, cell) if unit else ():
                    self.add(unit, float(number))

    def backs(self, figure: Figure) -> bool:
        values = self.numbers.get(figure.unit, [])
        lo = figure.value - figure.half_step * (1 + 1e-9)
        i = bisect.bisect_left(values, lo)
        return i < len(values) and values[i] <= figure.value + figure.half_step * (1 + 1e-9)


def json_unit(key: str) -> str | None:
    key = key.lower()
    if key == "us" or key.endswith("_us"):
        return "us"
    if key == "ms" or key.endswith("_ms") or key.startswith("ms_"):
        return "ms"
    if "tflops" in key:
        return "tflops"
    if "tb_per_s" in key:
        return "tb/s"
    if "gb_per_s" in key:
        return "gb/s"
    if any(word in key for word in RATIO_KEYS):
        return "x"
    return None


def header_unit(cell: str) -> str | None:
    if re.search(r"\bus\b|µs", cell):
        return "us"
    if "%" in cell:
        return "%"
    if re.search(r"\bms\b", cell):
        return "ms"
    if "TFLOP" in cell:
        return "tflops"
    if " / " in cell or re.search(r"\bx\b|\bvs\b|ratio", cell):
        return "x"
    return None


def unbacked_figures(text: str, backing: Backing) -> list[Figure]:
    """The figures quoted in the Markdown ``text`` (outside code) that no results file backs."""
    return [f for f in quoted_figures(prose(text)) if not backing.backs(f)]


def notebook_markdown(path: Path) -> str:
    cells = json.loads(Path(path).read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
