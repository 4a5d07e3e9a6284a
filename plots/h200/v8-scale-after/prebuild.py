"""Build, on the CPU machine, every kernel ``tests/test_v8_gpu.py`` and ``bench_v8.py``'s int4 decode
rows wait for, into ``$MATMUL_CACHE_DIR`` (as the call's build child builds them: the same tilus
cache entries), so that a GPU run spends its minutes on the tests, not on builds:

    MATMUL_CACHE_DIR=$PWD/.cache/v8t python plots/h200/v8-scale-after/prebuild.py [--formats int6]

``--formats`` keeps the kernels of those weight formats only (a change to one format's widening
rebuilds only its kernels: the others' programs, and so their tilus cache entries, are unchanged).
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import test_v8_gpu as t  # noqa: E402 (the tests' own lists of kernels)

from matmul.build import parallel  # noqa: E402
from matmul.build.compiler import target  # noqa: E402
from matmul.call import building, tilus_autotune  # noqa: E402
from matmul.kernels import versions  # noqa: E402
from matmul.quant import linear as quant_linear  # noqa: E402


def build(kind: str, dtype: torch.dtype, fmt: str, config: tuple) -> str:
    """One kernel as the build child builds it; "" once built (``parallel``'s convention)."""
    try:
        if kind == "widen":
            building.build_widen("sm_90a", dtype, "", {"weight": fmt}, None)
        else:
            with target("sm_90a"):
                tilus_autotune.build(quant_linear.script(dtype, fmt, dict(config)))
    except Exception as e:  # noqa: BLE001 (reported by parallel, the others still build)
        return f"{type(e).__name__}: {e}"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", default="", help="comma-separated weight formats (default: all)")
    formats = set(filter(None, parser.parse_args().formats.split(",")))
    space = versions.space(versions.load("sm_90a", "v8"))
    kernels = list(t.the_calls_kernels())
    kernels += [(d, f, c) for d in t.DTYPES for f, c in t.INTERLEAVED_FORMATS]
    kernels += [(d, "int4", c) for d in t.DTYPES for c in space]
    kernels += [(d, f, c) for d in t.DTYPES for f in quant_linear.INT4_PACKED for c in quant_linear.configs(f)]
    kernels += [(d, "int6", c) for d in t.DTYPES for c in quant_linear.configs("int6")]
    keys = {quant_linear.kernel_key(*k) for k in kernels}
    jobs = [("v8", dtype, fmt, config) for dtype, fmt, config in sorted(keys, key=str)]
    jobs += [("widen", d, f, ()) for f in ("int4", *t.OTHER_FORMATS) for d in t.DTYPES]
    if formats:
        jobs = [job for job in jobs if job[2] in formats]
    start = time.time()
    print(f"{len(jobs)} kernels", flush=True)
    parallel.in_forked_processes(build, jobs)
    print(f"built in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
