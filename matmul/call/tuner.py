"""The cross-version tuner behind ``matmul()``: which kernel runs a shape bucket, found in a child
process so that a kernel that faults cannot harm the caller.

Candidates (``candidates``): cuBLAS (``VENDOR``) and every version from V3 on whose ``supports(m,
n, k)`` and ``MAX_ELEMENTS`` admit the shape. V0-V2 are teaching steps that never beat V3-V6 or
cuBLAS on a timed shape (plots/h100/series/), so tuning them would only cost time.

``tune``: each candidate is autotuned by tilus over its space on fresh random operands (never the
caller's), checked against the float32 reference on a NaN-poisoned output, and the survivors timed
in ``TUNING_ROUNDS`` alternating rounds, each in one window with cuBLAS (``_gpu_timer``). Where
kernels are short (cuBLAS under ``HOST_BOUND_MS``) the host time per call through the public call's
own path is measured too (``host_ms``, least of ``HOST_ROUNDS``: a host hiccup only adds time), and
the longer of the two is compared (``call_ms``): at decode sizes torch's call can cost the host more
than its kernels take, so a version whose launch is cheaper can win where cuBLAS's kernel alone is
faster. A version replaces cuBLAS only when faster by more than ``VENDOR_MARGIN`` (the noise of a
power-limited GPU). A bucket spans a third below its top M to the top (``bucket_range``), so the
winner is timed again at its least and greatest M and keeps the bucket, or the part from where it
wins, only if it wins there (``held_across_the_bucket``).

Isolation (``tune_in_child``): all of that runs in ``python -m matmul.call.child``. A faulting
kernel (an illegal address ruins a CUDA context for good) takes down only the child; the parent
names that candidate rejected and starts a new child for the rest, and never launches an unchecked
candidate. The child reports each step as one JSON line prefixed by ``PROTOCOL`` and works the GPU
only while the caller's calls pause (``yielding``). A non-plain ``Variant`` is tuned on its own
operands among the versions that declare it and cuBLAS followed by torch's epilogue.

This module measures; ``chooser.Chooser`` decides when. What it needs of the public call (host
time through ``matmul()``) the child's entry hands in (``child.host_probe``), so it imports neither
``api`` nor ``launch``.
"""

from __future__ import annotations

import bisect
import datetime
import functools
import hashlib
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import tilus
import torch

from ..kernels import variant as variants
from ..kernels import versions
from ..kernels.variant import PLAIN, Variant
from ..kernels.versions import fits
from ..measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
from ..measure.timing import alternating_rounds, interleaved_ms, median_ms
from . import tilus_autotune, yielding
from .choice_cache import Entry, tilus_fix_sources
from .code_digest import code_digest

VENDOR = versions.CUBLAS  # the candidate that is not a version of the series: torch.matmul
# a version must beat cuBLAS by more than this share of its call time to be chosen: smaller wins did
# not hold when the model benchmark met them again (plots/h200/model/)
VENDOR_MARGIN = 0.02
TUNING_ROUNDS = 4  # even: each candidate is timed as often early as late in a round
PRUNE = 1.25  # after the first round, only candidates within this factor of the fastest are timed again
HOST_ROUNDS = 6  # host times per candidate, in turn: the least is kept
# Bisection steps for where in its bucket a version that loses at the bucket's least M starts to win
# (``held_across_the_bucket``, at the M of ``split_probe``): two place it within a quarter of the
# bucket, at two tunings of the version against cuBLAS. Without a split, a version that loses only
# where its tile is barely begun loses the whole bucket (V7's 128-token tile on a 4096 x 4096 weight
# at 97-128 tokens: plots/h200/after-loop/v7-tokens.txt of commit b43a7e1).
SPLIT_PROBES = 2
TEACHING = ("v0", "v1", "v2")  # steps of the series that never win: not tuned by matmul()
PROTOCOL = "@matmul-tuner "  # the prefix of the child's report lines on its stdout
# an entry's field, from the child to the chooser only (never stored): where the winner's kernel was built
PROGRAM_DIR = "program_dir"
CHILD_TIMEOUT_S = 3600.0  # building every candidate on a fresh machine takes minutes, not an hour


# --- which kernels may run a shape ---------------------------------------------------------------


def bucket(x: int) -> int:
    """``x`` rounded up to a multiple of 2^(bit_length - 2), tilus's tuning-key rule: 4096 -> 4096,
    4097 -> 6144, 14336 -> 16384, 1000 -> 1024."""
    block = 1 << max(x.bit_length() - 2, 0)
    return (x + block - 1) // block * block


def bucket_range(x: int) -> tuple[int, int]:
    """The least and the greatest size of ``x``'s bucket: 3330 -> (3073, 4096), 4096 -> (3073, 4096)."""
    top = bucket(x)
    return bisect.bisect_left(range(1, top + 1), top, key=bucket) + 1, top


def choice_key(arch: str, gpu: str, dtype: torch.dtype, m: int, n: int, k: int, variant: Variant = PLAIN) -> str:
    """The key of a choice: 'sm_90a/NVIDIA H100 80GB HBM3/float16/4096x4096x4096', and '/' + the
    variant's key for a variant other than the plain one ('.../4096x4096x4096/bias+gelu_tanh')."""
    key = f"{arch}/{gpu}/{str(dtype).removeprefix('torch.')}/{bucket(m)}x{bucket(n)}x{bucket(k)}"
    return key if variant == PLAIN else f"{key}/{variant.key()}"


def candidates(arch: str, m: int, n: int, k: int, variant: Variant = PLAIN) -> list[str]:
    """The versions ``matmul()`` tunes for this shape and variant (see the module's docstring), then
    cuBLAS: V0-V2 never, and a version only where it ``fits`` the shape and supports the variant."""
    found = []
    for version in versions.available(arch):
        if version in TEACHING:
            continue
        module = versions.load(arch, version)
        if variants.supported(module, variant) and fits(module, m, n, k, variant=variant):
            found.append(version)
    return [*found, VENDOR]


# --- stored choices ------------------------------------------------------------------------------


@functools.cache
def fingerprint(arch: str, version: str) -> str:
    """Changes when the code of the version's source, the shared entry point, the pipeline code they
    import or the tilus fixes changes, or tilus does (for cuBLAS: when torch or its CUDA change). The
    code, not the bytes (``code_digest``): an edit to a comment or a docstring keeps the choices."""
    if version == VENDOR:
        return hashlib.sha256(f"{torch.__version__} {torch.version.cuda}".encode()).hexdigest()[:16]
    digest = hashlib.sha256(tilus.__version__.encode())
    for path in fingerprint_files(arch, version):
        digest.update(code_digest(path).encode())
    return digest.hexdigest()[:16]


def choice_fingerprint(arch: str, version: str, timed_against=()) -> str:
    """What a stored choice stays valid for. A version's: its own sources (``fingerprint``). cuBLAS's:
    torch and its CUDA, and the sources of every version it was timed against (``timed_against``:
    the entry's candidates and the versions it ruled out). cuBLAS holds a bucket only while no
    version beats it, so a version made faster since, or mended where it failed, must be able to
    take the bucket back: its edit makes the cuBLAS choice stale, to be measured again, as it makes
    the version's own choices stale. cuBLAS chosen with no version to time (none takes the shape)
    depends on torch alone."""
    if version != VENDOR:
        return fingerprint(arch, version)
    against = sorted(set(timed_against) - {VENDOR})
    if not against:
        return fingerprint(arch, VENDOR)
    digest = hashlib.sha256(fingerprint(arch, VENDOR).encode())
    for other in against:
        try:
            digest.update(f" {other}:{fingerprint(arch, other)}".encode())
        except (ModuleNotFoundError, ValueError, KeyError):  # a version removed since: measure again
            digest.update(f" {other}:gone".encode())
    return digest.hexdigest()[:16]


def timed_against(entry: Entry) -> list[str]:
    """The versions a stored choice was timed against: its candidates and those it ruled out."""
    return [*(entry.get("candidates") or {}), *(entry.get("rejected") or {})]


def fingerprint_files(arch: str, version: str) -> list[Path]:
    """The sources a version's kernels are built from: its file, the files of the versions it
    imports from (Hopper V6 sizes its epilogue with V5's ``staging_columns``), the shared entry
    point, the ``pipeline`` modules those import (directly or through one another: an edit to a
    building block the version does not use leaves its stored choices valid), and every tilus fix
    (they patch the code generator of every kernel)."""
    from ..kernels import entry

    version_file = Path(versions.load(arch, version).__file__)
    own = [version_file, *_sibling_imports(version_file), Path(entry.__file__)]
    return [*own, *_pipeline_imports(own), *tilus_fix_sources()]


def _sibling_imports(source: Path) -> list[Path]:
    """The files of the same package that ``source`` imports relatively (``from .v5 import ...``)."""
    found = []
    for level, module, _ in _imports(source):
        sibling = source.parent / f"{module}.py"
        if level == 1 and module and sibling.is_file() and sibling not in found:
            found.append(sibling)
    return found


def _pipeline_imports(sources: list[Path]) -> list[Path]:
    """The ``pipeline`` modules that ``sources`` import, statically, and the ones those import."""
    import pipeline

    package = Path(pipeline.__file__).parent
    found: set[Path] = set()
    queue = list(sources)
    while queue:
        source = queue.pop()
        for level, module, aliases in _imports(source):
            names: list[str] = []
            if level == 0 and module:  # ``import a.b`` (module None: one alias a name) or ``from a import b``
                names = [module, *(f"{module}.{a}" for a in aliases)]
            elif level == 0:
                names = list(aliases)
            elif level == 1 and source.parent == package:
                relative = f"pipeline.{module}" if module else "pipeline"
                names = [relative, *(f"{relative}.{a}" for a in aliases)]
            for name in names:
                parts = name.split(".")
                if parts[0] != "pipeline":
                    continue
                # importing pipeline.x runs pipeline/__init__.py first
                paths = [package / "__init__.py", package.joinpath(*parts[1:]).with_suffix(".py")]
                for path in paths:
                    if path.is_file() and path not in found:
                        found.add(path)
                        queue.append(path)
    return sorted(found)


def _imports(source: Path) -> tuple:
    """The import statements of ``source``, anywhere in it (a function's own imports too), as
    (level, module, names): ``import a.b`` is (0, None, ("a.b",)), ``from .x import y`` (1, "x",
    ("y",)). Read once a version of the file (its path, size and modification time): every version's
    fingerprint reads the same pipeline modules, and the first call of a process pays for each
    parse while it holds the GIL (the planner's thread: plots/h200/first-call-profile/ of commit b43a7e1)."""
    stat = source.stat()
    return _imports_of(source, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _imports_of(source: Path, mtime_ns: int, size: int) -> tuple:
    import ast

    found = []
    statements = list(ast.parse(source.read_text()).body)
    while statements:  # statements only: an import is one, and a file's expressions are most of its nodes
        node = statements.pop()
        if isinstance(node, ast.Import):
            found.append((0, None, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module, tuple(a.name for a in node.names)))
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                statements.extend(child for child in getattr(node, field, ()) if isinstance(child, ast.AST))
    return tuple(reversed(found))


def space_config(module, config: Any, variant: Optional[Variant] = None) -> Optional[dict]:
    """The point of the version's autotune space (those that build for ``variant``, given one: a
    narrow V5 tile is no point of it for torch's b [K, N]) equal to ``config`` (as stored in JSON), or None.
    A parameter outside the space that ``config`` gives its default value is no part of it: until
    ``tilus_autotune.tuned_config`` left them out, tuned choices were recorded with them (V6's
    ``"pingpong": false``), and a choice cache or a shipped table may still hold such entries."""
    if not isinstance(config, dict):
        return None
    space = versions.space(module, variant)
    named = {name for point in space for name in point}  # every point names the same parameters
    defaults = inspect.signature(module.Kernel.__init__).parameters
    config = {
        name: value
        for name, value in config.items()
        if name in named or name not in defaults or defaults[name].default != value
    }
    normal = json.loads(json.dumps(config))
    return next((c for c in space if json.loads(json.dumps(c)) == normal), None)


def entry_is_valid(arch: str, entry: Entry) -> bool:
    """A stored choice may be used: its version and configuration exist, and nothing it was timed with changed."""
    version = entry.get("version")
    ms = entry.get("ms")
    if version == VENDOR:
        fresh = entry.get("fingerprint") == choice_fingerprint(arch, VENDOR, timed_against(entry))
        return fresh and isinstance(ms, (int, float)) and ms > 0
    if version not in versions.VERSIONS:
        return False
    try:
        module = versions.load(arch, version)
    except ModuleNotFoundError:  # the version was removed
        return False
    if space_config(module, entry.get("config")) is None:
        return False
    return entry.get("fingerprint") == fingerprint(arch, version) and isinstance(ms, (int, float)) and ms > 0


def entry_is_usable(arch: str, entry: Entry, variant: Variant = PLAIN) -> bool:
    """A choice that may run here, though perhaps timed with other kernel sources (a stale
    fingerprint): cuBLAS, or a version that exists, supports ``variant`` and has the configuration
    in its space. What an instant choice needs (``chooser``); ``entry_is_valid`` is what a final one needs."""
    version = entry.get("version")
    if version == VENDOR:
        return True
    if version not in versions.VERSIONS:
        return False
    try:
        module = versions.load(arch, version)
    except ModuleNotFoundError:
        return False
    return variants.supported(module, variant) and space_config(module, entry.get("config"), variant) is not None


# --- tuning one bucket ---------------------------------------------------------------------------


@dataclass
class Candidate:
    """One version, autotuned by tilus for the shape and checked: its configuration, error and launcher."""

    version: str
    config: dict
    error: float
    run: Callable[[], object]
    # cuBLAS on the same operands, launched in turn with ``run`` when it is timed, and its time in
    # a window of its own (measured once, when first asked): the scale of the candidate's time
    reference: Optional[Callable[[], object]] = None
    reference_ms: Optional[Callable[[], float]] = None
    # measures the host's time in ms to issue one call through matmul()'s own launch path
    # (``launch``), where it may matter (short kernels); None where it cannot
    host: Optional[Callable[[], float]] = None
    # the directory of the candidate's built program (``tilus_autotune.build``): the winner's is
    # reported with its entry, so that the caller loads it instead of building it again
    built: Optional[Callable[[], str]] = None


def tune(
    arch: str,
    dtype: torch.dtype,
    prepare: Callable[[str], Candidate],
    timer: Callable[[Candidate], float],
    names: list[str],
    rounds: int = TUNING_ROUNDS,
    label: str = "",
    rejected: Optional[dict[str, str]] = None,
) -> Entry:
    """Prepare every candidate of ``names`` (a failure or a wrong result rules it out), time the
    survivors in ``rounds`` alternating rounds, and describe the fastest as a choice entry (cuBLAS,
    if it is a candidate, unless a version is faster by more than ``VENDOR_MARGIN``). ``rejected``:
    candidates ruled out before (by a fault in an earlier child), kept in the entry."""
    found, rejected = [], dict(rejected or {})
    for version in names:
        try:
            candidate = prepare(version)
        except Exception as e:  # a version that does not build or run here is not a candidate
            rejected[version] = f"{type(e).__name__}: {e}"[:400]
            continue
        if not candidate.error <= TOLERANCE[dtype]:
            rejected[version] = f"relative error {candidate.error:.3g} over the tolerance {TOLERANCE[dtype]:g}"
            continue
        found.append(candidate)
    if not found:
        raise RuntimeError(
            f"no candidate ran correctly for {label}: {rejected}; use torch.matmul meanwhile, and report it"
        )
    times = alternating_rounds(found, rounds, timer, prune=PRUNE)
    ms = {c.version: statistics.median(t) for c, t in zip(found, times)}
    host_ms = host_times(found)
    # back to back, a call takes the longer of the kernel's time and the host's time to issue it
    call_ms = {c.version: max(ms[c.version], host_ms.get(c.version) or 0.0) for c in found}
    best = min(found, key=lambda c: call_ms[c.version])
    vendor = next((c for c in found if c.version == VENDOR), None)
    if vendor is not None and not beats_vendor(call_ms[best.version], call_ms[VENDOR]):
        best = vendor
    candidates = {
        c.version: {
            "config": c.config,
            "ms": ms[c.version],
            "host_ms": host_ms.get(c.version),
            "call_ms": call_ms[c.version],
            "error": c.error,
        }
        for c in found
    }
    entry = {
        **chosen(arch, best.version, candidates[best.version], [*candidates, *rejected]),
        "candidates": candidates,
        "rejected": rejected,
        "tuned": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if best.built is not None:
        try:
            entry[PROGRAM_DIR] = best.built()
        except Exception:  # the caller then has it built in a child of its own (``building``)
            pass
    return entry


def beats_vendor(version_ms: float, vendor_ms: float) -> bool:
    """``tune``'s rule: a version replaces cuBLAS only where its call is faster by more than ``VENDOR_MARGIN``."""
    return version_ms < vendor_ms * (1 - VENDOR_MARGIN)


def chosen(arch: str, version: str, timed: dict, timed_against=()) -> Entry:
    """The fields of an entry that say what it chose: ``version``, its configuration and times
    (``timed``: its row of the entry's ``candidates``), and the fingerprint of what it was chosen
    with (``choice_fingerprint``; ``timed_against``: the versions of its candidates and of those
    ruled out)."""
    return {
        "version": version,
        "config": timed["config"],
        "ms": timed["ms"],
        "error": timed["error"],
        "call_ms": timed["call_ms"],
        "fingerprint": choice_fingerprint(arch, version, timed_against),
    }


def held_across_the_bucket(arch: str, entry: Entry, m: int, tune_at: Callable[[int], Entry]) -> Entry:
    """A version chosen over cuBLAS at M = ``m`` keeps the bucket only if it also wins against cuBLAS
    (``tune``'s rule, margin included) at the least and the greatest M of the bucket (``bucket_range``)
    that are not ``m``: ``tune_at(M)`` tunes the version, in its chosen configuration, against cuBLAS
    there. Every call of the bucket runs the choice, and a version's tiles meet the token count
    unevenly: one that wins at 4096 rows, a whole number of its tiles, can lose at 3073 (one row
    into a new tile, a wave's tail), where cuBLAS picks another kernel of its own. Where it loses at
    the greatest M, the bucket's choice is cuBLAS, and the entry says where the version lost
    (``lost_at``). Where it loses only at the least, it keeps the bucket's upper part: the least M
    found to win by ``SPLIT_PROBES`` bisection steps between the least M and ``m`` becomes the entry's
    ``from_m``, below which its calls run cuBLAS (``chooser.Chooser.get``). Either way ``edges``
    holds each M's call times."""
    if entry["version"] == VENDOR or VENDOR not in entry["candidates"]:
        return entry
    edges = {}

    def wins_at(at: int) -> bool:
        found = tune_at(at)
        edges[str(at)] = {version: timed["call_ms"] for version, timed in found["candidates"].items()}
        return found["version"] != VENDOR

    return _bucket_verdict(arch, entry, m, wins_at, edges)


def redecided(arch: str, entry: Entry, m: int) -> Entry:
    """``entry``, a choice tuned at M = ``m``, decided again by ``tune``'s and ``held_across_the_bucket``'s
    rules from the call times it stores (its candidates' and its ``edges``'), without measuring:
    for a table made before a rule became stricter (a larger ``VENDOR_MARGIN``). Where the stricter
    rule would have timed the version at an M the entry has no times for (a bisection that turned
    the other way), that M counts as a loss: the version keeps no M it was not seen to win at. An
    entry made with other sources than the version's now stays stale (its old fingerprint kept)."""
    if entry["version"] == VENDOR or VENDOR not in entry["candidates"]:
        return entry
    stored = entry.get("edges") or {}
    fresh = entry.get("fingerprint") == fingerprint(arch, entry["version"])
    entry = {key: value for key, value in entry.items() if key not in ("edges", "from_m", "lost_at")}
    timed = entry["candidates"]
    if not beats_vendor(timed[entry["version"]]["call_ms"], timed[VENDOR]["call_ms"]):
        vendor = chosen(arch, VENDOR, timed[VENDOR], timed_against(entry))
        return {**entry, **vendor, "fingerprint": vendor["fingerprint"] if fresh else entry["fingerprint"]}
    edges = {}

    def wins_at(at: int) -> bool:
        times = stored.get(str(at))
        if times is None or entry["version"] not in times or VENDOR not in times:
            return False
        edges[str(at)] = times
        return beats_vendor(times[entry["version"]], times[VENDOR])

    return _bucket_verdict(arch, entry, m, wins_at, edges)


def _bucket_verdict(arch: str, entry: Entry, m: int, wins_at: Callable[[int], bool], edges: dict) -> Entry:
    """``held_across_the_bucket``'s decision, given whether the version wins at an M (``wins_at``,
    which records the times it used in ``edges``)."""
    least, greatest = bucket_range(m)
    if greatest != m and not wins_at(greatest):
        return _lost(arch, entry, edges, greatest)
    if least == m or wins_at(least):
        return {**entry, "edges": edges}
    loses, wins = least, m  # bisect between the two; the version runs from the least M known to win
    for _ in range(SPLIT_PROBES):
        probe = split_probe(loses, wins)
        if probe is None:
            break
        if wins_at(probe):
            wins = probe
        else:
            loses = probe
    return {**entry, "edges": edges, "from_m": wins}


def split_probe(loses: int, wins: int) -> Optional[int]:
    """Where ``held_across_the_bucket`` times the version next, between an M where it lost and one
    where it won: one row past the middle rounded down to a quarter of the bucket's step (``bucket``:
    3073-4096 in steps of 1024, so 3585 = 28 x 128 + 1). Like the bucket's least M, such an M has just
    begun a tile of every size that divides the quarter, the worst case of a tile's padding, and for
    V6's pairs of 128-row tiles an odd number of tiles (its second CTA idle in the last row): a
    version that wins there wins at the M around it. None where no M lies strictly between."""
    step = max((1 << max(loses.bit_length() - 2, 0)) // 4, 1)  # loses < the bucket's top: its step
    probe = (loses + wins) // 2 // step * step + (1 if step > 1 else 0)
    return probe if loses < probe < wins else None


def _lost(arch: str, entry: Entry, edges: dict, at: int) -> Entry:
    """``entry``'s bucket given to cuBLAS, its version having lost at M = ``at``."""
    kept = {key: value for key, value in entry.items() if key != PROGRAM_DIR}
    vendor = chosen(arch, VENDOR, entry["candidates"][VENDOR], timed_against(entry))
    return {**kept, **vendor, "edges": edges, "lost_at": at}


def host_times(found: list[Candidate], rounds: int = HOST_ROUNDS) -> dict[str, float]:
    """Each candidate's host time per call (of those that measure one): ``rounds`` measurements
    taken in turn, the order reversed every other round, and the least kept."""
    timed = [c for c in found if c.host is not None]
    samples: dict[str, list[float]] = {c.version: [] for c in timed}
    for r in range(rounds):
        for c in timed if r % 2 == 0 else timed[::-1]:
            samples[c.version].append(c.host())
    return {version: min(times) for version, times in samples.items()}


def vendor_launch(m, n, k, a, bt, out, lda, ldb, ldc, bias=0) -> None:
    """cuBLAS behind the kernels' launch signature (the operands as the tuner hands them over; the
    plain variant: no bias)."""
    a, bt = a.as_strided((m, k), (lda, 1)), bt.as_strided((n, k), (ldb, 1))
    c = out.as_strided((m, n), (ldc, 1))
    if c.is_contiguous():
        torch.matmul(a, bt.T, out=c)
    else:  # rows padded to 16 bytes: cuBLAS writes a dense result, copied into the padded rows
        c.copy_(torch.matmul(a, bt.T))


def variant_vendor(a, b, bias, activation: Optional[str]) -> torch.Tensor:
    """cuBLAS's candidate for a variant: a @ b (b [K, N], a view or not) with the bias and the
    activation as ``F.linear`` + the activation run them, into a new output (a copy into the
    kernels' output buffer would be timed with it, and neither torch nor the call pays one)."""
    y = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
    return variants.torch_epilogue(y, None, activation)


# probe(program, a, operand, c, bias, variant): a function that measures the host's time in ms per
# call of the variant's public call (``matmul(a, w.T)``, ``matmul(a, b)`` with b [K, N], or
# ``linear``; operand: B as the kernel reads it) where it launches ``program`` (the compiled launch
# function of a version, writing c; None: cuBLAS). Made by ``child.host_probe``, which knows the call.
HostProbe = Callable[..., Callable[[], float]]


def variant_operands(m: int, n: int, k: int, dtype: torch.dtype, device, variant: Variant):
    """Fresh random operands of ``variant`` (rows padded to 16 bytes): A [M, K]; B as the kernel
    reads it ([N, K], or [K, N] row-major for "kn"); a bias of N values in ``dtype`` or None; and
    the float32 reference of the variant's result, ``out_columns(N)`` columns wide."""
    a, b = random_operands(m, n, k, dtype, device=device)  # b [N, K]
    operand = b
    if variant.b_layout == "kn":
        operand = torch.empty((k, n + (-n) % 8), dtype=dtype, device=device)[:, :n]
        operand.copy_(b.T)
    bias = torch.empty(n, dtype=dtype, device=device).uniform_(-1, 1) if variant.bias else None
    ref = variants.torch_epilogue(reference(a, b), None if bias is None else bias.float(), variant.activation)
    return a, b, operand, bias, ref


def gpu_worker(
    arch: str,
    dtype: torch.dtype,
    m: int,
    n: int,
    k: int,
    device: torch.device,
    variant: Variant = PLAIN,
    probe: Optional[HostProbe] = None,
    configs: Optional[dict] = None,
):
    """The candidates' preparation and timer on the GPU, on fresh random operands of the shape and
    ``variant``. cuBLAS's candidate is torch.matmul followed by the variant's epilogue in torch (what
    a model runs today); a version's is its kernel built for the variant, autotuned by tilus over
    its space, or with the configuration ``configs`` names for it (a narrowed tuning: the chooser's
    ``narrowed``). Host times (``probe``) through the variant's public call (``matmul()`` or ``linear``):
    at decode sizes torch's own call for a row-major B or an epilogue costs its caller more host time
    than its kernels take, which a flushed timing of the kernels alone does not see."""
    a, b, operand, bias, ref = variant_operands(m, n, k, dtype, device, variant)
    out = poisoned_output(m, variant.out_columns(n), dtype, device=device)
    args = versions.launch_args(a, operand, out, bias, variant.b_layout)
    if variant == PLAIN:
        vendor = functools.partial(vendor_launch, *args)
    else:
        vendor_b = b.T if variant.b_layout == "nk" else operand
        vendor = functools.partial(variant_vendor, a, vendor_b, bias, variant.activation)

    vendor_ms = functools.cache(lambda: median_ms(vendor, warmup_ms=20.0, repeat_ms=100.0))

    def prepare(version: str) -> Candidate:
        if version == VENDOR:
            out.fill_(float("nan"))
            result = vendor()  # a variant's: its own output
            host = host_timer(probe, None, a, operand, out, bias, variant, vendor_ms)
            return Candidate(
                version, {}, relative_error(out if result is None else result, ref), vendor, vendor, vendor_ms, host
            )
        module = versions.load(arch, version)
        # None where this variant cannot take the neighbour's configuration (a narrow V5 tile for b [K, N]):
        # the variant's space is searched
        given = space_config(module, (configs or {}).get(version), variant)
        config, fixed = tuned_kernel(module, dtype, variant, args, given)
        out.fill_(float("nan"))
        fixed(*args)
        error = relative_error(out, ref)
        program = functools.partial(tilus_autotune.launch_function, fixed)
        host = host_timer(probe, program, a, operand, out, bias, variant, vendor_ms)
        run = functools.partial(fixed, *args)
        return Candidate(version, config, error, run, vendor, vendor_ms, host, lambda: tilus_autotune.build(fixed))

    return prepare, _gpu_timer


def tuned_kernel(module, dtype: torch.dtype, variant: Variant, args: tuple, config: Optional[dict] = None):
    """The configuration and the kernel of a version for ``variant`` as a tuning candidate: with
    ``config``, or else the point of its space that tilus's autotuner picks for the bucket of
    ``args`` (or has stored for it); the kernel ready for its first call with ``args``."""
    if config is None:
        tuned = versions.kernel(module, dtype, None, variant)
        tilus_autotune.prepare(tuned, args)
        tuned(*args)  # tilus tunes its space for this shape bucket, or reads its stored choice
        config = tilus_autotune.tuned_config(tuned, args)
    fixed = versions.kernel(module, dtype, config, variant)
    tilus_autotune.prepare(fixed, args)
    return config, fixed


HOST_BOUND_MS = 0.1  # kernels longer than cuBLAS's this: the host's time to issue a call cannot matter


def host_timer(
    probe: Optional[HostProbe],
    program: Optional[Callable],
    a,
    operand,
    c,
    bias,
    variant: Variant,
    vendor_ms: Callable[[], float],
) -> Optional[Callable[[], float]]:
    """A function that measures the host's time per call of the variant's public call launching
    ``program()`` (None: cuBLAS) with the call's own path (``probe``; ``operand``: B as the kernel
    reads it); None where there is no probe or the shape's kernels are too long for the host's
    time to matter."""
    if probe is None or a.device.type != "cuda" or vendor_ms() > HOST_BOUND_MS:
        return None
    return probe(None if program is None else program(), a, operand, c, bias, variant)


def _gpu_timer(candidate: Candidate) -> float:
    """The candidate's time in milliseconds at cuBLAS's clock: it is timed in one window with
    cuBLAS, launched in turn (``timing.interleaved_ms``), and its ratio to cuBLAS there scales
    cuBLAS's time. On a power-limited GPU a kernel timed in a window of its own moves by several
    percent with what ran before it; the ratio in a shared window does not (the harness times the
    same way)."""
    if candidate.reference is None:
        return median_ms(candidate.run, warmup_ms=20.0, repeat_ms=100.0)
    ms, reference_ms = interleaved_ms([candidate.run, candidate.reference], warmup_ms=20.0, repeat_ms=100.0)
    return candidate.reference_ms() * ms / reference_ms


# --- the child process ---------------------------------------------------------------------------

DTYPE_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _report(**message) -> None:
    sys.stdout.write(PROTOCOL + json.dumps(message) + "\n")
    sys.stdout.flush()


def _context_is_usable(device: torch.device) -> bool:
    try:
        torch.cuda.synchronize(device)
        return torch.ones(1, device=device).add_(1).item() == 2.0
    except Exception:  # a sticky CUDA error: every later call of this process would fail too
        return False


def child_main(request: dict, probe: Optional[HostProbe] = None) -> None:
    """Tune each job of ``request`` and report its entry; on a fault that leaves the CUDA context
    unusable, report the candidate and exit (the parent starts a new child without it). ``probe``:
    what measures a candidate's host time through the public call (``child.host_probe``). Each step
    that puts the GPU to work waits for the caller to be quiet first (``yielding``)."""
    default_worker = request.get("worker", "matmul.call.tuner:gpu_worker")
    device = torch.device(request["device"])
    dtype = DTYPE_NAMES[request["dtype"]]
    gate = yielding.CallerGate.for_request(request)
    gate.hold_tilus_benchmarks()
    held_before = gate.held_s  # each job reports the waits since the one before it: the first, the context's too
    if device.type == "cuda":
        # creating a CUDA context puts the GPU to work (the driver's, for the whole GPU), so it waits
        # for the caller to pause like every other such step
        gate.wait()
        torch.cuda.set_device(device)
    for job in request["jobs"]:
        # a job may name its own worker: a batch of products is measured by the batched call's
        # (``batched.gpu_worker``), named by the chooser, so that this module need not import it
        module_name, _, function = job.get("worker", default_worker).partition(":")
        worker = getattr(importlib.import_module(module_name), function)
        m, n, k = job["m"], job["n"], job["k"]
        variant = Variant.parse(job.get("variant", ""))
        extra = {} if variant == PLAIN else {"variant": variant}  # a worker may know only the plain call
        if probe is not None and "probe" in inspect.signature(worker).parameters:
            extra["probe"] = probe
        takes_configs = "configs" in inspect.signature(worker).parameters  # a configuration can be fixed
        if job.get("configs") and takes_configs:
            extra["configs"] = job["configs"]
        gate.wait()  # the worker's operands and reference are made on the GPU
        prepare_here, timer = worker(request["arch"], dtype, m, n, k, device, **extra)

        def prepare(version, prepare_here=prepare_here, key=job["key"]):
            _report(key=key, preparing=version)
            gate.wait()
            try:
                candidate = prepare_here(version)
            except Exception:
                if device.type == "cuda" and not _context_is_usable(device):
                    _report(key=key, fault=version)
                    os._exit(3)
                raise
            if candidate.host is not None:
                candidate.host = gate.before(candidate.host)
            return candidate

        entry = tune(
            request["arch"],
            dtype,
            prepare,
            gate.before(timer),
            names=job["names"],
            label=job["key"],
            rejected=job.get("rejected"),
        )
        if takes_configs:  # the winner, in its configuration, against cuBLAS at the bucket's edges
            tune_at = functools.partial(_tune_at, request, dtype, device, gate, worker, extra, entry, n, k)
            entry = held_across_the_bucket(request["arch"], entry, m, tune_at)
        if job.get("narrowed_from"):
            entry["narrowed_from"] = job["narrowed_from"]  # timed among the neighbour's close candidates only
        entry["yielded_s"] = round(gate.held_s - held_before, 3)  # waited for the caller to be quiet
        held_before = gate.held_s
        _report(key=job["key"], entry=entry)


def _tune_at(request, dtype, device, gate, worker, extra, entry, n: int, k: int, m: int) -> Entry:
    """``held_across_the_bucket``'s check: the chosen version, in its configuration, tuned against
    cuBLAS at M = ``m`` on operands of its own."""
    gate.wait()
    fixed = {**extra, "configs": {entry["version"]: entry["config"]}}
    prepare, timer = worker(request["arch"], dtype, m, n, k, device, **fixed)
    names = [entry["version"], VENDOR]
    return tune(request["arch"], dtype, prepare, gate.before(timer), names=names, label=f"M={m}x{n}x{k}")


class TuningError(RuntimeError):
    """Tuning in the child process failed for a reason other than a faulting candidate."""


# The caller's calls come first on a busy CPU: a child imports torch, tilus and this package (seconds
# of a core), builds kernels (tilus, then nvcc on as many cores as it gets), and a caller's thread
# descheduled meanwhile pays milliseconds on its calls (plots/h100/first-calls/). The parent lowers
# the child's priority as it starts it, so that its imports run below the caller too; the compilers
# it starts inherit it.
NICENESS = 10


def _lower_priority(pid: int) -> None:
    """The child ``pid`` at ``NICENESS`` below this process (where allowed; else at its priority)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(os.getpriority(os.PRIO_PROCESS, 0) + NICENESS, 19))
    except OSError:  # not allowed here, or the child is gone already
        pass


def run_child(
    request: dict, on_message: Callable[[dict], None], timeout_s: float, log_chars: int, **popen
) -> tuple[int, str]:
    """Run the child process (``python -m matmul.call.child``) on ``request``, sent as JSON on its
    stdin, handing each message it reports on stdout (a line starting with ``PROTOCOL``; the others
    are the kernels' build output) to ``on_message`` as it arrives; the child is killed after
    ``timeout_s``. Its exit code and the last ``log_chars`` of its stderr. ``popen``: more of
    ``subprocess.Popen``'s arguments (``env``, ``pass_fds``)."""
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "matmul.call.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            **popen,
        )
        _lower_priority(process.pid)
        timer = threading.Timer(timeout_s, process.kill)
        timer.start()
        try:
            process.stdin.write(json.dumps(request))
            process.stdin.close()
            for line in process.stdout:
                if line.startswith(PROTOCOL):
                    on_message(json.loads(line[len(PROTOCOL) :]))
            code = process.wait()
        finally:
            timer.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
        stderr.seek(0)
        return code, stderr.read()[-log_chars:]


def tune_in_child(
    arch: str,
    dtype: torch.dtype,
    device: torch.device,
    jobs: list[dict],
    worker: str = "matmul.call.tuner:gpu_worker",
    on_entry: Callable[[str, Entry], None] = None,
    timeout_s: float = CHILD_TIMEOUT_S,
) -> dict[str, Entry]:
    """Tune ``jobs`` (dicts of key, m, n, k, the candidate ``names`` and optionally the
    ``variant``'s key) in child processes; the
    entries by key, each handed to ``on_entry`` as it arrives. A candidate that kills its child (or
    leaves its CUDA context unusable) is rejected for that job, and a new child tunes the rest.
    The child inherits this process's word of its last call (``yielding``) and puts the GPU to work
    only while the calls pause."""
    pending = [dict(job, rejected=dict(job.get("rejected", {}))) for job in jobs]
    entries: dict[str, Entry] = {}
    last_call = yielding.shared_fd()
    while pending:
        request = {
            "arch": arch,
            "dtype": str(dtype).removeprefix("torch."),
            "device": str(device),
            "worker": worker,
            "jobs": pending,
        }
        if last_call is not None:  # the child waits for this process's calls to pause (``yielding``)
            request[yielding.REQUEST_FIELD] = last_call
        preparing: dict[str, str] = {}

        def on_message(message, preparing=preparing):
            key = message["key"]
            if "preparing" in message:
                preparing[key] = message["preparing"]
            elif "entry" in message:
                entries[key] = message["entry"]
                preparing.pop(key, None)
                if on_entry is not None:
                    on_entry(key, message["entry"])

        code, log = run_child(
            request, on_message, timeout_s, log_chars=3000, pass_fds=() if last_call is None else (last_call,)
        )
        pending = [job for job in pending if job["key"] not in entries]
        if not pending:
            break
        if code == 0 or not preparing:  # no candidate to blame: a bug or an environment problem
            raise TuningError(
                f"tuning {pending[0]['key']} in a child process failed (exit code {code}); its output ends with:\n{log}"
            )
        for job in pending:  # blame the candidate the child was preparing when it died
            culprit = preparing.get(job["key"])
            if culprit is not None:
                job["rejected"][culprit] = (
                    f"faulted: the child process tuning it died (exit code {code}) or lost its CUDA context"
                )
                job["names"] = [v for v in job["names"] if v != culprit]
    return entries
