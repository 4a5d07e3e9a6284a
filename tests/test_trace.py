"""The first-calls trace's timing (matmul/harness/trace.py) on the CPU, with torch.cuda's events and
synchronizes standing in: a cost that another thread put on the GPU shows in the device-wide
timing only, and the summaries are made by each timing."""

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

from matmul.harness import trace


class Event:
    """torch.cuda.Event on the host's clock: ``record`` notes the time, ``elapsed_time`` their gap."""

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):  # the stream's own work: nothing more to wait for
        pass

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


@pytest.fixture
def another_threads_gpu_work(monkeypatch):
    """Each device-wide synchronize after the first waits 30 ms, as it would for a kernel another
    thread of the process launched on a stream of its own."""
    calls = []

    def synchronize(device=None):
        calls.append(1)
        if len(calls) > 1:
            time.sleep(0.03)

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "Event", Event)


def test_a_cost_another_thread_put_on_the_gpu_shows_only_in_the_device_wide_timing(another_threads_gpu_work):
    found = trace.timed(lambda: time.sleep(0.002))
    assert 2 <= found["event_ms"] < 20 and 2 <= found["host_ms"] < 20 and found["stream_ms"] < 20
    assert found["device_ms"] >= found["stream_ms"] + 25


def test_the_summaries_count_each_timing_on_its_own():
    def row(ours, theirs):
        return {
            "source": "nearest",
            **{f"matmul_{field}": ours[i] for i, field in enumerate(trace.TIMINGS.values())},
            **{f"torch_{field}": theirs[i] for i, field in enumerate(trace.TIMINGS.values())},
        }

    rows = [row((1.0, 1.1, 9.0), (1.0, 1.0, 1.0)), row((1.0, 1.0, 1.0), (2.0, 2.0, 2.0))]
    found = trace.summaries(rows)
    assert found["event"]["over_1.5x"] == 0 and found["device"]["over_1.5x"] == 1
    assert found["device"]["worst_ratio"] == 9.0 and found["stream"]["total_ratio"] == pytest.approx(2.1 / 3.0)
    assert found["event"]["sources"] == {"nearest": 2}


def test_the_first_pass_is_compared_with_torch_alone_at_the_same_place():
    """A row whose matmul() call went first meets torch alone's first call there, a row where torch
    went first its second: a first use of a kernel on both sides cancels."""
    rows = [
        {"dtype": "float16", "name": "qkv", "m": 5, "first": "matmul", "matmul_event_ms": 4.0, "source": "nearest"},
        {"dtype": "bfloat16", "name": "qkv", "m": 7, "first": "torch", "matmul_event_ms": 0.3, "source": "fallback"},
    ]
    alone = [
        {"dtype": "float16", "name": "qkv", "m": 5, "first": {"event_ms": 3.0}, "second": {"event_ms": 0.2}},
        {"dtype": "bfloat16", "name": "qkv", "m": 7, "first": {"event_ms": 3.0}, "second": {"event_ms": 0.1}},
    ]
    found = trace.against_alone(rows, alone)
    assert found["over_1.5x"] == 1 and found["worst_ratio"] == pytest.approx(3.0)
    assert found["total_ratio"] == pytest.approx(4.3 / 3.1)
    with pytest.raises(ValueError, match="the traces differ"):
        trace.against_alone(rows, alone[::-1])


def _alone_row(dtype, name, m, first, second, **choice):
    return {
        "dtype": dtype,
        "name": name,
        "m": m,
        "first": {field: first for field in trace.TIMINGS.values()},
        "second": {field: second for field in trace.TIMINGS.values()},
        **choice,
    }


def test_matmul_alone_is_compared_with_torch_alone_call_by_call():
    """Each library's first call against the other's first call of the same place of the trace,
    and the second against the second: a first use costs each process its own."""
    ours = [
        _alone_row("float16", "qkv", 5, 4.0, 0.2, version="cuBLAS", source="nearest"),
        _alone_row("bfloat16", "qkv", 7, 0.3, 0.1, version="v7", source="shipped"),
    ]
    theirs = [_alone_row("float16", "qkv", 5, 3.0, 0.2), _alone_row("bfloat16", "qkv", 7, 0.1, 0.1)]
    first = trace.alone_against_alone(ours, theirs, "first")
    assert first["over_1.5x"] == 1 and first["worst_ratio"] == pytest.approx(3.0)
    assert first["total_ratio"] == pytest.approx(4.3 / 3.1)
    assert first["sources"] == {"nearest": 1, "shipped": 1}
    second = trace.alone_against_alone(ours, theirs, "second", "device_ms")
    assert second["over_1.5x"] == 0 and second["total_ratio"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="the traces differ"):
        trace.alone_against_alone(ours, theirs[::-1])


def test_the_second_pass_times_each_side_first_once(monkeypatch):
    """In both orders, a side's timing is the mean of its two, whichever went first; a pair timed
    one way only would charge the first call's cost to one side."""
    order = []

    timings = []

    def timed(fn):
        timings.append(fn())
        return {"event_ms": 3.0 if len(timings) == 1 else 1.0}  # the first timed call pays more

    monkeypatch.setattr(trace, "timed", timed)
    ours, theirs = trace._both_orders(lambda: order.append("ours"), lambda: order.append("theirs"), matmul_first=True)
    assert order == ["ours", "theirs"] + ["ours", "theirs", "theirs", "ours"]  # one untimed call each first
    assert ours["event_ms"] == 2.0 and theirs["event_ms"] == 1.0 and len(ours["each"]) == 2
    order.clear(), timings.clear()
    ours, theirs = trace._both_orders(lambda: order.append("ours"), lambda: order.append("theirs"), matmul_first=False)
    assert order == ["theirs", "ours"] + ["theirs", "ours", "ours", "theirs"]
    assert ours["event_ms"] == 1.0 and theirs["event_ms"] == 2.0


def test_a_library_alone_reads_the_last_line_of_its_process(monkeypatch):
    """What the process prints before its rows (a warning, a progress line) is not taken for them;
    matmul() alone runs with an empty cache directory of its own."""
    seen = {}

    def run(args, input, capture_output, text, env):
        seen["request"], seen["env"] = json.loads(input), env
        rows = [_alone_row("float16", "qkv", 5, 2.0, 1.0)]
        return subprocess.CompletedProcess(args, 0, stdout="tuning qkv...\n" + json.dumps(rows) + "\n", stderr="")

    monkeypatch.setattr(trace.subprocess, "run", run)
    found = trace.matmul_alone(calls=1)
    assert seen["request"]["through"] == "matmul" and len(seen["request"]["trace"]) == 1
    assert Path(seen["env"]["MATMUL_CACHE_DIR"]).name.startswith("matmul-alone-")
    assert found["summary"]["event"]["first_over_1.5x_second"] == 1


@pytest.mark.parametrize(
    "parts", [trace.PARTS, ("trace",), ("block", "torch_alone"), ("torch_alone", "matmul_alone"), ("alternating",)]
)
def test_the_trace_runs_only_the_parts_asked_for(tmp_path, monkeypatch, parts):
    ran = []
    monkeypatch.setattr(trace, "blocks_first", lambda env: ran.append("block") or {})
    monkeypatch.setattr(trace.subprocess, "call", lambda *args, **kwargs: ran.append("trace") or 0)
    monkeypatch.setattr(trace, "torch_alone", lambda calls: ran.append("torch_alone") or {"error": "stand-in"})
    monkeypatch.setattr(trace, "matmul_alone", lambda calls: ran.append("matmul_alone") or {"error": "stand-in"})
    monkeypatch.setattr(
        trace, "alternating", lambda calls, repeats, ways: ran.append("alternating") or {"error": "stand-in"}
    )
    assert trace.main(tmp_path, calls=3, wait_s=0.0, parts=parts) == 0
    assert tuple(ran) == parts
    written = {"block": "block_first", "torch_alone": "torch_alone", "matmul_alone": "matmul_alone"}
    for part, name in {**written, "alternating": "alternating"}.items():
        assert (tmp_path / f"{name}.json").exists() == (part in parts)


def _process(firsts: list[float], source: str = "shipped") -> list[dict]:
    """One process's rows of ``alone`` over a trace of len(firsts) calls (second calls 0.1 ms)."""
    return [
        _alone_row("float16", "qkv", m, first, 0.1, version="cuBLAS", source=source) for m, first in enumerate(firsts)
    ]


def test_first_calls_over_several_processes_are_compared_by_their_medians():
    """A call slow in one process of matmul() only is a draw, not the library; a call slow in most
    of them is counted; each single process is counted against torch's median too."""
    theirs = [_process([1.0, 1.0, 1.0]), _process([1.0, 1.0, 3.0]), _process([1.0, 1.2, 1.0])]
    ours = [_process([4.0, 1.0, 1.0]), _process([4.0, 1.0, 1.0]), _process([1.0, 1.0, 9.0], source="nearest")]
    found = trace.across_processes(ours, theirs)
    median = found["median_against_median"]
    assert median["over_1.5x"] == 1 and median["worst_ratio"] == pytest.approx(4.0)  # call 0, slow in two of three
    assert median["total_ratio"] == pytest.approx(6.0 / 3.0)
    assert median["sources"] == {"shipped": 3}
    assert found["each_matmul_over_1.5x_torch_median"] == [1, 1, 1]
    assert found["each_torch_over_1.5x_the_others_median"] == [0, 1, 0]
    with pytest.raises(ValueError, match="the traces differ"):
        trace.across_processes(ours, theirs[:1] + [theirs[1][::-1]])


def test_alternating_starts_the_libraries_in_turn_each_in_a_fresh_process(monkeypatch):
    """torch, matmul(), torch, ... (a machine's state drifts over a run: neither library gets all of
    one end of it); matmul()'s processes skip rebuilding the native entry only."""
    order = []
    monkeypatch.setattr(trace, "torch_alone", lambda calls: order.append("torch") or {"rows": _process([1.0] * calls)})

    def matmul_alone(calls, native_entry=False, settings=None):
        order.append(("matmul", native_entry, settings))
        return {"rows": _process([2.0 if settings is None else 1.2] * calls)}

    monkeypatch.setattr(trace, "matmul_alone", matmul_alone)
    found = trace.alternating(calls=2, repeats=3)
    assert order == ["torch", ("matmul", True, None)] * 3 and "ways" not in found
    assert found["across_processes"]["event"]["median_against_median"]["over_1.5x"] == 2
    order.clear()
    quiet = {"MATMUL_PLAN_QUIET_MS": "2"}
    found = trace.alternating(calls=2, repeats=2, ways={"quiet": quiet})  # a setting against the default
    assert order == ["torch", ("matmul", True, None), ("matmul", True, quiet)] * 2
    assert found["across_processes"]["event"]["median_against_median"]["over_1.5x"] == 2
    way = found["ways"]["quiet"]
    assert way["settings"] == quiet and way["across_processes"]["event"]["median_against_median"]["over_1.5x"] == 0
    assert len(way["rows"]) == 2
    assert len(found["rows"]["torch"]) == 2 and set(found["rows"]["torch"][0][0]["first"]) == set(
        trace.TIMINGS.values()
    )
    monkeypatch.setattr(trace, "torch_alone", lambda calls: {"error": "no GPU"})
    assert trace.alternating(calls=2, repeats=2) == {"error": {"torch": ["no GPU", "no GPU"], "matmul": []}}


def test_alternating_compares_the_processes_that_finished_and_says_which_did_not(monkeypatch):
    monkeypatch.setattr(trace, "torch_alone", lambda calls: {"rows": _process([1.0] * calls)})
    ran = []

    def matmul_alone(calls, native_entry=False, settings=None):
        ran.append(1)
        return {"error": "terminate called"} if len(ran) == 2 else {"rows": _process([2.0] * calls)}

    monkeypatch.setattr(trace, "matmul_alone", matmul_alone)
    found = trace.alternating(calls=2, repeats=3)
    assert found["failed"] == {"matmul": ["terminate called"]} and len(found["rows"]["matmul"]) == 2
    assert found["across_processes"]["event"]["median_against_median"]["over_1.5x"] == 2
    ran.clear()
    found = trace.alternating(calls=2, repeats=2)  # one of two left: no median of the others
    assert found == {"error": {"torch": [], "matmul": ["terminate called"]}}


def test_a_fresh_cache_may_keep_the_native_entry_only(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "default_dir", lambda: tmp_path)
    (tmp_path / "entry" / "tilus_matmul_entry_x").mkdir(parents=True)
    (tmp_path / "entry" / "tilus_matmul_entry_x" / "built.so").write_text("stand-in")
    (tmp_path / "choices.json").write_text("{}")
    with trace.fresh_cache_env("t-", native_entry=True) as env:
        fresh = Path(env["MATMUL_CACHE_DIR"])
        assert [p.name for p in fresh.iterdir()] == ["entry"]
        assert (fresh / "entry" / "tilus_matmul_entry_x" / "built.so").read_text() == "stand-in"
    with trace.fresh_cache_env("t-") as env:
        assert not any(Path(env["MATMUL_CACHE_DIR"]).iterdir())


def test_matmul_alone_part_writes_its_comparison_with_torch_alone(tmp_path, monkeypatch):
    rows = [_alone_row("float16", "qkv", 5, 2.0, 1.0)]
    (tmp_path / "torch_alone.json").write_text(json.dumps({"rows": rows}))
    monkeypatch.setattr(trace, "matmul_alone", lambda calls: {"rows": rows, "summary": {}})
    trace.matmul_alone_part(tmp_path, calls=1)
    found = json.loads((tmp_path / "matmul_alone.json").read_text())["against_torch_alone"]
    assert found["first"]["event"]["total_ratio"] == pytest.approx(1.0)


def test_the_trace_command_takes_settings_for_more_matmul_processes(monkeypatch):
    from matmul import cli

    monkeypatch.setattr(cli.versions, "local_arch", lambda: "sm_90a")
    seen = {}
    monkeypatch.setattr(trace, "main", lambda out, **kwargs: seen.update(kwargs) or 0)
    args = ["trace", "--parts", "alternating", "--matmul-env", "MATMUL_PLAN_QUIET_MS=2"]
    assert cli.main([*args, "--matmul-env", "A=1,B=x=y"]) == 0
    assert seen["ways"] == {
        "MATMUL_PLAN_QUIET_MS=2": {"MATMUL_PLAN_QUIET_MS": "2"},
        "A=1,B=x=y": {"A": "1", "B": "x=y"},
    }
    for bad in ("NOEQUALS", "=1", ","):
        with pytest.raises(SystemExit) as exit:
            cli.main([*args[:3], "--matmul-env", bad])
        assert exit.value.code == 2


def test_matmul_alone_adds_its_settings_to_a_fresh_cache_environment(monkeypatch):
    seen = {}
    monkeypatch.setattr(trace, "alone", lambda through, calls, env: seen.update(env) or {})
    trace.matmul_alone(calls=1, settings={"MATMUL_PLAN_QUIET_MS": "20"})
    assert seen["MATMUL_PLAN_QUIET_MS"] == "20" and Path(seen["MATMUL_CACHE_DIR"]).name.startswith("matmul-alone-")


def test_the_trace_command_refuses_an_unknown_part(monkeypatch):
    from matmul import cli

    monkeypatch.setattr(cli.versions, "local_arch", lambda: "sm_90a")
    with pytest.raises(SystemExit) as exit:  # argparse's usage error, which names the parts
        cli.main(["trace", "--parts", "trace,blocks"])
    assert exit.value.code == 2


def test_a_garbage_collection_is_charged_to_the_call_it_overlapped():
    from matmul.harness.first_use import Collections

    collections = Collections()
    collections.spans = [(2, 1.0, 1.02), (0, 1.5, 1.501), (2, 3.0, 3.05)]
    found = collections.during({"begin_s": 1.01, "issued_s": 1.6})
    assert found["gc_full"] == 1 and found["gc_ms"] == pytest.approx(21.0)
    assert collections.during({"begin_s": 2.0, "issued_s": 2.5}) == {"gc_ms": 0, "gc_full": 0}
