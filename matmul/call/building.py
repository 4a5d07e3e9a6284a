"""Kernels built outside the caller's process: a child (``python -m matmul.call.child``, given a
build request) transpiles and compiles each kernel, or finds it in tilus's disk cache, and reports
its program's directory; the caller only opens the library (``tilus_autotune.load``) on the
chooser's background thread.

Not a thread of the caller: tilus transpiles and generates code in Python, holding the GIL for a
second or more per kernel, and finding a cached build needs the same transpilation (tilus names its
entry by the program's text). The child sees no GPU (``CUDA_VISIBLE_DEVICES`` empty), so it takes no
GPU time or memory; nothing warms a loaded kernel up either: its first launch is the caller's call.

A request is ``{"build": [job, ...], "builder": "module:function"}``, each job ``{"id", "arch",
"dtype", "version", "config", "variant"}``; the child reports each kernel as done, one
``tuner.PROTOCOL`` line: ``{"id", "built": dir}`` or ``{"id", "failed": reason}``. The kernels run
beside the series (``OUTSIDE``: Hopper V8, the widening of a packed weight, swiglu's activation)
are built the same way, each entry naming one as its version. This module imports neither the
public call nor the launch path.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Callable, Optional

import torch

from ..kernels import versions
from ..kernels.variant import Variant
from . import tilus_autotune
from .tuner import CHILD_TIMEOUT_S, DTYPE_NAMES, PROTOCOL, run_child, space_config

BUILDER = "matmul.call.building:build_kernel"  # what the child runs per job (tests name a stand-in)

# on_built(job_id, program_dir, None) once a kernel is built, or (job_id, None, reason) if it failed
OnBuilt = Callable[[str, Optional[str], Optional[str]], None]


# The kernels the call runs beside the series' products, by the name their entries carry as a
# version: the function (module:name) that makes the tilus script of one of them from its dtype and
# configuration, and what the call runs until it is built (or where it failed to build)
OUTSIDE = {
    "v8": ("matmul.call.quantized:v8_script", "the weight widened for cuBLAS"),
    "widen": ("matmul.quant.widen:script", "torch's dequantize"),
    "swiglu": ("matmul.kernels.swiglu:script", "torch's operators"),
}


def fallback_of(version: str) -> str:
    """What runs while ``version``'s kernel is not built, in words (for the warnings)."""
    return OUTSIDE[version][1] if version in OUTSIDE else "cuBLAS"


def build_kernel(arch: str, dtype: torch.dtype, version: str, config: dict, variant: Variant) -> str:
    """Build one kernel for ``arch`` (whatever GPU this machine has, if any), fixed to ``config``, for
    ``dtype`` and ``variant``: a version of the series, or one of ``OUTSIDE``; the directory of its
    program."""
    from ..build.compiler import target

    if version in OUTSIDE:
        module_name, _, function = OUTSIDE[version][0].partition(":")
        script = getattr(importlib.import_module(module_name), function)(dtype, config)
        with target(arch):
            return tilus_autotune.build(script)
    module = versions.load(arch, version)
    fixed = space_config(module, config, variant)
    if fixed is None:
        raise ValueError(f"{version}'s space has no configuration {config} for {variant.key() or 'plain'}")
    with target(arch):
        return tilus_autotune.build(versions.kernel(module, dtype, fixed, variant))


def job(job_id: str, arch: str, dtype: torch.dtype, entry: dict, variant: Variant) -> dict:
    """The request for one kernel: ``entry``'s version and configuration, for ``dtype`` and ``variant``."""
    return {
        "id": job_id,
        "arch": arch,
        "dtype": str(dtype).removeprefix("torch."),
        "version": entry["version"],
        "config": entry.get("config"),
        "variant": variant.key(),
    }


def _report(**message) -> None:
    sys.stdout.write(PROTOCOL + json.dumps(message) + "\n")
    sys.stdout.flush()


def child_main(request: dict) -> None:
    """The child's side: build each job of ``request`` in turn and report it as it is done."""
    module_name, _, function = request.get("builder", BUILDER).partition(":")
    builder = getattr(importlib.import_module(module_name), function)
    for item in request["build"]:
        try:
            dtype, variant = DTYPE_NAMES[item["dtype"]], Variant.parse(item["variant"])
            program_dir = builder(item["arch"], dtype, item["version"], item["config"], variant)
        except Exception as e:  # this kernel does not build: the others may
            _report(id=item["id"], failed=f"{type(e).__name__}: {e}"[:400])
        else:
            _report(id=item["id"], built=str(program_dir))


def build_in_child(
    jobs: list[dict], on_built: OnBuilt, builder: str = BUILDER, timeout_s: float = CHILD_TIMEOUT_S
) -> None:
    """Build ``jobs`` (``job``'s dicts) in one child process, handing each kernel to ``on_built``
    as the child reports it (so that each takes over as soon as it is ready); a job the child did
    not report (it died, or ran past ``timeout_s``) is handed over as failed, with the end of the
    child's output."""
    if not jobs:
        return
    reported: set[str] = set()

    def on_message(message):
        reported.add(message["id"])
        on_built(message["id"], message.get("built"), message.get("failed"))

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # a build needs no GPU: no CUDA context in the child
    code, log = run_child({"build": jobs, "builder": builder}, on_message, timeout_s, log_chars=1500, env=env)
    for item in jobs:
        if item["id"] not in reported:
            on_built(item["id"], None, f"the build child exited with code {code} before this kernel; it said: {log}")
