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
import statistics
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
ABOUT = "about.json"  # a results folder's description: what, date, commit, commands (``Folder``'s fields)


def folders(plots: Path | None = None) -> list[Folder]:
    """Every results folder under ``plots/<gpu>/``, as its ``about.json`` describes it."""
    plots = Path(plots or PLOTS)
    found = []
    for about in sorted(plots.glob(f"*/*/{ABOUT}")):
        fields = json.loads(about.read_text())
        path = str(about.parent.relative_to(plots))
        found.append(Folder(path, **{**fields, "commands": tuple(fields["commands"])}))
    return found


def load_json(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def result_files(folder: Path) -> list[Path]:
    """The results files of a folder and its subfolders (its README aside)."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in RESULT_SUFFIXES and p.name not in ("README.md", ABOUT)
    )


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
            lines.append(
                f"{dtype}: the best of the series / cuBLAS {span(best)}, geomean {statistics.geometric_mean(best):.3f}x"
            )
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
        for folder in folders(plots):
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
    for folder in folders(plots):
        files[plots / folder.path / "README.md"] = folder_readme(folder, plots)
    return files


def unregistered_folders(plots: Path) -> list[str]:
    """Folders under ``plots/<gpu>/`` with results files and no ``about.json``."""
    known = {f.path for f in folders(plots)}
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
        print(f"results with no {ABOUT} (what, date, commit, commands): {', '.join(stray)}", file=sys.stderr)
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
