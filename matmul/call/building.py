"""Kernels built outside the caller's process: a child process (``python -m matmul.call.child``,
given a build request) transpiles and compiles each chosen kernel, or finds it in tilus's disk
cache, and reports the directory of its program; the caller's process only opens that library
(``tilus_autotune.load``, a dlopen), on the chooser's background thread.

Why not a thread of the caller: tilus transpiles, optimizes and generates code in Python, holding
the GIL for a second or more per kernel, and finding a cached build needs the same transpilation
(tilus names its cache entry by the transpiled program's text); all of that is host work that the
caller's own thread would have to share the interpreter with, on the calls it makes meanwhile.

The child is told the architecture to build for and sees no GPU (``CUDA_VISIBLE_DEVICES`` empty):
it creates no CUDA context, so it cannot take GPU time or memory from the caller. The parent side
launches nothing either: a loaded kernel reaches the GPU at its first launch, which is a call of
the caller's own, on the caller's thread and stream (lazy module loading loads it into the CUDA
context there); no background thread warms it up.

A build request is ``{"build": [job, ...], "builder": "module:function"}``, each job ``{"id",
"arch", "dtype", "version", "config", "variant"}`` (the variant's key). The child reports each
kernel on its stdout as it is done, one line each (``tuner.PROTOCOL``): ``{"id", "built": dir}``
or ``{"id", "failed": reason}``. This module imports neither the public call nor the launch path.
The kernels outside the series that the call runs are built the same way, each installed as its
module's builder when this module is imported: the swiglu activation's (``kernels.swiglu``,
``swiglu_in_child``), the widening of a packed weight (``quant.widen``, ``widen_in_child``) and
Hopper V8 on a packed weight (``quant.linear``, ``v8_in_child``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from typing import Callable, Optional

import torch

from ..kernels import swiglu, versions
from ..kernels.variant import Variant
from ..quant import linear as quant_linear
from ..quant import widen
from . import tilus_autotune
from .tuner import CHILD_TIMEOUT_S, DTYPE_NAMES, PROTOCOL, run_child, space_config

BUILDER = "matmul.call.building:build_kernel"  # what the child runs per job (tests name a stand-in)

# on_built(job_id, program_dir, None) once a kernel is built, or (job_id, None, reason) if it failed
OnBuilt = Callable[[str, Optional[str], Optional[str]], None]


def build_kernel(arch: str, dtype: torch.dtype, version: str, config: dict, variant: Variant) -> str:
    """Build one version's kernel for ``arch`` (whatever GPU this machine has, if any), fixed to
    ``config``, for ``dtype`` and ``variant``; the directory of its program."""
    from ..build.compiler import target

    module = versions.load(arch, version)
    fixed = space_config(module, config, variant)
    if fixed is None:
        raise ValueError(f"{version}'s space has no configuration {config} for {variant.key() or 'plain'}")
    with target(arch):
        return tilus_autotune.build(versions.kernel(module, dtype, fixed, variant))


def build_swiglu(arch: str, dtype: torch.dtype, version: str, config: dict, variant: Variant) -> str:
    """The child's builder for ``kernels.swiglu``'s kernels (``config``: ``{"backward": bool}``)."""
    from ..build.compiler import target

    with target(arch):
        return tilus_autotune.build(
            swiglu.InterleavedSwigluKernel(dtype=swiglu.DTYPES[dtype], backward=config["backward"])
        )


def build_widen(arch: str, dtype: torch.dtype, version: str, config: dict, variant: Variant) -> str:
    """The child's builder for ``quant.widen``'s kernel (``config``: ``{"weight": format}``)."""
    from ..build.compiler import target

    with target(arch):
        return tilus_autotune.build(widen.WidenKernel(dtype=widen.DTYPES[dtype], weight=config["weight"]))


def build_v8(arch: str, dtype: torch.dtype, version: str, config: dict, variant: Variant) -> str:
    """The child's builder for Hopper V8 (``quant.linear``; ``config``: ``{"weight": format}`` and
    the configuration, as ``quant_linear.kernel_config`` builds it)."""
    from ..build.compiler import target

    fixed = dict(config)
    weight_format = fixed.pop("weight")
    with target(arch):
        return tilus_autotune.build(quant_linear.script(dtype, weight_format, fixed))


def swiglu_in_child(key, on_ready, on_failed) -> None:
    """``kernels.swiglu``'s builder (``swiglu.set_builder``): the kernel of ``key`` (dtype, backward)
    built by a build child on a thread of its own, then its library opened here."""
    dtype, backward = key
    _one_kernel_in_child(key, "swiglu", build_swiglu, dtype, {"backward": backward}, on_ready, on_failed)


def widen_in_child(key, on_ready, on_failed) -> None:
    """``quant.widen``'s builder (``widen.set_builder``): the kernel of ``key`` (dtype, weight format)
    built by a build child on a thread of its own, then its library opened here."""
    dtype, weight_format = key
    _one_kernel_in_child(key, "widen", build_widen, dtype, {"weight": weight_format}, on_ready, on_failed)


def v8_in_child(key, on_ready, on_failed) -> None:
    """``quant.linear``'s builder (``quant_linear.set_builder``): V8's kernel of ``key`` (dtype, weight
    format, configuration items: ``quant_linear.kernel_key``) built by a build child on a thread of
    its own, then its library opened here."""
    dtype, weight_format, config = key
    _one_kernel_in_child(key, "v8", build_v8, dtype, {"weight": weight_format, **dict(config)}, on_ready, on_failed)


def _one_kernel_in_child(key, kernel: str, build, dtype: torch.dtype, config: dict, on_ready, on_failed) -> None:
    """A kernel outside the series (its name, and ``build``, this module's builder of it, that the
    child runs) built by a build child on a thread of its own; then ``on_ready(key, launch)`` with
    its library opened here, or ``on_failed(key, reason)``."""
    request = {
        "id": kernel,
        "arch": versions.local_arch(),
        "dtype": str(dtype).removeprefix("torch."),
        "version": kernel,
        "config": config,
        "variant": Variant().key(),
    }

    def on_built(job_id, program_dir, reason):
        if program_dir is None:
            on_failed(key, reason)
            return
        try:
            on_ready(key, tilus_autotune.load(program_dir))
        except Exception as e:  # a library that does not open leaves the fallback path in place
            on_failed(key, f"{type(e).__name__}: {e}")

    builder = f"{__name__}:{build.__name__}"
    threading.Thread(target=build_in_child, args=([request], on_built, builder), daemon=True).start()


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


# the kernels outside the series, like the chosen ones: never built in the caller
swiglu.set_builder(swiglu_in_child)
widen.set_builder(widen_in_child)
quant_linear.set_builder(v8_in_child)
