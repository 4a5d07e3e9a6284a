"""What the tutorial notebooks share: showing a version's source and what changed, building it for
an architecture and showing its PTX, checking and timing it on a GPU of the right kind, and the
closing figure from the committed benchmark results.

Nothing here holds kernel code: the notebooks show the modules of ``matmul/`` themselves.
"""

from __future__ import annotations

import ast
import difflib
import functools
import glob
import inspect
import json
import re
from pathlib import Path
from types import ModuleType

import torch

from matmul import build
from matmul.kernels import versions
from matmul.measure import correctness

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("sm_100a", "sm_90a")  # Blackwell is the main thread, Hopper the counterpart
NAMES = versions.ARCH_NAMES


# -- where are we ---------------------------------------------------------------------------------


def gpu_arch() -> str | None:
    """The series this machine's GPU runs (sm_90a for Hopper, sm_100a for Blackwell), or None."""
    return versions.local_arch()


def machine_line() -> str:
    arch = gpu_arch()
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        if arch is None:
            return f"GPU here: {name}, neither Hopper nor Blackwell: every kernel is built, none is run."
        other = "sm_100a" if arch == "sm_90a" else "sm_90a"
        return (
            f"GPU here: {name} ({arch}). The {NAMES[arch]} kernels run and are timed; the "
            f"{NAMES[other]} kernels are built and inspected only."
        )
    return (
        "No GPU here: every kernel is built for its architecture and inspected (PTX, registers, shared memory), "
        "none is run."
    )


def available(version: str) -> dict[str, bool]:
    return {arch: version in versions.available(arch) for arch in ARCHS}


def previous(version: str) -> str | None:
    n = int(version[1:])
    return f"v{n - 1}" if n > 0 else None


# -- showing text ---------------------------------------------------------------------------------


def md(text: str) -> None:
    """Render Markdown in a notebook, print it elsewhere."""
    try:
        from IPython.display import Markdown, display

        display(Markdown(text))
    except ImportError:
        print(text)


def fenced(text: str, language: str = "") -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`")  # the docstrings use reStructuredText literals


def docstring(module: ModuleType) -> str:
    return inspect.getdoc(module) or ""


def show_docstring(module: ModuleType) -> None:
    """A module's docstring (its idea and its synchronization invariants) as a quote."""
    md(
        f"**`{module.__name__}`** &mdash; {module.IDEA}\n\n"
        + "\n".join("> " + line for line in _rst_to_md(docstring(module)).splitlines())
    )


def show_source(obj, language: str = "python", folded: bool = False) -> None:
    """The source of a module, class or function, exactly as it is in the repository; ``folded``
    puts it in a block the reader opens with a click (for a second copy of the same idea)."""
    text = fenced(inspect.getsource(obj), language)
    if folded:
        md(f"<details><summary><code>{_where(obj)}</code> (click to open)</summary>\n\n{text}\n\n</details>")
    else:
        md(f"`{_where(obj)}`\n\n" + text)


def _where(obj) -> str:
    path = Path(inspect.getsourcefile(obj)).resolve()
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def code_without_docstring(module: ModuleType) -> list[str]:
    """The module's source lines after its docstring (the docstrings differ wholesale between
    versions; the diff is about the code)."""
    source = inspect.getsource(module)
    tree = ast.parse(source)
    lines = source.splitlines()
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = lines[first.end_lineno :]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


def diff(old: ModuleType, new: ModuleType, context: int = 3) -> list[str]:
    return list(
        difflib.unified_diff(
            code_without_docstring(old),
            code_without_docstring(new),
            fromfile=_where(old),
            tofile=_where(new),
            n=context,
            lineterm="",
        )
    )


def show_diff(old: ModuleType, new: ModuleType, context: int = 3) -> None:
    """What changed from ``old`` to ``new`` (code only, docstrings left out) as a unified diff:
    ``-`` lines left, ``+`` lines came in."""
    lines = diff(old, new, context)
    added = sum(1 for l in lines if l.startswith("+") and not l.startswith("+++"))
    removed = sum(1 for l in lines if l.startswith("-") and not l.startswith("---"))
    note = ""
    try:
        from matmul.kernels.entry import MatmulKernel

        shared = [issubclass(m.Kernel, MatmulKernel) for m in (old, new)]
        if shared[0] != shared[1]:
            which = _where(new if not shared[1] else old)
            note = (
                f"\n\n*Note:* `{which}` spells out the kernel's entry point (`__call__` with the global views) "
                "instead of deriving from the shared `matmul.kernel.MatmulKernel`, so those lines show up in the "
                "diff too; they are not part of the step."
            )
    except ImportError:
        pass
    md(
        f"`{_where(old)}` &rarr; `{_where(new)}`: **{added}** lines in, **{removed}** lines out "
        f"(module docstrings left out)\n\n" + fenced("\n".join(lines) or "(no change in the code)", "diff") + note
    )


# -- building and reading the PTX -----------------------------------------------------------------


@functools.cache
def build_representative(arch: str, version: str) -> build.BuildResult:
    """The version's REPRESENTATIVE configuration built for ``arch`` (float16), once per kernel
    session; tilus keeps built kernels in its cache, so a second session finds it there."""
    module = versions.load(arch, version)
    return build.build_config(module, arch, module.REPRESENTATIVE)


def ptx_excerpt(ptx: str, markers, context: int = 1, per_marker: int = 1, width: int = 160) -> str:
    """For each marker: how often it occurs in the PTX and its first occurrence(s) with a little
    context (the line that matches is marked with >>)."""
    lines = ptx.splitlines()
    out = []
    for marker in markers:
        hits = [i for i, line in enumerate(lines) if marker in line]
        out.append(f"// ---- {marker}: {len(hits)} line(s) of the PTX")
        for i in hits[:per_marker]:
            for j in range(max(0, i - context), min(len(lines), i + context + 1)):
                text = lines[j].strip()
                text = text if len(text) <= width else text[: width - 3] + "..."
                out.append(f"{'>>' if j == i else '  '} {j + 1:5d}  {text}")
    return "\n".join(out)


def resources(result: build.BuildResult) -> dict:
    return {
        "arch": result.arch,
        "version": result.version,
        "config": ", ".join(f"{k}={v}" for k, v in result.config.items()),
        "threads": result.threads,
        "registers/thread": result.registers,
        "spills (B)": result.spill_bytes,
        "shared memory (KiB)": round(result.shared_bytes / 1024, 1),
        "cluster": "x".join(map(str, result.cluster)),
        "PTX lines": len(result.ptx().splitlines()),
    }


def show_build(arch: str, version: str, per_marker: int = 1, context: int = 1) -> build.BuildResult:
    """Build the representative configuration for ``arch``, fail loudly if it does not build,
    and show its resources and the PTX lines of its markers."""
    module = versions.load(arch, version)
    result = build_representative(arch, version)
    if not result.ok:
        raise RuntimeError(
            f"{module.__name__} {module.REPRESENTATIVE} does not build for {arch}:\n{result.error[-3000:]}"
        )
    table = resources(result)
    md(
        f"**{NAMES[arch]} {version}** built for `{arch}` with `REPRESENTATIVE = {module.REPRESENTATIVE}`\n\n"
        + _md_table([table])
    )
    missing = [m for m in module.PTX_MARKERS if m not in result.ptx()]
    md(
        f"PTX lines that show the step (`PTX_MARKERS` of `{module.__name__}`)"
        + (f" &mdash; **missing: {missing}**" if missing else "")
        + "\n\n"
        + fenced(ptx_excerpt(result.ptx(), module.PTX_MARKERS, context=context, per_marker=per_marker), "text")
    )
    if missing:
        raise AssertionError(f"{module.__name__}: markers missing from the PTX: {missing}")
    return result


def ptx_lines(arch: str, version: str, pattern: str, limit: int = 8, width: int = 160) -> str:
    """The PTX lines of a built version that match a regular expression (with their numbers)."""
    lines = build_representative(arch, version).ptx().splitlines()
    hits = [(i, l.strip()) for i, l in enumerate(lines) if re.search(pattern, l)]
    shown = [f"{i + 1:5d}  {l if len(l) <= width else l[: width - 3] + '...'}" for i, l in hits[:limit]]
    more = f"\n... and {len(hits) - limit} more" if len(hits) > limit else ""
    return f"// {len(hits)} line(s) match {pattern!r}\n" + "\n".join(shown) + more


def count_in_ptx(arch: str, version: str, needles) -> dict[str, int]:
    ptx = build_representative(arch, version).ptx()
    return {n: ptx.count(n) for n in needles}


def _md_table(rows: list[dict]) -> str:
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(out)


def show_table(rows: list[dict]) -> None:
    md(_md_table(rows))


def show_committed_figure(path: Path) -> None:
    """A committed figure (plots/), shown where the checkout has it."""
    if path.exists():
        from IPython.display import Image, display

        display(Image(filename=str(path)))


# -- running on a GPU of the right architecture ---------------------------------------------------

CHECK_SHAPES = (*correctness.CHECK_SHAPES, (4096, 4096, 4096))
TIME_SHAPE = (4096, 4096, 4096)


def check(module: ModuleType, shapes=CHECK_SHAPES, dtypes=(torch.float16, torch.bfloat16)) -> list[dict]:
    """The version's REPRESENTATIVE configuration checked as the tests check it
    (``matmul.measure.correctness.check_cases``: awkward shapes, poisoned output, float32
    reference), shown as a table. Raises if any result is off by more than its dtype's tolerance."""
    rows = [
        {
            "M x N x K": f"{m} x {n} x {k}",
            "dtype": str(dtype).split(".")[-1],
            "relative error": f"{error:.2e}",
            "tolerance": f"{correctness.TOLERANCE[dtype]:.1e}",
            "ok": error <= correctness.TOLERANCE[dtype],
        }
        for m, n, k, dtype, error in correctness.check_cases(module, shapes, dtypes, module.REPRESENTATIVE)
    ]
    _show_checked(module, rows)
    return rows


def _configured_row(m: int, n: int, k: int, dtype, config: dict, error: float) -> dict:
    """A row of a check table for a configuration of the caller's choosing."""
    return {
        "M x N x K": f"{m} x {n} x {k}",
        "dtype": str(dtype).split(".")[-1],
        "config": config,
        "relative error": f"{error:.2e}",
        "ok": error <= correctness.TOLERANCE[dtype],
    }


def _show_checked(module: ModuleType, rows: list[dict]) -> None:
    """The check table, shown; raises if any row is off by more than its dtype's tolerance."""
    show_table(rows)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        raise AssertionError(f"{module.__name__} is wrong: {bad}")


def time_against_cublas(modules: list[ModuleType], shape=TIME_SHAPE, dtype=torch.float16) -> list[dict]:
    """Each version's REPRESENTATIVE configuration timed against cuBLAS (torch.matmul) on one shape,
    as ``python -m matmul candidates`` does it (the harness's loop: checked first, then in one
    window with cuBLAS, launched in turn, so the ratio is taken at one clock; the TFLOPS are at
    cuBLAS's median clock)."""
    from matmul.harness import bench, candidates
    from matmul.harness.presets import Shape
    from matmul.harness.results import CUBLAS
    from matmul.measure.timing import interleaved_ms

    m, n, k = shape
    a, b = correctness.random_operands(m, n, k, dtype)
    arch = gpu_arch()
    chosen = [(module.__name__.rsplit(".", 1)[1], module.REPRESENTATIVE) for module in modules]
    found = candidates.contenders(arch, chosen, a, b, correctness.poisoned_output(m, n, dtype))
    timer = functools.partial(interleaved_ms, warmup_ms=100.0, repeat_ms=300.0)
    measured = {
        r["kernel"]: r for r in bench.measure(Shape(m, n, k, ""), found, correctness.reference(a, b), dtype, timer, 1)
    }
    rows = []
    for name, config in [*chosen, (CUBLAS, {})]:
        r = measured[candidates.label(name, config) if config else CUBLAS]
        if not r["ok"]:
            raise AssertionError(f"{name}: {r.get('message') or 'relative error %.3g' % r['error']} at {shape}")
        rows.append(
            {
                "kernel": "cuBLAS (torch.matmul)" if name == CUBLAS else name.upper(),
                "config": config or "",
                "ms": round(r["ms"], 4),
                "TFLOPS": round(r["tflops"], 1),
                "vs cuBLAS": f"{r['vs_cublas']:.2f}x" if name != CUBLAS else "1.00x",
            }
        )
    md(
        f"Measured here on **{torch.cuda.get_device_name(a.device)}**, {m} x {n} x {k} {str(dtype).split('.')[-1]}, "
        "each version at its REPRESENTATIVE configuration (the harness autotunes; see the closing figure):"
    )
    show_table(rows)
    return rows


def live(arch: str, version: str, compare_previous: bool = True) -> None:
    """On a GPU of ``arch``'s kind: check the version and time it (with the previous version and
    cuBLAS; V7, the skinny kernel, on skinny shapes against the memory roofline). Elsewhere: say
    why not (the build above is what this machine can show)."""
    here = gpu_arch()
    if here != arch:
        md(
            f"*{NAMES[arch]} {version} is not run here*: this needs a {NAMES[arch]} GPU (`{arch}`); this machine has "
            f"{'no GPU' if not torch.cuda.is_available() else torch.cuda.get_device_name()}."
            + (
                " No Blackwell GPU is available to this project: every Blackwell kernel in these notebooks is "
                "built and inspected, never run or timed."
                if arch == "sm_100a"
                else ""
            )
        )
        return
    module = versions.load(arch, version)
    if version == "v7":
        live_skinny(module)
        return
    if version == "v8":
        live_quantized(module)
        return
    check(module)
    modules = [module]
    before = previous(version)
    if compare_previous and before and before in versions.available(arch):
        modules.insert(0, versions.load(arch, before))
    time_against_cublas(modules)


# -- the closing figure: the harness's committed results ------------------------------------------


def results_files() -> list[Path]:
    """Committed benchmark results of one GPU's series (``plots/<gpu>/series/results-*.json``, written by
    ``python -m matmul bench``; the model and skinny runs have folders of their own)."""
    return sorted(Path(p) for p in glob.glob(str(ROOT / "plots" / "*" / "series" / "results-*.json")))


def png(figure):
    """A matplotlib Figure as a PNG image for display: the same picture whether or not pyplot's
    inline backend is active in this kernel."""
    import io

    from IPython.display import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return Image(data=buffer.getvalue(), format="png")


def show_results(upto: str | None = None) -> None:
    """The series' progression as measured by the harness, from the committed results file(s):
    the harness's own figure (``matmul.plot.progression``), or the PNG committed beside the results,
    and this notebook's version's rows. Never fails: with no results committed it says so."""
    files = results_files()
    if not files:
        md(
            "**No benchmark results are committed yet** (no results of `python -m matmul bench` under "
            "`plots/`): the progression figure "
            "appears here once the harness's results are committed (`python -m matmul bench` on a GPU)."
        )
        return
    for path in files:
        try:
            _show_results_file(path, upto)
        except Exception as e:  # a results file this notebook cannot read must not break the tutorial
            md(f"`{path.relative_to(ROOT)}` could not be shown here ({type(e).__name__}: {e}).")


def _show_results_file(path: Path, upto: str | None) -> None:
    from IPython.display import display

    from matmul.harness import plot
    from matmul.harness import results as results_file

    results = results_file.load(path)
    gpu, arch = results["machine"].get("gpu", "an unknown GPU"), results["arch"]
    sustained = results_file.is_sustained(results)
    figure = plot.progression(results)  # None: this file has no square series (e.g. the LLM shapes)
    if figure is not None:
        display(png(figure))
    how = (
        "each kernel launched alone, back to back, at the clock its own power draw allows"
        if sustained
        else "each kernel timed in turn with cuBLAS, at a shared clock"
    )
    md(
        f"From `{path.relative_to(ROOT)}`: measured on **{gpu}** ({NAMES.get(arch, arch)} series, `{arch}`), each "
        f"version autotuned by the harness, {how}. Only that GPU's series was measured: no Blackwell figure comes "
        "from this project's machines."
    )
    if upto:
        mine = [r for r in results.get("rows", []) if r.get("kernel", r.get("version")) == upto]
        if mine:
            show_table(
                [
                    {
                        "version": upto,
                        "M x N x K": f"{r['m']} x {r['n']} x {r['k']}",
                        "TFLOPS": None if r.get("tflops") is None else round(r["tflops"], 1),
                        "x cuBLAS": None if r.get("vs_cublas") is None else round(r["vs_cublas"], 3),
                        "ok": r.get("ok"),
                    }
                    for r in mine
                ]
            )


# -- which code produced these outputs ------------------------------------------------------------

COMMIT_ENV = "MATMUL_TUTORIALS_COMMIT"  # set by the one who runs the notebooks where .git is stale


def commit() -> str:
    """The commit of the code these cells run: ``$MATMUL_TUTORIALS_COMMIT`` when set (a GPU machine
    may carry the working tree with an older ``.git``), else ``git describe --always --dirty``."""
    import os
    import subprocess

    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def stamp() -> None:
    """What produced the outputs below: the commit, the machine and the software, printed once at the
    top of each notebook (``_run.py`` writes the same into the notebook's metadata)."""
    import datetime
    import platform

    import tilus

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(
        f"outputs of commit {commit()}, run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n"
        f"machine: {gpu}; Python {platform.python_version()}, torch {torch.__version__}, tilus {tilus.__version__}"
    )
    md(machine_line())


# -- the measured step on the H100 (committed results) --------------------------------------------

SERIES = ROOT / "plots" / "h100" / "series"
PAIRED = SERIES / "results-sm_90a-float16-series_ksweep.json"
SUSTAINED = SERIES / "results-sm_90a-float16-series-sustained.json"
PAIRED_MEANS = (
    "*Paired windows*: each kernel is launched in turn with cuBLAS in one window (L2 flushed before "
    "every launch), so both run at the same clock: the ratio is work per clock."
)
SUSTAINED_MEANS = (
    "*Sustained*: each kernel runs alone, back to back for 3 s, and is timed once its clock has "
    "settled under the card's 700 W power limit: the rate it keeps, which also credits a kernel that "
    "draws less power (moves fewer bytes) with the higher clock it then gets."
)


def _series_rows(path: Path) -> dict:
    from matmul.harness import results as results_file

    results = results_file.load(path)
    return results, {(r["m"], r["n"], r["k"], r["kernel"]): r for r in results["rows"] if r["m"] == r["n"] == r["k"]}


def h100_rows(version: str, sizes=(4096, 8192)) -> list[dict]:
    """This version, the previous one and cuBLAS on the square series shapes, in both committed
    H100 runs (paired windows and sustained), one row each with its GPU, shape and dtype."""
    rows = []
    before = previous(version)
    for label, path in (("paired", PAIRED), ("sustained", SUSTAINED)):
        results, by_key = _series_rows(path)
        gpu = results["machine"]["gpu"].replace("NVIDIA ", "")
        for size in sizes:
            prev = by_key.get((size, size, size, before)) if before else None
            for kernel in [k for k in (before, version) if k] + ["cuBLAS"]:
                r = by_key.get((size, size, size, kernel))
                if r is None:
                    continue
                rows.append(
                    {
                        "timing": label,
                        "GPU": gpu,
                        "M x N x K": f"{size} x {size} x {size}",
                        "dtype": results["dtype"],
                        "kernel": kernel.upper() if kernel != "cuBLAS" else kernel,
                        "ms": f"{r['ms']:.3f}",
                        "TFLOPS": f"{r['tflops']:.0f}",
                        "x cuBLAS": f"{r['vs_cublas']:.3f}",
                        f"x {before.upper() if before else 'previous'}": (
                            f"{prev['ms'] / r['ms']:.2f}" if prev and kernel == version else ""
                        ),
                        "config": ", ".join(f"{k}={v}" for k, v in (r.get("config") or {}).items()),
                    }
                )
    return rows


def on_the_h100(version: str) -> None:
    """The measured step: this version against the previous one and cuBLAS on the project's H100,
    read from the committed results (never from this machine), with what each timing means."""
    missing = [p for p in (PAIRED, SUSTAINED) if not p.exists()]
    if missing:
        md(f"**No committed H100 results** ({', '.join(str(p.relative_to(ROOT)) for p in missing)} missing).")
        return
    md(
        f"Hopper {version.upper()} on the project's H100 (the autotuned configuration the harness picked), "
        f"from `{PAIRED.relative_to(ROOT)}` and `{SUSTAINED.relative_to(ROOT)}` "
        "(commands in `plots/h100/series/README.md`). These are measurements of the **Hopper** kernels only; "
        "no Blackwell kernel has been run by this project.\n\n"
        f"* {PAIRED_MEANS}\n* {SUSTAINED_MEANS}\n\n" + _md_table(h100_rows(version))
    )


# -- the Pipeline, in two steps -------------------------------------------------------------------

PIPELINE_V4_METHODS = (
    "producer_acquire",
    "producer_barrier",
    "producer_release",
    "producer_advance",
    "consumer_acquire",
    "consumer_barrier",
    "consumer_release",
    "consumer_release_previous",
    "release_barrier",
    "consumer_advance",
)
PIPELINE_CLUSTER_METHODS = ("__init__", "release_barrier", "arrive_on_ranks", "producer_tail")


def _pipeline_doc_sections() -> tuple[str, str, str]:
    """pipeline.Pipeline's module docstring cut where it changes subject: what one CTA needs, the
    tensor-memory paragraph, the cluster parameters."""
    import pipeline.pipeline as module

    doc = _rst_to_md(docstring(module))
    head, cluster = doc.split("Cluster pipelines", 1)
    one_cta, tmem = head.split("Tensor-memory stages", 1)
    return one_cta.strip(), "Tensor-memory stages" + tmem.rstrip(), "Cluster pipelines" + cluster


def _methods(names) -> str:
    import pipeline

    return "\n".join(inspect.getsource(getattr(pipeline.Pipeline, name)) for name in names)


def show_pipeline_v4() -> None:
    """The Pipeline as V4 uses it: a ring of stages, two barriers a stage, phase bits, arrival
    counts, elect_release; the cluster parameters wait for V6."""
    one_cta, _, _ = _pipeline_doc_sections()
    md(
        "\n".join("> " + line for line in one_cta.splitlines())
        + "\n\n"
        + "`pipeline/pipeline.py`, the methods V4 calls (the constructor's cluster parameters `scope`, "
        "`release_to`, `cluster_fences`, the `tcgen05_fences` of tensor-memory rings and `producer_tail` "
        "come in the V6 notebook; V4 leaves them at their defaults):\n\n"
        + fenced(_methods(PIPELINE_V4_METHODS), "python")
    )


def show_pipeline_cluster() -> None:
    """The Pipeline's parameters for rings that span a cluster or hold tensor memory (V6)."""
    _, tmem, cluster = _pipeline_doc_sections()
    md(
        "\n".join("> " + line for line in (tmem + "\n\n" + cluster).splitlines())
        + "\n\n"
        + "`pipeline/pipeline.py`, the constructor and the methods those parameters change:\n\n"
        + fenced(_methods(PIPELINE_CLUSTER_METHODS), "python")
    )


# -- V7: skinny GEMMs at the memory roofline ------------------------------------------------------

SKINNY = ROOT / "plots" / "h100" / "skinny"


def skinny_results(dtype: str = "float16") -> None:
    """The committed H100 table of V7 against cuBLAS and the attainable floor (plots/h100/skinny)."""
    path = SKINNY / "roofline.json"
    if not path.exists():
        md(f"**No committed skinny results** (`{path.relative_to(ROOT)}` missing).")
        return
    results = json.loads(path.read_text())
    floor = results["floor"]
    rows = [
        {
            "GPU": results["device"].replace("NVIDIA ", ""),
            "dtype": r["dtype"],
            "M": r["m"],
            "N x K": f"{r['n']} x {r['k']}" + (f" ({r['label']})" if r.get("label") else ""),
            "V7 us": f"{r['v7_us']:.1f}",
            "cuBLAS us": f"{r['cublas_us']:.1f}",
            "floor us": f"{r['attainable_us']:.1f}",
            "V7 % floor": f"{100 * r['v7_share']:.0f}%",
            "cuBLAS % floor": f"{100 * r['cublas_share']:.0f}%",
            "V7 / cuBLAS": f"{r['ratio']:.2f}",
            "writing flush: V7 % floor": f"{100 * r['write_v7_share']:.0f}%" if "write_v7_share" in r else "-",
            "writing flush: V7 / cuBLAS": f"{r['write_ratio']:.2f}" if "write_ratio" in r else "-",
            "back to back V7 / cuBLAS": f"{r['b2b_ratio']:.2f}",
            "V7 config": "/".join(str(r["config"][k]) for k in ("block_m", "warpgroups", "split", "stages")),
        }
        for r in results["rows"]
        if r["dtype"] == dtype and not r.get("failed")
    ]
    summary = results["summary"].get(dtype, {})
    md(
        f"From `{path.relative_to(ROOT)}` (command in `plots/h100/skinny/README.md`): one run on the "
        f"**{results['device']}**, {dtype}, L2 flushed before each launch by reading 256 MiB (the *writing flush* "
        "columns: by writing it, which leaves dirty lines for the timed kernel to write back). Copy bandwidth "
        f"**{floor['copy_tb_per_s']:.2f} TB/s** (512 MiB; 32 MiB: {floor['copy_32mib_tb_per_s']:.2f}), empty kernel "
        f"**{floor['empty_ms'] * 1e3:.1f} us**; floor = bytes / copy bandwidth + empty kernel. V7 config = tokens per "
        "tile / consumer warpgroups / split (CTAs of a cluster) / stages. *Back to back*: 200 calls in a row, "
        "no flush, host time included (as a model calls them).\n\n"
        + _md_table(rows)
        + (
            f"\n\nOver the issue's bar shapes (4096 x 4096, 6144 x 4096, 4096 x 14336 at M = 1, 16, 64, 128): "
            f"geometric mean **{summary['bar_geomean_vs_cublas']:.3f}x cuBLAS** (bar: 1.15x), worst share of the "
            f"attainable floor **{100 * summary['bar_min_share_of_floor']:.0f}%** (bar: 85%)."
            if summary
            else ""
        )
    )
    show_committed_figure(SKINNY / "skinny-sm_90a.png")


SKINNY_CHECK_SHAPES = ((1, 1000, 1000), (3, 4097, 520), (17, 1000, 4104), (100, 2050, 1030), (255, 1030, 2000))
SKINNY_TIME_SHAPES = ((1, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096))


def live_skinny(module: ModuleType, dtypes=(torch.float16, torch.bfloat16)) -> None:
    """V7 on this Hopper GPU: checked on ragged skinny shapes (poisoned output, float32 reference),
    then timed against cuBLAS and the attainable floor measured here, through the roofline harness's
    own functions (its configuration picked per M as the harness does)."""
    from matmul.harness import roofline
    from matmul.measure.timing import interleaved_ms

    rows = []
    for dtype in dtypes:
        for m, n, k in SKINNY_CHECK_SHAPES:
            config = roofline.candidates(module, m)[0]
            ((*_, error),) = correctness.check_cases(module, [(m, n, k)], [dtype], config)
            rows.append(_configured_row(m, n, k, dtype, config, error))
    _show_checked(module, rows)
    copy = roofline.copy_tb_per_s(512 << 20, 100.0, 200.0)
    empty_ms = roofline.empty_kernel_ms(100.0, 200.0)
    timed = []
    for m, n, k in SKINNY_TIME_SHAPES:
        a, b = correctness.random_operands(m, n, k, torch.float16)
        out, ref_out = (
            correctness.poisoned_output(m, n, torch.float16),
            torch.empty(m, n, dtype=torch.float16, device=a.device),
        )
        config = roofline.candidates(module, m)[0]

        def cublas(a=a, b=b, ref_out=ref_out):
            return torch.matmul(a, b.T, out=ref_out)

        v7_ms, cublas_ms = interleaved_ms([roofline.launcher(module, a, b, out, config), cublas], 100.0, 300.0)
        floor_ms = roofline.bytes_floor(m, n, k, 2) / (copy * 1e12) * 1e3 + empty_ms
        timed.append(
            {
                "M x N x K": f"{m} x {n} x {k}",
                "dtype": "float16",
                "config": config,
                "V7 us": round(v7_ms * 1e3, 1),
                "cuBLAS us": round(cublas_ms * 1e3, 1),
                "floor us": round(floor_ms * 1e3, 1),
                "V7 % floor": f"{100 * floor_ms / v7_ms:.0f}%",
                "V7 / cuBLAS": f"{cublas_ms / v7_ms:.2f}",
            }
        )
    md(
        f"Timed here on **{torch.cuda.get_device_name()}** (L2 flushed before each launch, V7 and cuBLAS in one "
        f"window): copy bandwidth {copy:.2f} TB/s, empty kernel {empty_ms * 1e3:.1f} us. Each M at the first "
        "configuration of its token width (the harness sweeps them all; the table above is its best)."
    )
    show_table(timed)


# -- V8: low-precision weights widened on chip ----------------------------------------------------

V8_RESULTS = ROOT / "plots" / "h100" / "v8"


def thread_words(qw, thread: int, half: int, tile: tuple[int, int] = (0, 0)) -> list[dict]:
    """What thread ``thread`` of a warpgroup reads of half ``half`` of one packed 64 x 128 tile
    (``tile``: row tile, K block) of an int4 ``QuantizedWeight``: its 4 words, each value of a word in
    the fragment's register order ``v`` with the nibble that holds it (``v // 2 + 4 (v % 2)``: values
    ``2 p``, ``2 p + 1`` in nibbles ``p``, ``p + 4``) and the row and column of the weight it is
    (v8.py's docstring), checked against ``qw.q()``."""
    i, b = tile
    words = qw.packed[16 * i : 16 * i + 16, 64 * b : 64 * b + 64].reshape(-1)  # word 64 r + column of the box
    q = qw.q()
    warp, g, c = thread // 32, (thread % 32) // 4, thread % 4
    rows = []
    for j in range(4):
        index = (half * 128 + thread) * 4 + j
        word = int(words[index]) & 0xFFFFFFFF
        for v in range(8):
            e = v // 2 + 4 * (v % 2)
            nibble = (word >> (4 * e)) & 0xF
            row = 64 * i + 16 * warp + g + 8 * ((v // 2) % 2)
            col = 128 * b + 16 * (4 * half + j) + 2 * c + v % 2 + 8 * (v // 4)
            value = nibble - 16 if nibble >= 8 else nibble
            if row < qw.shape[0] and value != int(q[row, col]):
                raise AssertionError(
                    f"word {j} value {v} (nibble {e}): {value} but q[{row}, {col}] = {int(q[row, col])}"
                )
            rows.append(
                {
                    "word j": j,
                    "word (hex)": f"0x{word:08x}" if v == 0 else "",
                    "byte offset in the box": 4 * index if v == 0 else "",
                    "value v": v,
                    "nibble e": e,
                    "bits": f"{nibble:04b}",
                    "q": value,
                    "row": row,
                    "column": col,
                    "q[row, column]": int(q[row, col]) if row < qw.shape[0] else "(padding)",
                }
            )
    return rows


def magic_widen(nibbles: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The magic-number conversion in plain torch, for unsigned nibbles u (0..15) of two's
    complement int4 values: the 16-bit pattern ``magic | (u ^ 8)`` is the number ``base + q + 8``
    (``0x6400`` = 1024.0 in float16, ``0x4300`` = 128.0 in bfloat16: the exponent where one unit of
    the mantissa is 1), so subtracting ``base + 8`` leaves ``q`` exactly."""
    magic, base = (0x6400, 1024.0) if dtype == torch.float16 else (0x4300, 128.0)
    pattern = (magic | (nibbles.to(torch.int32) ^ 8)).to(torch.int16)
    return pattern.view(dtype) - (base + 8)


def v8_results() -> dict | None:
    path = V8_RESULTS / "bench.json"
    return json.loads(path.read_text()) if path.exists() else None


def quantized_results(dtype: str | None = None, formats=("int4",), tokens=(1, 16)) -> None:
    """The committed H100 run of the quantized call (plots/h100/v8/bench.json) as the roofline shows
    it, at decode sizes: V8 and cuBLAS on the 16-bit weight in one window, V8's floor and the 16-bit
    one, V7 from its own run; then the roofline's V8 figure."""
    from matmul.harness import roofline

    v8 = v8_results()
    if v8 is None:
        md(f"**No committed V8 results** (`{(V8_RESULTS / 'bench.json').relative_to(ROOT)}` missing).")
        return
    v7_path = SKINNY / "roofline.json"
    v7 = json.loads(v7_path.read_text()) if v7_path.exists() else None
    rows = [
        r
        for r in roofline.quantized_rows(v8, v7)
        if (dtype is None or r["dtype"] == dtype) and r["format"] in formats and r["m"] in tokens
    ]
    gpu = v8["device"].replace("NVIDIA ", "")
    table = [
        {
            "GPU": gpu,
            "weight": r["format"],
            "dtype": r["dtype"],
            "M x N x K": f"{r['m']} x {r['n']} x {r['k']}"
            + (f" ({r['label']})" if r["label"] and "x" not in r["label"] else ""),
            "V8 us": f"{r['v8_us']:.1f}",
            "cuBLAS us": f"{r['cublas_us']:.1f}",
            "V8 floor us": f"{r['attainable_us']:.1f}",
            "16-bit floor us": f"{r['dense_attainable_us']:.1f}",
            "V8 % its floor": f"{100 * r['v8_share']:.0f}%",
            "16-bit floor / V8": f"{r['v8_over_dense_floor']:.2f}",
            "V8 / cuBLAS": f"{r['ratio']:.2f}",
            "V8 / V7": f"{r['v8_over_v7']:.2f}" if "v8_over_v7" in r else "-",
            "V8 config": "/".join(str(r["config"][k]) for k in roofline.V8_CONFIG_KEYS if k in r["config"]),
        }
        for r in rows
        if not r.get("failed")
    ]
    md(
        f"From `{(V8_RESULTS / 'bench.json').relative_to(ROOT)}` (command in `plots/h100/v8/README.md`) "
        f"through `matmul.harness.roofline.quantized_rows`: one run on the "
        f"**{v8['device']}**, L2 flushed before each launch by reading, V8 (in the configuration the call "
        "picks, checked first) and cuBLAS on the unquantized weight timed in one window. Copy bandwidth "
        f"**{v8['floor']['copy_tb_per_s']:.2f} TB/s**, empty kernel **{v8['floor']['empty_ms'] * 1e3:.1f} us**; "
        "floor = bytes / copy bandwidth + empty kernel, V8's with the int4 bytes (packed weight + scales + "
        "activations + output), the 16-bit one with the 16-bit weight. V7: its own, earlier run "
        "(`plots/h100/skinny/roofline.json`, the same GPU model). V8 config = tokens per tile / "
        "warpgroups / split / stages / K columns a wgmma group.\n\n" + _md_table(table)
    )
    show_committed_figure(SKINNY / "roofline-v8-sm_90a.png")


V8_CHECK_SHAPES = ((1, 1000, 1024), (3, 4095, 1024), (17, 200, 384), (100, 1000, 4096), (255, 31, 128))
V8_TIME_SHAPES = ((1, 4096, 4096), (16, 4096, 4096), (16, 28672, 4096), (16, 4096, 14336))


def live_quantized(module: ModuleType, dtypes=(torch.float16, torch.bfloat16)) -> None:
    """V8 on this Hopper GPU: checked on ragged shapes (output poisoned, float32 reference from
    ``qw.dequantize()``), then timed against cuBLAS on the 16-bit weight and both floors measured
    here, in the configuration the call picks for M (``matmul.call.quantized.config_for``)."""
    import matmul
    from matmul.call import quantized as quant_linear
    from matmul.harness import roofline
    from matmul.measure.timing import interleaved_ms

    def built(dtype, config):
        """V8 is built by the call's build child; until then ``v8`` runs the widened path."""
        if not quant_linear.wait_until_built(dtype, "int4", config):
            raise RuntimeError(f"V8 {config} {dtype} did not build (the log says why)")

    def operands(m, n, k, dtype):
        x = torch.empty(m, k, dtype=dtype, device="cuda").uniform_(-1, 1)
        w = torch.empty(n, k, dtype=dtype, device="cuda").normal_(0, 0.05)
        return x, w, matmul.quantize(w)

    rows = []
    for dtype in dtypes:
        for m, n, k in V8_CHECK_SHAPES:
            x, _, qw = operands(m, n, k, dtype)
            config = quant_linear.config_for(m, n, k, "int4")
            built(dtype, config)
            out = correctness.poisoned_output(m, n, dtype)
            quant_linear.v8(x, qw, out, config)
            error = correctness.relative_error(out, x.float() @ qw.dequantize().float().T)
            rows.append(_configured_row(m, n, k, dtype, config, error))
    _show_checked(module, rows)
    copy = roofline.copy_tb_per_s(512 << 20, 100.0, 200.0)
    empty_ms = roofline.empty_kernel_ms(100.0, 200.0)
    timed = []
    for m, n, k in V8_TIME_SHAPES:
        x, w, qw = operands(m, n, k, torch.float16)
        out = torch.empty(m, n, dtype=x.dtype, device="cuda")
        dense_out = torch.empty_like(out)
        config = quant_linear.config_for(m, n, k, "int4")
        built(torch.float16, config)

        def v8(x=x, qw=qw, out=out, config=config):
            return quant_linear.v8(x, qw, out, config)

        def cublas(x=x, w=w, dense_out=dense_out):
            return torch.matmul(x, w.T, out=dense_out)

        v8_ms, cublas_ms = interleaved_ms([v8, cublas], 100.0, 300.0)
        floor_ms = roofline.quantized_bytes_floor(m, n, k, 2) / (copy * 1e12) * 1e3 + empty_ms
        dense_ms = roofline.bytes_floor(m, n, k, 2) / (copy * 1e12) * 1e3 + empty_ms
        timed.append(
            {
                "M x N x K": f"{m} x {n} x {k}",
                "dtype": "float16",
                "config": config,
                "V8 us": round(v8_ms * 1e3, 1),
                "cuBLAS us": round(cublas_ms * 1e3, 1),
                "V8 floor us": round(floor_ms * 1e3, 1),
                "16-bit floor us": round(dense_ms * 1e3, 1),
                "V8 % its floor": f"{100 * floor_ms / v8_ms:.0f}%",
                "16-bit floor / V8": f"{dense_ms / v8_ms:.2f}",
                "V8 / cuBLAS": f"{cublas_ms / v8_ms:.2f}",
            }
        )
    md(
        f"Timed here on **{torch.cuda.get_device_name()}** (L2 flushed before each launch, V8 and cuBLAS on the "
        f"16-bit weight in one window): copy bandwidth {copy:.2f} TB/s, empty kernel {empty_ms * 1e3:.1f} us. "
        "V8 at the configuration the call picks for M (`matmul.call.quantized.config_for`), not the fastest of its "
        "space (the committed table below is that)."
    )
    show_table(timed)


def exists(arch: str, version: str) -> bool:
    """Whether this checkout has the version for ``arch`` (``versions.available`` lists V0-V7 only)."""
    import importlib.util

    return importlib.util.find_spec(versions.module_name(arch, version)) is not None


def twin(arch: str, version: str) -> None:
    """A version's counterpart on the other architecture, where this checkout has one: its idea,
    its source (folded), its build and its live part; otherwise a line that says there is none."""
    if not exists(arch, version):
        md(f"*There is no {NAMES[arch]} {version.upper()} in this checkout* (`{versions.module_name(arch, version)}`).")
        return
    module = versions.load(arch, version)
    show_docstring(module)
    show_source(module, folded=True)
    show_build(arch, version)
    live(arch, version)
