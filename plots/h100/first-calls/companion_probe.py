"""What in a tuning child's start slows the caller's first calls? torch.matmul alone over the
first-calls trace (``matmul.harness.first_use``, the process imports nothing of the package), with
a *companion* process started just before the trace's third call, as matmul() starts its tuning
child at the first unseen bucket. Each companion does one more of what the child's start does:

* ``none``: no companion (torch alone, as ``trace --parts torch_alone``);
* ``python``: an interpreter that imports nothing and sleeps;
* ``torch``: ``import torch``;
* ``driver``: ``import torch`` and the CUDA driver's initialization (``cudaGetDeviceCount``, cuInit);
* ``context``: ``import torch`` and a CUDA context on the GPU (a one-element tensor);
* ``child``: the tuning child's own imports (``matmul.call.child``, tilus and its fixes), no CUDA;
* ``child_nice``: the same at niceness 10 from its first instruction (``child.NICENESS``);
* ``child_idle``: the same under ``SCHED_IDLE`` (it runs only on a CPU nothing else wants).

Each companion writes its milestones (``time.perf_counter``, the clock ``first_use`` stamps its
calls with, CLOCK_MONOTONIC for every process of the machine) to a file, then sleeps until the
traced process is over. A row per run: how many first calls took over 1.5x, and over 1.5x the same call of
the first ``none`` run; where the companion's milestones fall among the calls.

    python plots/h100/first-calls/companion_probe.py OUT_DIR [--repeats 2] [--kinds none,python,...]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from matmul.harness import first_use, trace
from matmul.harness import model as model_bench

COMPANIONS = {
    "none": None,
    "python": "",
    "torch": "import torch",
    "driver": "import torch; torch._C._cuda_getDeviceCount()",
    "context": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "child": "import matmul.call.child",
    "child_nice": "import os; os.nice(10); import matmul.call.child",
    "child_idle": "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)); import matmul.call.child",
}

COMPANION = """
import os, sys, time
parent = os.getppid()
marks = [("started", time.perf_counter())]
{work}
marks.append(("ready", time.perf_counter()))
open(sys.argv[1], "w").write(repr(marks))
while os.getppid() == parent:  # until the traced process is over
    time.sleep(0.1)
"""

# run inside first_use's process: start the companion before the trace's call number ``at``
DRIVER = """
import json, subprocess, sys, time
sys.argv = [sys.argv[0]] + sys.argv[1:]
spec = json.loads(sys.argv[1])
import importlib.util
loaded = importlib.util.spec_from_file_location("first_use", spec["first_use"])
first_use = importlib.util.module_from_spec(loaded)
loaded.loader.exec_module(first_use)
plain = first_use.timed
count = [0]
def timed(fn):
    if spec["code"] is not None and count[0] == 2 * spec["at"]:
        spec["spawned_s"] = time.perf_counter()
        spec["process"] = subprocess.Popen([sys.executable, "-c", spec["code"], spec["marks"]])
        open(spec["marks"] + ".spawn", "w").write(repr(spec["spawned_s"]))
    count[0] += 1
    return plain(fn)
first_use.timed = timed
raise SystemExit(first_use.main())
"""


def run(kind: str, calls: int, at: int, workdir: Path) -> dict:
    request = {
        "through": "torch",
        "seed": trace.SEED,
        "projections": model_bench.PROJECTIONS,
        "trace": trace.the_trace(calls),
    }
    marks = workdir / f"{kind}-{os.getpid()}-{len(list(workdir.iterdir()))}.marks"
    code = None if COMPANIONS[kind] is None else COMPANION.format(work=COMPANIONS[kind])
    spec = {"first_use": first_use.__file__, "code": code, "at": at, "marks": str(marks)}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(spec)], input=json.dumps(request), capture_output=True, text=True
    )
    if done.returncode != 0:
        return {"kind": kind, "error": done.stderr[-2000:]}
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    found = {"kind": kind, "rows": rows}
    if code is not None:
        found["spawned_s"] = float(Path(str(marks) + ".spawn").read_text())
        found["marks"] = eval(marks.read_text()) if marks.exists() else None  # noqa: S307 (our own file)
    return found


def compare(run: dict, base: dict) -> dict:
    rows, other = run["rows"], base["rows"]
    ratios = [r["first"]["event_ms"] / o["first"]["event_ms"] for r, o in zip(rows, other)]
    over = [i for i, x in enumerate(ratios) if x > 1.5]
    t0 = rows[0]["first"]["begin_s"]
    where = {}
    if run.get("marks"):
        for name, t in [("spawned", run["spawned_s"])] + list(run["marks"]):
            where[name] = round(t - t0, 3)
    return {
        "kind": run["kind"],
        "over_1.5x_base": len(over),
        "calls_over": over[:40],
        "total_ms": round(sum(r["first"]["event_ms"] for r in rows), 1),
        "base_total_ms": round(sum(r["first"]["event_ms"] for r in other), 1),
        "marks_s_from_trace_start": where,
        "burst_calls_17_35_ms": round(sum(r["first"]["event_ms"] for r in rows[17:36]), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(COMPANIONS))
    parser.add_argument("--calls", type=int, default=trace.CALLS)
    parser.add_argument("--at", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kinds = args.kinds.split(",")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for kind in kinds:
                runs.append(run(kind, args.calls, args.at, Path(tmp)))
                print(kind, "error" if "error" in runs[-1] else "done", flush=True)
    base = next(r for r in runs if r["kind"] == "none" and "error" not in r)
    table = [compare(r, base) for r in runs if "error" not in r]
    for row in table:
        print(json.dumps(row), flush=True)
    (args.out / "companion_probe.json").write_text(json.dumps({"runs": runs, "table": table}))
    errors = [r for r in runs if "error" in r]
    for r in errors:
        print(r["kind"], r["error"], file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
