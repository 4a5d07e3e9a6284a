"""Does the planner's derivation of an unseen call's plan, on its own thread while the caller's
first call of the signature runs, cost that call its excess over torch's first call?

matmul() alone over the first-calls trace (``matmul.harness.first_use``, each call twice, fresh
processes with an empty cache directory but for the native entry), two ways, in turn:

* ``normal``: as a user meets it (the planner derives each unseen call's plan at once);
* ``held``: the planner's thread holds every derivation until the trace is over, so that no
  derivation overlaps a call (every call of the trace runs cuBLAS through the native entry's miss
  path, its plan not yet derived);

and torch alone between them. Per process: its rows, and the planner's time per derivation. A row per
call of the result compares each way's median first call with torch's median.

    python plots/h100/first-calls/planner_probe.py OUT_DIR [--repeats 3]

It reaches into the planner's thread (``Plans.planner``, ``_derive_deferred``). 2b2761c derived the
plans on the caller's thread instead, once a call's cuBLAS kernel was launched; measured worse (28
first calls over 1.5x torch's median, against 8), it was reverted.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from matmul.harness import first_use, trace
from matmul.harness import model as model_bench

DRIVER = """
import json, sys, threading, time
spec = json.loads(sys.argv[1])
import importlib.util
loaded = importlib.util.spec_from_file_location("first_use", spec["first_use"])
first_use = importlib.util.module_from_spec(loaded)
loaded.loader.exec_module(first_use)
from matmul.call import api
plans = api._plans
derive = plans._derive_deferred
spent, release = [], threading.Event()
if spec["mode"] != "held":
    release.set()
def timed_derive(group, payloads):
    release.wait()
    begin = time.perf_counter()
    derive(group, payloads)
    spent.append((begin, time.perf_counter() - begin, len(payloads)))
plans.planner.run = timed_derive
plain, count = first_use.timed, [0]
def timed(fn):
    count[0] += 1
    found = plain(fn)
    if count[0] == spec["timed_calls"]:
        release.set()
    return found
first_use.timed = timed
code = first_use.main()
open(spec["spent"], "w").write(json.dumps(spent))
raise SystemExit(code)
"""


def run_matmul(mode: str, calls: int, spent: Path) -> dict:
    request = {"through": "matmul", "seed": trace.SEED, "projections": model_bench.PROJECTIONS}
    request["trace"] = trace.the_trace(calls)
    spec = {"first_use": first_use.__file__, "mode": mode, "timed_calls": 2 * calls, "spent": str(spent)}
    with trace.fresh_cache_env("planner-probe-", native_entry=True) as env:
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, json.dumps(spec)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=env,
        )
    if done.returncode != 0:
        return {"mode": mode, "error": done.stderr[-2000:]}
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return {"mode": mode, "rows": trace._slim(rows), "derivations": json.loads(spent.read_text())}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=trace.CALLS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {"torch": [], "normal": [], "held": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in ("normal", "held"):
                found = trace.torch_alone(args.calls)
                runs["torch"].append({"rows": trace._slim(found["rows"])} if "rows" in found else found)
                runs[mode].append(run_matmul(mode, args.calls, Path(tmp) / f"{mode}-{i}.json"))
                print(mode, i, "error" if "error" in runs[mode][-1] else "done", flush=True)
    errors = [r for found in runs.values() for r in found if "error" in r]
    if errors:
        print(json.dumps(errors)[-4000:], file=sys.stderr)
        return 1
    torch_rows = [r["rows"] for r in runs["torch"]]
    table = {}
    for mode in ("normal", "held"):
        ours = [r["rows"] for r in runs[mode]]
        compared = {name: trace.across_processes(ours, torch_rows, field) for name, field in trace.TIMINGS.items()}
        host = [
            statistics.median(run[i]["first"]["host_ms"] for run in ours)
            - statistics.median(run[i]["first"]["host_ms"] for run in torch_rows)
            for i in range(args.calls)
        ]
        derivations = [d[1] * 1e3 for r in runs[mode] for d in r["derivations"]]
        table[mode] = {
            "against_torch": compared,
            "median_first_host_excess_ms": statistics.median(host),
            "first_host_excess_over_0.2ms": sum(h > 0.2 for h in host),
            "derivation_ms": {
                "median": statistics.median(derivations),
                "max": max(derivations),
                "count": len(derivations),
            },
        }
        print(mode, json.dumps(table[mode]), flush=True)
    (args.out / "planner_probe.json").write_text(json.dumps({"runs": runs, "table": table}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
