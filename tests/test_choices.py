"""Where a choice comes from without waiting (matmul/call/chooser.py): the shipped table, the instant
rule, background tuning and the hand-over to its result, variants, and the limits of a version
called on its own. CPU stand-ins for the kernels and for the tuner."""

import ast
import functools
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from stand_ins import build_here, caller_never_pausing, load_built

import matmul
from matmul.call import api, chooser, launch, tuner
from matmul.call.choice_cache import ChoiceCache, ShippedTable, write_shipped
from matmul.call.chooser import Chooser
from matmul.call.launch import Plans, SeriesPlan, VendorPlan, signature
from matmul.contract import check_call
from matmul.kernels import versions
from matmul.kernels.variant import PLAIN, Variant
from matmul.measure.correctness import TOLERANCE, random_operands, reference, relative_error

ARCH, GPU = "sm_90a", "stand-in GPU"
CPU = torch.device("cpu")


def entry(version, m=None, fresh=True):
    """A stored choice of ``version`` (its representative configuration), fresh or made with other sources."""
    config = {} if version == tuner.VENDOR else dict(versions.load(ARCH, version).REPRESENTATIVE)
    fingerprint = tuner.fingerprint(ARCH, version) if fresh else "0" * 16
    return {"version": version, "config": config, "ms": 1.0, "fingerprint": fingerprint}


def key(m, n, k, dtype=torch.float16, variant=PLAIN):
    return tuner.choice_key(ARCH, GPU, dtype, m, n, k, variant)


UNTIMELY = []  # tunings that were not due (recorded: a failure raised in the tuner's thread would go unseen)


def never(arch, dtype, device, jobs, on_entry):
    UNTIMELY.extend(job["key"] for job in jobs)


@pytest.fixture(autouse=True)
def no_untimely_tuning():
    UNTIMELY.clear()
    yield
    assert UNTIMELY == [], "tuned although no tuning was due"


def make_chooser(tmp_path, measured=None, shipped=None, tune_jobs=never, mode="background", build_jobs=build_here):
    cache = ChoiceCache(tmp_path / "cache")
    for k, e in (measured or {}).items():
        cache.store(k, e)
    path = tmp_path / "shipped.json"
    if shipped is not None:
        write_shipped(path, shipped, command="test", machine={"gpu": GPU})
    return Chooser(
        cache,
        tune_jobs=tune_jobs,
        arch_of=lambda device: ARCH,
        gpu_name=lambda device: GPU,
        shipped=ShippedTable([path]),
        mode=mode,
        build_jobs=build_jobs,
        load=load_built,
    )


def settled(choose, *shape, variant=PLAIN):
    """The choice of ``shape`` once its kernel is built (a stand-in build, at once)."""
    choose.get(CPU, torch.float16, *shape, variant)
    assert choose.wait(10)
    return choose.get(CPU, torch.float16, *shape, variant)[1]


# --- the instant rule ----------------------------------------------------------------------------


def test_an_unseen_bucket_takes_the_nearest_measured_m_of_the_same_n_and_k_else_cublas(tmp_path):
    measured = {
        key(64, 4096, 4096): entry("v4"),
        key(4096, 4096, 4096): entry("v3"),
        key(1024, 14336, 4096): entry("v5"),  # another N: says nothing about 4096 x 4096
        key(1024, 4096, 4096, variant=Variant("nk", bias=True)): entry("v5"),  # another variant, not plain
        tuner.choice_key(ARCH, "another GPU", torch.float16, 1024, 4096, 4096): entry("v5"),  # after this GPU's
        tuner.choice_key(ARCH, "another GPU", torch.float16, 16, 6144, 4096): entry("v6"),  # where this has none
        tuner.choice_key("sm_100a", GPU, torch.float16, 16, 2048, 4096): entry("v3"),  # another architecture: never
    }
    choose = make_chooser(tmp_path, measured, mode="off")

    def instant(m, n=4096, k=4096, variant=PLAIN):
        return settled(choose, m, n, k, variant=variant)

    near = instant(300)  # log(300 / 64) = 1.5 < log(4096 / 320) = 2.6
    assert (near["version"], near["source"], near["nearest"]) == ("v4", "nearest", key(64, 4096, 4096))
    assert instant(1000)["nearest"] == key(4096, 4096, 4096)  # 1024: 4x from 4096, 16x from 64
    other_gpu = instant(128, n=6144)  # another GPU of this architecture, where this GPU has measured none
    assert (other_gpu["version"], other_gpu["nearest"]) == (
        "v6",
        tuner.choice_key(ARCH, "another GPU", torch.float16, 16, 6144, 4096),
    )
    assert instant(16, n=2048)["source"] == "fallback"
    assert instant(512)["nearest"] == key(4096, 4096, 4096)  # 8x from either: the larger M
    assert instant(2000, n=4095)["nearest"] == key(4096, 4096, 4096)  # N = 4095 is in 4096's bucket
    fallback = instant(1024, n=8192)
    assert (fallback["version"], fallback["source"]) == (tuner.VENDOR, "fallback") and "nearest" not in fallback
    assert instant(1000, variant=Variant("nk", activation="relu"))["nearest"] == key(4096, 4096, 4096)  # plain
    assert choose.get(CPU, torch.float16, 4096, 4096, 4096)[1]["source"] == "measured"


def test_the_nearest_relative_is_found_among_choices_measured_since_the_last_lookup(tmp_path):
    """``nearest`` indexes the stored choices once (scanning them all took a third of a millisecond a
    bucket, on a thread beside the caller's calls); a choice measured since is a relative too."""
    choose = make_chooser(tmp_path, {key(4096, 4096, 4096): entry("v3")}, shipped={key(16, 4096, 4096): entry("v5")})
    choose.mode = "off"
    assert settled(choose, 100, 4096, 4096)["nearest"] == key(16, 4096, 4096)  # shipped: 6x from 100
    choose.cache.store(key(512, 4096, 4096), entry("v4"))  # measured meanwhile (by another process, say)
    near = settled(choose, 300, 4096, 4096)  # the bucket of 320 rows
    assert (near["version"], near["nearest"]) == ("v4", key(512, 4096, 4096))
    choose.cache.path.write_text("not json")  # a corrupt cache: its choices are nobody's relatives
    assert settled(choose, 700, 4096, 4096)["nearest"] == key(16, 4096, 4096)


def test_an_unseen_bucket_takes_the_same_bucket_in_the_other_dtype_or_without_its_variant(tmp_path):
    kn = Variant("kn")
    measured = {
        key(4096, 4096, 4096): entry("v3"),
        key(1024, 4096, 4096, torch.bfloat16): entry("v5"),
        key(1024, 4096, 4096, variant=kn): entry("v4"),
        key(16, 4096, 4096, torch.bfloat16, kn): entry("v6"),
    }
    choose = make_chooser(tmp_path, measured, mode="off")

    def nearest(m, dtype=torch.float16, variant=PLAIN):
        choose.get(CPU, dtype, m, 4096, 4096, variant)
        assert choose.wait(10)
        return choose.get(CPU, dtype, m, 4096, 4096, variant)[1]["nearest"]

    assert nearest(1000) == key(1024, 4096, 4096, torch.bfloat16)  # the same M: before 4096 in float16
    assert nearest(1000, torch.bfloat16, kn) == key(1024, 4096, 4096, variant=kn)  # this variant before this dtype
    assert nearest(16, torch.float16, kn) == key(16, 4096, 4096, torch.bfloat16, kn)  # this variant, other dtype
    assert nearest(4096, torch.bfloat16, kn) == key(4096, 4096, 4096)  # the plain one, other dtype
    assert nearest(2048, torch.bfloat16) == key(1024, 4096, 4096, torch.bfloat16)  # this dtype on a tie


def test_the_nearest_bucket_is_skipped_where_its_kernel_cannot_take_the_shape(tmp_path, monkeypatch):
    v4 = versions.load(ARCH, "v4")
    monkeypatch.setattr(v4, "supports", lambda m, n, k: m <= 256, raising=False)
    measured = {key(128, 4096, 4096): entry("v4"), key(16384, 4096, 4096): entry("v3")}
    choose = make_chooser(tmp_path, measured, mode="off")
    assert choose.get(CPU, torch.float16, 1024, 4096, 4096)[1]["nearest"] == key(16384, 4096, 4096)


# --- the shipped table ---------------------------------------------------------------------------


def test_the_shipped_table_is_read_before_any_tuning(tmp_path):
    choose = make_chooser(tmp_path, shipped={key(1024, 4096, 4096): entry("v4")})
    found = settled(choose, 1000, 4096, 4096)
    assert (found["version"], found["source"], found["pending"]) == ("v4", "shipped", False)
    assert "stale" not in found  # fresh: final, nothing queued (no_untimely_tuning)


def test_a_measured_choice_overrides_the_shipped_one(tmp_path):
    k = key(1024, 4096, 4096)
    choose = make_chooser(tmp_path, measured={k: entry("v3")}, shipped={k: entry("v4")})
    found = settled(choose, 1000, 4096, 4096)
    assert (found["version"], found["source"]) == ("v3", "measured")


def test_a_version_that_won_from_some_m_up_runs_from_there_and_lends_no_bound_to_relatives(tmp_path):
    """A bucket whose version won only from ``from_m`` up (``tuner.held_across_the_bucket``): cuBLAS
    runs below it, and the choice says why (``below``, ``chosen``); the version from it up. A
    relative's bucket takes the version without that bound: it was found in another bucket."""
    choose = make_chooser(tmp_path, shipped={key(128, 4096, 4096): {**entry("v4"), "from_m": 112}}, mode="off")
    below = settled(choose, 100, 4096, 4096)
    assert (below["version"], below["below"], below["source"]) == (tuner.VENDOR, 112, "shipped")
    assert below["chosen"]["version"] == "v4"
    assert settled(choose, 112, 4096, 4096)["version"] == settled(choose, 128, 4096, 4096)["version"] == "v4"
    near = settled(choose, 64, 4096, 4096)
    assert (near["version"], near["nearest"]) == ("v4", key(128, 4096, 4096)) and "from_m" not in near


def test_a_stale_shipped_entry_is_an_instant_choice_measured_again(tmp_path):
    k = key(1024, 4096, 4096)
    measured = threading.Event()

    def tune_jobs(arch, dtype, device, jobs, on_entry):
        measured.wait(10)
        on_entry(jobs[0]["key"], entry(tuner.VENDOR))

    choose = make_chooser(tmp_path, shipped={k: entry("v4", fresh=False)}, tune_jobs=tune_jobs)
    found = choose.get(CPU, torch.float16, 1000, 4096, 4096)[1]
    assert (found["source"], found["stale"], found["pending"]) == ("shipped", True, True)
    measured.set()
    assert choose.wait(10)
    found = choose.get(CPU, torch.float16, 1000, 4096, 4096)[1]
    assert (found["version"], found["source"], found["pending"]) == (tuner.VENDOR, "measured", False)


@pytest.mark.parametrize("content", ["", "{", "[1, 2]", json.dumps({"format": 99, "entries": {}}), "\x00\xff"])
def test_a_corrupt_shipped_table_is_ignored_with_a_warning(tmp_path, caplog, content):
    path = tmp_path / "h100.json"
    path.write_text(content, errors="surrogateescape")
    choose = make_chooser(tmp_path, mode="off")
    choose.shipped = ShippedTable([path])
    with caplog.at_level(logging.WARNING):
        found = choose.get(CPU, torch.float16, 1000, 4096, 4096)[1]
    assert found["source"] == "fallback" and "shipped choice table" in caplog.text


def test_every_table_the_package_ships_is_read_without_a_warning(caplog):
    """Every ``*.json`` of ``shipped/`` is a choice table (the packed-weight call's rules lie apart,
    in ``shipped/rules/``): the process's first call reads them all and warns of none."""
    with caplog.at_level(logging.WARNING):
        entries = ShippedTable().entries()
    assert entries and "shipped choice table" not in caplog.text


@pytest.mark.parametrize("name", ["h100.json", "h200.json"])
def test_the_package_ships_tables_that_name_their_command_date_and_machine(name):
    shipped = Path(chooser.__file__).with_name("shipped")
    table = json.loads((shipped / name).read_text())
    assert {"format", "command", "date", "machine", "entries"} <= set(table)
    assert "python -m matmul tune" in table["command"] and name in (shipped / "README.md").read_text()
    assert all(key.split("/")[1] == table["machine"]["gpu"] for key in table["entries"])  # keyed by its GPU


def test_a_table_extended_by_another_command_names_every_command(tmp_path):
    path = tmp_path / "table.json"
    for command in ("tune --m 1", "tune --m 8", "tune --m 1"):
        write_shipped(path, {}, command, {"gpu": GPU})
    table = json.loads(path.read_text())
    assert table["command"] == "tune --m 1" and table["commands"] == ["tune --m 8", "tune --m 1"]


@pytest.mark.parametrize("name", ["h100.json", "h200.json"])
def test_a_shipped_table_whose_kernel_sources_changed_says_so(name):
    """A table whose versions' entries were measured with other kernel sources is only a set of
    instant choices, each bucket tuned again in the background at first use: the shipped README's
    row for it must say "Stale" (and a table made again must not). (cuBLAS entries also depend on
    torch's build, which this machine's need not be: only the series' entries are checked.)"""
    shipped = Path(chooser.__file__).with_name("shipped")
    table = json.loads((shipped / name).read_text())
    series = [e for e in table["entries"].values() if e["version"] != tuner.VENDOR]
    stale = [e["version"] for e in series if not tuner.entry_is_valid(ARCH, e)]
    row = next(line for line in (shipped / "README.md").read_text().splitlines() if line.startswith(f"| `{name}`"))
    assert bool(stale) == ("Stale" in row), (
        f"{len(stale)} of {len(series)} series entries of {name} are stale for these sources: make the table "
        "again on its GPU, or say 'Stale since <commit>' in its row of matmul/call/shipped/README.md (and take "
        "the mark out once it is made again)"
    )


@pytest.mark.parametrize("name", ["h100.json", "h200.json"])
def test_every_shipped_choice_is_what_the_tuners_rules_make_of_its_own_times(name):
    """A table made under an older rule (a smaller ``VENDOR_MARGIN``) is decided again from the times
    it stores (``tuner.redecided``) before it ships: no entry keeps a version the
    tuner would not choose from those times."""
    table = json.loads((Path(chooser.__file__).with_name("shipped") / name).read_text())
    for key, entry in table["entries"].items():
        head, _, m, _, _, _ = chooser.key_parts(key)
        again = tuner.redecided(head.partition("/")[0], entry, int(m))
        decision = (again["version"], again.get("from_m"), again.get("lost_at"))
        assert decision == (entry["version"], entry.get("from_m"), entry.get("lost_at")), key


# --- background tuning and the hand-over ---------------------------------------------------------


@pytest.fixture
def stand_ins(monkeypatch):
    from stand_ins import install

    return install(monkeypatch, wrong=("v3",), available=("v2", "v3", "v4"))


@pytest.fixture
def route():
    previous = api._plans
    yield lambda plans: api.use_plans(plans) and plans
    api.use_plans(previous)


class LateTuner:
    """A background tuner that measures ``winner`` (v4) as the winner once ``finish`` is set (or fails)."""

    def __init__(self, fails=False, winner="v4"):
        self.finish, self.jobs, self.fails, self.winner = threading.Event(), [], fails, winner

    def __call__(self, arch, dtype, device, jobs, on_entry):
        self.jobs.extend(jobs)
        # generous: a test may first wait for a real build child, which a loaded CI machine slows
        # down; had this run out, the tuning would fail and the instant choice stay (a false failure)
        assert self.finish.wait(300)
        if self.fails:
            raise tuner.TuningError("the child process died")
        for job in jobs:
            on_entry(job["key"], {**entry(self.winner), "candidates": {}, "rejected": {}})


def stand_in_plans(choose):
    return Plans(choose, check=functools.partial(check_call, require_cuda=False))


def test_a_background_tuning_takes_over_from_the_instant_choice(tmp_path, stand_ins, route):
    late = LateTuner()
    choose = make_chooser(tmp_path, tune_jobs=late)
    path = stand_in_plans(choose)
    route(path)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    for _ in range(2):  # before the tuning ends: cuBLAS, at once, and the bucket queued once
        assert relative_error(matmul.matmul(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]
    assert isinstance(path.plans[signature(a, w.T, None)], VendorPlan)
    if path.direct is not None:
        assert path.direct.kind(a, w.T) == "vendor"
    before = choose.get(CPU, torch.float16, 128, 64, 32)[1]
    assert (before["version"], before["source"], before["pending"]) == (tuner.VENDOR, "fallback", True)

    late.finish.set()
    assert choose.wait(10)
    assert [job["key"] for job in late.jobs] == [key(128, 64, 32)]
    after = choose.get(CPU, torch.float16, 128, 64, 32)[1]
    assert (after["version"], after["source"], after["pending"]) == ("v4", "measured", False)
    a2, w2 = random_operands(128, 64, 32, torch.float16, device="cpu")
    assert relative_error(matmul.matmul(a2, w2.T), reference(a2, w2)) <= TOLERANCE[torch.float16]
    plan = path.plans[signature(a, w.T, None)]
    assert isinstance(plan, SeriesPlan) and plan.launch.version == "v4"
    if path.direct is not None:  # the native entry's route replaced, not left on cuBLAS
        assert path.direct.kind(a, w.T) == "launch"
        matmul.matmul(a2, w2.T)
        assert plan.launch.launches == 2


def test_a_chosen_kernel_runs_only_once_built(tmp_path, stand_ins):
    built, release = [], threading.Event()

    def build_jobs(jobs, on_built):
        assert release.wait(10)
        built.extend(job["version"] for job in jobs)
        build_here(jobs, on_built)

    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): entry("v4")}, build_jobs=build_jobs)
    path = stand_in_plans(choose)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    path.launch(a, w.T)
    assert isinstance(path.plans[signature(a, w.T, None)], VendorPlan)  # nvcc is not waited for
    waiting = choose.get(CPU, torch.float16, 128, 64, 32)[1]
    assert (waiting["version"], waiting["building"], waiting["source"]) == (tuner.VENDOR, "v4", "shipped")
    release.set()
    assert choose.wait(10) and built == ["v4"]
    path.launch(a, w.T)
    assert isinstance(path.plans[signature(a, w.T, None)], SeriesPlan)


def test_each_side_of_a_buckets_from_m_runs_its_own_kernel_and_native_route(tmp_path, stand_ins):
    """A bucket (97-128) whose version won only from M = 112 up: calls at 100 run cuBLAS and calls
    at 120 and 128 the version, and the native entry's route, one a bucket, serves only the side of
    112 it was derived on: a call on the other side misses it and takes its own plan."""
    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): {**entry("v4"), "from_m": 112}})
    path = stand_in_plans(choose)
    settled(choose, 128, 64, 32)  # v4 built
    calls = {m: random_operands(m, 64, 32, torch.float16, device="cpu") for m in (100, 120, 128)}
    for m, kind, missed in ((120, "launch", 100), (100, "vendor", 120), (128, "launch", 100)):
        a, w = calls[m]
        assert relative_error(path.launch(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]
        plan = path.plans[signature(a, w.T, None)]
        assert isinstance(plan, SeriesPlan if kind == "launch" else VendorPlan)
        if path.direct is not None:
            other, w_other = calls[missed]
            assert path.direct.kind(a, w.T) == kind and path.direct.kind(other, w_other.T) is None


def test_a_kernel_built_only_to_be_timed_leaves_every_plan_in_place(tmp_path, stand_ins):
    """A background tuning builds its candidates first; each build used to drop every plan and
    native route, sending every bucket back through the Python path (and cuBLAS) until the
    planner derived it again. Only a kernel that a bucket has chosen may change a plan."""
    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): entry("v4")})
    path = stand_in_plans(choose)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    settled(choose, 128, 64, 32)
    path.launch(a, w.T)
    plan = path.plans[signature(a, w.T, None)]
    assert isinstance(plan, SeriesPlan)
    choose._build_batch(chooser.BUILD_GROUP, [(ARCH, torch.float16, entry("v2"), PLAIN)])  # a candidate
    assert path.plans.get(signature(a, w.T, None)) is plan


def test_a_tuned_result_that_keeps_the_kernel_leaves_every_plan_in_place(tmp_path, stand_ins):
    """The background tuning confirms the instant choice's kernel (a stale shipped v4, measured
    again: v4): the plans that run it are kept; a result that changes the kernel drops them."""
    for winner, kept in (("v4", True), ("v2", False)):
        late = LateTuner(winner=winner)
        choose = make_chooser(tmp_path / winner, shipped={key(128, 64, 32): entry("v4", fresh=False)}, tune_jobs=late)
        path = stand_in_plans(choose)
        a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
        path.launch(a, w.T)  # the instant choice, v4, is built meanwhile: cuBLAS runs
        assert choose.builder.wait(10)
        path.launch(a, w.T)
        plan = path.plans[signature(a, w.T, None)]
        assert isinstance(plan, SeriesPlan) and plan.launch.version == "v4"
        late.finish.set()
        assert choose.wait(10) and choose.get(CPU, torch.float16, 128, 64, 32)[1]["source"] == "measured"
        assert (path.plans.get(signature(a, w.T, None)) is plan) == kept, winner


def test_a_new_kernel_for_one_bucket_leaves_the_other_buckets_plans_in_place(tmp_path, stand_ins):
    """The tuning of one bucket (a stale shipped v4) picks another kernel (v2): that bucket's plan
    and native route go, to be derived again from v2; a bucket whose choice did not change keeps
    its plan and route. Dropping every bucket's sent all their calls back through the Python path."""
    late = LateTuner(winner="v2")
    shipped = {key(128, 64, 32): entry("v4", fresh=False), key(128, 96, 32): entry("v4")}
    choose = make_chooser(tmp_path, shipped=shipped, tune_jobs=late)
    path = stand_in_plans(choose)
    (a, w), (a2, w2) = (random_operands(128, n, 32, torch.float16, device="cpu") for n in (64, 96))
    for operands in ((a, w), (a2, w2)):
        path.launch(operands[0], operands[1].T)  # v4 is built meanwhile: cuBLAS runs
    assert choose.builder.wait(10)
    plans = {}
    for x, y in ((a, w), (a2, w2)):
        path.launch(x, y.T)
        plans[y.shape[0]] = path.plans[signature(x, y.T, None)]
        assert isinstance(plans[y.shape[0]], SeriesPlan) and plans[y.shape[0]].launch.version == "v4"
        if path.direct is not None:
            path.keep(plans[y.shape[0]], x, y.T)  # as the planner keeps an unseen call's plan: with its route
            assert path.direct.kind(x, y.T) == "launch"
    late.finish.set()
    assert choose.wait(10) and choose.get(CPU, torch.float16, 128, 64, 32)[1]["version"] == "v2"
    assert signature(a, w.T, None) not in path.plans
    assert path.plans.get(signature(a2, w2.T, None)) is plans[96]
    if path.direct is not None:
        assert path.direct.kind(a, w.T) is None and path.direct.kind(a2, w2.T) == "launch"
    assert relative_error(path.launch(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]
    assert path.plans[signature(a, w.T, None)].launch.version == "v2"


def test_a_failing_background_tuning_leaves_the_instant_choice(tmp_path, stand_ins, caplog):
    late = LateTuner(fails=True)
    measured = {key(256, 64, 32): entry(tuner.VENDOR)}
    choose = make_chooser(tmp_path, measured, tune_jobs=late)
    path = stand_in_plans(choose)
    a, w = random_operands(100, 64, 32, torch.float16, device="cpu")
    with caplog.at_level(logging.WARNING):
        path.launch(a, w.T)
        late.finish.set()
        assert choose.wait(10)
        for m in (100, 99, 97):  # the same bucket again: not queued again, no second warning
            assert relative_error(path.launch(a[:m], w.T), reference(a[:m], w)) <= TOLERANCE[torch.float16]
    assert choose.wait(10) and len(late.jobs) == 1
    found = choose.get(CPU, torch.float16, 100, 64, 32)[1]
    assert (found["source"], found["nearest"], found["pending"]) == ("nearest", key(256, 64, 32), False)
    assert "TuningError" in found["tuning_failed"]
    warnings = [r for r in caplog.records if "in the background failed" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_nothing_starts_inside_a_cuda_graph_capture(tmp_path, monkeypatch):
    choose = make_chooser(tmp_path, shipped={key(1024, 4096, 4096): entry("v4", fresh=False)})
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    found = choose.get(gpu, torch.float16, 1000, 4096, 4096)[1]
    # the stale shipped v4 is not built yet: cuBLAS, and neither a tuning nor a build started
    assert (found["version"], found["transient"]) == (tuner.VENDOR, True)
    assert not choose.tuner.busy() and not choose.builder.busy() and choose.entries == {}
    choose.mode = "blocking"
    with pytest.raises(chooser.NotTunedError, match="before capturing"):
        choose.get(gpu, torch.float16, 1000, 4096, 4096)
    choose.mode = "off"  # after the capture: kept, and the kernel built
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert "transient" not in choose.get(gpu, torch.float16, 1000, 4096, 4096)[1]
    assert choose.wait(10) and choose.get(gpu, torch.float16, 1000, 4096, 4096)[1]["version"] == "v4"


def test_blocking_mode_waits_for_the_tuning(tmp_path, monkeypatch):
    tuned = []

    def tune_jobs(arch, dtype, device, jobs, on_entry):
        tuned.extend(job["key"] for job in jobs)
        on_entry(jobs[0]["key"], entry("v4"))

    monkeypatch.setenv(chooser.SWITCH, "blocking")
    choose = make_chooser(tmp_path, tune_jobs=tune_jobs, mode=None)
    found = choose.get(CPU, torch.float16, 1000, 4096, 4096)[1]
    assert tuned == [key(1000, 4096, 4096)] and (found["version"], found["source"]) == ("v4", "measured")
    monkeypatch.setenv(chooser.SWITCH, "off")
    assert choose.get(CPU, torch.float16, 5000, 4096, 4096)[1]["pending"] is False and choose.mode == "off"


# --- provenance through the public call ----------------------------------------------------------


def test_choice_says_where_the_choice_came_from(tmp_path, stand_ins, monkeypatch):
    measured = {key(1024, 64, 32): {**entry(tuner.VENDOR), "candidates": {}, "rejected": {}}}
    choose = make_chooser(tmp_path, measured, mode="off")
    monkeypatch.setattr(api, "_chooser", choose)
    monkeypatch.setattr(api, "check_call", functools.partial(check_call, require_cuda=False))
    a, w = random_operands(1000, 64, 32, torch.float16, device="cpu")
    found = matmul.choice(a, w.T)
    assert found["source"] == "measured" and {"version", "config", "candidates", "rejected"} <= set(found)
    found = matmul.choice(a[:10], w.T)
    assert (found["source"], found["nearest"], found["version"]) == ("nearest", key(1024, 64, 32), tuner.VENDOR)
    a2, w2 = random_operands(1000, 48, 32, torch.float16, device="cpu")
    assert matmul.choice(a2, w2.T)["source"] == "fallback"


# --- variants ------------------------------------------------------------------------------------


def test_a_variant_has_a_key_and_candidates_of_its_own(monkeypatch, tmp_path):
    plain = tuner.choice_key(ARCH, GPU, torch.float16, 1000, 4096, 4096)
    assert plain == "sm_90a/stand-in GPU/float16/1024x4096x4096"  # the plain variant's keys stay as they were
    fused = tuner.choice_key(ARCH, GPU, torch.float16, 1000, 4096, 4096, Variant("nk", True, "gelu_tanh"))
    assert fused == plain + "/bias+gelu_tanh"
    assert tuner.choice_key(ARCH, GPU, torch.float16, 1000, 4096, 4096, Variant("kn")) == plain + "/kn"

    monkeypatch.setattr(versions, "available", lambda arch: ["v0", "v1", "v2", "v3", "v4"])
    for version in ("v0", "v3", "v4"):  # v0 declares everything: a teaching step is never a candidate
        monkeypatch.setattr(versions.load(ARCH, version), "B_LAYOUTS", ("nk", "kn"), raising=False)
    monkeypatch.setattr(versions.load(ARCH, "v3"), "FUSED_EPILOGUE", False, raising=False)
    monkeypatch.setattr(versions.load(ARCH, "v4"), "FUSED_EPILOGUE", True, raising=False)
    bias = Variant("nk", True, None)
    assert tuner.candidates(ARCH, 128, 4096, 4096, Variant("kn")) == ["v3", "v4", tuner.VENDOR]
    assert tuner.candidates(ARCH, 128, 4096, 4096, bias) == ["v4", tuner.VENDOR]
    monkeypatch.setattr(versions.load(ARCH, "v4"), "B_LAYOUTS", ("nk",))
    assert tuner.candidates(ARCH, 128, 4096, 4096, Variant("kn", True, "relu")) == [tuner.VENDOR]

    jobs = []

    def tune_jobs(arch, dtype, device, sent, on_entry):
        jobs.extend(sent)

    choose = make_chooser(tmp_path, measured={plain: entry("v4")}, tune_jobs=tune_jobs)
    instant = choose.get(CPU, torch.float16, 1000, 4096, 4096, bias)[1]
    assert (instant["source"], instant["nearest"], instant["building"]) == (
        "nearest",
        plain,
        "v4",
    )  # at once, then tuned
    assert choose.wait(10) and jobs[0]["key"] == plain + "/bias" and jobs[0]["variant"] == "bias"
    assert jobs[0]["names"] == ["v4", tuner.VENDOR]


def test_the_tuner_times_a_variant_on_its_own_operands(stand_ins):
    """gpu_worker on the CPU: B read as [K, N] for kn, a bias of N values, the vendor candidate
    torch.matmul then torch's epilogue, the stand-in kernels built for the variant."""
    variant = Variant("kn", True, "silu")
    prepare, _ = tuner.gpu_worker(ARCH, torch.float16, 40, 24, 32, CPU, variant)
    vendor, version = prepare(tuner.VENDOR), prepare("v4")
    assert vendor.error <= TOLERANCE[torch.float16] and version.error <= TOLERANCE[torch.float16]
    assert stand_ins[-1] == ("v4", dict(versions.load(ARCH, "v4").REPRESENTATIVE))
    swiglu = Variant("nk", False, "swiglu")
    prepare, _ = tuner.gpu_worker(ARCH, torch.float16, 40, 32, 32, CPU, swiglu)
    assert prepare(tuner.VENDOR).error <= TOLERANCE[torch.float16] and prepare("v4").error <= TOLERANCE[torch.float16]


def test_the_tuners_cublas_candidate_for_a_variant_times_what_torch_runs_and_no_copy(stand_ins, monkeypatch):
    """Timed with a copy of its result into the kernels' output buffer, cuBLAS + torch's epilogue
    paid a read and a write of the output that neither torch nor the call pays: at 1024 x 14336 x
    4096 that made a V6 "faster" in the tuner and 8% slower back to back."""
    copies, copy = [], torch.Tensor.copy_

    def watched(self, *args, **kwargs):
        copies.append(self.shape)
        return copy(self, *args, **kwargs)

    for variant in (Variant("kn"), Variant("nk", True, "gelu_tanh")):
        prepare, _ = tuner.gpu_worker(ARCH, torch.float16, 40, 24, 32, CPU, variant)
        vendor = prepare(tuner.VENDOR)
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "copy_", watched)
            result = vendor.run()
        assert copies == [] and result.shape == (40, 24) and vendor.error <= TOLERANCE[torch.float16]


@pytest.mark.parametrize(
    "variant", [PLAIN, Variant("kn"), Variant("nk", True, "gelu_tanh"), Variant("nk", False, "silu")], ids=str
)
def test_the_host_probe_times_each_variants_own_public_call(monkeypatch, variant):
    """A candidate's host time is measured through the call a model makes for its variant
    (``matmul(x, w.T)``, ``matmul(x, W)`` with W [K, N], ``linear`` with an epilogue): torch's call for
    a row-major B or an epilogue costs its caller more host time than its kernels take at decode
    sizes. The stand-in program counts its launches: every probed call must reach it."""
    from matmul.call import child

    monkeypatch.setattr(api, "matmul", api.python_matmul)  # the native entry would route by its own table
    monkeypatch.setattr(api, "linear", api.python_linear)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    a, w = random_operands(40, 24, 32, torch.float16, device=CPU)  # w [N, K]
    operand = w if variant.b_layout == "nk" else w.T.contiguous()  # B as the kernel reads it
    bias = torch.randn(24, dtype=torch.float16) if variant.bias else None
    c = torch.empty(40, 24, dtype=torch.float16)
    launches, epilogues, activation = [], [], launch.activation
    bias_ptr = 0 if bias is None else bias.data_ptr()
    measure = child.host_probe(lambda *args: launches.append((*args[:3], args[9])), a, operand, c, bias, variant, 5)
    assert measure() > 0 and launches == [(40, 24, 32, bias_ptr)] * 15  # 10 calls to warm up, then the timed ones
    monkeypatch.setattr(launch, "activation", lambda ch, y, name: epilogues.append(name) or activation(ch, y, name))
    with monkeypatch.context() as patch:  # cuBLAS's candidate: torch.mm, or addmm with the bias, then the activation
        patch.setattr(torch, "addmm", lambda *args: epilogues.append("bias") or torch.mm(*args[1:]) + args[0])
        vendor = child.host_probe(None, a, operand, c, bias, variant, calls=5)
        assert vendor() > 0
    assert epilogues == (["bias"] * variant.bias + [variant.activation]) * 15


def test_the_tuning_child_creates_its_cuda_context_only_once_the_caller_is_quiet(monkeypatch, capsys):
    """The child waits for a quiet caller before its CUDA context, and its first job's ``yielded_s``
    counts that wait (a child that held only there reports the hold: the GPU test of holding reads it)."""
    from matmul.call import yielding

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the job's stand-in worker
    steps = []

    class Gate:
        held_s = 0.0

        def wait(self):
            steps.append("wait")
            if steps == ["wait"]:  # the caller busy for 2 s before the context, quiet afterwards
                self.held_s += 2.0

        def before(self, step):
            return step

        def hold_tilus_benchmarks(self):
            pass

    monkeypatch.setattr(yielding.CallerGate, "for_request", classmethod(lambda cls, request: Gate()))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: steps.append("context"))
    job = {"key": "k", "m": 32, "n": 32, "k": 32, "names": ["v1", tuner.VENDOR]}
    request = {"device": "cuda:0", "dtype": "float16", "arch": "sm_90a", "jobs": [job, {**job, "key": "j"}]}
    tuner.child_main({**request, "worker": "stand_ins:cpu_worker"})
    assert steps[:2] == ["wait", "context"]
    reports = [json.loads(line.removeprefix(tuner.PROTOCOL)) for line in capsys.readouterr().out.splitlines()]
    yielded = {r["key"]: r["entry"]["yielded_s"] for r in reports if "entry" in r}
    assert yielded == {"k": 2.0, "j": 0.0}


# --- a version called on its own -----------------------------------------------------------------


@pytest.mark.parametrize(
    "version, m, n, k, limit",
    [
        ("v7", 70000, 32768, 64, "supports only some shapes"),  # V7 is for M <= 256
        ("v0", 70000, 32768, 64, r"32 bits .* C reaches element 2,293,760,000"),
        ("v7", 256, 2**23 + 8, 64, r"32 bits .* C reaches"),  # C written by store_global
    ],
)
def test_running_a_version_past_what_it_can_index_is_refused(monkeypatch, version, m, n, k, limit):
    module = versions.load(ARCH, version)
    monkeypatch.setattr(versions, "kernel", lambda *args, **kwargs: pytest.fail("launched past its limits"))
    monkeypatch.setattr(versions, "check_operands", lambda a, b, out: torch.empty(m, n, device="meta").half())
    a, b = torch.empty(m, k, device="meta").half(), torch.empty(n, k, device="meta").half()
    with pytest.raises(matmul.MatmulInputError, match=limit) as refused:
        versions.run(module, a, b)
    assert f"hopper/{version}" in str(refused.value) and "matmul.matmul(a, b)" in str(refused.value)
    assert not versions.fits(module, m, n, k) and tuner.fits is versions.fits


# --- the structure -------------------------------------------------------------------------------


def test_the_tuner_imports_neither_the_public_call_nor_the_launch_path():
    from matmul.call import building

    for module in (tuner, chooser, building):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
        } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"api", "launch", "child"}, module.__name__


def test_the_tune_command_expands_a_model_to_one_m_per_bucket():
    import argparse

    from matmul import cli

    ms = cli.bucket_representatives("1-8192")
    assert {tuner.bucket(m) for m in range(1, 8193)} == {tuner.bucket(m) for m in ms} and len(ms) == len(set(ms))
    assert cli.bucket_representatives("1-100") == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 100]
    shapes = cli.tune_shapes(argparse.Namespace(model="llama-3-8b", m="16,128", shapes="1x2x3"))
    assert (16, 128256, 4096) in shapes and (128, 1024, 4096) in shapes and shapes[-1] == (1, 2, 3)
    assert len(shapes) == 2 * 7 + 1


def test_the_tune_command_measures_only_the_buckets_its_out_table_lacks():
    """``--out FILE`` keeps FILE's entries valid for these sources: a run cut short resumes, and a table
    made again for a few buckets (their entries stale) measures only those."""
    from matmul import cli

    kept = {key(128, 4096, 4096): entry("v7"), key(16, 4096, 4096, torch.bfloat16): entry("v7")}
    shapes = [(128, 4096, 4096), (100, 4096, 4096), (16, 4096, 4096), (128, 6144, 4096)]
    todo, versions_kept = cli.still_to_tune(shapes, kept, ARCH, GPU, torch.float16, PLAIN)
    assert todo == [(16, 4096, 4096), (128, 6144, 4096)]  # 100 is in 128's bucket; 16's entry is bfloat16's
    assert versions_kept == {(128, 4096, 4096): "v7", (100, 4096, 4096): "v7"}
    assert cli.still_to_tune(shapes, kept, ARCH, GPU, torch.float16, Variant("kn")) == (shapes, {})


def test_the_tune_command_keeps_its_out_tables_entries_decided_by_the_rules_as_they_stand(tmp_path):
    """``tune --out FILE`` keeps FILE's entries made with these sources (a stale one is measured
    again), each decided again from its own times: a version that won by less than the margin now
    gives its bucket to cuBLAS, one that won by more keeps it."""
    from matmul import cli

    def timed(version_ms, fresh=True):
        made = entry("v7", fresh=fresh)
        made["candidates"] = {
            "v7": {**made, "call_ms": version_ms},
            tuner.VENDOR: {"config": {}, "ms": 1.0, "call_ms": 1.0, "error": 0.0},
        }
        return {**made, "ms": version_ms, "call_ms": version_ms}

    thin, clear, stale = key(16, 4096, 4096), key(128, 4096, 4096), key(1, 4096, 4096)
    path = tmp_path / "table.json"
    write_shipped(path, {thin: timed(0.99), clear: timed(0.9), stale: timed(0.9, fresh=False)}, "test", {"gpu": GPU})
    kept = cli.kept_entries(path, ARCH)
    assert set(kept) == {thin, clear} and kept[clear]["version"] == "v7" and kept[thin]["version"] == tuner.VENDOR
    assert tuner.entry_is_valid(ARCH, kept[thin])  # cuBLAS's own fingerprint: kept, not measured again


# --- off the caller's path: narrowed tunings, deferred plans, the GIL --------------------------------


def test_a_bucket_near_a_measured_one_is_tuned_among_the_candidates_that_came_close_there(tmp_path):
    late = LateTuner()
    neighbour = {
        **entry("v4"),
        "candidates": {
            "v4": {"config": entry("v4")["config"], "call_ms": 1.0},
            "v5": {"config": entry("v5")["config"], "call_ms": 1.2},  # within tuner.PRUNE: timed again
            "v3": {"config": entry("v3")["config"], "call_ms": 2.0},  # lost by more: not timed
            tuner.VENDOR: {"config": {}, "call_ms": 1.1},
        },
    }
    other_gpu = tuner.choice_key(ARCH, "another GPU", torch.float16, 1024, 6144, 4096)
    choose = make_chooser(tmp_path, {key(1024, 4096, 4096): neighbour, other_gpu: neighbour}, tune_jobs=late)
    choose.get(CPU, torch.float16, 1500, 4096, 4096)
    choose.get(CPU, torch.float16, 1500, 8192, 4096)  # no neighbour of this N x K: a full tuning
    instant = choose.get(CPU, torch.float16, 1500, 6144, 4096)[1]  # only another GPU's: its choice, a full tuning
    late.finish.set()
    assert choose.wait(10)
    near, other, alone = sorted(late.jobs, key=lambda job: job["n"])
    assert near["names"] == ["v4", "v5", tuner.VENDOR] and near["narrowed_from"] == key(1024, 4096, 4096)
    assert near["configs"] == {"v4": entry("v4")["config"], "v5": entry("v5")["config"]}
    assert "configs" not in alone and alone["names"] == tuner.candidates(ARCH, 1500, 8192, 4096)
    chosen = instant.get("chosen", instant)  # cuBLAS runs while v4's kernel is built
    assert (chosen["version"], chosen["nearest"]) == ("v4", other_gpu)
    assert "configs" not in other and other["names"] == tuner.candidates(ARCH, 1500, 6144, 4096)


def test_a_narrowed_tuning_at_another_m_times_v7_at_the_token_tile_of_this_m(tmp_path):
    """V7's configuration from a neighbouring M bucket is carried to this bucket's M (``refit``): a
    32-token bucket narrowed from the 16-token one times the 32-token tile, which a full tuning
    would find and which the 16-token configuration, timed as it was, would never be. The same
    bucket's measurement in the other dtype keeps its configuration."""
    late = LateTuner()
    v7 = versions.load(ARCH, "v7")
    sixteen = {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 8, "multicast": 1}
    timed = {"v7": {"config": sixteen, "call_ms": 1.0}, tuner.VENDOR: {"config": {}, "call_ms": 1.05}}
    measured = {
        key(16, 4096, 4096): {**entry("v7"), "config": sixteen, "candidates": timed},
        key(64, 4096, 14336, torch.bfloat16): {**entry("v7"), "config": sixteen, "candidates": timed},
    }
    choose = make_chooser(tmp_path, measured, tune_jobs=late)
    choose.get(CPU, torch.float16, 32, 4096, 4096)
    choose.get(CPU, torch.float16, 64, 4096, 14336)  # the bfloat16 bucket of the same M: as it was
    late.finish.set()
    assert choose.wait(10)
    other_m, same_m = sorted(late.jobs, key=lambda job: job["k"])
    assert other_m["narrowed_from"] == key(16, 4096, 4096)
    assert other_m["configs"]["v7"] == {"block_m": 32, "warpgroups": 1, "split": 2, "stages": 12, "multicast": 1}
    assert other_m["configs"]["v7"] in versions.space(v7)
    assert same_m["configs"]["v7"] == sixteen


def test_a_stale_buckets_background_tuning_is_narrowed_by_its_own_times(tmp_path):
    """As ``tune(narrow=True)`` (``Chooser.hint``): a bucket measured with other kernel sources is
    timed again among the candidates that came close in its own measurement, not its relative's."""
    late = LateTuner()
    timed = {
        "v4": {"config": entry("v4")["config"], "call_ms": 1.0},
        "v5": {"config": entry("v5")["config"], "call_ms": 2.0},
        tuner.VENDOR: {"config": {}, "call_ms": 1.1},
    }
    own = {"v3": {"config": entry("v3")["config"], "call_ms": 1.0}, tuner.VENDOR: {"config": {}, "call_ms": 1.2}}
    measured = {key(1024, 4096, 4096): {**entry("v4"), "candidates": timed}}
    shipped = {key(128, 4096, 4096): {**entry("v3", fresh=False), "candidates": own}}
    choose = make_chooser(tmp_path, measured, shipped=shipped, tune_jobs=late)
    found = choose.get(CPU, torch.float16, 128, 4096, 4096)[1]
    assert (found["source"], found["stale"]) == ("shipped", True)
    late.finish.set()
    assert choose.wait(10)
    (job,) = late.jobs
    assert job["names"] == ["v3", tuner.VENDOR] and job["narrowed_from"] == key(128, 4096, 4096)


def test_tuning_up_front_narrowed_takes_the_buckets_own_stale_times_else_its_relatives(tmp_path, monkeypatch):
    monkeypatch.setattr(chooser, "PARALLEL_BUILDS", 4)
    late = LateTuner()
    late.finish.set()
    timed = {
        "v4": {"config": entry("v4")["config"], "call_ms": 1.0},
        "v5": {"config": entry("v5")["config"], "call_ms": 2.0},  # not close: not timed again
        tuner.VENDOR: {"config": {}, "call_ms": 1.1},
    }
    stale = {**entry("v5", fresh=False), "candidates": {**timed, "v3": {"config": entry("v3")["config"], "call_ms": 1}}}
    measured = {key(1024, 4096, 4096): {**entry("v4"), "candidates": timed}, key(128, 4096, 4096): stale}
    batches = []

    def build_recorded(jobs, on_built):
        batches.append(sorted(job["version"] for job in jobs))
        build_here(jobs, on_built)

    choose = make_chooser(tmp_path, measured, tune_jobs=late, mode="blocking", build_jobs=build_recorded)
    shapes = [(1000, 4096, 4096), (128, 4096, 4096), (16, 8192, 4096)]
    choose.tune(CPU, torch.bfloat16, shapes, narrow=True, progress=False)
    jobs = {job["key"]: job for job in late.jobs}
    other_dtype = jobs[key(1024, 4096, 4096, torch.bfloat16)]  # float16's same bucket
    assert other_dtype["names"] == ["v4", tuner.VENDOR] and other_dtype["narrowed_from"] == key(1024, 4096, 4096)
    assert jobs[key(16, 8192, 4096, torch.bfloat16)]["names"] == tuner.candidates(ARCH, 16, 8192, 4096)  # no relative
    choose.tune(CPU, torch.float16, [(128, 4096, 4096)], narrow=True, progress=False)
    own = late.jobs[-1]  # its own stale times, not the relative's
    assert own["names"] == ["v3", "v4", tuner.VENDOR] and own["narrowed_from"] == key(128, 4096, 4096)
    # the narrowed candidates' kernels were built before the tuning, at once (v3: timed, never chosen)
    assert sorted(v for batch in batches[-2:] for v in batch) == ["v3", "v4"] and all(len(b) == 1 for b in batches)
    choose.tune(CPU, torch.float16, [(8000, 4096, 4096)], progress=False)
    assert late.jobs[-1]["names"] == tuner.candidates(ARCH, 8000, 4096, 4096)  # not asked to narrow: in full


def test_the_kernels_listed_for_a_narrowed_tuning_are_those_it_builds_first(tmp_path, monkeypatch):
    """``Chooser.planned_builds`` (``tune --list-kernels``), computed without the GPU: the kernels a
    narrowed tuning of the same buckets builds before it measures, none for a bucket with a fresh
    choice or nothing to narrow from."""
    monkeypatch.setattr(chooser, "PARALLEL_BUILDS", 4)
    late = LateTuner()
    late.finish.set()
    timed = {
        "v4": {"config": entry("v4")["config"], "call_ms": 1.0},
        "v5": {"config": entry("v5")["config"], "call_ms": 2.0},
        tuner.VENDOR: {"config": {}, "call_ms": 1.1},
    }
    stale = {**entry("v5", fresh=False), "candidates": {**timed, "v3": {"config": entry("v3")["config"], "call_ms": 1}}}
    measured = {key(1024, 4096, 4096): {**entry("v4"), "candidates": timed}, key(128, 4096, 4096): stale}
    built = []

    def build_recorded(jobs, on_built):
        built.extend((job["version"], job["config"]) for job in jobs)
        build_here(jobs, on_built)

    choose = make_chooser(tmp_path, measured, tune_jobs=late, mode="blocking", build_jobs=build_recorded)
    # its own stale times (v3, v4); fresh (none); the nearest M's (v4); no relative (none)
    shapes = [(128, 4096, 4096), (1000, 4096, 4096), (3000, 4096, 4096), (16, 8192, 4096)]
    planned = choose.planned_builds(ARCH, GPU, torch.float16, shapes)
    assert sorted(version for version, _ in planned) == ["v3", "v4"]
    choose.tune(CPU, torch.float16, shapes, narrow=True, progress=False)
    assert sorted(planned, key=str) == sorted(built, key=str)


def test_tune_list_kernels_prints_compile_kernels_lines_for_the_named_gpu(monkeypatch, capsys):
    from matmul import cli

    with pytest.raises(SystemExit):
        cli.main(["tune", "--shapes", "128x4096x4096", "--list-kernels"])
    assert "--list-kernels needs --gpu" in capsys.readouterr().err
    asked = []

    def planned_builds(arch, gpu, dtype, shapes, variant, use_shipped):
        asked.append((arch, gpu, dtype, shapes, variant.key()))
        return [("v7", {"block_m": 16, "split": 2}), ("v0", None)]  # a version without a configuration: no line

    monkeypatch.setattr(api._chooser, "planned_builds", planned_builds)
    argv = ["tune", "--shapes", "128x4096x4096", "--list-kernels", "--gpu", "G", "--dtype", "bfloat16"]
    assert cli.main([*argv, "--variant", "kn"]) == 0
    assert capsys.readouterr().out.splitlines() == ['v7|{"block_m": 16, "split": 2}|bfloat16|kn']
    assert asked == [("sm_90a", "G", torch.bfloat16, [(128, 4096, 4096)], "kn")]


def test_an_unseen_call_deferred_by_the_native_entry_gets_its_plan_on_the_planners_thread(tmp_path, stand_ins):
    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): entry(tuner.VENDOR)})
    path = stand_in_plans(choose)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    assert path.defer(a, w.T) is True  # the entry runs cuBLAS now
    assert path.planner.wait(10)
    assert isinstance(path.plans[signature(a, w.T, None)], VendorPlan)
    assert path.defer(a, w.T) is False  # derived: the Python path has its plan
    column_major = a.T.contiguous().T  # TMA cannot read it, torch can: a cuBLAS plan
    assert path.defer(column_major, w.T) is True and path.planner.wait(10)
    assert isinstance(path.plans[signature(column_major, w.T, None)], VendorPlan)
    bad = a[:, :31]  # K of 31 against w's 32: the checks refuse it, so its later calls take the Python path
    assert path.defer(bad, w.T) is True and path.planner.wait(10)
    assert signature(bad, w.T, None) in path.refused and path.defer(bad, w.T) is False
    choose.mode = "blocking"  # the caller asked to wait for the choice: nothing is deferred
    b, v = random_operands(64, 64, 32, torch.float16, device="cpu")
    assert path.defer(b, v.T) is False
    assert stand_in_plans(None).defer(a, w.T) is False  # no chooser (the tuner's host probe)


def test_the_planners_derivation_allocates_no_output(tmp_path, stand_ins, monkeypatch):
    """The planner derives a plan from C's strides, not from a C it allocates: its allocation would
    hold the GIL (and wait for cudaMalloc) while the caller's first call of the signature runs."""
    from matmul import contract

    allocated = []
    plain = contract.empty_padded

    def recorded(rows, cols, dtype, device):
        allocated.append(str(device))
        return plain(rows, cols, dtype, device)

    monkeypatch.setattr(contract, "empty_padded", recorded)
    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): entry("v4")})
    choose.get(CPU, torch.float16, 128, 64, 32)  # its kernel built before the calls below
    assert choose.wait(10)
    path = stand_in_plans(choose)
    a, w = random_operands(100, 64, 32, torch.float16, device="cpu")
    assert path.defer(a, w.T) is True and path.planner.wait(10)
    plan = path.plans[signature(a, w.T, None)]
    assert isinstance(plan, SeriesPlan) and plan.ldc == contract.aligned_row_length(64, torch.float16)
    assert "cpu" not in allocated and allocated  # the strides came from a C on the meta device


def _derived_while_calling(path, a, w, calling_s: float) -> tuple[float, float]:
    """Defer ``a @ w.T`` while a caller stamps a call every 2 ms for ``calling_s``; when its plan was
    kept and when the calls stopped (seconds from the deferral)."""
    from matmul.call import yielding

    assert yielding.shared_fd() is not None  # the process's word of its last call
    start = time.monotonic()
    stop = start + calling_s

    def caller():
        while time.monotonic() < stop:
            yielding.stamp_call()
            time.sleep(0.002)

    calls = threading.Thread(target=caller)
    calls.start()
    try:
        assert path.defer(a, w.T) is True
        while signature(a, w.T, None) not in path.plans and time.monotonic() < start + 10:
            time.sleep(0.005)
        kept = time.monotonic() - start
    finally:
        calls.join()
    assert path.planner.wait(10)
    return kept, stop - start


def test_the_planner_waits_for_the_caller_to_pause_unless_told_not_to(tmp_path, stand_ins, monkeypatch):
    """``MATMUL_PLAN_QUIET_MS`` (yielding.planner_gate): by default a deferred call's plan is derived
    once the caller's calls pause, or after the longest hold; with 0, at once."""
    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): entry(tuner.VENDOR)})
    monkeypatch.delenv("MATMUL_PLAN_QUIET_MS", raising=False)
    monkeypatch.setenv("MATMUL_PLAN_MAX_HOLD_MS", "5000")
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    kept, stopped = _derived_while_calling(stand_in_plans(choose), a, w, calling_s=0.6)
    assert stopped + 0.015 <= kept < stopped + 2  # once the calls had paused for the default gap
    monkeypatch.setenv("MATMUL_PLAN_QUIET_MS", "0")
    kept, stopped = _derived_while_calling(stand_in_plans(choose), a, w, calling_s=0.6)
    assert kept < stopped  # at once, the caller still calling
    monkeypatch.setenv("MATMUL_PLAN_QUIET_MS", "50")
    monkeypatch.setenv("MATMUL_PLAN_MAX_HOLD_MS", "150")
    kept, stopped = _derived_while_calling(stand_in_plans(choose), a, w, calling_s=1.5)
    assert 0.14 <= kept < stopped  # the caller never paused: after the longest hold


def test_a_busy_caller_gets_one_plan_per_hold_and_its_stale_operands_back(tmp_path, stand_ins, monkeypatch):
    """While the caller never pauses, the planner derives one plan per longest hold and drops the
    calls that waited longer (their operands released, not kept alive for minutes); the next call
    of a dropped signature queues it again, and it is derived once the caller pauses."""
    import gc
    import weakref

    monkeypatch.setenv("MATMUL_PLAN_QUIET_MS", "50")
    monkeypatch.setenv("MATMUL_PLAN_MAX_HOLD_MS", "300")
    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): entry(tuner.VENDOR)})
    path = stand_in_plans(choose)
    with caller_never_pausing():
        rows = [100, 110, 120]
        operands = [random_operands(m, 64, 32, torch.float16, device="cpu") for m in rows]
        keys = [signature(a, w.T, None) for a, w in operands]
        held = [weakref.ref(a) for a, _ in operands]
        assert path.defer(operands[0][0], operands[0][1].T)
        time.sleep(0.15)  # the first call's plan waits one hold (to 0.3 s); the next two queue meanwhile
        assert all(path.defer(a, w.T) for a, w in operands[1:])
        del operands
        # at 0.3 s the second is 0.15 s old: it waits a hold of its own (to 0.6 s); the third is then
        # older than a hold and dropped, not derived at 0.9 s
        time.sleep(1.05)
        gc.collect()
        assert [k in path.plans for k in keys] == [True, True, False]
        assert held[2]() is None  # nothing of the dropped call kept
        assert not path.refused and not path.planner.busy()
        again = random_operands(rows[2], 64, 32, torch.float16, device="cpu")
        assert path.defer(again[0], again[1].T) is True  # queued again by its next call
    assert path.planner.wait(10) and keys[2] in path.plans  # the caller paused: derived


def test_a_job_submitted_without_a_wake_waits_for_the_lingering_threads_next_look():
    """``Worker.submit(wake=False)``: a lingering thread is not woken (it would take the GIL the moment
    the caller releases it); it finds the job at its next look, ``poll_s`` later. With a wake, at once."""
    from matmul.call.background import Worker

    ran = {}
    worker = Worker("test", lambda group, payloads: ran.update({p: time.monotonic() for p in payloads}), 5.0, 0.4)
    worker.submit("first", "first")  # starts the thread, which then lingers
    assert worker.wait(10)
    time.sleep(0.05)
    submitted = time.monotonic()
    worker.submit("woken", "woken")
    assert worker.wait(10) and ran["woken"] - submitted < 0.2
    time.sleep(0.05)
    submitted = time.monotonic()
    worker.submit("asleep", "asleep", wake=False)
    assert worker.wait(10) and 0.2 < ran["asleep"] - submitted < 2


def test_the_planner_is_woken_for_a_deferred_call_only_where_it_derives_at_once(tmp_path, stand_ins, monkeypatch):
    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): entry(tuner.VENDOR)})
    path = stand_in_plans(choose)
    wakes = []
    monkeypatch.setattr(path.planner, "submit", lambda key, payload, group=None, wake=True: wakes.append(wake))
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    monkeypatch.delenv("MATMUL_PLAN_QUIET_MS", raising=False)
    assert path.defer(a, w.T)
    monkeypatch.setenv("MATMUL_PLAN_QUIET_MS", "0")
    assert path.defer(a, w.T)
    assert wakes == [False, True]


def test_a_process_exits_cleanly_while_a_worker_is_inside_torch():
    """A daemon thread inside torch when the interpreter finalizes aborts the process ("terminate
    called without an active exception"): at exit the workers are closed and their threads given
    time to finish first (background._close_workers)."""
    import subprocess
    import textwrap

    script = textwrap.dedent(
        """
        import time, torch
        from matmul.call.background import Worker
        worker = None
        def job(group, payloads):
            x = torch.ones(256, 256)
            while not worker.closing:
                x @ x  # torch's binding releases the GIL here and takes it back after
        worker = Worker("test", job, exit_join_s=2.0)
        worker.submit("spin", None)
        time.sleep(0.3)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_worker_waiting_on_a_long_job_does_not_hold_the_process_exit():
    """The tuning and building workers wait on child processes for minutes: at exit they are closed,
    not waited for (``exit_join_s`` 0)."""
    import subprocess
    import textwrap

    from matmul.call.background import EXIT_JOIN_S

    def seconds_to_exit(job_seconds: float) -> float:
        """From the script's last line to the end of its process, with a worker in the middle of a job."""
        script = textwrap.dedent(
            f"""
            import time
            from matmul.call.background import Worker
            worker = Worker("test", lambda group, payloads: time.sleep({job_seconds}))
            worker.submit("job", None)
            time.sleep(0.2)
            print(time.time(), flush=True)
            """
        )
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return time.time() - float(done.stdout.split()[-1])

    # against the same process whose job ended before the exit: the interpreter's own teardown
    # (1-2 s on a loaded two-core machine) is in both, a wait of EXIT_JOIN_S or of the job's 30 s only in one
    assert seconds_to_exit(30) - seconds_to_exit(0) < EXIT_JOIN_S / 2


def test_the_planner_derives_nothing_once_the_process_is_exiting(tmp_path, stand_ins, monkeypatch):
    monkeypatch.setenv("MATMUL_PLAN_QUIET_MS", "50")
    monkeypatch.setenv("MATMUL_PLAN_MAX_HOLD_MS", "5000")
    from matmul.call import yielding

    choose = make_chooser(tmp_path, shipped={key(128, 64, 32): entry(tuner.VENDOR)})
    path = stand_in_plans(choose)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    yielding.shared_fd()
    yielding.stamp_call()  # the caller called just now: the derivation waits for 50 ms of quiet
    assert path.defer(a, w.T)
    deadline = time.monotonic() + 0.04
    while not path.planner.running and time.monotonic() < deadline:
        time.sleep(0.001)
    assert path.planner.running  # taken: the thread is in its wait for the caller to pause
    path.planner.close()  # meanwhile the process starts to exit
    assert path.planner.join(5) and not path.plans and not path.refused
    assert path.defer(a, w.T) and path.planner.thread is None  # nothing queued after close


def test_background_work_shortens_the_gils_switch_interval_while_it_runs():
    from matmul.call.background import SWITCH_INTERVAL_S, Worker

    before, seen, release = sys.getswitchinterval(), [], threading.Event()

    def job(group, payloads):
        seen.append(sys.getswitchinterval())
        assert release.wait(10)

    worker = Worker("test", job, linger_s=0.5)
    worker.submit("a", None)
    release.set()
    assert worker.wait(10)
    assert seen == [pytest.approx(min(before, SWITCH_INTERVAL_S))] and sys.getswitchinterval() == before
    assert worker.thread is not None  # lingers for the next job instead of ending at once


# --- tuning that yields the GPU to the caller (matmul/call/yielding.py) ---------------------------


class Caller:
    """A stand-in clock and caller for ``CallerGate``: ``calls`` are the times (ns) at which the caller
    calls; ``sleep`` advances the clock, and the word holds the last call made by then."""

    def __init__(self, calls):
        self.now, self.calls, self.slept = 0, sorted(calls), []

    def last_call_ns(self):
        return max((t for t in self.calls if t <= self.now), default=-(10**12))

    def sleep(self, seconds):
        assert seconds > 0, "a wait that does not advance would spin"
        self.slept.append(seconds)
        self.now += round(seconds * 1e9)

    def gate(self, quiet_s=0.05, max_hold_s=5.0):
        from matmul.call.yielding import CallerGate

        return CallerGate(self.last_call_ns, quiet_s, max_hold_s, now_ns=lambda: self.now, sleep=self.sleep)


MS = 10**6


def test_the_tuning_child_waits_while_the_callers_last_call_is_fresh():
    caller = Caller([0, 30 * MS, 70 * MS])  # calls 30 and 40 ms apart: never 50 ms quiet until 120 ms
    gate = caller.gate(quiet_s=0.05)
    assert gate.wait() == pytest.approx(0.12) and caller.now == 120 * MS and gate.cut_short == 0
    assert caller.slept == pytest.approx([0.05, 0.03, 0.04])  # woken when the gap would end, not polling


def test_the_tuning_child_goes_on_at_once_once_the_caller_is_quiet():
    caller = Caller([0])
    caller.now = 50 * MS  # the last call 50 ms ago: quiet
    assert caller.gate(quiet_s=0.05).wait() == 0 and caller.slept == []
    caller = Caller([])  # no call at all (a fresh word holds its creation, long past)
    assert caller.gate().wait() == 0 and caller.slept == []


def test_the_tuning_child_goes_on_after_the_longest_hold_though_the_caller_never_pauses():
    caller = Caller(range(0, 10**10, 10 * MS))  # a call every 10 ms for 10 s
    gate = caller.gate(quiet_s=0.05, max_hold_s=2.0)
    assert gate.wait() == pytest.approx(2.0) and gate.cut_short == 1
    assert gate.wait() == pytest.approx(2.0) and gate.held_s == pytest.approx(4.0)  # each step held at most 2 s
    forever = Caller(range(0, 10**10, 10 * MS))
    assert forever.gate(quiet_s=0.05, max_hold_s=float("inf")).wait() == pytest.approx(10.04, abs=0.011)
    for never_hold in (forever.gate(quiet_s=0.0), forever.gate(max_hold_s=0.0)):
        assert never_hold.wait() == 0


def test_a_gated_step_runs_after_the_wait(monkeypatch):
    caller = Caller([0])
    gate = caller.gate(quiet_s=0.05)
    ran_at = []
    step = gate.before(lambda x, y=0: ran_at.append(caller.now) or x + y)
    assert step(1, y=2) == 3 and ran_at == [50 * MS]


def test_the_gates_settings_come_from_the_environment(monkeypatch, caplog):
    from matmul.call import yielding

    assert (yielding.quiet_s(), yielding.max_hold_s()) == (0.05, 5.0)
    monkeypatch.setenv(yielding.QUIET_ENV, "20")
    monkeypatch.setenv(yielding.MAX_HOLD_ENV, "inf")
    assert (yielding.quiet_s(), yielding.max_hold_s()) == (0.02, float("inf"))
    monkeypatch.setenv(yielding.MAX_HOLD_ENV, "soon")
    with caplog.at_level(logging.WARNING):
        assert yielding.max_hold_s() == 5.0
    assert "MATMUL_TUNE_MAX_HOLD_S=soon" in caplog.text
    gate = yielding.CallerGate.for_request({})  # a request that names no word: nothing to wait for
    assert gate.last_call_ns is None and gate.wait() == 0


def test_the_child_reads_the_word_the_caller_stamps():
    from matmul.call import yielding

    word = yielding.LastCall.create()
    child = yielding.LastCall.attach(word.fd)  # as the child maps the descriptor it inherited
    assert child.read_ns() == word.read_ns()
    before = time.monotonic_ns()
    word.stamp()
    assert before <= child.read_ns() <= time.monotonic_ns()


def test_the_tuning_child_holds_its_gpu_steps_while_the_caller_calls(monkeypatch):
    """End to end: the parent hands its word to the child (tuner.tune_in_child); a thread calls
    through the Python path all along; every step the child gates waits the longest hold."""
    from matmul.call import yielding

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv(yielding.QUIET_ENV, "1000")
    monkeypatch.setenv(yielding.MAX_HOLD_ENV, "0.1")
    stop = threading.Event()

    def caller():
        while not stop.is_set():
            yielding.stamp_call()
            time.sleep(0.005)

    assert yielding.shared_fd() is not None
    thread = threading.Thread(target=caller)
    thread.start()
    try:
        jobs = [{"key": "k", "m": 32, "n": 32, "k": 32, "names": ["v1", tuner.VENDOR]}]
        entries = tuner.tune_in_child("sm_90a", torch.float16, CPU, jobs, worker="stand_ins:cpu_worker")
    finally:
        stop.set()
        thread.join()
    # the worker's operands, two preparations and at least one timing of each candidate: held 0.1 s each
    assert entries["k"]["version"] == "v1" and entries["k"]["yielded_s"] >= 5 * 0.1 * 0.9


def test_an_unseen_linear_call_is_deferred_where_a_matmul_call_would_be(tmp_path, stand_ins):
    from matmul.call.launch import fused_signature

    relu = Variant("nk", True, "relu")
    choose = make_chooser(
        tmp_path, shipped={key(128, 64, 32, variant=relu): entry(tuner.VENDOR), key(128, 64, 32): entry(tuner.VENDOR)}
    )
    path = stand_in_plans(choose)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    bias = torch.randn(64).half()
    assert path.defer_linear(a, w.T, bias, "relu") is True  # the entry runs torch's ops now
    assert path.wait_for_background(10)
    fused = fused_signature(a, w.T, None, bias, relu)
    assert fused in path.plans and signature(a, w.T, None) not in path.plans  # the variant's plan, not the plain one
    if path.direct is not None:
        assert path.direct.variant(True, "relu").kind(a, w.T) is not None and path.direct.kind(a, w.T) is None
    assert path.defer_linear(a, w.T, bias, "relu") is False  # derived: the route runs it
    assert path.defer_linear(a, w.T, None, None) is True  # no epilogue: matmul()'s own deferral
    assert path.planner.wait(10) and signature(a, w.T, None) in path.plans
    odd = random_operands(128, 40, 32, torch.float16, device="cpu")[1]  # 40 rows: not gate_up's groups
    assert path.defer_linear(a, odd.T, None, "swiglu") is False  # the Python path names the problem
    assert path.defer_linear(a, w.T, None, "gelu") is False  # not a variant's name (Python maps it)
    bad = a.T.contiguous().T  # column-major x: the checks refuse it, so its later calls take the Python path
    assert path.defer_linear(bad, w.T, bias, "relu") is True and path.planner.wait(10)
    assert path.defer_linear(bad, w.T, bias, "relu") is False
    choose.mode = "blocking"  # the caller asked to wait for the choice: nothing is deferred
    assert path.defer_linear(a, w.T, bias, "silu") is False


# --- kernels built outside the caller's process (matmul/call/building.py) --------------------------


@pytest.fixture
def caller_builds(monkeypatch):
    """Every transpilation or build the caller's process starts, as (what, thread): tilus's entry
    points stand in (a build here still works, with a stand-in kernel, so only this record tells)."""
    from stand_ins import StandInKernel

    from matmul.call import tilus_autotune

    found = []

    def kernel(module, dtype, config=None, variant=PLAIN):
        found.append(("versions.kernel", threading.current_thread().name))
        return StandInKernel(module.__name__.rsplit(".", 1)[1], config, wrong=False, dtype=dtype, variant=variant)

    def record(what, result=None):
        return lambda *args: found.append((what, threading.current_thread().name)) or (result or args[0])

    monkeypatch.setattr(versions, "kernel", kernel)
    monkeypatch.setattr(tilus_autotune, "launch_function", record("launch_function"))
    monkeypatch.setattr(tilus_autotune, "jit_instance", record("jit_instance"))
    monkeypatch.setattr(tilus_autotune, "build", record("build", "/nowhere"))
    return found


@pytest.fixture
def synchronized(monkeypatch):
    """The threads that synchronized the device (``torch.cuda.synchronize``)."""
    threads = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: threads.append(threading.current_thread().name))
    return threads


def in_build_child(builder="stand_ins:cpu_build"):
    from matmul.call import building

    return functools.partial(building.build_in_child, builder=builder)


def test_after_an_unseen_call_the_callers_process_builds_no_kernel(tmp_path, monkeypatch, caller_builds, synchronized):
    """End to end with a real build child (its builder a stand-in that records where it ran): the
    neighbour's kernel that an unseen call's bucket runs at once, then the background tuning's
    winner, are both built in a child; the caller's process only loads them, on the builder's
    thread, and every launch is the caller's own, on its thread; no background thread synchronizes."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    late = LateTuner()  # measures v4, and says nothing of where it was built
    shipped = {key(1024, 64, 32): entry("v3")}  # the neighbour of M = 100: the instant choice
    choose = make_chooser(tmp_path, shipped=shipped, tune_jobs=late, build_jobs=in_build_child())
    path = stand_in_plans(choose)
    a, w = random_operands(100, 64, 32, torch.float16, device="cpu")
    assert path.defer(a, w.T) is True  # as the native entry hands over an unseen call: cuBLAS runs it now
    assert path.planner.wait(10) and choose.builder.wait(120)
    path.launch(a, w.T)
    neighbour = path.plans[signature(a, w.T, None)]
    assert isinstance(neighbour, SeriesPlan) and neighbour.launch.version == "v3"
    assert choose.get(CPU, torch.float16, 100, 64, 32)[1]["source"] == "nearest"

    late.finish.set()
    assert choose.wait(120)
    assert relative_error(path.launch(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]
    measured = path.plans[signature(a, w.T, None)]
    assert isinstance(measured, SeriesPlan) and measured.launch.version == "v4"
    assert caller_builds == [], "the caller's process transpiled or built a kernel"
    assert synchronized == [], "a thread of the caller synchronized the device"
    for plan in (neighbour, measured):
        child_pid, _ = plan.launch.built_by
        assert child_pid != os.getpid() and plan.launch.visible_devices == ""  # built in a child that sees no GPU
        assert plan.launch.loaded_by == (os.getpid(), "matmul-builder")  # only loaded here
        assert set(plan.launch.threads) == {threading.current_thread().name}  # launched by the caller only


def test_the_tuning_childs_winner_is_loaded_where_the_child_built_it(tmp_path, caller_builds):
    from stand_ins import cpu_build

    first_call_done = threading.Event()

    def tune_jobs(arch, dtype, device, jobs, on_entry):
        assert first_call_done.wait(10)
        for job in jobs:  # as tuner.child_main reports the winner: with the directory of its build
            built = cpu_build(arch, dtype, "v4", entry("v4")["config"], PLAIN)
            on_entry(job["key"], {**entry("v4"), "candidates": {}, "rejected": {}, tuner.PROGRAM_DIR: built})

    rebuilt = []
    choose = make_chooser(tmp_path, tune_jobs=tune_jobs, build_jobs=lambda jobs, on_built: rebuilt.extend(jobs))
    path = stand_in_plans(choose)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    path.launch(a, w.T)  # cuBLAS now; the bucket tuned in the background
    first_call_done.set()
    assert choose.wait(10)
    assert rebuilt == [], "the tuning child's build was not used"
    path.launch(a, w.T)
    plan = path.plans[signature(a, w.T, None)]
    assert isinstance(plan, SeriesPlan) and plan.launch.version == "v4" and plan.launch.launches == 1
    stored = ChoiceCache(tmp_path / "cache").entries()[key(128, 64, 32)]
    assert stored["version"] == "v4" and tuner.PROGRAM_DIR not in stored  # a path of this machine's run only
    assert caller_builds == []


def test_a_tuned_result_that_brings_the_running_kernel_built_hands_it_over(tmp_path, caller_builds):
    """The instant choice is v4 (a stale shipped entry) and its build has not come back; the tuning
    measures v4 too and its child built it: the result keeps the kernel, yet the plans that ran
    cuBLAS while v4 was missing must now run it."""
    from stand_ins import cpu_build

    first_call_done = threading.Event()

    def tune_jobs(arch, dtype, device, jobs, on_entry):
        assert first_call_done.wait(10)
        for job in jobs:
            built = cpu_build(arch, dtype, "v4", entry("v4")["config"], PLAIN)
            on_entry(job["key"], {**entry("v4"), "candidates": {}, "rejected": {}, tuner.PROGRAM_DIR: built})

    shipped = {key(128, 64, 32): entry("v4", fresh=False)}
    never_built = []  # the build child that was asked for v4 never reports
    choose = make_chooser(
        tmp_path, shipped=shipped, tune_jobs=tune_jobs, build_jobs=lambda jobs, on_built: never_built.extend(jobs)
    )
    path = stand_in_plans(choose)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    path.launch(a, w.T)
    assert isinstance(path.plans[signature(a, w.T, None)], VendorPlan)  # v4 is not built yet: cuBLAS
    first_call_done.set()
    assert choose.wait(10)
    path.launch(a, w.T)
    plan = path.plans[signature(a, w.T, None)]
    assert isinstance(plan, SeriesPlan) and plan.launch.version == "v4"
    assert caller_builds == []


def test_a_kernel_that_does_not_build_leaves_cublas_in_place(tmp_path, monkeypatch, caller_builds, caplog):
    """The build child reports v4 as failed and dies building v5: both buckets keep running cuBLAS,
    each build is tried once, and the caller builds neither itself. v3's build died with the child
    if it was queued to the same one, else a later child built it: which, the builder's batching
    decides (the three calls come one after another while the first build runs)."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    shipped = {key(128, 64, 32): entry("v4"), key(128, 96, 32): entry("v5"), key(128, 128, 32): entry("v3")}
    choose = make_chooser(tmp_path, shipped=shipped, build_jobs=in_build_child("stand_ins:cpu_build_failing"))
    path = stand_in_plans(choose)
    calls = [random_operands(128, n, 32, torch.float16, device="cpu") for n in (64, 96, 128)]
    with caplog.at_level(logging.WARNING):
        for a, w in calls:
            path.launch(a, w.T)
        assert choose.wait(120)
        for a, w in calls:
            assert relative_error(path.launch(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]
    (a4, w4), (a5, w5), (a3, w3) = calls
    for a, w, why in ((a4, w4, "does not build here"), (a5, w5, "exited with code 7")):
        assert isinstance(path.plans[signature(a, w.T, None)], VendorPlan)
        assert why in choose.get(CPU, torch.float16, 128, w.shape[0], 32)[1]["build_failed"]
    v3_plan = path.plans[signature(a3, w3.T, None)]
    if isinstance(v3_plan, VendorPlan):  # queued behind v5 in the child that died
        assert "exited with code 7" in choose.get(CPU, torch.float16, 128, 128, 32)[1]["build_failed"]
    else:
        assert isinstance(v3_plan, SeriesPlan) and "build_failed" not in choose.get(CPU, torch.float16, 128, 128, 32)[1]
    assert not choose.builder.busy() and caller_builds == []
    failed = 3 if isinstance(v3_plan, VendorPlan) else 2
    assert sum("cuBLAS runs instead" in r.getMessage() for r in caplog.records) == failed


def test_a_stored_choice_goes_stale_only_with_the_sources_its_version_is_built_from(monkeypatch):
    """Hopper V7 sums split-K partials with pipeline/cluster_reduce.py, V6 does not: an edit there
    makes V7's stored choices stale and leaves V6's valid; an edit to the ring both use, both."""
    files = {v: {p.name for p in tuner.fingerprint_files(ARCH, v)} for v in ("v6", "v7")}
    assert "cluster_reduce.py" in files["v7"] and "cluster_reduce.py" not in files["v6"]
    assert {"pipeline.py", "__init__.py", "wgmma_descriptor_offsets.py", "v6.py"} <= files["v6"]  # ring, package, fix
    assert not {"keep_ptx.py", "atomic_library.py"} & files["v6"]  # fixes of how kernels are built, not of their code
    assert "v5.py" in files["v6"] and "v5.py" not in files["v7"]  # V6 sizes its epilogue with V5's staging_columns

    before = {v: tuner.fingerprint.__wrapped__(ARCH, v) for v in ("v6", "v7")}
    read_bytes = Path.read_bytes

    def edited(name):
        return lambda path: read_bytes(path) + (b"\nedited = 1\n" if path.name == name else b"")  # code, not a comment

    monkeypatch.setattr(Path, "read_bytes", edited("cluster_reduce.py"))
    assert tuner.fingerprint.__wrapped__(ARCH, "v7") != before["v7"]
    assert tuner.fingerprint.__wrapped__(ARCH, "v6") == before["v6"]
    monkeypatch.setattr(Path, "read_bytes", edited("pipeline.py"))
    assert all(tuner.fingerprint.__wrapped__(ARCH, v) != before[v] for v in ("v6", "v7"))


def test_a_fingerprint_reads_every_import_of_a_source_once_a_version_of_it(tmp_path, monkeypatch):
    """A version's fingerprint follows its imports wherever they stand (a function's own, a branch,
    a handler, a class body), and a file is parsed once until it changes (the first call's planner
    holds the GIL while it parses)."""
    source = tmp_path / "kernel.py"
    source.write_text(
        "import pipeline.schedulers\n"
        "from pipeline import cluster_reduce, dsmem\n"
        "from .v5 import staging_columns\n"
        "try:\n    import pipeline.clc\nexcept ImportError:\n    from pipeline import turns\n"
        "else:\n    pass\nfinally:\n    import pipeline.broadcast\n"
        "if True:\n    pass\nelse:\n    import pipeline.tma_store\n"
        "def f():\n    for _ in ():\n        with open(0) as x:\n            from pipeline.epilogue import y\n"
        "class K:\n    def g(self):\n        import pipeline.mainloop\n"
    )
    assert set(tuner._imports(source)) == {
        (0, None, ("pipeline.schedulers",)),
        (0, "pipeline", ("cluster_reduce", "dsmem")),
        (1, "v5", ("staging_columns",)),
        (0, None, ("pipeline.clc",)),
        (0, "pipeline", ("turns",)),
        (0, None, ("pipeline.broadcast",)),
        (0, None, ("pipeline.tma_store",)),
        (0, "pipeline.epilogue", ("y",)),
        (0, None, ("pipeline.mainloop",)),
    }
    found = {path.name for path in tuner._pipeline_imports([source])}
    assert {"__init__.py", "cluster_reduce.py", "turns.py", "tma_store.py", "epilogue.py", "mainloop.py"} <= found

    parses = []
    parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda text, *a, **k: parses.append(1) or parse(text, *a, **k))
    tuner._imports_of.cache_clear()
    tuner._imports(source), tuner._imports(source)
    assert len(parses) == 1
    source.write_text(source.read_text() + "import pipeline.stream_k\n")
    os.utime(source, ns=(time.time_ns() + 10**9,) * 2)  # a later version of the file
    assert (0, None, ("pipeline.stream_k",)) in tuner._imports(source) and len(parses) == 2


def test_a_cublas_choice_goes_stale_with_the_versions_it_beat(monkeypatch):
    """cuBLAS holds a bucket only while no version beats it: an edit to a version it was timed
    against (a candidate, or one ruled out by a failure) makes the choice stale, to be measured
    again; an edit to a version it was not timed against does not, and cuBLAS chosen with no version
    to time depends on torch alone. Entries as the tuner writes them (``tune``)."""
    vendor = tuner.VENDOR
    row = {"config": {}, "ms": 1.0, "error": 0.0, "call_ms": 1.0}

    def stored(candidates, rejected=None):
        rejected = rejected or {}
        return {
            **tuner.chosen(ARCH, vendor, row, [*candidates, *rejected]),
            "candidates": candidates,
            "rejected": rejected,
        }

    beat_v7 = stored({"v7": dict(row, ms=1.2), vendor: row})
    v5_failed = stored({vendor: row}, {"v5": "RuntimeError: no kernel image"})
    alone = stored({vendor: row})
    assert all(tuner.entry_is_valid(ARCH, e) for e in (beat_v7, v5_failed, alone))
    assert alone["fingerprint"] == tuner.fingerprint(ARCH, vendor) != beat_v7["fingerprint"]
    # stored before: stamped with torch's fingerprint alone though it was timed against V7
    assert not tuner.entry_is_valid(ARCH, {**beat_v7, "fingerprint": tuner.fingerprint(ARCH, vendor)})

    real = {v: tuner.fingerprint(ARCH, v) for v in ("v5", "v7", vendor)}
    monkeypatch.setattr(tuner, "fingerprint", lambda arch, v: real[v] + ("+edited" if v == "v7" else ""))
    assert not tuner.entry_is_valid(ARCH, beat_v7)  # V7 may beat cuBLAS now
    assert tuner.entry_is_valid(ARCH, v5_failed) and tuner.entry_is_valid(ARCH, alone)
    monkeypatch.setattr(tuner, "fingerprint", lambda arch, v: real[v] + ("+mended" if v == "v5" else ""))
    assert not tuner.entry_is_valid(ARCH, v5_failed)  # V5 may run now
    assert tuner.entry_is_valid(ARCH, beat_v7)


# --- what a recorded configuration is -------------------------------------------------------------


def test_the_tuned_configuration_is_a_point_of_the_space_without_the_kernels_other_parameters(monkeypatch):
    """tilus's schedule names every parameter of the kernel, its dtype, its variant and a default
    such as V6's ``pingpong``; the configuration recorded for a choice is the autotune space's point
    only (with ``pingpong`` in it, V6's choices matched no point: each was refused, and the call ran
    cuBLAS instead of the V6 it had chosen)."""
    from types import SimpleNamespace

    from tilus.lang import instantiated_script

    from matmul.call import tilus_autotune

    v6 = versions.load("sm_90a", "v6")
    point = dict(versions.space(v6)[-1])
    schedule = {"dtype": "float16", **point, "pingpong": False, "b_layout": "nk", "bias": False, "activation": ""}
    script = SimpleNamespace(
        space=v6.Kernel._autotune_space,
        const_params=(),
        tuning_params=(),
        jit_instances={"jit": SimpleNamespace(schedules=[schedule], valid_schedules=[0], dispatch_table={"bucket": 0})},
    )
    monkeypatch.setattr(instantiated_script, "extract_keys", lambda args, const, tuning: ("jit", "bucket"))
    config = tilus_autotune.tuned_config(script, ())
    assert config == point and tuner.space_config(v6, config) == point


def test_a_choice_recorded_with_a_parameters_default_is_still_its_point_of_the_space():
    """Choices tuned before the configuration left the kernel's other parameters out (a choice cache
    on disk, the shipped table's candidates) name V6's ``"pingpong": false``: the same point, which
    must build and be valid. A value other than the default, or a value off the space, is no point."""
    v6 = versions.load("sm_90a", "v6")
    point = dict(versions.space(v6)[0])
    assert tuner.space_config(v6, {**point, "pingpong": False}) == point
    stored = {
        "version": "v6",
        "config": {**point, "pingpong": False},
        "ms": 1.0,
        "fingerprint": tuner.fingerprint("sm_90a", "v6"),
    }
    assert tuner.entry_is_valid("sm_90a", stored) and tuner.entry_is_usable("sm_90a", stored)
    assert tuner.space_config(v6, {**point, "pingpong": True}) is None  # built and checked, never tuned
    assert tuner.space_config(v6, {**point, "stages": 5}) is None
    assert tuner.space_config(v6, {**point, "unknown": 1}) is None
