"""Time the versions of the series against cuBLAS on this machine's GPU.

For each shape: fresh random operands, each version autotuned by tilus and checked against the
float32 reference before it is timed, cuBLAS (``torch.matmul``) timed before and after the
versions so that neither side is favoured by the GPU's warming up; the ratio is to the mean of
the two cuBLAS times.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from . import versions
from .check import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from .contract import row_stride
from .timing import median_ms, tflops


def chosen_config(module, a, b, out) -> dict[str, Any]:
    """The configuration tilus's autotuner picked for these operands."""
    from tilus.lang.instantiated_script import extract_keys

    script = versions.kernel(module, a.dtype)
    (m, k), n = a.shape, b.shape[0]
    args = (m, n, k, a, b, out, row_stride(a), row_stride(b), row_stride(out))
    jit_key, tuning_key = extract_keys(args, script.const_params, script.tuning_params)
    instance = script.jit_instances[jit_key]
    schedule = dict(instance.schedules[instance.valid_schedules[instance.dispatch_table[tuning_key]]])
    schedule.pop("dtype", None)
    return schedule


def machine() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        import tilus

        info["tilus"] = tilus.__version__
        query = "clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,driver_version"
        line = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        info.update(dict(zip(query.split(","), [x.strip() for x in line.split(",")])))
    except Exception as e:  # the figures are still worth keeping without the clocks
        info["nvidia-smi"] = f"unavailable: {e}"
    return info


def bench_shape(arch: str, version_names: list[str], m: int, n: int, k: int, dtype=torch.float16) -> list[dict]:
    a, b = random_operands(m, n, k, dtype)
    ref = reference(a, b)
    out = poisoned_output(m, n, dtype)
    cublas_out = torch.empty(m, n, dtype=dtype, device="cuda")
    cublas = lambda: torch.matmul(a, b.T, out=cublas_out)  # noqa: E731
    cublas_ms = [median_ms(cublas)]
    rows = []
    for name in version_names:
        module = versions.load(arch, name)
        out.fill_(float("nan"))
        versions.run(module, a, b, out)  # autotunes on first use
        error = relative_error(out, ref)
        row = {"arch": arch, "version": name, "m": m, "n": n, "k": k, "dtype": str(dtype).split(".")[-1],
               "config": chosen_config(module, a, b, out), "error": error, "ok": error <= TOLERANCE[dtype]}
        if row["ok"]:
            row["ms"] = median_ms(lambda: versions.run(module, a, b, out))
            row["tflops"] = tflops(m, n, k, row["ms"])
        rows.append(row)
    cublas_ms.append(median_ms(cublas))
    base = sum(cublas_ms) / 2
    rows.append({"arch": "cublas", "version": "cuBLAS", "m": m, "n": n, "k": k, "dtype": str(dtype).split(".")[-1],
                 "ms": base, "tflops": tflops(m, n, k, base), "ok": True,
                 "error": relative_error(cublas_out, ref)})
    for row in rows:
        if "ms" in row:
            row["vs_cublas"] = base / row["ms"]
    return rows


def write_results(rows: list[dict], path: Path, command: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), "command": command, "rows": rows}, indent=1))
