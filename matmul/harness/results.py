"""The harness's results: the typed record of one measured kernel on one shape (``Row``), the file
that holds a run (``Results``, JSON, format ``FORMAT``), the environment a run records, the
summary of the autotuned call and the text table.

A row's kernel is a version name (``"v0"``..), ``CUBLAS`` (``torch.matmul``, the reference point
of every ratio), ``TRITON`` (the Triton baseline) or ``AUTOTUNED`` (the ``matmul()`` call).
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Optional, TypedDict

import torch

from ..kernels.versions import CUBLAS

FORMAT = "tilus-matmul-bench/1"
TRITON, AUTOTUNED = "Triton", "matmul()"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}  # the 16-bit dtypes by name


class Row(TypedDict, total=False):
    """One kernel on one shape. Paired windows fill ``vs_cublas`` and ``cublas_ms_rounds``; sustained
    windows fill ``clock_mhz_rounds`` and ``power_w_rounds`` (one value per window)."""

    m: int
    n: int
    k: int
    label: str  # the preset's name for the shape ("qkv", "gate-up"...), or ""
    dtype: str  # "float16" or "bfloat16"
    kernel: str  # a version name, CUBLAS, TRITON or AUTOTUNED
    kind: str  # "version", "baseline" or "autotuned"
    config: Optional[dict]  # what it ran with; for AUTOTUNED, the chosen {"version": ..., **config}
    ok: bool  # within the dtype's tolerance of the float32 reference
    error: float  # relative error against the reference (inf if it did not run)
    message: str  # why it did not run
    ms_rounds: list[float]  # its median time in each window
    ms: float  # its time: at cuBLAS's median clock when paired, else the median of ms_rounds
    vs_cublas: float  # its speed as a multiple of cuBLAS's (> 1: faster)
    cublas_ms_rounds: list[float]  # cuBLAS's median time in each of its windows
    tflops: float
    clock_mhz_rounds: list[float]
    power_w_rounds: list[float]


class Results(TypedDict, total=False):
    """A run of ``bench.run``: what was measured, where, how, and one ``Row`` per kernel and shape."""

    format: str  # FORMAT
    command: str
    arch: str
    dtype: str
    started: str
    machine: dict[str, Any]  # the GPU and its clocks before the run (``machine()``)
    machine_after: dict[str, Any]  # and after it
    software: dict[str, str]
    timing: dict[str, Any]  # "mode": "paired" or "sustained", and its parameters
    presets: dict[str, list[dict]]  # preset name -> its shapes
    rows: list[Row]
    summary: dict[str, Any]


def machine() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    info = {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
    }
    query = (
        "clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,power.limit,temperature.gpu,pstate,driver_version"
    )
    try:
        line = _output(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], timeout=30).splitlines()[0]
        info.update(zip(query.split(","), (x.strip() for x in line.split(","))))
    except Exception as e:  # the timings are still worth keeping without the clocks
        info["nvidia-smi"] = f"unavailable: {e}"
    return info


def software() -> dict[str, str]:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    for package in ("tilus", "apache-tvm-ffi", "triton", "tilus-matmul"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = "not installed"
    try:
        git = _output(["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty"], timeout=10)
    except Exception:
        git = ""
    info["git"] = git or "unknown"
    return info


def _output(command: list[str], timeout: float) -> str:
    """What ``command`` prints on its standard output, stripped."""
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout).stdout.strip()


def summary(results: Results) -> dict[str, Any]:
    """The issue's bar for the autotuned call: its geometric mean and its worst ratio to cuBLAS on
    the LLM preset (and on everything timed)."""
    out = {}
    llm = {(s["m"], s["n"], s["k"]) for s in results.get("presets", {}).get("llm", [])}
    for name, keep in (("llm", lambda r: (r["m"], r["n"], r["k"]) in llm), ("all", lambda r: True)):
        ratios = [r.get("vs_cublas") for r in results["rows"] if r["kernel"] == AUTOTUNED and keep(r)]
        if ratios and all(ratios):
            out[name] = {
                "matmul_vs_cublas_geomean": statistics.geometric_mean(ratios),
                "matmul_vs_cublas_min": min(ratios),
                "shapes": len(ratios),
            }
        elif ratios:
            out[name] = {"failed": sum(1 for x in ratios if not x), "shapes": len(ratios)}
    return out


def results_name(arch: str, dtype: str, chosen: dict[str, list], sustained: bool = False) -> str:
    return f"results-{arch}-{dtype}-{'_'.join(chosen)}{'-sustained' if sustained else ''}.json"


def is_sustained(results: Results) -> bool:
    return results.get("timing", {}).get("mode") == "sustained"


def write(results: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=True))
    tmp.replace(path)


def is_bench(path: Path) -> bool:
    """Whether ``path`` is a results file of ``bench`` (other commands' results share the name ``results-*``)."""
    try:
        return json.loads(Path(path).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def load(path: Path) -> Results:
    """A results file, checked for the fields the plots read."""
    results = json.loads(Path(path).read_text())
    if not isinstance(results, dict) or results.get("format") != FORMAT:
        raise ValueError(f"{path} is not a results file of this harness (format {FORMAT})")
    for key in ("arch", "dtype", "machine", "presets", "rows"):
        if key not in results:
            raise ValueError(f"{path}: the results have no {key!r}")
    for row in results["rows"]:  # files written before cuBLAS had one name call matmul()'s choice "cublas"
        if row.get("kernel") == AUTOTUNED and (row.get("config") or {}).get("version") == "cublas":
            row["config"]["version"] = CUBLAS
    return results


def table(results: Results) -> str:
    from tabulate import tabulate

    rows = []
    clocks = any("clock_mhz_rounds" in r for r in results["rows"])  # sustained windows: the clock each ran at
    for r in results["rows"]:
        status = "" if r.get("ok") else ("FAILED " + r.get("message", f"error {r.get('error', 0):.3g}"))[:60]
        row = {
            "shape": f"{r['m']}x{r['n']}x{r['k']}",
            "label": r.get("label", ""),
            "kernel": r["kernel"],
            "ms": r.get("ms"),
            "TFLOPS": r.get("tflops"),
            "x cuBLAS": r.get("vs_cublas"),
        }
        if clocks:
            row["MHz"] = statistics.median(r["clock_mhz_rounds"]) if r.get("clock_mhz_rounds") else None
        rows.append({**row, "rel. error": r.get("error"), "config": _config_text(r.get("config")), "": status})
    return tabulate(rows, headers="keys", floatfmt=".4g")


def _config_text(config: Optional[dict]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items()) if config else ""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
