"""matmul.matmul's contract where no GPU is needed: errors, the layouts of b, the choice and its caches."""

import functools
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import matmul
from matmul.call import api, tilus_autotune, torch_op, tuner
from matmul.call.choice_cache import ChoiceCache, ShippedTable, default_dir
from matmul.call.chooser import Chooser
from matmul.call.launch import Plans, SeriesPlan, VendorPlan, signature
from matmul.contract import check_call, kernel_b
from matmul.kernels import versions
from matmul.kernels.variant import Variant
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error

# --- errors before anything runs -----------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (torch.randn(64, 48).half(), torch.randn(48, 32).half()), "CUDA tensors"),
        (lambda: (torch.randn(64, 48).half(), torch.randn(32, 48).half().T), "CUDA tensors"),
        (lambda: (torch.tensor(1.0).half(), torch.randn(48, 32).half()), "at least one dimension"),
        (lambda: (torch.randn(64, 48).half(), torch.randn(40, 32).half()), r"inner dimensions differ.*b is \[K, N\]"),
        (lambda: (torch.randn(64, 48), torch.randn(48, 32)), "float16 or both bfloat16"),
        (lambda: (torch.randn(64, 48).half(), torch.randn(48, 32).bfloat16()), "float16 or both bfloat16"),
        (lambda: ([[1.0]], torch.randn(1, 1).half()), "must be a torch.Tensor"),
    ],
)
def test_bad_calls_name_the_problem_and_the_fix(make, message):
    a, b = make()
    with pytest.raises(matmul.MatmulInputError, match=message):
        matmul.matmul(a, b)


def test_a_gpu_without_kernels_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(matmul.UnsupportedGPUError, match=r"compute capability 8\.0.*torch\.matmul"):
        api.device_arch(torch.device("cuda:0"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert api.device_arch(torch.device("cuda:0")) == "sm_90a"
    assert issubclass(matmul.UnsupportedGPUError, matmul.MatmulInputError)


# --- the layouts of b ----------------------------------------------------------------------------


def test_transposed_view_of_a_weight_is_read_in_place():
    w = torch.randn(32, 48).half()  # [N, K] row-major, rows of 96 bytes
    bt, b_layout = kernel_b(w.T)  # b = w.T has strides (1, K)
    assert b_layout == "nk" and bt.data_ptr() == w.data_ptr() and bt.stride() == w.stride()


def test_row_major_b_is_read_as_it_is():
    b = torch.randn(17, 30).half()  # [K, N] row-major
    operand, b_layout = kernel_b(b)
    assert b_layout == "kn" and operand is b


@pytest.mark.parametrize(
    "b, expected",
    [
        (torch.randn(5, 1).half(), "nk"),  # N = 1: b.T is one row, in place
        (torch.randn(1, 16).half(), "kn"),  # K = 1: b [1, N] row-major (b.T's rows would be 2 bytes apart)
        (torch.randn(1, 1).half(), "nk"),
    ],
)
def test_degenerate_layouts(b, expected):
    operand, b_layout = kernel_b(b)
    assert b_layout == expected and torch.equal(operand if b_layout == "kn" else operand.T, b)


def test_misaligned_weight_rows_are_refused_with_the_fix():
    w = torch.randn(32, 17).half()  # rows of 34 bytes: TMA cannot read w.T in place
    with pytest.raises(matmul.MatmulInputError, match=r"b\.T's row stride .* pad its rows"):
        kernel_b(w.T)


def test_other_strides_are_refused_with_the_fix():
    b = torch.randn(64, 64).half()[::2, ::2]  # neither layout
    with pytest.raises(matmul.MatmulInputError, match=r"b\.contiguous\(\)"):
        kernel_b(b)


# --- the choice ----------------------------------------------------------------------------------


def test_shape_buckets_follow_tilus():
    from tilus.lang.instantiated_script import construct_keys

    for x in (1, 7, 17, 128, 1000, 4095, 4096, 4097, 14336):
        assert tuner.bucket(x) == construct_keys((), [x])[1][0]
    key = tuner.choice_key("sm_90a", "NVIDIA H100 80GB HBM3", torch.bfloat16, 1000, 14336, 4096)
    assert key == "sm_90a/NVIDIA H100 80GB HBM3/bfloat16/1024x16384x4096"


def fake_prepare(calls, errors=None, failing=()):
    def prepare(version):
        calls.append(version)
        if version in failing:
            raise RuntimeError(f"{version} did not build")
        module = versions.load("sm_90a", version)
        return tuner.Candidate(version, dict(module.REPRESENTATIVE), (errors or {}).get(version, 1e-4), lambda: None)

    return prepare


def test_gpu_timer_times_a_candidate_in_turn_with_cublas_and_scales_cublas_time(monkeypatch):
    windows = []

    def paired(fns, warmup_ms, repeat_ms):  # in this window the clock runs at 80%: both read 1.25x
        windows.append(fns)
        return [1.25 * 1.5, 1.25 * 2.0]

    kernel, cublas = (lambda: None), (lambda: None)
    monkeypatch.setattr(tuner, "interleaved_ms", paired)
    candidate = tuner.Candidate("v1", {}, 1e-4, kernel, reference=cublas, reference_ms=lambda: 2.0)
    assert tuner._gpu_timer(candidate) == pytest.approx(1.5)  # 0.75x cuBLAS's 2.0 ms
    assert windows == [[kernel, cublas]]
    monkeypatch.setattr(tuner, "median_ms", lambda fn, warmup_ms, repeat_ms: 7.0)
    assert tuner._gpu_timer(tuner.Candidate("v1", {}, 1e-4, kernel)) == 7.0  # no reference: its own window


def test_tune_times_the_correct_versions_in_alternating_rounds():
    calls, order = [], []

    def timer(candidate):
        order.append(candidate.version)
        return {"v0": 3.0, "v1": 1.0}[candidate.version]

    times = {"v0": 1.1, "v1": 1.0, "v2": 3.0}
    order.clear()
    entry = tuner.tune(
        "sm_90a",
        torch.float16,
        fake_prepare([]),
        lambda c: order.append(c.version) or times[c.version],
        names=["v0", "v1", "v2"],
        rounds=3,
    )
    # after the first round, v2 (3x the fastest) is not timed again
    assert order == ["v0", "v1", "v2", "v1", "v0", "v0", "v1"] and entry["candidates"]["v2"]["ms"] == 3.0
    order.clear()
    entry = tuner.tune("sm_90a", torch.float16, fake_prepare(calls), timer, names=["v0", "v1"], rounds=3)
    assert calls == ["v0", "v1"] and order == ["v0", "v1", "v1", "v1"]
    assert entry["version"] == "v1" and entry["ms"] == 1.0
    assert entry["config"] == versions.load("sm_90a", "v1").REPRESENTATIVE
    assert entry["fingerprint"] == tuner.fingerprint("sm_90a", "v1")
    assert set(entry["candidates"]) == {"v0", "v1"}


def test_a_version_replaces_cublas_only_when_clearly_faster():
    versions_only = fake_prepare([])

    def prepare(version):
        return tuner.Candidate(version, {}, 1e-4, lambda: None) if version == tuner.VENDOR else versions_only(version)

    def tune(version_ms):
        return tuner.tune(
            "sm_90a",
            torch.float16,
            prepare,
            lambda c: 1.0 if c.version == tuner.VENDOR else version_ms,
            names=["v1", tuner.VENDOR],
        )

    assert tune(0.995)["version"] == tuner.VENDOR  # 0.5% faster: within the noise
    assert tune(1 - tuner.VENDOR_MARGIN / 2)["version"] == tuner.VENDOR  # within the margin
    assert tune(0.97)["version"] == "v1"  # 3% faster
    assert tune(1.2)["version"] == tuner.VENDOR


def test_tune_rules_out_wrong_and_failing_versions():
    entry = tuner.tune(
        "sm_90a",
        torch.float16,
        fake_prepare([], errors={"v1": float("nan")}, failing={"v2"}),
        lambda c: 1.0,
        names=["v0", "v1", "v2"],
    )
    assert entry["version"] == "v0"
    assert "over the tolerance" in entry["rejected"]["v1"] and "did not build" in entry["rejected"]["v2"]
    with pytest.raises(RuntimeError, match="no candidate ran correctly"):
        tuner.tune("sm_90a", torch.float16, fake_prepare([], failing={"v0"}), lambda c: 1.0, names=["v0"])


def tuned_entry(cache, key, calls, names=("v0", "v1")):
    return cache.choose(
        key,
        lambda: tuner.tune(
            "sm_90a", torch.float16, fake_prepare(calls), lambda c: {"v0": 2.0, "v1": 1.0}[c.version], names=list(names)
        ),
        lambda e: tuner.entry_is_valid("sm_90a", e),
    )


KEY = "sm_90a/fake GPU/float16/4096x4096x4096"


def test_a_second_cache_instance_reuses_the_stored_choice(tmp_path):
    first, second = [], []
    assert tuned_entry(ChoiceCache(tmp_path), KEY, first)["version"] == "v1"
    assert tuned_entry(ChoiceCache(tmp_path), KEY, second)["version"] == "v1"
    assert first == ["v0", "v1"] and second == []
    data = json.loads((tmp_path / "choices.json").read_text())
    assert data["format"] == 1 and data["entries"][KEY]["version"] == "v1"


CHILD = textwrap.dedent("""
    import json, sys, time, torch
    sys.path.insert(0, {tests!r})
    from test_api import KEY, fake_prepare
    from matmul.call import tuner
    from matmul.call.choice_cache import ChoiceCache
    calls = []
    def tune():
        time.sleep({sleep})  # a long tuning: another process must wait for it, not tune as well
        return tuner.tune("sm_90a", torch.float16, fake_prepare(calls),
                        lambda c: {{"v0": 2.0, "v1": 1.0}}[c.version], names=["v0", "v1"])
    entry = ChoiceCache({root!r}).choose(KEY, tune, lambda e: tuner.entry_is_valid("sm_90a", e))
    print(json.dumps({{"version": entry["version"], "tuned": calls}}))
""")


def run_children(root, count, sleep, together):
    def start():
        code = CHILD.format(tests=os.path.dirname(__file__), root=str(root), sleep=sleep)
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(proc):
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        return json.loads(stdout.strip().splitlines()[-1])

    if together:
        return [finish(p) for p in [start() for _ in range(count)]]
    return [finish(start()) for _ in range(count)]


def test_a_second_process_reuses_the_stored_choice(tmp_path):
    first, second = run_children(tmp_path, 2, sleep=0, together=False)
    assert first == {"version": "v1", "tuned": ["v0", "v1"]}
    assert second == {"version": "v1", "tuned": []}


def test_concurrent_processes_tune_a_shape_once(tmp_path):
    results = run_children(tmp_path, 2, sleep=2, together=True)
    assert sorted(len(r["tuned"]) for r in results) == [0, 2]
    assert [r["version"] for r in results] == ["v1", "v1"]


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{",
        "garbage \x00\xff",
        json.dumps({"format": 1})[:-3],
        "[1, 2, 3]",
        json.dumps({"format": 1, "tilus": "0.0.1", "entries": {}}),  # another tilus release
        json.dumps({"format": 99, "entries": {}}),
    ],
)
def test_a_corrupt_or_stale_choice_file_is_rebuilt(tmp_path, caplog, content):
    (tmp_path / "choices.json").write_text(content, errors="surrogateescape")
    calls = []
    with caplog.at_level(logging.WARNING):
        assert tuned_entry(ChoiceCache(tmp_path), KEY, calls)["version"] == "v1"
    assert calls == ["v0", "v1"] and "choice cache" in caplog.text
    assert json.loads((tmp_path / "choices.json").read_text())["entries"][KEY]["version"] == "v1"


@pytest.mark.parametrize(
    "spoil",
    [
        lambda e: e.update(version="v9"),  # a version that does not exist
        lambda e: e.update(config={"block_m": 3, "block_n": 5, "block_k": 7}),  # not in the space any more
        lambda e: e.update(fingerprint="0" * 16),  # the kernel's source changed since it was tuned
        lambda e: e.update(ms="fast"),
        lambda e: e.pop("config"),
    ],
)
def test_a_stale_entry_is_tuned_again(tmp_path, spoil):
    cache = ChoiceCache(tmp_path)
    tuned_entry(cache, KEY, [])
    data = json.loads(cache.path.read_text())
    spoil(data["entries"][KEY])
    cache.path.write_text(json.dumps(data))
    calls = []
    assert tuned_entry(cache, KEY, calls)["version"] == "v1" and calls == ["v0", "v1"]
    assert tuner.entry_is_valid("sm_90a", cache.entries()[KEY])


def test_the_choice_file_is_parsed_again_only_when_it_changes(tmp_path, monkeypatch):
    """Lookups of an unchanged file, and of what this process stored, parse nothing (json.loads
    holds the GIL while the caller's calls wait); another process's write is read."""
    from matmul.call import choice_cache

    cache = ChoiceCache(tmp_path)
    tuned_entry(cache, KEY, [])
    parsed = []
    real_loads = json.loads
    monkeypatch.setattr(choice_cache.json, "loads", lambda text: parsed.append(1) or real_loads(text))
    for _ in range(3):
        assert cache.lookup(KEY)["version"] == "v1"
    cache.store("other", {"version": tuner.VENDOR})
    assert set(cache.entries()) == {KEY, "other"} and parsed == []
    data = real_loads(cache.path.read_text())
    data["entries"][KEY]["version"] = "v0"  # another process's write, in place, the same size
    cache.path.write_text(json.dumps(data, indent=1))
    assert cache.lookup(KEY)["version"] == "v0" and parsed == [1]
    cache.entries()["mine"] = {}  # a caller's copy: the cache's own stays as read
    assert "mine" not in cache.entries() and parsed == [1]


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("MATMUL_CACHE_DIR", str(tmp_path / "mine"))
    assert default_dir() == tmp_path / "mine"
    monkeypatch.delenv("MATMUL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == tmp_path / "xdg" / "tilus-matmul"


def test_matmul_cache_dir_also_moves_tilus_cache_unless_tilus_has_its_own(tmp_path):
    """In a folder named after tilus's release and the package's fixes (``tilus_fixes_key``)."""
    from matmul.call.choice_cache import tilus_fixes_key

    code = "import matmul, tilus.option; print(tilus.option.get_option('cache_dir'))"
    env = {k: v for k, v in os.environ.items() if k not in ("MATMUL_CACHE_DIR", "TILUS_CACHE_DIR")}
    env["MATMUL_NATIVE_ENTRY"] = "0"  # a new cache directory would build the native entry again: not tested here
    key = tilus_fixes_key()
    for extra, expected in (
        ({"MATMUL_CACHE_DIR": str(tmp_path / "m")}, tmp_path / "m" / "tilus" / key),
        ({"MATMUL_CACHE_DIR": str(tmp_path / "m"), "TILUS_CACHE_DIR": str(tmp_path / "t")}, tmp_path / "t" / key),
    ):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, **extra})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == str(expected)


def test_a_change_to_a_tilus_fix_moves_tilus_cache_to_a_folder_of_its_own(monkeypatch):
    """tilus keys a built program by its IR alone: a fix that changes only the generated code (as
    ``wgmma_descriptor_offsets`` did) must not find the kernels built before it. Any edit of a fix of
    the code generator, or another tilus release, names another folder; the same sources name the
    same one (a cache built on one machine is found on another). An edit of a fix of how kernels are
    built or loaded (``CHANGES_GENERATED_CODE = False``) keeps the folder, and so the stored choices."""
    from pathlib import Path

    import tilus

    from matmul.call.choice_cache import tilus_fixes_key

    before = tilus_fixes_key()
    assert tilus_fixes_key() == before and before.startswith("fixes-")
    read_bytes = Path.read_bytes

    def edited(name):
        monkeypatch.setattr(Path, "read_bytes", lambda p: read_bytes(p) + (b"\nx = 1\n" if p.name == name else b""))
        key = tilus_fixes_key()
        monkeypatch.setattr(Path, "read_bytes", read_bytes)
        return key

    assert edited("wgmma_descriptor_offsets.py") != before
    assert edited("keep_ptx.py") == before and edited("atomic_library.py") == before
    monkeypatch.setattr(tilus, "__version__", tilus.__version__ + ".post1")
    assert tilus_fixes_key() != before


# --- tilus's own dispatch table ------------------------------------------------------------------


def write_table(directory, content: bytes):
    (directory / "dispatch_table.pickle").write_bytes(content)
    (directory / "latency" / "4096-4096").mkdir(parents=True)


def test_a_valid_tilus_dispatch_table_is_kept(tmp_path):
    write_table(tmp_path, pickle.dumps({(4096, 4096, 4096): 2}))
    assert not tilus_autotune.check_dispatch_table(tmp_path, programs=3)
    assert (tmp_path / "dispatch_table.pickle").exists() and (tmp_path / "latency").exists()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"garbage",
        pickle.dumps({(4096,): 2})[:-4],  # truncated
        pickle.dumps({(4096,): 7}),  # names a program that was not built
        pickle.dumps([1, 2]),
        pickle.dumps({(4096,): "2"}),
    ],
)
def test_a_broken_tilus_dispatch_table_is_removed(tmp_path, content):
    write_table(tmp_path, content)
    assert tilus_autotune.check_dispatch_table(tmp_path, programs=3)
    assert not (tmp_path / "dispatch_table.pickle").exists()
    assert not (tmp_path / "latency").exists()  # tilus would fail to re-create its links there


def test_launch_arguments_hand_tilus_whole_padded_rows():
    from matmul.measure.correctness import poisoned_output, random_operands

    a, b = random_operands(5, 3, 17, torch.float16, device="cpu")
    out = poisoned_output(5, 3, torch.float16, device="cpu")
    m, n, k, fa, fb, fc, lda, ldb, ldc, bias = versions.launch_args(a, b, out)
    assert (m, n, k, lda, ldb, ldc, bias) == (5, 3, 17, 24, 24, 8, 0)
    assert fa.shape == (5, 24) and fa.is_contiguous() and fa.data_ptr() == a.data_ptr()
    assert fa.clone().stride() == (24, 1)  # what tilus tunes on keeps the padded layout


# --- the whole path, with CPU stand-ins for the kernels -------------------------------------------


@pytest.fixture
def stand_ins(monkeypatch):
    from stand_ins import install

    return install(monkeypatch, wrong=("v3",), available=("v2", "v3", "v4"))


def in_process(timer, tuned=None):
    """The chooser's tuning step without a child process: the stand-ins live in this one."""

    def tune_jobs(arch, dtype, device, jobs, on_entry):
        for job in jobs:
            if tuned is not None:
                tuned.append(job["key"])
            variant = Variant.parse(job.get("variant", ""))
            prepare, _ = tuner.gpu_worker(arch, dtype, job["m"], job["n"], job["k"], device, variant)
            on_entry(job["key"], tuner.tune(arch, dtype, prepare, timer, names=job["names"], label=job["key"]))

    return tune_jobs


def versions_win(c):
    return 2.0 if c.version == tuner.VENDOR else 1.0


def cublas_wins(c):
    return 0.5 if c.version == tuner.VENDOR else 1.0


def plans(root, timer=versions_win, tuned=None, gpu="stand-in GPU", mode="blocking"):
    chooser = Chooser(  # blocking: the first call of a bucket waits for its tuning (chooser.py: the other modes)
        ChoiceCache(root),
        tune_jobs=in_process(timer, tuned),
        arch_of=lambda device: "sm_90a",
        gpu_name=lambda device: gpu,
        shipped=ShippedTable([]),
        mode=mode,
    )
    return Plans(chooser, check=functools.partial(check_call, require_cuda=False))


def test_candidates_leave_out_the_teaching_versions_and_what_a_version_rejects(monkeypatch):
    monkeypatch.setattr(versions, "available", lambda arch: ["v0", "v1", "v2", "v3", "v4"])
    v4 = versions.load("sm_90a", "v4")
    assert tuner.candidates("sm_90a", 128, 4096, 4096) == ["v3", "v4", tuner.VENDOR]
    monkeypatch.setattr(v4, "supports", lambda m, n, k: m <= 256, raising=False)
    assert tuner.candidates("sm_90a", 4096, 4096, 4096) == ["v3", tuner.VENDOR]
    assert tuner.candidates("sm_90a", 256, 4096, 4096) == ["v3", "v4", tuner.VENDOR]


def test_a_version_with_32_bit_offsets_declares_how_far_it_reaches(monkeypatch):
    for arch in ("sm_90a", "sm_100a"):
        v0 = versions.load(arch, "v0")
        assert v0.MAX_ELEMENTS == 2**31 - 1
        assert tuner.fits(v0, 4096, 4096, 4096)
        assert not tuner.fits(v0, 135000, 256, 16384)  # A: 2.2e9 elements
        assert not tuner.fits(v0, 256, 135000, 16384)  # B
        assert not tuner.fits(v0, 70000, 32768, 64)  # C
        assert not tuner.fits(v0, 1024, 256, 1024, lda=2**22)  # a view of much wider rows reaches as far
    assert tuner.fits(versions.load("sm_90a", "v3"), 135000, 256, 16384)  # TMA: 64-bit addressing


def test_the_whole_path_with_stand_in_kernels(tmp_path, stand_ins):
    m, n, k = 100, 60, 17  # ragged: the operands tuned on have padded rows
    path = plans(tmp_path)
    a, w = random_operands(m, n, k, torch.float16, device="cpu")
    out = path.launch(a, w.T)
    assert relative_error(out, reference(a, w)) <= TOLERANCE[torch.float16]
    plan = path.plans[signature(a, w.T, None)]
    assert isinstance(plan, SeriesPlan) and plan.launch.version == "v4"
    _, entry = path.chooser.get(torch.device("cpu"), torch.float16, m, n, k)
    assert entry["version"] == "v4" and "over the tolerance" in entry["rejected"]["v3"]  # v3 is wrong
    assert set(entry["candidates"]) == {"v4", tuner.VENDOR}  # v2 teaches; it is not tuned
    out = poisoned_output(m, n, torch.float16, device="cpu")
    assert path.launch(a, w.T, out) is out and relative_error(out, reference(a, w)) <= TOLERANCE[torch.float16]

    # another process: the stored choice is launched without tuning
    never = []
    again = plans(tmp_path, timer=lambda c: pytest.fail("timed again although the choice is stored"), tuned=never)
    assert relative_error(again.launch(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16] and never == []


def test_a_seen_signature_is_launched_without_deriving_anything_again(tmp_path, stand_ins, monkeypatch):
    path = plans(tmp_path)
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    path.launch(a, w.T)
    plan = path.plans[signature(a, w.T, None)]
    derived = []
    original = path.derive
    monkeypatch.setattr(path, "derive", lambda *args: derived.append(args[3]) or original(*args))
    for _ in range(3):
        a2, w2 = random_operands(128, 64, 32, torch.float16, device="cpu")  # new data, same signature
        assert relative_error(path.launch(a2, w2.T), reference(a2, w2)) <= TOLERANCE[torch.float16]
    assert derived == [] and plan.launch.launches == 4

    def calls(*operands):
        before = len(derived)
        result = path.launch(*operands)
        return len(derived) - before, result

    b = w.T.contiguous()  # a new stride: row-major b [K, N], copied per call
    assert calls(a, b)[0] == 1 and calls(a, b)[0] == 0
    assert relative_error(calls(a, b)[1], reference(a, w)) <= TOLERANCE[torch.float16]
    assert calls(a.bfloat16(), w.T.bfloat16())[0] == 1  # a new dtype
    with pytest.raises(matmul.MatmulInputError, match="float16 or both bfloat16"):
        path.launch(a, w.T.bfloat16())  # b's dtype alone differs from a seen signature
    a_big, w_big = random_operands(1000, 64, 32, torch.float16, device="cpu")  # a new bucket: tuned
    tuned_before = len(path.chooser.entries)
    assert calls(a_big, w_big.T)[0] == 1 and len(path.chooser.entries) == tuned_before + 1
    a_near = random_operands(120, 64, 32, torch.float16, device="cpu")[0]  # same bucket, new shape: no tuning
    assert calls(a_near, w.T)[0] == 1 and len(path.chooser.entries) == tuned_before + 1
    out = poisoned_output(128, 64, torch.float16, device="cpu")
    assert calls(a, w.T, out)[0] == 1 and calls(a, w.T, out)[0] == 0  # with out=: a signature of its own


@pytest.fixture
def route():
    """``api.use_plans`` for the test: matmul() uses the plans it is given; the process's afterwards."""
    previous = api._plans

    def use(plans):
        api.use_plans(plans)
        return plans

    yield use
    api.use_plans(previous)


native = pytest.mark.skipif(api._native is None, reason="matmul()'s native entry is not built here")


@native
def test_a_seen_call_without_out_goes_straight_to_its_plan(tmp_path, stand_ins, monkeypatch, route):
    path = route(plans(tmp_path))
    a, w = random_operands(128, 64, 32, torch.float16, device="cpu")
    matmul.matmul(a, w.T)  # first call: through Python, the full checks, the choice, the plan and its route
    plan = path.plans[signature(a, w.T, None)]
    assert path.direct.kind(a, w.T) == "launch"  # the native entry calls the program itself
    launch = path.launch
    monkeypatch.setattr(path, "launch", lambda *args: pytest.fail("a seen call went through Python's matmul"))
    a2, w2 = random_operands(128, 64, 32, torch.float16, device="cpu")
    assert relative_error(matmul.matmul(a2, w2.T), reference(a2, w2)) <= TOLERANCE[torch.float16]
    with torch.no_grad():  # a model's parameters require gradients; inference records none
        assert matmul.matmul(a2, w2.T.requires_grad_()).shape == (128, 64)
    assert plan.launch.launches == 3

    # the same shapes in another layout, b's dtype or b's device: other signatures, through Python
    sent = []
    monkeypatch.setattr(path, "launch", lambda a, b, out=None: sent.append(b) or launch(a, b, out))
    assert relative_error(matmul.matmul(a2, w2.T.contiguous()), reference(a2, w2)) <= TOLERANCE[torch.float16]
    assert isinstance(path.plans[signature(a2, w2.T.contiguous(), None)], SeriesPlan)  # derived for that layout
    assert path.direct.kind(a2, w2.T.contiguous()) == "launch"  # b [K, N] read in place: the program runs
    with pytest.raises(matmul.MatmulInputError, match="float16 or both bfloat16"):
        matmul.matmul(a2, w2.T.bfloat16())
    with pytest.raises(RuntimeError):  # the stand-in kernels check no device: the meta b fails in them
        matmul.matmul(a2, w2.T.to("meta"))
    assert [b.dtype for b in sent] == [torch.float16, torch.bfloat16, torch.float16]
    assert sent[2].device.type == "meta" and plan.launch.launches == 3  # not through the cpu plan
    odd = torch.randn(32, 256).half()[:, ::4]  # strides no kernel takes, as torch takes them: cuBLAS runs it
    assert torch.equal(matmul.matmul(a2, odd), a2 @ odd)
    assert isinstance(path.plans[signature(a2, odd, None)], VendorPlan) and plan.launch.launches == 3

    # cuBLAS won: at::mm on the caller's tensors, with neither Python's matmul nor torch.mm in between
    cublas = route(plans(tmp_path / "cublas", timer=cublas_wins))
    matmul.matmul(a, w.T)
    assert isinstance(cublas.direct.get(a, w.T).__self__, VendorPlan)
    monkeypatch.setattr(cublas, "launch", lambda *args: pytest.fail("a seen call went through Python's matmul"))
    monkeypatch.setattr(torch, "mm", lambda *args, **kwargs: pytest.fail("the vendor route called torch.mm"))
    assert torch.equal(matmul.matmul(a2, w2.T), a2 @ w2.T)


def test_a_call_that_records_a_gradient_or_passes_out_goes_through_python(tmp_path, stand_ins, monkeypatch, route):
    path = route(plans(tmp_path))
    a, w = random_operands(64, 32, 16, torch.float16, device="cpu")
    matmul.matmul(a, w.T)
    seen = []
    monkeypatch.setattr(torch_op, "with_grad", lambda *args: seen.append("grad"))
    matmul.matmul(a.clone().requires_grad_(), w.T)  # recorded by autograd: through the operator
    launch = path.launch
    monkeypatch.setattr(path, "launch", lambda *args: seen.append("out") or launch(*args))
    out = poisoned_output(64, 32, torch.float16, device="cpu")
    assert matmul.matmul(a, w.T, out=out) is out and relative_error(out, reference(a, w)) <= TOLERANCE[torch.float16]
    assert seen == ["grad", "out"]


def test_b_on_another_device_is_a_new_signature():
    a, b = torch.empty(8, 16, dtype=torch.float16), torch.empty(16, 8, dtype=torch.float16)
    assert signature(a, b, None) != signature(a, b.to("meta"), None)


def test_the_signature_names_the_device():
    a, b = torch.empty(8, 16, dtype=torch.float16), torch.empty(16, 8, dtype=torch.float16)
    on_meta = signature(a.to("meta"), b.to("meta"), None)
    assert signature(a, b, None) != on_meta and on_meta[-1] == torch.device("meta")


def test_a_misaligned_pointer_on_a_seen_signature_runs_cublas(tmp_path, stand_ins):
    """TMA needs 16-byte aligned bases; torch takes any: such a call of a kernel's signature runs
    cuBLAS (into ``out`` too), and the next aligned call the kernel again."""
    path = plans(tmp_path)
    a, w = random_operands(64, 32, 16, torch.float16, device="cpu")
    path.launch(a, w.T)
    plan = path.plans[signature(a, w.T, None)]
    launches = plan.launch.launches
    buffer = torch.randn(64 * 16 + 8, dtype=torch.float16)
    shifted = buffer[4 : 4 + 64 * 16].view(64, 16)  # same shape and strides, base 8 bytes off
    assert signature(shifted, w.T, None) == signature(a, w.T, None)
    assert torch.equal(path.launch(shifted, w.T), shifted @ w.T) and plan.launch.launches == launches
    out_buffer = torch.full((64 * 32 + 8,), float("nan"), dtype=torch.float16)
    out = out_buffer[4 : 4 + 64 * 32].view(64, 32)  # an out TMA cannot write: its base 8 bytes off
    assert path.launch(a, w.T, out) is out and torch.equal(out, a @ w.T)
    path.launch(a, w.T)
    assert plan.launch.launches == launches + 1


@pytest.mark.parametrize("odd", ["out rows", "a rows", "out columns"])
def test_operands_torch_takes_and_tma_cannot_run_cublas(tmp_path, stand_ins, odd):
    """Any out (and a) torch.matmul accepts gives its result: cuBLAS where TMA cannot read or write."""
    path = plans(tmp_path)
    a, w = random_operands(16, 17, 24, torch.float16, device="cpu")
    out = torch.full((16, 17), float("nan"), dtype=torch.float16)  # rows of 34 bytes: not TMA's
    if odd == "a rows":
        a, out = torch.randn(16, 25).half()[:, :24], None  # a's rows of 50 bytes
    elif odd == "out columns":
        out = torch.full((17, 16), float("nan"), dtype=torch.float16).T  # column-major
    result = path.launch(a, w.T, out)
    assert torch.equal(result, a @ w.T) and (out is None or result is out)
    assert isinstance(path.plans[signature(a, w.T, out)], VendorPlan)


@pytest.mark.parametrize("winner", [versions_win, cublas_wins])
def test_out_overlapping_an_input_is_refused_on_every_path(tmp_path, stand_ins, winner):
    buffer = torch.randn(64, 64).half()
    a, w = buffer[:, :32], torch.randn(32, 32).half()  # a [64, 32] in the left half of the buffer
    with pytest.raises(matmul.MatmulInputError, match="out overlaps a"):
        plans(tmp_path / "first", timer=winner).launch(a, w.T, buffer[:, 16:48])  # a first call: the full checks
    path = plans(tmp_path / "seen", timer=winner)
    path.launch(a, w.T, buffer[:, 32:])  # the right half is apart from a: fine
    assert signature(a, w.T, buffer[:, 16:48]) == signature(a, w.T, buffer[:, 32:])
    with pytest.raises(matmul.MatmulInputError, match="out overlaps a"):  # a seen signature: the short path
        path.launch(a, w.T, buffer[:, 16:48])
    square = torch.randn(32, 32).half()
    path.launch(torch.randn(32, 32).half(), square, torch.empty(32, 32).half())
    with pytest.raises(matmul.MatmulInputError, match="out overlaps b"):
        path.launch(torch.randn(32, 32).half(), square, square)
    w = torch.randn(32, 32).half()
    path.launch(torch.randn(32, 32).half(), w.T, torch.empty(32, 32).half())
    with pytest.raises(matmul.MatmulInputError, match="out overlaps b"):  # out is the weight behind b = w.T
        path.launch(torch.randn(32, 32).half(), w.T, w)


def test_when_cublas_wins_the_callers_operands_go_to_torch_as_they_are(tmp_path, stand_ins, monkeypatch):
    path = plans(tmp_path, timer=cublas_wins)
    a, w = random_operands(128, 60, 40, torch.float16, device="cpu")
    real = torch.mm
    for b in (w.T, w.T.contiguous()):  # x @ w.T, and a row-major [K, N] b: cuBLAS takes either as it is
        path.launch(a, b)
        assert isinstance(path.plans[signature(a, b, None)], VendorPlan)
        seen = []
        monkeypatch.setattr(torch, "mm", lambda x, y, seen=seen, **kw: seen.append((x, y)) or real(x, y, **kw))
        result = path.launch(a, b)
        monkeypatch.setattr(torch, "mm", real)
        assert seen[0][0] is a and seen[0][1] is b and torch.equal(result, real(a, b))
    b = w.T.contiguous()
    out = poisoned_output(128, 60, torch.float16, device="cpu")  # rows padded to 64: cuBLAS's result copied in
    assert path.launch(a, b, out) is out and relative_error(out, reference(a, w)) <= TOLERANCE[torch.float16]


def test_a_chosen_version_that_cannot_take_a_shape_of_its_bucket_leaves_it_to_cublas(tmp_path, stand_ins, monkeypatch):
    path = plans(tmp_path)
    a, w = random_operands(96, 64, 32, torch.float16, device="cpu")
    path.launch(a, w.T)  # v4 chosen for the bucket of M = 96 (up to 96)
    monkeypatch.setattr(versions.load("sm_90a", "v4"), "supports", lambda m, n, k: m < 90, raising=False)
    a2 = random_operands(95, 64, 32, torch.float16, device="cpu")[0]  # same bucket, M = 95
    out = path.launch(a2, w.T)
    assert isinstance(path.plans[signature(a2, w.T, None)], VendorPlan)
    assert relative_error(out, reference(a2, w)) <= TOLERANCE[torch.float16]


# --- tuning in a child process -------------------------------------------------------------------


def test_a_candidate_that_kills_its_child_is_rejected_and_the_rest_are_tuned(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    jobs = [
        {"key": "one", "m": 64, "n": 64, "k": 64, "names": ["v0", "v1", "v3", "v4", "v5", tuner.VENDOR]},
        {"key": "two", "m": 32, "n": 32, "k": 32, "names": ["v1", tuner.VENDOR]},
    ]
    arrived = []
    entries = tuner.tune_in_child(
        "sm_90a",
        torch.float16,
        torch.device("cpu"),
        jobs,
        worker="stand_ins:cpu_worker",
        on_entry=lambda key, e: arrived.append(key),
    )
    one = entries["one"]
    assert one["version"] == "v5" and "faulted" in one["rejected"]["v3"]
    assert "over the tolerance" in one["rejected"]["v0"] and "does not build" in one["rejected"]["v4"]
    assert set(one["candidates"]) == {"v1", "v5", tuner.VENDOR}
    assert entries["two"]["version"] == "v1" and arrived == ["one", "two"]
    assert torch.ones(2).sum().item() == 2.0  # this process was never touched


def test_a_bucket_runs_from_its_least_to_its_greatest_size():
    assert tuner.bucket_range(3330) == tuner.bucket_range(4096) == (3073, 4096)
    assert tuner.bucket_range(4097) == (4097, 6144) and tuner.bucket_range(1) == (1, 1)
    for x in (5, 100, 1000, 1025, 3330, 8192, 100_000):
        low, top = tuner.bucket_range(x)
        assert tuner.bucket(low) == tuner.bucket(x) == top and tuner.bucket(low - 1) < top


def test_a_version_keeps_the_part_of_its_bucket_where_it_wins(monkeypatch):
    """Tuned in the child, each version against cuBLAS over the bucket 3073-4096 (``edge_worker``: N
    is where v1 starts, and v2 stops, winning). v2, chosen at 3500 and losing at 4096, the greatest
    M: the bucket goes to cuBLAS, and the entry says where v2 lost. v1, chosen at 4096 and winning
    from 3500 up: two bisection steps find 3585, from where it runs. v1 winning at 4096 only: it runs
    there only. v5, faster at every M, keeps its bucket. Every M is tuned with the configuration the
    winner was chosen in."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    jobs = [
        {"key": "lost", "m": 3500, "n": 3500, "k": 64, "names": ["v2", tuner.VENDOR]},
        {"key": "split", "m": 4096, "n": 3500, "k": 64, "names": ["v1", tuner.VENDOR]},
        {"key": "top", "m": 4096, "n": 4096, "k": 64, "names": ["v1", tuner.VENDOR]},
        {"key": "kept", "m": 3500, "n": 64, "k": 64, "names": ["v5", tuner.VENDOR]},
    ]
    entries = tuner.tune_in_child("sm_90a", torch.float16, torch.device("cpu"), jobs, worker="stand_ins:edge_worker")
    lost, split, top, kept = (entries[key] for key in ("lost", "split", "top", "kept"))
    assert lost["version"] == tuner.VENDOR and lost["config"] == {} and lost["lost_at"] == 4096
    assert lost["ms"] == lost["candidates"][tuner.VENDOR]["ms"] and tuner.PROGRAM_DIR not in lost
    assert lost["edges"] == {"4096": {"v2": 1.5, tuner.VENDOR: 1.0}} and "from_m" not in lost
    # stale once v2, which it beat, is edited (``choice_fingerprint``)
    assert lost["fingerprint"] == tuner.choice_fingerprint("sm_90a", tuner.VENDOR, ["v2"])
    assert tuner.entry_is_valid("sm_90a", lost)
    assert split["version"] == "v1" and split["config"] == {"M": 4096} and split["from_m"] == 3585
    assert split["edges"] == {"3073": {"v1": 1.5, tuner.VENDOR: 1.0}, "3585": {"v1": 0.5, tuner.VENDOR: 1.0},
                              "3329": {"v1": 1.5, tuner.VENDOR: 1.0}}  # fmt: skip
    assert top["version"] == "v1" and top["from_m"] == 4096 and set(top["edges"]) == {"3073", "3585", "3841"}
    assert kept["version"] == "v5" and kept["config"] == {"M": 3500} and "lost_at" not in kept
    assert set(kept["edges"]) == {"3073", "4096"} and "from_m" not in kept


def test_a_buckets_split_is_probed_one_row_into_a_tile():
    """``split_probe``: between an M where the version lost and one where it won, one row past a
    quarter of the bucket's step, as the bucket's least M is: a 128-row tile just begun, and an odd
    number of them (V6's pairs idle in the last row)."""
    assert tuner.split_probe(3073, 4096) == 3585 and tuner.split_probe(3585, 4096) == 3841
    assert tuner.split_probe(3073, 3585) == 3329 and tuner.split_probe(6145, 8192) == 7169
    assert tuner.split_probe(97, 128) == 113 and tuner.split_probe(113, 128) == 121
    for probe in (3585, 3841, 3329, 7169, 1793):
        assert probe % 128 == 1 and -(-probe // 128) % 2 == 1
    assert (
        tuner.split_probe(13, 16) == 14 and tuner.split_probe(15, 16) is None and tuner.split_probe(3841, 4096) is None
    )


def test_a_stored_choice_is_decided_again_by_the_rules_from_its_own_times():
    """``tuner.redecided``: a table made under a looser margin, decided again from the call times
    its entries store. A version whose win at its own M is within ``VENDOR_MARGIN`` gives the bucket
    to cuBLAS (with cuBLAS's fingerprint); one that still wins there but no longer at the greatest M
    loses the bucket there (``lost_at``); one that still wins at its M and at a probe keeps the part
    from the least M it is seen winning at, an M it has no times for counting as a loss."""
    near = 1 - tuner.VENDOR_MARGIN / 2  # within the margin: no longer a win
    far = 1 - 2 * tuner.VENDOR_MARGIN

    def stored(version_ms, edges, **fields):
        times = {"v7": {"config": {"M": 1}, "ms": version_ms, "call_ms": version_ms, "error": 0.0},
                 tuner.VENDOR: {"config": {}, "ms": 1.0, "call_ms": 1.0, "error": 0.0}}  # fmt: skip
        edges = {str(m): {"v7": t, tuner.VENDOR: 1.0} for m, t in edges.items()}
        return {"version": "v7", "config": {"M": 1}, "ms": version_ms, "call_ms": version_ms, "fingerprint": "x",
                "candidates": times, "rejected": {}, "edges": edges, **fields}  # fmt: skip

    thin = tuner.redecided("sm_90a", stored(near, {3073: far}), 4096)
    assert thin["version"] == tuner.VENDOR and "edges" not in thin and "from_m" not in thin
    assert thin["call_ms"] == 1.0 and thin["candidates"]["v7"]["call_ms"] == near
    assert thin["fingerprint"] == "x"  # made with other sources than v7's: it stays stale
    fresh = tuner.redecided("sm_90a", stored(near, {}, fingerprint=tuner.fingerprint("sm_90a", "v7")), 4096)
    assert fresh["fingerprint"] == tuner.choice_fingerprint("sm_90a", tuner.VENDOR, ["v7", tuner.VENDOR])
    assert tuner.entry_is_valid("sm_90a", fresh) and not tuner.entry_is_valid("sm_90a", thin)
    lost = tuner.redecided("sm_90a", stored(far, {4096: near, 3073: far}), 3500)
    assert (lost["version"], lost["lost_at"], lost["edges"]) == (
        tuner.VENDOR,
        4096,
        {"4096": {"v7": near, tuner.VENDOR: 1.0}},
    )
    # kept from 3329 under the looser margin (3073 lost, 3585 won, then 3329): 3585 is now within
    # the margin, so the next probe is 3841, never timed: the version keeps 4096 only
    split = tuner.redecided("sm_90a", stored(far, {3073: 1.5, 3585: near, 3329: far}, from_m=3329), 4096)
    assert (split["version"], split["from_m"]) == ("v7", 4096) and set(split["edges"]) == {"3073", "3585"}
    turned = tuner.redecided("sm_90a", stored(far, {3073: 1.5, 3585: near, 3841: far}, from_m=3585), 4096)
    assert turned["from_m"] == 3841 and set(turned["edges"]) == {"3073", "3585", "3841"}
    held = stored(far, {3073: far, 4096: far})
    assert tuner.redecided("sm_90a", held, 3500) == {**held, "edges": held["edges"]}
    vendor = {"version": tuner.VENDOR, "candidates": {tuner.VENDOR: {}}, "lost_at": 3073}
    assert tuner.redecided("sm_90a", vendor, 4096) is vendor


def test_cublas_or_a_bucket_of_one_size_needs_no_edge():
    def tune_at(m):
        raise AssertionError("no edge to tune")

    entry = {"version": tuner.VENDOR, "candidates": {tuner.VENDOR: {}}}
    assert tuner.held_across_the_bucket("sm_90a", entry, 4096, tune_at) is entry
    entry = {"version": "v7", "candidates": {"v7": {}, tuner.VENDOR: {}}}
    assert tuner.held_across_the_bucket("sm_90a", entry, 4, tune_at) == {**entry, "edges": {}}


def test_the_child_runs_below_the_callers_priority(monkeypatch):
    """Its imports, builds and timings yield the CPU to the caller's calls (tuner.NICENESS, set by the
    parent as it starts the child)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    jobs = [{"key": "k", "m": 8, "n": 8, "k": 8, "names": [tuner.VENDOR]}]
    cpu = torch.device("cpu")
    entries = tuner.tune_in_child("sm_90a", torch.float16, cpu, jobs, worker="stand_ins:niceness_worker")
    assert entries["k"]["config"]["nice"] == min(os.nice(0) + tuner.NICENESS, 19)


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie no one has reaped yet)."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_a_child_whose_caller_died_exits(tmp_path):
    """A caller that exits while its buckets are tuned takes its tuning child with it: left alone,
    the child would time kernels for no one on a GPU others use (child.exit_when_orphaned)."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(
        """
        import torch
        from matmul.call import tuner
        jobs = [{"key": "k", "m": 8, "n": 8, "k": 8, "names": [tuner.VENDOR]}]
        tuner.tune_in_child("sm_90a", torch.float16, torch.device("cpu"), jobs, worker="stand_ins:sleeping_worker")
        """
    )
    tests_dir = os.path.dirname(__file__)
    env = dict(os.environ, MATMUL_TEST_PID_FILE=str(pid_file))
    env["PYTHONPATH"] = os.pathsep.join([tests_dir, env.get("PYTHONPATH", "")])
    caller = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 120
    while not pid_file.exists() and time.monotonic() < deadline and caller.poll() is None:
        time.sleep(0.1)
    assert pid_file.exists(), "the tuning child never started its job"
    child_pid = int(pid_file.read_text())
    caller.kill()
    caller.wait()
    try:
        deadline = time.monotonic() + 10
        while not _ended(child_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ended(child_pid), "the tuning child outlived its caller"
    finally:
        if not _ended(child_pid):
            os.kill(child_pid, 9)


def test_a_child_that_fails_with_no_candidate_to_blame_is_a_clear_error(monkeypatch):
    with pytest.raises(tuner.TuningError, match="no_such_module"):
        tuner.tune_in_child(
            "sm_90a",
            torch.float16,
            torch.device("cpu"),
            [{"key": "k", "m": 8, "n": 8, "k": 8, "names": [tuner.VENDOR]}],
            worker="no_such_module:worker",
        )


# --- torch: compile and autograd through the custom operator ------------------------------------


@pytest.fixture
def stand_in_api(tmp_path, stand_ins, route):
    return route(plans(tmp_path))


def test_torch_compile_traces_matmul_without_a_graph_break(stand_in_api):
    import torch._dynamo

    torch._dynamo.reset()

    def layer(x, w, out):
        h = matmul.matmul(x, w.T)
        matmul.matmul(h.relu(), w2.T, out=out)
        return out * 2

    w2 = torch.randn(48, 64).half()
    x, w = torch.randn(32, 40).half(), torch.randn(64, 40).half()
    out = torch.empty(32, 48).half()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    result = compiled(x, w, out)
    expected = ((x.float() @ w.float().T).half().relu().float() @ w2.float().T) * 2
    assert len(graphs) == 1 and relative_error(result, expected) <= 2 * TOLERANCE[torch.float16]
    ops = {str(node.target).removesuffix(".default") for node in graphs[0].graph.nodes if node.op == "call_function"}
    assert {"tilus_matmul.mm", "tilus_matmul.mm_out"} <= ops


def test_the_fake_operator_gives_the_kernels_shapes_and_strides(stand_in_api):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(30, 40, dtype=torch.float16), torch.empty(17, 40, dtype=torch.float16)
        y = torch.ops.tilus_matmul.mm(x, w.T)
        assert y.shape == (30, 17) and y.stride() == (24, 1)
        with pytest.raises(matmul.MatmulInputError, match="inner dimensions differ"):
            torch.ops.tilus_matmul.mm(x, w)
    real = torch.ops.tilus_matmul.mm(torch.randn(30, 40).half(), torch.randn(17, 40).half().T)
    assert real.shape == (30, 17) and real.stride() == (24, 1)


def test_gradients_flow_through_the_same_kernels(stand_in_api):
    x = torch.randn(24, 40).half().requires_grad_()
    w = torch.randn(32, 40).half().requires_grad_()
    y = matmul.matmul(x, w.T)
    (y.float() * torch.linspace(-1, 1, 32)).sum().backward()
    xf, wf = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ((xf @ wf.T) * torch.linspace(-1, 1, 32)).sum().backward()
    assert relative_error(x.grad, xf.grad) <= TOLERANCE[torch.float16]
    assert relative_error(w.grad, wf.grad) <= TOLERANCE[torch.float16]
    series = [p for p in stand_in_api.plans.values() if isinstance(p, SeriesPlan)]
    # forward and dA (= dC @ w, w read in place as b [K, N]) through the series' (stand-in) kernels;
    # dB = x^T @ dC by cuBLAS: x^T is column-major, and no version reads a transposed A
    assert sum(p.launch.launches for p in series) == 2
    assert {p.launch.variant.b_layout for p in series} == {"nk", "kn"}
    with pytest.raises(matmul.MatmulInputError, match="does not support automatic differentiation"):
        matmul.matmul(x, w.T, out=torch.empty(24, 32).half())
    with torch.no_grad():
        assert matmul.matmul(x, w.T, out=torch.empty(24, 32).half()).shape == (24, 32)


def test_a_call_costs_the_longer_of_its_kernel_and_its_launch_on_the_host():
    def prepare(host):
        def make(version):
            config = {} if version == tuner.VENDOR else dict(versions.load("sm_90a", version).REPRESENTATIVE)
            measure = None if host[version] is None else functools.partial(float, host[version])
            return tuner.Candidate(version, config, 1e-4, lambda: None, host=measure)

        return make

    gpu = {"v4": 1.5, tuner.VENDOR: 1.0}.get
    # the host issues cuBLAS's call in 2.0 and the version's in 1.0: back to back, the version is faster
    entry = tuner.tune(
        "sm_90a",
        torch.float16,
        prepare({"v4": 1.0, tuner.VENDOR: 2.0}),
        lambda c: gpu(c.version),
        names=["v4", tuner.VENDOR],
    )
    assert entry["version"] == "v4" and entry["call_ms"] == 1.5 and entry["candidates"][tuner.VENDOR]["call_ms"] == 2.0
    # long kernels: no host time measured, the kernels' times decide
    entry = tuner.tune(
        "sm_90a",
        torch.float16,
        prepare({"v4": None, tuner.VENDOR: None}),
        lambda c: gpu(c.version),
        names=["v4", tuner.VENDOR],
    )
    assert entry["version"] == tuner.VENDOR and entry["call_ms"] == 1.0


def test_a_hiccup_of_the_host_does_not_decide_a_shape():
    # the host issues v4's call in 1.0 and cuBLAS's in 2.0, but v4's first measurement meets a
    # hiccup (3.0); the kernels take 1.5 and 1.0: v4 still wins, on the least of its host times
    rounds = tuner.HOST_ROUNDS
    host = {"v4": iter([3.0] + [1.0] * (rounds - 1)), tuner.VENDOR: iter([2.0] * rounds)}  # one per round

    def make(version):
        config = {} if version == tuner.VENDOR else dict(versions.load("sm_90a", version).REPRESENTATIVE)
        return tuner.Candidate(version, config, 1e-4, lambda: None, host=functools.partial(next, host[version]))

    gpu = {"v4": 1.5, tuner.VENDOR: 1.0}.get
    entry = tuner.tune("sm_90a", torch.float16, make, lambda c: gpu(c.version), names=["v4", tuner.VENDOR])
    assert entry["version"] == "v4" and entry["candidates"]["v4"]["host_ms"] == 1.0
    assert entry["candidates"][tuner.VENDOR]["call_ms"] == 2.0
