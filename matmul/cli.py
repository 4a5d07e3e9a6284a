"""``python -m matmul``: the project's command line.

python -m matmul compile [--arch sm_90a|sm_100a] [--versions v0,v1,...,v8] [--out DIR] [--all-configs] [--list]
python -m matmul compile --arch sm_90a --kernels FILE|- [--jobs N]
python -m matmul bench [--arch ...] [--versions ...] [--shapes series,ksweep,llm|MxNxK,...] [--out DIR]
python -m matmul plot RESULTS.json [...] [--out DIR]
python -m matmul model [--out DIR] [--dtype float16|bfloat16] [--rounds N]
python -m matmul candidates VERSION[:knob=value,...] ... [--sizes 4096,8192x14336x4096] [--sustained S | --profile N]
python -m matmul drop-in [--parts kn,linear,llama,llama-<int4|int6|fp8_e4m3>] [--out DIR]
                         [--dtype float16|bfloat16] [--rounds N]
python -m matmul trace [--out DIR] [--calls N] [--wait-s S] [--repeats N] [--matmul-env VAR=VALUE,...]
                       [--parts block,trace,torch_alone,matmul_alone,alternating]
python -m matmul tune [--model llama-3-8b] [--m 1-8192] [--shapes MxNxK,...] [--dtype float16,bfloat16]
                      [--narrow] [--out FILE] [--list-kernels --gpu NAME [--arch sm_90a]]
python -m matmul shipped-table [--table FILE] [--list-kernels --gpu NAME]
python -m matmul quantized --out DIR [--formats int4,int6,fp8_e4m3] [--dtypes ...] [--tokens 1,16] [--shapes NxK,...]
python -m matmul v8-configs --out DIR [--configs all|chosen|LIST] [--shapes MxNxK,...] [--format int4] [--widened]
python -m matmul skinny [--out DIR] [--others] [--dtypes ...] [--table multicast.json]
python -m matmul options [--out DIR] [--kernels plain-g8,pingpong-g8,v5-plain,v5-stream-k,...] [--rounds 8]
python -m matmul figures [--check] [--plots DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tabulate import tabulate

from . import build
from .kernels import versions


def _arches(value: str | None) -> list[str]:
    return [versions.normalize_arch(a) for a in value.split(",")] if value else list(versions.ARCHS)


def _versions(value: str | None, arch: str, have: list[str] | None = None) -> list[str]:
    """The versions ``--versions`` names (all of ``have``, default the series of ``arch``, if none)."""
    have = versions.available(arch) if have is None else have
    if not value:
        return have
    wanted = [v.strip().lower() for v in value.split(",")]
    unknown = [v for v in wanted if v not in versions.VERSIONS and v not in have]
    if unknown:
        raise ValueError(f"unknown version(s) {', '.join(unknown)}; the series is {', '.join(versions.VERSIONS)}")
    return [v for v in wanted if v in have]


def compiled_versions(arch: str) -> list[str]:
    """Every version ``python -m matmul compile`` builds for ``arch``: the series, then the versions
    that read a packed weight (V8 on both architectures; Hopper's V8-prefill)."""
    return versions.available(arch) + versions.quantized(arch)


def _compile_work(value: str | None, arches: list[str]) -> list[tuple[str, str]]:
    """(arch, version) for each version ``--versions`` names (default: every one) that ``arches`` have;
    a name that is a version of no architecture is an error."""
    have = {arch: compiled_versions(arch) for arch in arches}
    if not value:
        return [(arch, version) for arch in arches for version in have[arch]]
    wanted = [v.strip().lower() for v in value.split(",")]
    known = [*versions.VERSIONS, *versions.QUANTIZED_VERSIONS]
    unknown = [v for v in wanted if v not in known]
    if unknown:
        raise ValueError(f"unknown version(s) {', '.join(unknown)}; the versions are {', '.join(known)}")
    return [(arch, version) for arch in arches for version in wanted if version in have[arch]]


def compile_list(work: list[tuple[str, str]], all_configs: bool) -> int:
    """``--list``: what ``compile`` would build, one row a version, without building."""
    rows = []
    for arch, version in work:
        module = versions.load(arch, version)
        configs = versions.build_configs(module) if all_configs else [module.REPRESENTATIVE]
        packed = version in versions.QUANTIZED_VERSIONS
        rows.append([arch, version, "packed" if packed else "16-bit", len(configs), module.REPRESENTATIVE])
    print(tabulate(rows, headers=["arch", "version", "weight", "configurations", "representative"]))
    return 0


def _build_listed(arch: str, line: str) -> str:
    """Build one line of a ``--kernels`` list: "" when it built, else why not (parallel's contract)."""
    import json

    import torch

    from .kernels.variant import PLAIN, Variant

    fields = line.split("|")
    if len(fields) not in (3, 4):
        return f"not 'version|configuration json|dtype[|variant]': {line!r}"
    version, config, dtype, key = (*fields, "")[:4]
    try:
        module = versions.load(arch, version.strip())
        variant = Variant.parse(key.strip()) if key.strip() else PLAIN
        tilus_dtype = versions.TILUS_DTYPES[getattr(torch, dtype.strip())]  # the kernels' 16-bit dtypes
        result = build.build_config(module, arch, json.loads(config), tilus_dtype, variant)
    except (ValueError, KeyError, AttributeError, ImportError, TypeError) as error:
        return f"{type(error).__name__}: {error}"
    return "" if result.ok else (result.error or "failed")


def compile_listed(args) -> int:
    """``--kernels``: build exactly the listed kernels for one architecture, ``--jobs`` at once, into
    tilus's cache (``$MATMUL_CACHE_DIR``): a GPU session's kernels built on a machine without a GPU,
    the cache then carried to the GPU (the GPU tests' list: ``python tests/gpu_kernels.py``)."""
    from .build import parallel

    arches = _arches(args.arch)
    if len(arches) != 1:
        raise ValueError("--kernels builds for one architecture: give --arch sm_90a or --arch sm_100a")
    text = sys.stdin.read() if args.kernels == "-" else Path(args.kernels).read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    errors = parallel.in_forked_processes(_build_listed, [(arches[0], line) for line in lines], args.jobs)
    print(f"[compile] {len(lines) - sum(map(bool, errors))} of {len(lines)} kernels built for {arches[0]}")
    return 1 if any(errors) else 0


def compile_command(args) -> int:
    from tqdm import tqdm

    if args.kernels:
        return compile_listed(args)

    work = _compile_work(args.versions, _arches(args.arch))
    if args.list:
        return compile_list(work, args.all_configs)
    rows, failed = [], False
    gpu_arch = None if args.no_check else versions.local_arch()
    progress = tqdm(
        total=sum(len(versions.build_configs(versions.load(a, v))) if args.all_configs else 1 for a, v in work),
        desc="[compile]",
        unit="config",
        disable=None,
    )  # disable=None: silent when not a terminal
    for arch, version in work:
        module = versions.load(arch, version)

        def building(config, arch=arch, version=version):
            progress.set_postfix_str(f"{arch} {version} " + " ".join(f"{k}={v}" for k, v in config.items()))
            if progress.disable:  # not a terminal (a log, CI): one line per build instead of a bar
                print(f"[compile] {arch} {version} {config}", file=sys.stderr, flush=True)

        results = build.build_version(module, arch, all_configs=args.all_configs, progress=building)
        progress.update(len(results))
        built = [r for r in results if r.ok]
        markers = build.markers_found(built[0], module.PTX_MARKERS) if built else {}
        missing = [m for m, found in markers.items() if not found]
        spills = max((r.spill_bytes for r in built), default=0)
        over_smem = [r for r in built if not r.within_shared_limit]
        ok = len(built) == len(results) and not missing and spills == 0 and not over_smem
        row = {
            "arch": arch,
            "version": version,
            "built": len(built),
            "failed": len(results) - len(built),
            "registers": max((r.registers for r in built), default="-"),
            "spills (B)": spills,
            "smem (KiB)": max((r.shared_bytes for r in built), default=0) // 1024,
            "cluster": "x".join(map(str, built[0].cluster)) if built else "-",
            "PTX shows": ", ".join(m if f else f"MISSING {m}" for m, f in markers.items()),
        }
        if gpu_arch == arch and version in versions.QUANTIZED_VERSIONS:
            row["check on GPU (rel. err.)"] = "tests/test_v8*_gpu.py"  # a packed weight: not check_version's
        elif gpu_arch == arch:
            from .measure.correctness import check_version

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
        if args.compare and built:
            before = Path(args.compare) / arch / f"{version}.ptx"
            same = before.is_file() and build.normalized_ptx(before.read_text()) == build.normalized_ptx(built[0].ptx())
            row[f"PTX as {args.compare}"] = "same" if same else ("DIFFERENT" if before.is_file() else "none there")
    progress.close()
    print(tabulate(rows, headers="keys"))
    if gpu_arch is None and not args.no_check:
        print("\nNo GPU of either architecture here: the kernels were compiled and inspected, not run.")
    return 1 if failed else 0


def _default_plots_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "plots"


def redraw(results_dir: Path, out: Path | None = None) -> int:
    """Redraw the figures of every results file under ``results_dir`` (next to each, or into ``out``)."""
    from .harness import plot
    from .harness import results as results_file

    found = [path for path in sorted(Path(results_dir).glob("**/results-*.json")) if results_file.is_bench(path)]
    if not found:
        print(
            f"No results under {results_dir} yet: run `python -m matmul bench --out {results_dir}` on an H100 "
            "to make them."
        )
        return 0
    for path in found:
        results = results_file.load(path)
        for written in plot.draw_all(results, out or path.parent):
            print(f"wrote {written}  (from {path}, measured on {results['machine']['gpu']})")
    return 0


def bench_command(args) -> int:
    import torch

    from .call.choice_cache import default_dir
    from .harness import bench, presets
    from .harness import results as results_file

    chosen = presets.parse(args.shapes)
    dtype = getattr(torch, args.dtype)  # --dtype: float16 or bfloat16
    here = versions.local_arch()
    arch = versions.normalize_arch(args.arch) if args.arch else here
    if here is None or arch != here:
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        print(
            f"No GPU of the {arch or 'sm_90a/sm_100a'} series here ({gpu}): nothing can be timed. Compiling "
            "instead, then redrawing the committed results.\n",
            flush=True,
        )
        args.no_check, args.all_configs = True, False
        status = compile_command(args)
        print()
        return redraw(Path(args.redraw_from or _default_plots_dir()), Path(args.out) if args.out else None) or status
    names = _versions(args.versions, arch)
    out_dir = Path(args.out) if args.out else default_dir() / "bench"
    path = out_dir / results_file.results_name(arch, args.dtype, chosen, sustained=bool(args.sustained))
    command = "python -m matmul " + " ".join(sys.argv[1:] if args.argv is None else args.argv)
    try:
        results = bench.run(
            arch,
            names,
            chosen,
            dtype,
            rounds=args.rounds,
            warmup_ms=args.warmup_ms,
            repeat_ms=args.repeat_ms,
            triton=not args.no_triton,
            command=command,
            save=lambda r: results_file.write(r, path),
            sustained_s=args.sustained,
        )
    except ValueError as e:  # from inside the run: not a usage error, keep the traceback
        raise RuntimeError(f"{type(e).__name__}: {e}") from e
    results_file.write(results, path)
    print(results_file.table(results))
    for name, s in results["summary"].items():
        if "matmul_vs_cublas_geomean" in s:
            print(
                f"matmul() vs cuBLAS over {name} ({s['shapes']} shapes): geometric mean "
                f"{s['matmul_vs_cublas_geomean']:.3f}x, worst {s['matmul_vs_cublas_min']:.3f}x"
            )
    from .harness import plot

    print(f"\nresults: {path}")
    for written in plot.draw_all(results, out_dir):
        print(f"figure: {written}")
    return 0 if all(r["ok"] for r in results["rows"]) else 1


def _gpu_out_dir(args, name: str, what: str) -> Path:
    """``--out``, else ``<matmul cache dir>/name``; an error where there is no GPU of the series."""
    from .call.choice_cache import default_dir

    if versions.local_arch() is None:
        raise ValueError(f"{what} on a Hopper or Blackwell GPU; there is none here")
    return Path(args.out) if args.out else default_dir() / name


def plot_command(args) -> int:
    from .harness import plot
    from .harness import results as results_file

    for name in args.results:
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"no results file {path}: pass a results-*.json written by `python -m matmul bench`")
        results = results_file.load(path)
        for written in plot.draw_all(results, Path(args.out) if args.out else path.parent):
            print(f"wrote {written}")
    return 0


def candidates_command(args) -> int:
    from .harness import candidates
    from .measure.timing import SustainedTimer

    arch = _arches(args.arch)[0] if args.arch else versions.local_arch()
    if arch is None:
        raise ValueError("no Hopper or Blackwell GPU here: pass --arch (and --prebuild to only build)")
    chosen = [c for text in args.candidates for c in candidates.parse(text, arch)]
    if args.prebuild:
        for name, config in chosen:
            r = build.build_config(versions.load(arch, name), arch, config)
            print(
                candidates.label(name, config),
                "ok" if r.ok else f"FAILED {r.error[-2000:]}",
                f"{r.registers} registers",
                f"{r.spill_bytes} B spilled",
                f"{r.shared_bytes // 1024} KiB shared",
                flush=True,
            )
        return 0
    sizes = [tuple(int(d) for d in s.split("x")) if "x" in s else (int(s),) * 3 for s in args.sizes.split(",")]
    timer = SustainedTimer(args.sustained) if args.sustained else None
    rows = candidates.measure(
        arch, chosen, sizes, args.rounds, timer=timer, profile=args.profile, print_=lambda line: print(line, flush=True)
    )
    return 0 if all(r["ok"] for r in rows) else 1


def protocol_command(args) -> int:
    from . import protocol
    from .kernels.variant import Variant, supported

    variant = Variant.parse(args.variant or "")
    rows, failed = [], False
    for arch in _arches(args.arch):
        for version in _versions(args.versions, arch, protocol.versions_to_check(arch)):
            module = versions.load(arch, version)
            if not supported(module, variant):
                continue
            for config in protocol.configs_to_check(module, arch, args.all_configs, variant):
                r = protocol.check(
                    arch,
                    version,
                    config,
                    seeds=args.seeds,
                    module=module,
                    ordered_commits=not args.unordered_commits,
                    variant=variant,
                )
                failed |= not r.ok
                rows.append(
                    [
                        versions.ARCH_NAMES[arch],
                        f"{version} {variant.key()}" if variant.key() else version,
                        r.cluster,
                        r.roles,
                        r.events,
                        r.interleavings,
                        f"{r.seconds:.1f}",
                        r.verdict,
                    ]
                    + ([config] if args.all_configs else [])
                )
                if not r.ok and args.trace:
                    print(f"{r.label}: {r.verdict}\n{r.trace()}\n", flush=True)
    headers = ["arch", "version", "cluster", "roles", "events", "interleavings", "s", "verdict"]
    headers += ["configuration"] if args.all_configs else []
    print(tabulate(rows, headers=headers))
    return 1 if failed else 0


def model_command(args) -> int:
    import torch

    from .harness import model

    out = _gpu_out_dir(args, "model", "the model benchmark times matmul() against torch.matmul")
    return model.main(out, dtype=getattr(torch, args.dtype), rounds=args.rounds)


def _settings(text: str) -> dict[str, str]:
    """``VAR=VALUE[,VAR=VALUE...]`` as a dict (``trace --matmul-env``)."""
    items = [item.partition("=") for item in text.split(",") if item]
    if not items or any(not name or not sep for name, sep, _ in items):
        raise ValueError(f"--matmul-env takes VAR=VALUE[,VAR=VALUE...]; got {text!r}")
    return {name: value for name, _, value in items}


def trace_command(args) -> int:
    from .harness import trace

    out = _gpu_out_dir(args, "trace", "the trace runs matmul()")
    parts = tuple(args.parts.split(","))
    unknown = set(parts) - set(trace.PARTS)
    if unknown:
        raise ValueError(f"--parts takes {', '.join(trace.PARTS)}; got {', '.join(sorted(unknown))}")
    ways = {text: _settings(text) for text in args.matmul_env or []}
    return trace.main(out, calls=args.calls, wait_s=args.wait_s, parts=parts, repeats=args.repeats, ways=ways)


def drop_in_command(args) -> int:
    import torch

    from .harness import drop_in

    out = _gpu_out_dir(args, "drop-in", "the drop-in benchmark runs")
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(drop_in.PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {', '.join(drop_in.PARTS)}")
    dtype = getattr(torch, args.dtype)
    if args.widths not in drop_in.WIDTHS:
        raise ValueError(f"unknown widths {args.widths!r}; choose from {', '.join(drop_in.WIDTHS)}")
    return drop_in.main(out, parts=parts, dtype=dtype, rounds=args.rounds, widths=args.widths)


# The shipped table's buckets: every bucket the README's models and ``python -m matmul drop-in`` meet.
SHIPPED_TABLE_M = "1,8,16,32,128,1024,2048,4096,8192"
# the backward's dX = dY W of a training step at 1024 tokens, W [N, K] read in place as b [K, N]
SHIPPED_TABLE_KN = "1024x4096x6144,1024x4096x4096,1024x4096x28672,1024x14336x4096,1024x4096x128256"


def shipped_table_commands() -> list[list[str]]:
    """The ``tune`` arguments that make a shipped table (``shipped-table``), in order: the model's seven
    weights, the fused gate-up's ``swiglu`` product, the training step's ``kn`` products; both dtypes,
    narrowed."""
    swiglu = ",".join(f"{m}x28672x4096" for m in SHIPPED_TABLE_M.split(","))
    both = ["--dtype", "float16,bfloat16", "--narrow"]
    return [
        ["--model", "llama-3-8b", "--m", SHIPPED_TABLE_M, *both],
        ["--shapes", swiglu, "--variant", "swiglu", *both],
        ["--shapes", SHIPPED_TABLE_KN, "--variant", "kn", *both],
    ]


def shipped_table_command(args) -> int:
    """Make a shipped table again on this GPU: the three narrowed ``tune`` commands of
    ``shipped_table_commands`` into ``--table``, each resumable (entries already there with these
    sources are kept); with ``--list-kernels``, the kernels those tunings build first on ``--gpu``."""
    for arguments in shipped_table_commands():
        if args.list_kernels:
            if not args.gpu:
                raise ValueError("--list-kernels needs --gpu, the GPU's name as torch gives it")
            status = main(["tune", *arguments, "--list-kernels", "--gpu", args.gpu, "--arch", args.arch])
        else:
            status = main(["tune", *arguments, "--out", args.table])
        if status:
            return status
    return 0


# The harness commands that time on a Hopper GPU and bring their own arguments (``add_arguments``,
# ``run``): name -> (module, help, when a GPU is needed, why it refuses without one).
HOPPER_COMMANDS = {
    "quantized": (
        "quantized",
        "the quantized call (matmul.linear(x, qw)) against cuBLAS on the 16-bit weight, every format and M",
        lambda args: True,
        "the quantized call's benchmark runs V8 on a Hopper GPU; there is none here",
    ),
    "v8-configs": (
        "v8_configs",
        "V8's configurations (its space, the call's choice or named ones) timed against cuBLAS on given shapes",
        lambda args: not args.build_only,
        "V8's configurations are timed on a Hopper GPU; there is none here (--build-only needs none)",
    ),
    "skinny": (
        "skinny",
        "V7 (with and without multicast) and V5/V6 against cuBLAS at 64-256 tokens on the decode weights",
        lambda args: not (args.table or args.prebuild),
        "the skinny benchmark times V7 on a Hopper GPU; there is none here (--table needs none)",
    ),
    "options": (
        "options",
        "V6's ping-pong and V5's stream-K options against those versions as tuned and cuBLAS",
        lambda args: not args.prebuild,
        "the options are timed on a Hopper GPU; there is none here (--prebuild needs none)",
    ),
}


def hopper_command(module, needs_gpu, why):
    def command(args) -> int:
        if needs_gpu(args) and versions.local_arch() != "sm_90a":
            raise ValueError(why)
        module.run(args)
        return 0

    return command


def figures_command(args) -> int:
    from .harness import figures

    return figures.main(Path(args.plots) if args.plots else None, check=args.check)


MODELS = ("llama-3-8b",)


def model_weights(name: str) -> list[tuple[int, int]]:
    """The (N, K) of a model's projection weights, as the harness's presets name them."""
    from .harness import presets

    if name != "llama-3-8b":
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    weights = [*presets.LLAMA3_8B_PROJECTIONS.values(), *presets.DECODE_PROJECTIONS.values()]
    return list(dict.fromkeys(weights))


def bucket_representatives(spec: str) -> list[int]:
    """``"1-8192"`` -> one M per shape bucket in the range (the bucket's largest M, as tilus buckets
    its tuning); ``"16,128,1024"`` -> those."""
    from .call.tuner import bucket

    ms = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        if not high:
            ms.append(int(low))
            continue
        low, high = int(low), int(high)
        if not 1 <= low <= high:
            raise ValueError(f"--m {part!r}: a range LOW-HIGH with 1 <= LOW <= HIGH")
        ms.extend(sorted({min(bucket(m), high) for m in range(low, high + 1)}))
    return list(dict.fromkeys(ms))


def tune_shapes(args) -> list[tuple[int, int, int]]:
    from .harness import presets

    shapes = []
    if args.model:
        ms = bucket_representatives(args.m or "1-8192")
        shapes += [(m, n, k) for n, k in model_weights(args.model) for m in ms]
    elif args.m:
        raise ValueError("--m expands a model's weights (--model); give other shapes as --shapes MxNxK")
    if args.shapes:
        shapes += [s.mnk for s in presets.unique(presets.parse(args.shapes))]
    if not shapes:
        raise ValueError("nothing to tune: give --model NAME and/or --shapes MxNxK,...")
    return list(dict.fromkeys(shapes))


def still_to_tune(shapes, kept: dict, arch: str, gpu: str, dtype, variant) -> tuple[list, dict]:
    """The shapes of ``shapes`` whose bucket ``kept`` (the --out table's entries valid for these
    sources) has no choice for, and the version ``kept`` holds for each of the others: those are not
    measured again. The tuning itself cannot tell, since it does not take an --out table's entries as
    measured."""
    from .call.tuner import choice_key

    todo, versions_kept = [], {}
    for shape in shapes:
        entry = kept.get(choice_key(arch, gpu, dtype, *shape, variant))
        if entry is None:
            todo.append(shape)
        else:
            versions_kept[shape] = entry["version"]
    return todo, versions_kept


def kept_entries(path: Path, arch: str) -> dict:
    """``tune --out FILE``'s entries that a run keeps instead of measuring again (resumable): those of
    FILE made with these sources, each decided again by the tuner's rules as they stand from the
    times it stores (``tuner.redecided``: a table begun under a looser rule is finished under one)."""
    from .call import choice_cache
    from .call.chooser import key_parts
    from .call.tuner import entry_is_valid, redecided

    found = choice_cache.read_shipped(path).items()
    return {k: redecided(arch, e, int(key_parts(k)[2])) for k, e in found if entry_is_valid(arch, e)}


def list_kernels(args, shapes, dtypes, variant) -> int:
    """``tune --list-kernels``: print, as ``compile --kernels`` lines, the kernels that the same
    narrowed tuning on a GPU named ``--gpu`` would build first (``Chooser.planned_builds``), so that
    a machine without that GPU builds them and tilus's cache is carried to it."""
    import json

    from .call import api

    if not args.gpu:
        raise ValueError(
            "--list-kernels needs --gpu, the name of the GPU the tuning will run on as torch names it "
            "(torch.cuda.get_device_name()), e.g. --gpu 'NVIDIA H100 80GB HBM3'"
        )
    kept = kept_entries(Path(args.out), args.arch) if args.out else {}
    suffix = [variant.key()] if variant.key() else []
    for dtype in dtypes:
        todo, _ = still_to_tune(shapes, kept, args.arch, args.gpu, dtype, variant)
        planned = api._chooser.planned_builds(args.arch, args.gpu, dtype, todo, variant, use_shipped=not args.out)
        name = str(dtype).removeprefix("torch.")
        for version, config in planned:
            if isinstance(config, dict):
                print("|".join([version, json.dumps(config, sort_keys=True), name, *suffix]))
    return 0


def tune_command(args) -> int:
    import torch

    from .call import api, choice_cache
    from .call.chooser import PROVENANCE
    from .harness import results as results_file
    from .kernels.variant import PLAIN, Variant

    shapes = tune_shapes(args)
    dtypes = [results_file.DTYPES[d.strip()] for d in args.dtype.split(",")]
    variant = Variant.parse(args.variant) if args.variant else PLAIN
    if args.list_kernels:
        return list_kernels(args, shapes, dtypes, variant)
    if versions.local_arch() is None:
        raise ValueError("tuning measures kernels on a Hopper or Blackwell GPU; there is none here")
    device = torch.device("cuda", torch.cuda.current_device())
    arch = api.device_arch(device)
    command = "python -m matmul " + " ".join(sys.argv[1:] if args.argv is None else args.argv)
    machine = {
        "gpu": torch.cuda.get_device_name(device),
        "arch": arch,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": results_file.machine().get("driver_version"),  # None without nvidia-smi
    }
    kept = kept_entries(Path(args.out), arch) if args.out else {}

    def stored(entry):
        return {k: v for k, v in entry.items() if k not in (*PROVENANCE, "chosen", "building", "build_failed")}

    def arrived(key, entry):
        if args.out:
            kept[key] = stored(entry)
            choice_cache.write_shipped(Path(args.out), kept, command, machine)

    rows = []
    for dtype in dtypes:
        todo, versions_kept = still_to_tune(shapes, kept, arch, machine["gpu"], dtype, variant)
        for (m, n, k), version in versions_kept.items():
            rows.append([str(dtype).removeprefix("torch."), f"{m}x{n}x{k}", version, "kept"])
        found = api.tune(
            todo, dtype, device, variant=variant, use_shipped=not args.out, on_entry=arrived, narrow=args.narrow
        )
        for (m, n, k), entry in found.items():
            chosen = entry.get("chosen", entry)  # the bucket's choice, also while its kernel is being built
            kernel = chosen["version"] + (f" from M={chosen['from_m']}" if chosen.get("from_m") else "")
            rows.append([str(dtype).removeprefix("torch."), f"{m}x{n}x{k}", kernel, entry["source"]])
            if args.out and entry["source"] == "measured":
                kept[entry["key"]] = stored(chosen)
    if args.out:
        choice_cache.write_shipped(Path(args.out), kept, command, machine)
    print(tabulate(rows, headers=["dtype", "shape", "kernel", "source"]))
    if args.out:
        print(f"\n{len(kept)} entries in {args.out}")
    return 0


def main(argv=None) -> int:
    import importlib

    parser = argparse.ArgumentParser(
        prog="python -m matmul", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compile", help="build the versions for an architecture and report what they compiled to")
    p.add_argument("--arch", help="sm_90a, sm_100a or both (comma-separated); default: both")
    p.add_argument(
        "--versions", help="comma-separated, e.g. v0,v1,v8; default: every version, V8 (and V8-prefill) included"
    )
    p.add_argument("--list", action="store_true", help="list the versions and configurations to build; build nothing")
    p.add_argument("--out", help="write each version's PTX (and SASS) to OUT/<arch>/<version>.ptx")
    p.add_argument("--all-configs", action="store_true", help="build every configuration of the autotune space")
    p.add_argument("--no-check", action="store_true", help="do not run the kernels even on a matching GPU")
    p.add_argument(
        "--compare",
        metavar="DIR",
        help="say whether each version's PTX is the same as DIR/<arch>/<version>.ptx "
        "(written by an earlier --out), ignoring line information: a refactoring's proof",
    )
    p.add_argument(
        "--kernels",
        metavar="FILE",
        help="build only the kernels listed in FILE ('-': standard input), one a line: "
        "version|configuration json|dtype[|variant key], e.g. "
        'v6|{"block_m": 128, "block_n": 96, "block_k": 64, "stages": 7, "group": 8}|float16|kn',
    )
    p.add_argument("--jobs", type=int, help="with --kernels: builds at once (default: one a core)")
    p.set_defaults(func=compile_command)
    p = sub.add_parser(
        "bench",
        help="check and time the versions, cuBLAS, Triton and matmul() on this GPU",
        description="Without a GPU of the series: compile report, then redraw the committed results.",
    )
    p.add_argument("--arch", help="sm_90a or sm_100a; default: this machine's GPU")
    p.add_argument("--versions", help="comma-separated, e.g. v0,v1; default: every version")
    p.add_argument(
        "--shapes",
        default="series",
        help="presets (series, ksweep, llm) and MxNxK shapes, comma-separated (default: series)",
    )
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument(
        "--out",
        help="directory for results-<arch>-<dtype>-<shapes>.json and the figures (default: <matmul cache dir>/bench)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="timing rounds per shape: each round times every kernel in one window with cuBLAS, the "
        "order reversed every other round (an even count gives every kernel as many early as "
        "late places); a kernel's ratio to cuBLAS is the median of its windows' (default 6)",
    )
    p.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up per timing window (default 50)")
    p.add_argument("--repeat-ms", type=float, default=200.0, help="timed runs per timing window, in ms (default 200)")
    p.add_argument(
        "--sustained",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="time each kernel (cuBLAS too) alone, launched back to back for SECONDS per window, "
        "with the clock and power it runs at (the rate a power-limited GPU settles at); "
        "default: paired windows with cuBLAS",
    )
    p.add_argument("--no-triton", action="store_true", help="leave out the Triton baseline")
    p.add_argument("--redraw-from", help="without a GPU: where the committed results are (default: plots/)")
    p.set_defaults(func=bench_command, all_configs=False, no_check=True, compare=None, kernels=None, list=False)
    p = sub.add_parser(
        "candidates",
        help="time chosen configurations of versions against cuBLAS (to choose a space)",
        description=importlib.import_module(".harness.candidates", __package__).__doc__,
    )
    p.add_argument("candidates", nargs="+", help="VERSION (its whole space) or VERSION:knob=value,knob=value,...")
    p.add_argument("--arch", help="sm_90a or sm_100a; default: this machine's GPU")
    p.add_argument("--sizes", default="4096,8192", help="N (for N^3) or MxNxK, comma-separated (default 4096,8192)")
    p.add_argument("--rounds", type=int, default=6, help="timing rounds (default 6)")
    p.add_argument("--prebuild", action="store_true", help="only build them for --arch (no GPU needed)")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="LAUNCHES",
        help="check, then launch each LAUNCHES times in an NVTX range 'profile' (for ncu)",
    )
    p.add_argument(
        "--sustained",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sustained windows of SECONDS instead of paired windows with cuBLAS",
    )
    p.set_defaults(func=candidates_command)
    p = sub.add_parser(
        "protocol",
        help="run each version's barriers on a CPU model over many interleavings "
        "(deadlock, overrun, byte counts, exits, coverage)",
    )
    p.add_argument("--arch", help="sm_90a, sm_100a or both (comma-separated); default: both")
    p.add_argument("--versions", help="comma-separated, e.g. v0,v1; default: every version")
    p.add_argument("--seeds", type=int, default=24, help="interleavings per configuration (default 24)")
    p.add_argument(
        "--all-configs",
        action="store_true",
        help="every configuration of the autotune spaces and EXTRA_CONFIGS (default: the representative and one of "
        "each other protocol shape: its cluster, multicast and the ranks its releases reach, turn-taking and warp "
        "count)",
    )
    p.add_argument("--trace", action="store_true", help="print the events before each finding")
    p.add_argument(
        "--unordered-commits",
        action="store_true",
        help="let one thread's tcgen05.commit arrivals land in any order (default: in issue order)",
    )
    p.add_argument(
        "--variant",
        help="check this variant's builds, e.g. bias+gelu_tanh, swiglu or batch4 (a Variant key), of the versions "
        "that build it (default: the plain build)",
    )
    p.set_defaults(func=protocol_command)
    p = sub.add_parser("plot", help="draw the figures of bench results files (PNG and SVG)")
    p.add_argument("results", nargs="+", help="results-*.json written by bench")
    p.add_argument("--out", help="directory for the figures (default: next to each results file)")
    p.set_defaults(func=plot_command)
    p = sub.add_parser(
        "model",
        help="matmul() against torch.matmul as a model calls it: back to back with host time, "
        "and a transformer block's forward",
    )
    p.add_argument("--out", help="directory for the results, table and figure (default: <matmul cache dir>/model)")
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds per comparison (default 10)")
    p.set_defaults(func=model_command)
    p = sub.add_parser(
        "drop-in",
        help="the call outside x @ w.T: b [K, N], linear with fused epilogues, a transformers Llama switched "
        "with matmul.nn.convert (needs transformers)",
    )
    p.add_argument("--out", help="directory for the results (default: <matmul cache dir>/drop-in)")
    p.add_argument(
        "--parts",
        default="kn,linear,llama",
        help="comma-separated: kn, linear, llama, llama-int4, llama-int6, llama-fp8_e4m3 (the Llama with "
        "packed weights; default: the first three)",
    )
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds per comparison (default 10)")
    p.add_argument(
        "--widths", default="llama-3-8b", help="the Llama parts' widths: llama-3-8b or qwen2-7b (default llama-3-8b)"
    )
    p.set_defaults(func=drop_in_command)
    p = sub.add_parser(
        "trace",
        help="first calls from an empty cache: a seeded trace of random token counts over the LLM preset, "
        "each call timed against torch.matmul, again once the background tuning has finished",
    )
    p.add_argument("--out", help="directory for trace.json (default: <matmul cache dir>/trace)")
    p.add_argument("--calls", type=int, default=300, help="calls in the trace (default 300)")
    p.add_argument(
        "--wait-s",
        type=float,
        default=1800.0,
        help="longest wait for the background tuning before the second pass (default 1800); the "
        "results say whether it finished",
    )
    p.add_argument(
        "--parts",
        default="block,trace,torch_alone,matmul_alone",
        help="which of block (the block's first forward pass), trace (both passes), torch_alone and "
        "matmul_alone (each library over the trace in a fresh process of its own), alternating (--repeats "
        "fresh processes of each library in turn, compared by their medians) to run (default: all but "
        "alternating)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="processes of each library for --parts alternating (default 5)",
    )
    p.add_argument(
        "--matmul-env",
        action="append",
        metavar="VAR=VALUE[,VAR=VALUE...]",
        help="--parts alternating: in each turn, one more matmul() process with these settings in its "
        "environment, compared with the same torch processes (repeatable)",
    )
    p.set_defaults(func=trace_command)
    p = sub.add_parser(
        "tune",
        help="tune shape buckets now (a model's, or given shapes), so that no call waits or runs an instant choice",
        description="Blocking, in a child process as matmul() tunes; what is measured is stored in choices.json "
        "(and, with --out, written as a shipped table). With --out, entries already in FILE that match the "
        "kernel sources are kept and not measured again: a run cut short can be resumed.",
    )
    p.add_argument("--model", choices=MODELS, help="the projection weights (N x K) of this model")
    p.add_argument("--m", help="with --model: M as LOW-HIGH (one M per shape bucket) or a list (default 1-8192)")
    p.add_argument("--shapes", help="presets (llm, decode, ...) and MxNxK shapes, comma-separated")
    p.add_argument("--dtype", default="float16", help="float16, bfloat16 or both, comma-separated (default float16)")
    p.add_argument("--variant", help="a variant key (matmul.kernels.variant), e.g. kn, bias+gelu_tanh; default: plain")
    p.add_argument(
        "--narrow",
        action="store_true",
        help="time each bucket among the candidates that came close in its earlier measurement or its nearest "
        "relative (other dtype, plain variant, nearest M), at their configurations there; a full tuning elsewhere",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write the measured entries as a shipped table (matmul/call/shipped/h100.json's format); "
        "shipped entries are not taken as measured then",
    )
    p.add_argument(
        "--list-kernels",
        action="store_true",
        help="measure nothing: print the kernels a --narrow tuning of these buckets on --gpu would build first, "
        "as lines for 'compile --kernels', to build them on a machine without that GPU and carry the cache",
    )
    p.add_argument("--gpu", help="with --list-kernels: the GPU's name as torch gives it, e.g. 'NVIDIA H100 80GB HBM3'")
    p.add_argument("--arch", default="sm_90a", help="with --list-kernels: the GPU's architecture (default sm_90a)")
    p.set_defaults(func=tune_command)
    p = sub.add_parser(
        "shipped-table",
        help="make a shipped choice table again on this GPU (three narrowed tune commands, resumable)",
        description=shipped_table_command.__doc__,
    )
    p.add_argument("--table", default="matmul/call/shipped/h100.json", help="the table to write (default: %(default)s)")
    p.add_argument(
        "--list-kernels",
        action="store_true",
        help="measure nothing: print the kernels the tunings build first on --gpu, for 'compile --kernels'",
    )
    p.add_argument("--gpu", help="with --list-kernels: the GPU's name as torch gives it, e.g. 'NVIDIA H100 80GB HBM3'")
    p.add_argument("--arch", default="sm_90a", help="with --list-kernels: the GPU's architecture (default sm_90a)")
    p.set_defaults(func=shipped_table_command)
    for command, (name, help_, needs_gpu, why) in HOPPER_COMMANDS.items():
        module = importlib.import_module(f".harness.{name}", __package__)
        p = sub.add_parser(
            command, help=help_, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(p)
        p.set_defaults(func=hopper_command(module, needs_gpu, why))
    p = sub.add_parser(
        "figures",
        help="write plots/README.md and each results folder's README.md from the committed results files",
    )
    p.add_argument("--plots", help="the results tree (default: the checkout's plots/)")
    p.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any README differs from what it would write"
    )
    p.set_defaults(func=figures_command)
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except ValueError as e:  # a bad --arch or --versions: say so, no traceback
        parser.error(str(e))
