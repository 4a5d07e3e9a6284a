"""First calls as a new machine meets them: ``python -m matmul trace``.

A seeded trace of calls with random token counts M in [1, ``MAX_M``] over the extended LLM preset's
projections (``model.PROJECTIONS``), both dtypes, each ``matmul(x, w.T)`` on fresh activations, in a
process whose cache directory starts empty. Every call is timed as the caller waits for it (host
time, the choice, any wait, the kernel), and ``torch.matmul`` on the same operands right after or
before (alternating), each call with its own ratio. Three clocks (``timed``): CUDA events around it
on the current stream, the host until that stream is done, and the host until the device is
(``device_ms``: a device-wide synchronize also charges another thread's GPU work to the call, so
where only it is slow, the cost was not the call's). The trace runs again once the background work
it started has finished (``settle``: deferred plans, tuning, builds, each call's plan derived and run
once untimed), so the second pass times the tuned choices; its pairs are timed in both orders.

The first pass's pairs charge a first use of a kernel (loaded at its first launch; a new shape's
cuBLAS setup) to whichever runs first. So each library also runs the trace alone in a fresh
process (``first_use``, each call twice): ``torch.matmul`` in one that imports nothing of this
package, ``matmul()`` in one with an empty cache (``alone_against_alone``). Two fresh torch
processes differ widely on some first calls, so ``alternating`` runs several fresh processes of
each library in turn and compares the median first calls. Also the first forward pass of
``model.Block`` through ``matmul()`` against ``torch.matmul``, each in a new process.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import torch

from ..call.choice_cache import default_dir
from ..measure.timing import waited_ms
from . import first_use
from . import model as model_bench
from .first_use import timed

CALLS = 300
MAX_M = 8192
SEED = 0
FORMAT = "tilus-matmul-trace/1"


def the_trace(calls: int = CALLS, seed: int = SEED) -> list[tuple[str, str, int, int, int]]:
    """(dtype, projection, M, N, K) of each call: seeded, both dtypes."""
    rng = random.Random(seed)
    names = list(model_bench.PROJECTIONS)
    out = []
    for i in range(calls):
        name = rng.choice(names)
        n, k = model_bench.PROJECTIONS[name]
        out.append(("float16" if i % 2 == 0 else "bfloat16", name, rng.randint(1, MAX_M), n, k))
    return out


TIMINGS = {  # a row's field of each timing (``timed``), for the summaries
    "event": "event_ms",  # CUDA events on the current stream
    "stream": "stream_ms",  # the host until the current stream has finished the call
    "device": "device_ms",  # the host until the whole device has (every stream of the process)
}


def _busy() -> dict:
    """Which of the caller's background workers has work queued or under way."""
    from matmul.call import api

    chooser = api._chooser
    return {
        "planner": api._plans.planner.busy(),
        "tuner": chooser.tuner.busy(),
        "builder": chooser.builder.busy(),
        "loaded": len(chooser.programs),  # kernels loaded so far: one more, and a first launch is near
        "threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
        "switch_interval_s": sys.getswitchinterval(),
    }


def _both_orders(ours, theirs, matmul_first: bool) -> tuple[dict, dict]:
    """Each of ``ours`` and ``theirs`` timed twice, in the order ours-theirs-theirs-ours (or the
    reverse), after one untimed call of each: each side's timings averaged (``timed``'s fields),
    the single ones kept under ``each``. The call timed first after the harness's own work (new
    activations, Python between calls) takes longer than the three after it, on either side
    (plots/h100/first-calls/); with a call of each before it and each side in every position once,
    that cost falls on neither."""
    for call in (ours, theirs) if matmul_first else (theirs, ours):
        call()
    if matmul_first:
        o1, t1, t2, o2 = timed(ours), timed(theirs), timed(theirs), timed(ours)
    else:
        t1, o1, o2, t2 = timed(theirs), timed(ours), timed(ours), timed(theirs)
    averaged = [f for f in o1 if f.endswith("_ms")]  # the timings, not the clock readings (begin_s, issued_s)
    sides = ((o1, o2), (t1, t2))
    return tuple({**{f: (one[f] + two[f]) / 2 for f in averaged}, "each": [one, two]} for one, two in sides)


def run_trace(trace, weights, both_orders: bool = False) -> list[dict]:
    """Each call of ``trace`` timed against ``torch.matmul`` on the same operands, the order of the
    pair alternating; with ``both_orders`` (the second pass, where no call is a first one), each
    pair timed in both orders (``_both_orders``)."""
    import matmul

    rows = []
    for i, (dtype, name, m, n, k) in enumerate(trace):
        w = weights[(dtype, name)]
        x = torch.randn(m, k, device="cuda", dtype=w.dtype)
        ours = functools.partial(matmul.matmul, x, w.T)
        theirs = functools.partial(torch.matmul, x, w.T)
        # the result's size may be new to torch's caching allocator: the first of the two calls
        # would pay its cudaMalloc and the second reuse the freed block
        _ = torch.empty((m, n), device="cuda", dtype=w.dtype)
        del _
        busy = _busy()
        if both_orders:
            ours_t, theirs_t = _both_orders(ours, theirs, matmul_first=i % 2 == 0)
        elif i % 2 == 0:
            ours_t, theirs_t = timed(ours), timed(theirs)
        else:
            theirs_t, ours_t = timed(theirs), timed(ours)
        entry = matmul.choice(x, w.T)
        row = dict(dtype=dtype, name=name, m=m, n=n, k=k, first="matmul" if i % 2 == 0 else "torch")
        for field in ("event_ms", "host_ms", "stream_ms", "device_ms"):
            row[f"matmul_{field}"], row[f"torch_{field}"] = ours_t[field], theirs_t[field]
        # matmul_ms, torch_ms and ratio: the device-wide synchronize's timing
        row.update(matmul_ms=ours_t["device_ms"], torch_ms=theirs_t["device_ms"])
        row["ratio"] = ours_t["device_ms"] / theirs_t["device_ms"]
        row["event_ratio"] = ours_t["event_ms"] / theirs_t["event_ms"]
        row["stream_ratio"] = ours_t["stream_ms"] / theirs_t["stream_ms"]
        row.update({key: entry.get(key) for key in ("version", "source", "building", "below", "pending")})
        row["busy_before"] = busy
        if both_orders:
            row.update(matmul_each=ours_t["each"], torch_each=theirs_t["each"])
        rows.append(row)
    return rows


def settle(trace, weights, timeout_s: float) -> bool:
    """Wait for the background work the calls started (``timeout_s`` at most, in all), then derive
    each call's plan and run it once, untimed; whether the work finished. A tuning's result drops
    the plans derived before it, so the next call of each signature would run cuBLAS while its
    plan is derived again, and a kernel chosen since would pay its first launch (the CUDA runtime
    loads it into the context then): derived and run here, the second pass meets what a process
    that has met its buckets since meets."""
    import matmul
    from matmul.call import api

    plans = api._plans
    finished = plans.wait_for_background(timeout_s)
    for dtype, name, m, _, k in trace:
        w = weights[(dtype, name)]
        x = torch.randn(m, k, device="cuda", dtype=w.dtype)
        plans.plan_for(x, w.T)
        matmul.matmul(x, w.T)
    torch.cuda.synchronize()
    return finished


def summary(rows: list[dict], field: str = "device_ms") -> dict:
    """The ratios of one timing (a ``TIMINGS`` field): how many calls over one and a half times torch's, the worst,
    the median, the totals; and where the choices came from."""
    ours, theirs = [r[f"matmul_{field}"] for r in rows], [r[f"torch_{field}"] for r in rows]
    ratios = [o / t for o, t in zip(ours, theirs)]
    return {
        "timing": field,
        "calls": len(rows),
        "worst_ratio": max(ratios),
        "median_ratio": statistics.median(ratios),
        "over_1.5x": sum(r > 1.5 for r in ratios),
        "total_matmul_ms": sum(ours),
        "total_torch_ms": sum(theirs),
        "total_ratio": sum(ours) / sum(theirs),  # below 1: matmul() faster
        "sources": {s: sum(r["source"] == s for r in rows) for s in {r["source"] for r in rows}},
    }


def summaries(rows: list[dict]) -> dict:
    """``summary`` by each timing."""
    return {name: summary(rows, field) for name, field in TIMINGS.items()}


def first_block(dtype, through: str) -> dict:
    """The first forward pass of ``model.Block`` at 1 x 128 tokens ``through`` "matmul" or "torch",
    then a second one: each in a process of its own (``block_child``), since whichever ran first
    in one process would load the kernels (cuBLAS's, attention's) that the other then finds."""
    torch.manual_seed(SEED)
    if through == "matmul":
        import matmul

        product = lambda x, w: matmul.matmul(x, w.T)  # noqa: E731
    else:
        product = lambda x, w: torch.matmul(x, w.T)  # noqa: E731
    block = model_bench.Block(product, dtype=dtype)
    x = torch.randn(1, 128, 4096, device="cuda", dtype=dtype)
    first = waited_ms(lambda: block(x))
    return {"first_ms": first, "second_ms": waited_ms(lambda: block(x))}


def block_child(through: str) -> int:
    torch.matmul(torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda"))  # CUDA and cuBLAS up
    print(json.dumps(first_block(torch.float16, through)), flush=True)
    return 0


def blocks_first(env: dict) -> dict:
    """``first_block`` through matmul() and through torch.matmul, each in a new process (``env``: an
    empty cache directory), and their ratio."""
    found = {}
    for through in ("torch", "matmul"):
        code = f"from matmul.harness import trace; raise SystemExit(trace.block_child({through!r}))"
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": f"{through}: {done.stderr[-2000:]}"}
        found[through] = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "matmul_first_ms": found["matmul"]["first_ms"],
        "torch_first_ms": found["torch"]["first_ms"],
        "ratio": found["matmul"]["first_ms"] / found["torch"]["first_ms"],
        "matmul_second_ms": found["matmul"]["second_ms"],
        "torch_second_ms": found["torch"]["second_ms"],
    }


def child(out: Path, calls: int, wait_s: float = 1800.0) -> int:
    """The measurement itself, in a process whose cache directory started empty."""
    import matmul
    from matmul.call import api

    trace = the_trace(calls)
    weights = first_use.trace_weights(SEED, model_bench.PROJECTIONS)
    results: dict = {"format": FORMAT, "gpu": torch.cuda.get_device_name(), "mode": api._chooser.mode}
    begin = time.perf_counter()
    results["first"] = run_trace(trace, weights)
    results["first_summary"] = summaries(results["first"])
    finished = settle(trace, weights, wait_s)
    results["background_s"] = time.perf_counter() - begin
    results["background_finished"] = finished
    results["again"] = run_trace(trace, weights, both_orders=True)
    results["again_summary"] = summaries(results["again"])
    results["matmul_version"] = getattr(matmul, "__version__", None)
    out.write_text(json.dumps(results, indent=1))
    for part in ("first_summary", "again_summary"):
        for timing, found in results[part].items():
            print(part, timing, json.dumps(found), flush=True)
    return 0


@contextlib.contextmanager
def fresh_cache_env(prefix: str, native_entry: bool = False):
    """This process's environment with an empty ``MATMUL_CACHE_DIR`` of its own (removed afterwards)
    and no ``TILUS_CACHE_DIR``, so that tilus's cache follows it: a process started with it meets
    what a new machine meets. ``native_entry``: but with the native entry this process built (if it
    did) copied in, so that a process started with it does not build it again at its import: a
    build that happens before its first call, by which no call's time changes."""
    with tempfile.TemporaryDirectory(prefix=prefix) as cache:
        built = default_dir() / "entry"
        if native_entry and built.is_dir():
            shutil.copytree(built, Path(cache) / "entry")
        env = dict(os.environ, MATMUL_CACHE_DIR=cache)
        env.pop("TILUS_CACHE_DIR", None)
        yield env


def alone(through: str, calls: int, env: Optional[dict] = None) -> dict:
    """``first_use`` over the trace in a fresh process, through "torch" or "matmul" (``env``: its
    environment; matmul()'s with an empty cache directory): each call's rows, and by each timing
    how many first calls took over one and a half times the second and the median of the first's excess."""
    request = {"through": through, "seed": SEED, "projections": model_bench.PROJECTIONS, "trace": the_trace(calls)}
    done = subprocess.run(
        [sys.executable, first_use.__file__], input=json.dumps(request), capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    found = {}
    for name, field in TIMINGS.items():
        excess = [r["first"][field] - r["second"][field] for r in rows]
        found[name] = {
            "first_over_1.5x_second": sum(r["first"][field] > 1.5 * r["second"][field] for r in rows),
            "median_first_excess_ms": statistics.median(excess),
            "first_excess_over_1ms": sum(e > 1.0 for e in excess),
        }
    return {"summary": found, "rows": rows}


def torch_alone(calls: int) -> dict:
    """``alone`` through torch.matmul, in a process that imports nothing of this package."""
    return alone("torch", calls)


def matmul_alone(calls: int, native_entry: bool = False, settings: Optional[dict] = None) -> dict:
    """``alone`` through matmul(), in a process whose cache directory starts empty (``native_entry``:
    but for the native entry, ``fresh_cache_env``), with ``settings`` added to its environment."""
    with fresh_cache_env("matmul-alone-", native_entry) as env:
        return alone("matmul", calls, {**env, **(settings or {})})


REPEATS = 5


def alternating(calls: int, repeats: int = REPEATS, ways: Optional[dict[str, dict]] = None) -> dict:
    """torch alone and matmul() alone over the trace, ``repeats`` fresh processes of each, started in
    turn (torch, matmul(), torch, ...), and their first calls compared across processes
    (``across_processes``). ``ways``: more matmul() processes in each turn, each with its settings
    in its environment (name: {variable: value}), each compared with the same torch processes
    (``ways`` in the result: one run measures a setting against the default).

    Why: a process's first calls are a draw. Two fresh torch processes, nothing else on the machine,
    differ widely on some of the trace's first calls (plots/h100/first-calls/): in some processes
    most of the trace's first uses of a cuBLAS kernel cost far more than in others. One process of
    each library compares two draws; the median over several processes of each compares the
    libraries. A process that fails (its stderr's end under ``failed``) is left
    out of the comparison, which needs two processes of each that finished."""
    ways = ways or {}
    runs = {"torch": [], "matmul": [], **{name: [] for name in ways}}
    for _ in range(repeats):
        runs["torch"].append(torch_alone(calls))
        runs["matmul"].append(matmul_alone(calls, native_entry=True))
        for name, settings in ways.items():
            runs[name].append(matmul_alone(calls, native_entry=True, settings=settings))
    failed = {lib: [r["error"] for r in found if "error" in r] for lib, found in runs.items()}
    rows = {lib: [_slim(r["rows"]) for r in found if "error" not in r] for lib, found in runs.items()}
    if min(len(kept) for kept in rows.values()) < 2:  # a median of the others needs two of each
        return {"error": failed}

    def compared(name: str) -> dict:
        return {timing: across_processes(rows[name], rows["torch"], field) for timing, field in TIMINGS.items()}

    found = {
        "repeats": repeats,
        "rows": {lib: rows[lib] for lib in ("torch", "matmul")},
        "across_processes": compared("matmul"),
    }
    if any(failed.values()):  # compared over the processes that finished; what the others said, kept
        found["failed"] = {lib: errors for lib, errors in failed.items() if errors}
    if ways:
        found["ways"] = {
            name: {"settings": settings, "rows": rows[name], "across_processes": compared(name)}
            for name, settings in ways.items()
        }
    return found


def _slim(rows: list[dict]) -> list[dict]:
    """A process's rows without the clock readings (``alternating`` keeps ten processes' rows)."""
    kept, timings = ("dtype", "name", "m", "n", "k", "version", "source"), (*TIMINGS.values(), "host_ms")
    return [
        {
            **{f: row[f] for f in kept if f in row},
            **{c: {f: v for f, v in row[c].items() if f in timings} for c in ("first", "second")},
        }
        for row in rows
    ]


def across_processes(ours: list[list[dict]], theirs: list[list[dict]], field: str = "event_ms") -> dict:
    """matmul()'s first calls against torch's, over several fresh processes of each (``alone``'s
    rows, one list a process): call by call, the median of matmul()'s processes against the median
    of torch's (``median_against_median``, ``summary``'s form); and how many first calls of each
    single process took over one and a half times the median of torch's processes (each torch process against the
    median of the others): what one process against another can show."""

    def first(runs: list[list[dict]], i: int) -> list[float]:
        return [run[i]["first"][field] for run in runs]

    calls = len(theirs[0])
    for run in ours + theirs[1:]:
        for row, other in zip(run, theirs[0], strict=True):
            _same_call(row, other)
    torch_median = [statistics.median(first(theirs, i)) for i in range(calls)]
    rows = [
        {
            "source": statistics.mode(run[i].get("source") for run in ours),
            f"matmul_{field}": statistics.median(first(ours, i)),
            f"torch_{field}": torch_median[i],
        }
        for i in range(calls)
    ]

    def over(run: list[dict], medians: list[float]) -> int:
        return sum(row["first"][field] > 1.5 * median for row, median in zip(run, medians))

    torch_single = []
    for j, run in enumerate(theirs):
        others = theirs[:j] + theirs[j + 1 :]
        torch_single.append(over(run, [statistics.median(first(others, i)) for i in range(calls)]) if others else None)
    return {
        "median_against_median": summary(rows, field),
        "each_matmul_over_1.5x_torch_median": [over(run, torch_median) for run in ours],
        "each_torch_over_1.5x_the_others_median": torch_single,
    }


def alone_against_alone(ours: list[dict], theirs: list[dict], call: str = "first", field: str = "event_ms") -> dict:
    """``summary`` of matmul() alone against torch.matmul alone (``alone``'s rows of each), call by
    call: each one's ``call`` ("first": the trace's call as a new process meets it; "second": the
    same operands right after). Each process pays its own first uses, and only its own."""
    rows = []
    for mine, other in zip(ours, theirs, strict=True):
        _same_call(mine, other)
        rows.append(
            {
                "source": mine.get("source"),
                f"matmul_{field}": mine[call][field],
                f"torch_{field}": other[call][field],
            }
        )
    return summary(rows, field)


def _same_call(row: dict, other: dict) -> None:
    """Two rows compared must be the same call of the same trace."""
    if (row["dtype"], row["name"], row["m"]) != (other["dtype"], other["name"], other["m"]):
        raise ValueError(f"the traces differ: {row['name']} M={row['m']} against {other['name']} M={other['m']}")


def against_alone(rows: list[dict], alone: list[dict], field: str = "event_ms") -> dict:
    """``summary`` of the trace's matmul() calls against torch.matmul alone (``torch_alone``'s rows)
    at the same place of the same trace: against torch's first call where matmul() was timed first
    in its pair, its second where torch went first. Each then meets a process that has used the
    same kernels before, so a first use of a kernel is paid on both sides or on neither."""
    paired = []
    for row, other in zip(rows, alone):
        _same_call(row, other)
        torch_call = other["first" if row["first"] == "matmul" else "second"]
        paired.append({**row, f"torch_{field}": torch_call[field]})
    return summary(paired, field)


PARTS = ("block", "trace", "torch_alone", "matmul_alone", "alternating")


def main(
    out_dir: Path,
    calls: int = CALLS,
    wait_s: float = 1800.0,
    parts=PARTS,
    repeats: int = REPEATS,
    ways: Optional[dict[str, dict]] = None,
) -> int:
    """``parts``: the block's first forward pass, the trace (both passes), torch alone over the
    trace, matmul() alone over it (a run on a machine with a time limit may keep only some). The
    processes alone run last: matmul() alone leaves its background tuning unfinished when it exits."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    code = 0
    if "block" in parts:
        with fresh_cache_env("matmul-block-") as env:
            block = blocks_first(env)
        (out_dir / "block_first.json").write_text(json.dumps(block, indent=1))
        print("block_first", json.dumps(block), flush=True)
    if "trace" in parts:
        with fresh_cache_env("matmul-trace-") as env:
            target = str(out_dir / "trace.json")
            script = "import pathlib, sys; from matmul.harness import trace; "
            script += "raise SystemExit(trace.child(pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))"
            code = subprocess.call([sys.executable, "-c", script, target, str(calls), str(wait_s)], env=env)
    if "torch_alone" in parts:
        torch_alone_part(out_dir, calls)
    if "matmul_alone" in parts:
        matmul_alone_part(out_dir, calls)
    if "alternating" in parts:
        alternating_part(out_dir, calls, repeats, ways)
    return code


def torch_alone_part(out_dir: Path, calls: int) -> None:
    """``torch_alone`` over the trace, and the trace's first pass against it where trace.json exists."""
    found = torch_alone(calls)
    if "rows" in found and (out_dir / "trace.json").exists():
        first = json.loads((out_dir / "trace.json").read_text())["first"]
        against = {name: against_alone(first, found["rows"], field) for name, field in TIMINGS.items()}
        found["against_first_pass"] = against
    (out_dir / "torch_alone.json").write_text(json.dumps(found, indent=1))
    print("torch_alone", json.dumps(found.get("summary", found)), flush=True)
    for timing, summarized in found.get("against_first_pass", {}).items():
        print("first pass against torch alone", timing, json.dumps(summarized), flush=True)


def matmul_alone_part(out_dir: Path, calls: int) -> None:
    """``matmul_alone`` over the trace, and against torch alone where torch_alone.json exists."""
    found = matmul_alone(calls)
    theirs = out_dir / "torch_alone.json"
    if "rows" in found and theirs.exists() and "rows" in (torch_rows := json.loads(theirs.read_text())):
        ours, theirs_rows = found["rows"], torch_rows["rows"]
        found["against_torch_alone"] = {
            call: {name: alone_against_alone(ours, theirs_rows, call, field) for name, field in TIMINGS.items()}
            for call in ("first", "second")
        }
    (out_dir / "matmul_alone.json").write_text(json.dumps(found, indent=1))
    print("matmul_alone", json.dumps(found.get("summary", found)), flush=True)
    for call, by_timing in found.get("against_torch_alone", {}).items():
        for timing, summarized in by_timing.items():
            print(f"matmul alone against torch alone, {call} calls", timing, json.dumps(summarized), flush=True)


def alternating_part(out_dir: Path, calls: int, repeats: int, ways: Optional[dict[str, dict]] = None) -> None:
    """``alternating`` over the trace: alternating.json, and its comparisons printed."""
    found = alternating(calls, repeats, ways)
    (out_dir / "alternating.json").write_text(json.dumps(found))
    for lib, errors in found.get("failed", {}).items():
        print(f"alternating: {len(errors)} of the {lib} processes failed, compared without them:", errors, flush=True)
    for timing, compared in found.get("across_processes", found).items():
        print("alternating", timing, json.dumps(compared), flush=True)
    for name, way in found.get("ways", {}).items():
        for timing, compared in way["across_processes"].items():
            print("alternating", name, timing, json.dumps(compared), flush=True)
