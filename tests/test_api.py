"""matmul.matmul's contract where no GPU is needed: errors, the layouts of b, the choice and its caches."""

import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import matmul
from matmul.call import api, tilus_autotune
from matmul.kernels import versions
from matmul.call.choice_cache import ChoiceCache, default_dir

# --- errors before anything runs -----------------------------------------------------------------


@pytest.mark.parametrize("make, message", [
    (lambda: (torch.randn(64, 48).half(), torch.randn(48, 32).half()), "CUDA tensors"),
    (lambda: (torch.randn(64, 48).half(), torch.randn(32, 48).half().T), "CUDA tensors"),
    (lambda: (torch.randn(2, 64, 48).half(), torch.randn(48, 32).half()), "must be 2-D"),
    (lambda: (torch.randn(64, 48).half(), torch.randn(40, 32).half()), r"a \[M, K\] and b \[K, N\]"),
    (lambda: (torch.randn(64, 48), torch.randn(48, 32)), "float16 or both bfloat16"),
    (lambda: (torch.randn(64, 48).half(), torch.randn(48, 32).bfloat16()), "float16 or both bfloat16"),
    (lambda: ([[1.0]], torch.randn(1, 1).half()), "must be a torch.Tensor"),
])
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
    bt, copied = api.kernel_b(w.T)  # b = w.T has strides (1, K)
    assert not copied and bt.data_ptr() == w.data_ptr() and bt.stride() == w.stride()


def test_row_major_b_is_transposed_once_into_aligned_rows():
    b = torch.randn(17, 30).half()  # [K, N] row-major with K = 17: the copy pads its rows to 24
    bt, copied = api.kernel_b(b)
    assert copied and bt.shape == (30, 17) and bt.stride() == (24, 1)
    assert torch.equal(bt, b.T)


@pytest.mark.parametrize("b, copied", [
    (torch.randn(5, 1).half(), False),  # N = 1: b.T is one row, in place
    (torch.randn(1, 16).half(), True),  # K = 1: b [1, N] row-major (b.T's rows would be 2 bytes apart)
    (torch.randn(1, 1).half(), False),
])
def test_degenerate_layouts(b, copied):
    bt, was_copied = api.kernel_b(b)
    assert was_copied == copied and torch.equal(bt, b.T)


def test_misaligned_weight_rows_are_refused_with_the_fix():
    w = torch.randn(32, 17).half()  # rows of 34 bytes: TMA cannot read w.T in place
    with pytest.raises(matmul.MatmulInputError, match=r"b\.T's row stride .* pad its rows"):
        api.kernel_b(w.T)


def test_other_strides_are_refused_with_the_fix():
    b = torch.randn(64, 64).half()[::2, ::2]  # neither layout
    with pytest.raises(matmul.MatmulInputError, match=r"b\.contiguous\(\)"):
        api.kernel_b(b)


# --- the choice ----------------------------------------------------------------------------------


def test_shape_buckets_follow_tilus():
    from tilus.lang.instantiated_script import construct_keys

    for x in (1, 7, 17, 128, 1000, 4095, 4096, 4097, 14336):
        assert api.bucket(x) == construct_keys((), [x])[1][0]
    key = api.choice_key("sm_90a", "NVIDIA H100 80GB HBM3", torch.bfloat16, 1000, 14336, 4096)
    assert key == "sm_90a/NVIDIA H100 80GB HBM3/bfloat16/1024x16384x4096"


def fake_prepare(calls, errors=None, failing=()):
    def prepare(version):
        calls.append(version)
        if version in failing:
            raise RuntimeError(f"{version} did not build")
        module = versions.load("sm_90a", version)
        return api.Candidate(version, dict(module.REPRESENTATIVE), (errors or {}).get(version, 1e-4), lambda: None)
    return prepare


def test_gpu_timer_times_a_candidate_in_turn_with_cublas_and_scales_cublas_time(monkeypatch):
    windows = []

    def paired(fns, warmup_ms, repeat_ms):  # in this window the clock runs at 80%: both read 1.25x
        windows.append(fns)
        return [1.25 * 1.5, 1.25 * 2.0]

    kernel, cublas = (lambda: None), (lambda: None)
    monkeypatch.setattr(api, "interleaved_ms", paired)
    candidate = api.Candidate("v1", {}, 1e-4, kernel, reference=cublas, reference_ms=lambda: 2.0)
    assert api._gpu_timer(candidate) == pytest.approx(1.5)  # 0.75x cuBLAS's 2.0 ms
    assert windows == [[kernel, cublas]]
    monkeypatch.setattr(api, "median_ms", lambda fn, warmup_ms, repeat_ms: 7.0)
    assert api._gpu_timer(api.Candidate("v1", {}, 1e-4, kernel)) == 7.0  # no reference: its own window


def test_tune_times_the_correct_versions_in_alternating_rounds():
    calls, order = [], []

    def timer(candidate):
        order.append(candidate.version)
        return {"v0": 3.0, "v1": 1.0}[candidate.version]

    times = {"v0": 1.1, "v1": 1.0, "v2": 3.0}
    order.clear()
    entry = api.tune("sm_90a", torch.float16, fake_prepare([]), lambda c: order.append(c.version) or
                     times[c.version], names=["v0", "v1", "v2"], rounds=3)
    # after the first round, v2 (3x the fastest) is not timed again
    assert order == ["v0", "v1", "v2", "v1", "v0", "v0", "v1"] and entry["candidates"]["v2"]["ms"] == 3.0
    order.clear()
    entry = api.tune("sm_90a", torch.float16, fake_prepare(calls), timer, names=["v0", "v1"], rounds=3)
    assert calls == ["v0", "v1"] and order == ["v0", "v1", "v1", "v1"]
    assert entry["version"] == "v1" and entry["ms"] == 1.0
    assert entry["config"] == versions.load("sm_90a", "v1").REPRESENTATIVE
    assert entry["fingerprint"] == api.fingerprint("sm_90a", "v1")
    assert set(entry["candidates"]) == {"v0", "v1"}


def test_a_version_replaces_cublas_only_when_clearly_faster():
    versions_only = fake_prepare([])

    def prepare(version):
        return api.Candidate(version, {}, 1e-4, lambda: None) if version == api.VENDOR else versions_only(version)

    def tune(version_ms):
        return api.tune("sm_90a", torch.float16, prepare, lambda c: 1.0 if c.version == api.VENDOR else version_ms,
                        names=["v1", api.VENDOR])

    assert tune(0.995)["version"] == api.VENDOR  # 0.5% faster: within the noise
    assert tune(0.98)["version"] == "v1"  # 2% faster
    assert tune(1.2)["version"] == api.VENDOR


def test_tune_rules_out_wrong_and_failing_versions():
    entry = api.tune("sm_90a", torch.float16, fake_prepare([], errors={"v1": float("nan")}, failing={"v2"}),
                     lambda c: 1.0, names=["v0", "v1", "v2"])
    assert entry["version"] == "v0"
    assert "over the tolerance" in entry["rejected"]["v1"] and "did not build" in entry["rejected"]["v2"]
    with pytest.raises(RuntimeError, match="no version of the series ran correctly"):
        api.tune("sm_90a", torch.float16, fake_prepare([], failing={"v0"}), lambda c: 1.0, names=["v0"])


def tuned_entry(cache, key, calls, names=("v0", "v1")):
    return cache.choose(key, lambda: api.tune("sm_90a", torch.float16, fake_prepare(calls),
                                              lambda c: {"v0": 2.0, "v1": 1.0}[c.version], names=list(names)),
                        lambda e: api.entry_is_valid("sm_90a", e))


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
    from matmul.call import api
    from matmul.call.choice_cache import ChoiceCache
    calls = []
    def tune():
        time.sleep({sleep})  # a long tuning: another process must wait for it, not tune as well
        return api.tune("sm_90a", torch.float16, fake_prepare(calls),
                        lambda c: {{"v0": 2.0, "v1": 1.0}}[c.version], names=["v0", "v1"])
    entry = ChoiceCache({root!r}).choose(KEY, tune, lambda e: api.entry_is_valid("sm_90a", e))
    print(json.dumps({{"version": entry["version"], "tuned": calls}}))
""")


def run_children(root, count, sleep, together):
    def start():
        code = CHILD.format(tests=os.path.dirname(__file__), root=str(root), sleep=sleep)
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

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


@pytest.mark.parametrize("content", [
    "", "{", "garbage \x00\xff", json.dumps({"format": 1})[:-3], "[1, 2, 3]",
    json.dumps({"format": 1, "tilus": "0.0.1", "entries": {}}),  # another tilus release
    json.dumps({"format": 99, "entries": {}}),
])
def test_a_corrupt_or_stale_choice_file_is_rebuilt(tmp_path, caplog, content):
    (tmp_path / "choices.json").write_text(content, errors="surrogateescape")
    calls = []
    with caplog.at_level(logging.WARNING):
        assert tuned_entry(ChoiceCache(tmp_path), KEY, calls)["version"] == "v1"
    assert calls == ["v0", "v1"] and "choice cache" in caplog.text
    assert json.loads((tmp_path / "choices.json").read_text())["entries"][KEY]["version"] == "v1"


@pytest.mark.parametrize("spoil", [
    lambda e: e.update(version="v9"),  # a version that does not exist
    lambda e: e.update(config={"block_m": 3, "block_n": 5, "block_k": 7}),  # not in the space any more
    lambda e: e.update(fingerprint="0" * 16),  # the kernel's source changed since it was tuned
    lambda e: e.update(ms="fast"),
    lambda e: e.pop("config"),
])
def test_a_stale_entry_is_tuned_again(tmp_path, spoil):
    cache = ChoiceCache(tmp_path)
    tuned_entry(cache, KEY, [])
    data = json.loads(cache.path.read_text())
    spoil(data["entries"][KEY])
    cache.path.write_text(json.dumps(data))
    calls = []
    assert tuned_entry(cache, KEY, calls)["version"] == "v1" and calls == ["v0", "v1"]
    assert api.entry_is_valid("sm_90a", cache.entries()[KEY])


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("MATMUL_CACHE_DIR", str(tmp_path / "mine"))
    assert default_dir() == tmp_path / "mine"
    monkeypatch.delenv("MATMUL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == tmp_path / "xdg" / "tilus-matmul"


def test_matmul_cache_dir_also_moves_tilus_cache_unless_tilus_has_its_own(tmp_path):
    code = "import matmul, tilus.option; print(tilus.option.get_option('cache_dir'))"
    env = {k: v for k, v in os.environ.items() if k not in ("MATMUL_CACHE_DIR", "TILUS_CACHE_DIR")}
    for extra, expected in (({"MATMUL_CACHE_DIR": str(tmp_path / "m")}, tmp_path / "m" / "tilus"),
                            ({"MATMUL_CACHE_DIR": str(tmp_path / "m"), "TILUS_CACHE_DIR": str(tmp_path / "t")},
                             tmp_path / "t")):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, **extra})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == str(expected)


# --- tilus's own dispatch table ------------------------------------------------------------------


def write_table(directory, content: bytes):
    (directory / "dispatch_table.pickle").write_bytes(content)
    (directory / "latency" / "4096-4096").mkdir(parents=True)


def test_a_valid_tilus_dispatch_table_is_kept(tmp_path):
    write_table(tmp_path, pickle.dumps({(4096, 4096, 4096): 2}))
    assert not tilus_autotune.check_dispatch_table(tmp_path, programs=3)
    assert (tmp_path / "dispatch_table.pickle").exists() and (tmp_path / "latency").exists()


@pytest.mark.parametrize("content", [
    b"", b"garbage", pickle.dumps({(4096,): 2})[:-4],  # truncated
    pickle.dumps({(4096,): 7}),  # names a program that was not built
    pickle.dumps([1, 2]), pickle.dumps({(4096,): "2"}),
])
def test_a_broken_tilus_dispatch_table_is_removed(tmp_path, content):
    write_table(tmp_path, content)
    assert tilus_autotune.check_dispatch_table(tmp_path, programs=3)
    assert not (tmp_path / "dispatch_table.pickle").exists()
    assert not (tmp_path / "latency").exists()  # tilus would fail to re-create its links there


def test_launch_arguments_hand_tilus_whole_padded_rows():
    from matmul.measure.correctness import poisoned_output, random_operands

    a, b = random_operands(5, 3, 17, torch.float16, device="cpu")
    out = poisoned_output(5, 3, torch.float16, device="cpu")
    m, n, k, fa, fb, fc, lda, ldb, ldc = versions.launch_args(a, b, out)
    assert (m, n, k, lda, ldb, ldc) == (5, 3, 17, 24, 24, 8)
    assert fa.shape == (5, 24) and fa.is_contiguous() and fa.data_ptr() == a.data_ptr()
    assert fa.clone().stride() == (24, 1)  # what tilus tunes on keeps the padded layout


# --- the whole choice, with CPU stand-ins for the kernels ----------------------------------------


@pytest.fixture
def stand_ins(monkeypatch):
    from stand_ins import install

    return install(monkeypatch)


def chooser(root, **overrides):
    # the versions time faster than cuBLAS unless a test says otherwise
    return api.Chooser(ChoiceCache(root), **{"timer": lambda c: 2.0 if c.version == api.VENDOR else 1.0, "arch_of": lambda device: "sm_90a",
                                              "gpu_name": lambda device: "stand-in GPU", **overrides})


def test_the_whole_choice_with_stand_in_kernels(tmp_path, stand_ins):
    from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
    from matmul.contract import row_stride

    m, n, k = 100, 60, 17  # ragged: the operands tuned on have padded rows
    script, entry = chooser(tmp_path).get(torch.device("cpu"), torch.float16, m, n, k)
    assert entry["version"] == "v1" and "over the tolerance" in entry["rejected"]["v0"]  # v0 is wrong
    assert script.version == "v1" and script.config == versions.load("sm_90a", "v1").REPRESENTATIVE
    a, w = random_operands(m, n, k, torch.float16, device="cpu")
    bt, copied = api.kernel_b(w.T)
    out = poisoned_output(m, n, torch.float16, device="cpu")
    script(m, n, k, a, bt, out, row_stride(a), row_stride(bt), row_stride(out))  # as matmul() launches it
    assert not copied and relative_error(out, reference(a, w)) <= TOLERANCE[torch.float16]

    # another process: the stored choice is launched without preparing or timing anything
    stand_ins.clear()
    never = lambda *args: pytest.fail("tuned again although the choice is stored")  # noqa: E731
    again, stored = chooser(tmp_path, prepare=never, timer=never).get(torch.device("cpu"), torch.float16, m, n, k)
    assert stored == entry and stand_ins == [("v1", versions.load("sm_90a", "v1").REPRESENTATIVE)]
    # same bucket (tilus's rounding), same process: no new lookup at all
    c = chooser(tmp_path, prepare=never, timer=never)
    first = c.get(torch.device("cpu"), torch.float16, 97, 60, 17)
    assert c.get(torch.device("cpu"), torch.float16, 100, 64, 20)[0] is first[0]


def test_cublas_is_a_candidate_and_is_launched_when_it_wins(tmp_path, stand_ins):
    from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error
    from matmul.contract import row_stride

    m, n, k = 128, 60, 40  # a skinny shape: the series' tiles leave most of a GPU idle
    timer = lambda c: 0.5 if c.version == api.VENDOR else 1.0  # noqa: E731
    script, entry = chooser(tmp_path, timer=timer).get(torch.device("cpu"), torch.float16, m, n, k)
    assert entry["version"] == api.VENDOR and script is api.vendor_launch
    assert set(entry["candidates"]) == {"v1", api.VENDOR} and entry["candidates"][api.VENDOR]["ms"] == 0.5
    assert api.entry_is_valid("sm_90a", entry)
    a, w = random_operands(m, n, k, torch.float16, device="cpu")
    out = poisoned_output(m, n, torch.float16, device="cpu")  # N = 60: rows padded, not contiguous
    script(m, n, k, a, w, out, row_stride(a), row_stride(w), row_stride(out))
    assert relative_error(out, reference(a, w)) <= TOLERANCE[torch.float16]
    assert not api.entry_is_valid("sm_90a", {**entry, "fingerprint": "another torch"})
