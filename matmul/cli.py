"""``python -m matmul``: the project's command line.

    python -m matmul compile [--arch sm_90a|sm_100a] [--versions v0,v1,...] [--out DIR] [--all-configs]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tabulate import tabulate

from . import build, versions


def _arches(value: str | None) -> list[str]:
    return [versions.normalize_arch(a) for a in value.split(",")] if value else list(versions.ARCHS)


def _versions(value: str | None, arch: str) -> list[str]:
    have = versions.available(arch)
    if not value:
        return have
    wanted = [v.strip().lower() for v in value.split(",")]
    unknown = [v for v in wanted if v not in versions.VERSIONS]
    if unknown:
        raise ValueError(f"unknown version(s) {', '.join(unknown)}; the series is {', '.join(versions.VERSIONS)}")
    return [v for v in wanted if v in have]


def local_gpu_arch() -> str | None:
    """The series that runs on this machine's GPU, if any."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, _ = torch.cuda.get_device_capability()
    return {9: "sm_90a", 10: "sm_100a"}.get(major)


def compile_command(args) -> int:
    rows, failed = [], False
    gpu_arch = None if args.no_check else local_gpu_arch()
    for arch in _arches(args.arch):
        for version in _versions(args.versions, arch):
            module = versions.load(arch, version)
            results = build.build_version(module, arch, all_configs=args.all_configs)
            built = [r for r in results if r.ok]
            markers = build.markers_found(built[0], module.PTX_MARKERS) if built else {}
            missing = [m for m, found in markers.items() if not found]
            spills = max((r.spill_bytes for r in built), default=0)
            over_smem = [r for r in built if not r.within_shared_limit]
            ok = len(built) == len(results) and not missing and spills == 0 and not over_smem
            row = {
                "arch": arch, "version": version, "built": len(built), "failed": len(results) - len(built),
                "registers": max((r.registers for r in built), default="-"),
                "spills (B)": spills,
                "smem (KiB)": max((r.shared_bytes for r in built), default=0) // 1024,
                "cluster": "x".join(map(str, built[0].cluster)) if built else "-",
                "PTX shows": ", ".join(m if f else f"MISSING {m}" for m, f in markers.items()),
            }
            if gpu_arch == arch:
                from .check import check_version

                error = check_version(module)
                row["check on GPU (rel. err.)"] = f"{error:.1e}" if error is not None else "FAILED"
                ok = ok and error is not None
            rows.append(row)
            failed |= not ok
            for r in results:
                if not r.ok:
                    print(f"[{arch} {version}] configuration {r.config} failed:\n{r.error[-4000:]}", file=sys.stderr)
            if args.out and built:
                dest = Path(args.out) / arch / f"{version}.ptx"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(built[0].ptx_path, dest)
                if built[0].sass_path:
                    shutil.copyfile(built[0].sass_path, dest.with_suffix(".sass"))
    print(tabulate(rows, headers="keys"))
    if gpu_arch is None and not args.no_check:
        print("\nNo GPU of either architecture here: the kernels were compiled and inspected, not run.")
    return 1 if failed else 0


def _shapes(value: str) -> list[tuple[int, int, int]]:
    try:
        return [tuple(int(x) for x in item.lower().split("x")) for item in value.split(",")]
    except ValueError:
        raise ValueError(f"shapes are MxNxK separated by commas, e.g. 4096x4096x4096; got {value!r}") from None


def bench_command(args) -> int:
    import sys as _sys

    from tabulate import tabulate as _tabulate

    from . import bench

    arch = local_gpu_arch()
    if arch is None:
        print("No Hopper or Blackwell GPU here: nothing to time.", file=_sys.stderr)
        return 1
    names = _versions(args.versions, arch)
    rows = []
    for m, n, k in _shapes(args.shapes):
        rows += bench.bench_shape(arch, names, m, n, k)
    if args.out:
        bench.write_results(rows, Path(args.out) / "results.json", "python -m matmul " + " ".join(_sys.argv[1:]))
    print(_tabulate([{key: r.get(key) for key in ("version", "m", "n", "k", "ms", "tflops", "vs_cublas", "error",
                                                  "config")} for r in rows], headers="keys", floatfmt=".4g"))
    return 0 if all(r["ok"] for r in rows) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matmul", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compile", help="build the versions for an architecture and report what they compiled to")
    p.add_argument("--arch", help="sm_90a, sm_100a or both (comma-separated); default: both")
    p.add_argument("--versions", help="comma-separated, e.g. v0,v1; default: every version")
    p.add_argument("--out", help="write each version's PTX (and SASS) to OUT/<arch>/<version>.ptx")
    p.add_argument("--all-configs", action="store_true", help="build every configuration of the autotune space")
    p.add_argument("--no-check", action="store_true", help="do not run the kernels even on a matching GPU")
    p.set_defaults(func=compile_command)
    p = sub.add_parser("bench", help="time the versions that match this GPU against cuBLAS")
    p.add_argument("--versions", help="comma-separated, e.g. v0,v1; default: every version")
    p.add_argument("--shapes", default="4096x4096x4096", help="MxNxK,... (default 4096x4096x4096)")
    p.add_argument("--out", help="write OUT/results.json")
    p.set_defaults(func=bench_command)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # a bad --arch or --versions: say so, no traceback
        parser.error(str(e))
