"""matmul.matmul on a GPU of the series: both layouts of b, both dtypes, out=, awkward shapes, against
the float32 reference on NaN-poisoned outputs; the choice reused by a second process; operands past
2^31 elements; a candidate that faults while tuning; torch.compile, CUDA graphs and autograd; the
harness end to end on a small shape. Skipped without a Hopper or Blackwell GPU.
"""

import functools
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import gpu_arch, require_gpu

import matmul
from matmul.call import api, tilus_autotune, tuner
from matmul.call.launch import SeriesPlan
from matmul.contract import check_call
from matmul.harness import bench, plot, presets, triton_baseline
from matmul.harness import results as results_file
from matmul.measure.correctness import TOLERANCE, poisoned_output, random_operands, reference, relative_error

ARCH = gpu_arch()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(ARCH is None, reason="needs a Hopper or Blackwell GPU"),
]

# not multiples of any tile; one row, one column; an LLM-like projection
SHAPES = [(1000, 4095, 17), (17, 1000, 4095), (1, 24, 1000), (333, 1, 257), (128, 1024, 4096)]
DTYPES = (torch.float16, torch.bfloat16)


@pytest.fixture(autouse=True)
def _on_this_gpu():
    require_gpu(ARCH)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_both_layouts_of_b(m, n, k, dtype):
    a, w = random_operands(m, n, k, dtype)
    ref = reference(a, w)
    for b in (w.T, w.T.contiguous()):  # x @ w.T read in place; a row-major [K, N] b (transposed copy)
        out = poisoned_output(m, n, dtype)
        result = matmul.matmul(a, b, out=out)
        assert result is out
        error = relative_error(out, ref)
        assert error <= TOLERANCE[dtype], f"{m}x{n}x{k} {dtype} b strides {b.stride()}: relative error {error:.3g}"
        plain = matmul.matmul(a, b)  # allocates [M, N] (rows padded to 16 bytes when N is ragged)
        assert plain.shape == (m, n) and relative_error(plain, ref) <= TOLERANCE[dtype]


def peak_extra_bytes(call) -> int:
    """What ``call`` allocates at its peak, beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def test_the_transposed_view_is_not_copied():
    a, w = random_operands(512, 1024, 2048, torch.float16)
    out = poisoned_output(512, 1024, torch.float16)
    matmul.matmul(a, w.T, out=out)  # tunes, if this shape was not tuned yet
    series = isinstance(api._plans.plan_for(a, w.T, out), SeriesPlan)  # cuBLAS reads a row-major b as it is
    for b, copies in ((w.T, False), (w.T.contiguous(), series)):
        matmul.matmul(a, b, out=out)  # the plan for this layout exists before anything is counted
        # cuBLAS may allocate a workspace through torch's allocator on every call: what torch.mm itself
        # allocates is allowed, nothing more (a series kernel allocates nothing)
        allowed = 0 if series else peak_extra_bytes(functools.partial(torch.mm, a, b, out=out))
        extra = peak_extra_bytes(functools.partial(matmul.matmul, a, b, out=out))
        assert (extra >= 1024 * 2048 * 2) if copies else extra <= allowed, (extra, allowed)


def test_results_match_torch_on_llm_shapes():
    for m, n, k in [(128, 4096, 4096), (128, 1024, 4096)]:
        x, w = random_operands(m, n, k, torch.bfloat16)
        ours = matmul.matmul(x, w.T)
        assert relative_error(ours, reference(x, w)) <= TOLERANCE[torch.bfloat16]
        assert relative_error(ours, (x @ w.T).float()) <= TOLERANCE[torch.bfloat16]


def test_misaligned_operands_are_refused_not_run():
    a = torch.randn(64, 17, device="cuda", dtype=torch.float16)  # rows of 34 bytes
    w = torch.randn(32, 17, device="cuda", dtype=torch.float16)
    with pytest.raises(matmul.MatmulInputError, match="pad"):
        matmul.matmul(a, w.T)
    out = torch.empty(64, 33, device="cuda", dtype=torch.float16)  # out rows of 66 bytes
    with pytest.raises(matmul.MatmulInputError, match="out's row stride"):
        matmul.matmul(torch.randn(64, 32, device="cuda").half(), torch.randn(32, 33, device="cuda").half(), out=out)


def test_a_second_process_reuses_the_choice_without_tuning():
    m, n, k = 768, 1536, 640
    a, w = random_operands(m, n, k, torch.float16)
    matmul.matmul(a, w.T)
    entry = api.choice(a, w.T)
    assert entry["version"] in matmul.versions.available(ARCH) + [tuner.VENDOR]  # cuBLAS may win this shape
    code = f"""
import json, torch
import matmul
from matmul.call import api, tilus_autotune, tuner
from matmul.call.launch import SeriesPlan
from matmul.contract import check_call
from matmul.measure.correctness import random_operands, reference, relative_error
def no_tuning(*args, **kwargs):
    raise AssertionError("tuned again although the choice is stored")
api._chooser.tune_jobs = no_tuning
a, w = random_operands({m}, {n}, {k}, torch.float16)
out = matmul.matmul(a, w.T)
print(json.dumps({{"error": relative_error(out, reference(a, w)), "version": api.choice(a, w.T)["version"]}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-4000:]
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert child["version"] == entry["version"] and child["error"] <= TOLERANCE[torch.float16]


@pytest.mark.skipif(not triton_baseline.available(), reason="Triton is not installed")
@pytest.mark.parametrize("m, n, k", [(1000, 4095, 17), (4096, 4096, 4096), (128, 14336, 4096)])
def test_triton_baseline(m, n, k):
    a, b = random_operands(m, n, k, torch.float16)
    out = triton_baseline.matmul_abt(a, b, poisoned_output(m, n, torch.float16))
    assert relative_error(out, reference(a, b)) <= TOLERANCE[torch.float16]
    assert triton_baseline.best_config()["BLOCK_M"] in (64, 128, 256)


def test_harness_end_to_end(tmp_path):
    chosen = presets.parse("256x512x384,1000x4095x17")
    names = matmul.versions.available(ARCH)[:2]
    results = bench.run(
        ARCH,
        names,
        chosen,
        torch.float16,
        rounds=2,
        warmup_ms=5,
        repeat_ms=20,
        save=lambda r: results_file.write(r, tmp_path / "partial.json"),
    )
    path = tmp_path / results_file.results_name(ARCH, "float16", chosen)
    results_file.write(results, path)
    loaded = results_file.load(path)
    kernels = {r["kernel"] for r in loaded["rows"]}
    assert {results_file.CUBLAS, results_file.AUTOTUNED, *names} <= kernels
    assert (results_file.TRITON in kernels) == triton_baseline.available()
    assert all(r["ok"] and r["ms"] > 0 and r["vs_cublas"] > 0 for r in loaded["rows"]), results_file.table(loaded)
    assert loaded["machine"]["sms"] > 0 and loaded["summary"]["all"]["shapes"] == 2
    assert (tmp_path / "partial.json").exists()
    written = plot.draw_all(loaded, tmp_path)
    assert {p.name for p in written} == {"progression-%s-float16.%s" % (ARCH, ext) for ext in ("png", "svg")}


def test_interleaved_timing_tells_a_kernel_from_one_of_twice_its_work():
    from matmul.measure.timing import interleaved_ms

    a, b = (torch.randn(4096, 4096, device="cuda", dtype=torch.float16) for _ in range(2))
    half, whole = a[:2048], a
    ms = interleaved_ms([lambda: half @ b.T, lambda: whole @ b.T, lambda: half @ b.T], warmup_ms=20, repeat_ms=50)
    assert ms[1] / ms[0] == pytest.approx(2.0, rel=0.25) and ms[2] / ms[0] == pytest.approx(1.0, rel=0.1)


def test_sustained_timing_tells_a_kernel_from_one_of_twice_its_work():
    from matmul.measure.timing import SustainedTimer

    a, b = (torch.randn(4096, 4096, device="cuda", dtype=torch.float16) for _ in range(2))
    half = a[:2048]
    timer = SustainedTimer(0.4)
    whole_ms = timer([lambda: a @ b.T])[0]
    half_ms = timer([lambda: half @ b.T])[0]
    assert whole_ms / half_ms == pytest.approx(2.0, rel=0.25)
    if shutil.which("nvidia-smi"):  # the clock and power of the window's timed half
        assert 100 < timer.last_window["clock_mhz"] < 3000 and timer.last_window["power_w"] > 0
    with pytest.raises(ValueError, match="one function"):
        timer([lambda: a @ b.T, lambda: half @ b.T])


# --- operands past 2^31 elements -----------------------------------------------------------------

LARGE = {"A": (135000, 256, 16384), "B": (256, 135000, 16384), "C": (70000, 32768, 64)}


def chunked_error(out, a, b, rows=8192):
    """relative_error for matrices too large for a float64 copy: row blocks against the float32 reference."""
    bf = b.float()
    diff = ref = 0.0
    for i in range(0, a.shape[0], rows):
        r = a[i : i + rows].float() @ bf.T
        d = out[i : i + rows].double() - r.double()
        if not torch.isfinite(d).all():
            return float("inf")
        diff, ref = diff + d.square().sum().item(), ref + r.double().square().sum().item()
    return (diff / ref) ** 0.5


# One version on one operand past 2^31 elements, in a process of its own: a fault (an illegal
# address) kills that process's CUDA context for good, so it must not take the other cases with it.
# The child prints one line: "refused <message>" (versions.run's MatmulInputError) or "error <value>".
PAST_2_31_CHILD = """
import sys
import torch
import matmul
from matmul.contract import MatmulInputError
from matmul.measure.correctness import poisoned_output, random_operands, reference, relative_error
arch, version, m, n, k = sys.argv[1], sys.argv[2], *map(int, sys.argv[3].split("x"))
a, b = random_operands(m, n, k, torch.float16)
out = poisoned_output(m, n, torch.float16)
module = matmul.versions.load(arch, version)
try:
    matmul.versions.run(module, a, b, out, config=module.REPRESENTATIVE)
except MatmulInputError as e:
    print("refused", str(e).replace(chr(10), " "))
else:
    torch.cuda.synchronize()
    print("error", relative_error(out, reference(a, b)))  # chunked in float64; the reference fits in memory
"""


@pytest.mark.parametrize("which", LARGE)
@pytest.mark.parametrize("version", matmul.versions.available(ARCH) if ARCH else ["none"])
def test_each_version_past_2_to_the_31_elements_is_correct_or_refused_never_a_fault(version, which):
    m, n, k = LARGE[which]
    shape = f"{m}x{n}x{k}"
    done = subprocess.run(
        [sys.executable, "-c", PAST_2_31_CHILD, ARCH, version, shape],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{version} on {which} past 2^31 ({shape}) died: {done.stderr[-2000:]}"
    verdict, _, detail = done.stdout.strip().splitlines()[-1].partition(" ")
    module = matmul.versions.load(ARCH, version)
    if tuner.fits(module, m, n, k):
        assert verdict == "error" and float(detail) <= TOLERANCE[torch.float16], (version, which, detail)
    else:  # the limit it declares is what refused it, and the message names the fix
        assert verdict == "refused" and "matmul.matmul" in detail, (version, which, detail)


@pytest.mark.parametrize("which", LARGE)
def test_matmul_past_2_to_the_31_elements(which):
    m, n, k = LARGE[which]
    a, b = random_operands(m, n, k, torch.float16)
    out = poisoned_output(m, n, torch.float16)
    matmul.matmul(a, b.T, out=out)
    assert chunked_error(out, a, b) <= TOLERANCE[torch.float16], api.choice(a, b.T)
    assert "v0" not in api.choice(a, b.T).get("candidates", {})


DEFERRED_CHILD = """
import torch
import matmul
from matmul.call import api
from matmul.measure.correctness import TOLERANCE, random_operands, reference, relative_error
a, w = random_operands(100, 384, 512, torch.float16)
assert api._plans.direct.kind(a, w.T) is None
c = matmul.matmul(a, w.T)  # unseen: cuBLAS at once, its plan left to the planner's thread
assert relative_error(c, reference(a, w)) <= TOLERANCE[torch.float16]
assert api._plans.planner.wait(60)
kind = api._plans.direct.kind(a, w.T)
a2 = random_operands(97, 384, 512, torch.float16)[0]  # M = 97 and 100 share the bucket of 128
assert kind is not None and api._plans.direct.kind(a2, w.T) == kind, kind
assert relative_error(matmul.matmul(a2, w.T), reference(a2, w)) <= TOLERANCE[torch.float16]
print("route", kind)
"""


def test_an_unseen_call_runs_cublas_at_once_and_its_bucket_gets_a_native_route(tmp_path):
    env = dict(os.environ, MATMUL_CACHE_DIR=str(tmp_path), MATMUL_TUNE="off")
    done = subprocess.run([sys.executable, "-c", DEFERRED_CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "route" in done.stdout, done.stderr[-3000:]


# An unseen bucket with nothing shipped or measured near it: its first calls run the instant choice
# (cuBLAS) while the bucket is tuned in the background, on this GPU, in a child process; then the
# measured result takes over (its plan and native route derived again), or, where the tuning fails,
# the instant choice stays, with the failure on the choice and every result still correct.
BACKGROUND_CHILD = """
import sys
import torch
import matmul
from matmul.call import api, tuner
from matmul.call.choice_cache import ShippedTable
from matmul.measure.correctness import TOLERANCE, random_operands, reference, relative_error

fails = sys.argv[1] == "fails"
api._chooser.shipped = ShippedTable([])  # no shipped choice, so no neighbour: the fallback
if fails:
    def died(arch, dtype, device, jobs, on_entry=None):
        raise tuner.TuningError("the tuning child died (the test's stand-in)")
    api._chooser.tune_jobs = died
m, n, k = 16, 4096, 4096  # a bucket where V7 beats cuBLAS on the H100 (plots/h100/skinny/)
a, w = random_operands(m, n, k, torch.float16)
first = api.choice(a, w.T)  # (a stand-in that fails at once may be done by the time this returns)
assert (first["source"], first["version"]) == ("fallback", tuner.VENDOR) and (first["pending"] or fails), first
for _ in range(3):  # the instant choice, at once, while the bucket is tuned
    assert relative_error(matmul.matmul(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]
assert api._plans.wait_for_background(900)
after = api.choice(a, w.T)
assert not after["pending"], after
if fails:
    assert after["source"] == "fallback" and "TuningError" in after["tuning_failed"], after
else:
    assert after["source"] == "measured" and "candidates" in after, after
matmul.matmul(a, w.T)  # the plan derived again from the choice it has now, on the planner's thread
assert api._plans.planner.wait(60)
kind = api._plans.direct.kind(a, w.T)
assert kind == ("vendor" if after["version"] == tuner.VENDOR else "launch"), (kind, after)
a2 = random_operands(m, n, k, torch.float16)[0]
assert relative_error(matmul.matmul(a2, w.T), reference(a2, w)) <= TOLERANCE[torch.float16]
print("choice", after["source"], after["version"])
"""


@pytest.mark.parametrize("tuning", ["finishes", "fails"])
def test_a_background_tuning_takes_over_from_the_instant_choice_or_leaves_it(tmp_path, tuning):
    env = dict(os.environ, MATMUL_CACHE_DIR=str(tmp_path), MATMUL_TUNE="background")
    done = subprocess.run(
        [sys.executable, "-c", BACKGROUND_CHILD, tuning], env=env, capture_output=True, text=True, timeout=1000
    )
    assert done.returncode == 0 and "choice" in done.stdout, done.stderr[-3000:]
    source = done.stdout.split("choice")[-1].split()[0]
    assert source == ("fallback" if tuning == "fails" else "measured"), done.stdout


# A bucket whose version won only from some M up (``from_m``, ``tuner.held_across_the_bucket``): a
# call below that M runs cuBLAS and one from it up the version, through the Python path and the
# native entry's routes alike, whichever M of the bucket came first (one route a side of from_m:
# ``launch.rows_served``); the kernels each side launches are told apart by the profiler.
FROM_M_CHILD = """
import sys
import torch
from torch.profiler import ProfilerActivity, profile
import matmul
from matmul.call import api, tuner
from matmul.call.choice_cache import ShippedTable, write_shipped
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, random_operands, reference, relative_error

arch, path = sys.argv[1], sys.argv[2]
gpu = torch.cuda.get_device_name()
n, k, from_m = 4096, 4096, 112  # the bucket of 97-128 rows
entry = {"version": "v7", "config": dict(versions.load(arch, "v7").REPRESENTATIVE), "ms": 1.0,
         "fingerprint": tuner.fingerprint(arch, "v7"), "from_m": from_m}
bucket = tuner.choice_key(arch, gpu, torch.float16, 128, n, k)
write_shipped(path, {bucket: entry}, command="test", machine={"gpu": gpu})
api._chooser.shipped = ShippedTable([path])
w = random_operands(1, n, k, torch.float16)[1]

def run(m):
    a = random_operands(m, n, k, torch.float16)[0]
    for _ in range(2):  # the first call's plan is derived (and the version built) off this thread; the
        matmul.matmul(a, w.T)  # second's again where the build's end dropped the plan made meanwhile
        assert api._plans.wait_for_background(900)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        c = matmul.matmul(a, w.T)
        torch.cuda.synchronize()
    assert relative_error(c, reference(a, w)) <= TOLERANCE[torch.float16], m
    names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
    return api.choice(a, w.T), api._plans.direct.kind(a, w.T), names

order = [120, 100, 112, 97, 128] if sys.argv[3] == "above first" else [100, 120, 97, 112, 128]
seen = {m: run(m) for m in order}
for m, (choice, kind, names) in seen.items():
    runs_version = m >= from_m
    assert choice["version"] == ("v7" if runs_version else tuner.VENDOR), (m, choice)
    assert runs_version or (choice["below"], choice["chosen"]["version"]) == (from_m, "v7"), (m, choice)
    assert kind == ("launch" if runs_version else "vendor"), (m, kind)
    assert names, m
version_kernels = set.intersection(*(seen[m][2] for m in order if m >= from_m))
vendor_kernels = set.union(*(seen[m][2] for m in order if m < from_m))
assert version_kernels and not version_kernels & vendor_kernels, (version_kernels, vendor_kernels)
print("split", sorted(version_kernels))
"""


@pytest.mark.parametrize("first", ["above first", "below first"])
def test_a_bucket_kept_from_an_m_runs_cublas_below_it_and_its_version_from_it(tmp_path, first):
    env = dict(os.environ, MATMUL_CACHE_DIR=str(tmp_path / "cache"), MATMUL_TUNE="off")
    args = [sys.executable, "-c", FROM_M_CHILD, ARCH, str(tmp_path / "shipped.json"), first]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1000)
    assert done.returncode == 0 and "split" in done.stdout, done.stderr[-3000:]


def test_a_candidate_that_faults_while_tuning_leaves_this_process_usable():
    m, n, k = LARGE["A"]  # V0 addresses A with int32 offsets: past 2^31 elements it faults
    job = {"key": f"{ARCH}/fault test/float16/{m}x{n}x{k}", "m": m, "n": n, "k": k, "names": ["v0", tuner.VENDOR]}
    device = torch.device("cuda", torch.cuda.current_device())
    entries = tuner.tune_in_child(ARCH, torch.float16, device, [job])
    entry = entries[job["key"]]
    assert entry["version"] == tuner.VENDOR and "faulted" in entry["rejected"]["v0"], entry
    a, w = random_operands(1000, 4095, 17, torch.float16)  # this process's CUDA context is intact
    assert relative_error(torch.matmul(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]
    assert relative_error(matmul.matmul(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]


# --- torch: compile, CUDA graphs, autograd -------------------------------------------------------


def test_torch_compile_fullgraph_matches_torch():
    x, w1 = random_operands(1000, 4096, 1024, torch.float16)
    w2 = random_operands(1, 1000, 4096, torch.float16)[1]

    def mlp(x, w1, w2, out):
        h = torch.relu(matmul.matmul(x, w1.T))
        matmul.matmul(h, w2.T, out=out)
        return out + 1

    expected = torch.relu(x @ w1.T) @ w2.T + 1
    compiled = torch.compile(mlp, fullgraph=True)
    result = compiled(x, w1, w2, torch.empty(1000, 1000, device="cuda", dtype=torch.float16))
    assert relative_error(result, expected.float()) <= 2 * TOLERANCE[torch.float16]


def forced_series_plan(x, w, version="v5"):
    """matmul()'s short path with a given version, whatever the choice (so that a capture records it)."""
    module = matmul.versions.load(ARCH, version)
    script = matmul.versions.kernel(module, x.dtype, module.REPRESENTATIVE)
    bt, copied, c = check_call(x, w.T)
    return SeriesPlan(tilus_autotune.launch_function(script), x, w.T, bt, copied, c, None)


def test_cuda_graph_replay_matches_torch():
    x, w = random_operands(2048, 4096, 4096, torch.float16)
    out = torch.empty(2048, 4096, device="cuda", dtype=torch.float16)
    series = forced_series_plan(x, w)
    matmul.matmul(x, w.T)  # tuned and planned before the capture
    matmul.matmul(x, w.T, out=out)
    series(x, w.T, None)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture's side stream, as torch's docs advise
        matmul.matmul(x, w.T)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = matmul.matmul(x, w.T)
        matmul.matmul(x, w.T, out=out)
        z = series(x, w.T, None)
    for _ in range(2):
        x.copy_(torch.rand_like(x) * 2 - 1)
        out.fill_(float("nan"))
        z.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(x, w)
        for result in (y, out, z):
            assert relative_error(result, ref) <= TOLERANCE[torch.float16]
        assert torch.equal(y, torch.matmul(x, w.T)) or api.choice(x, w.T)["version"] != tuner.VENDOR


def test_an_untuned_shape_inside_a_capture_runs_cublas_or_is_a_clear_error(monkeypatch):
    x, w = random_operands(3001, 5001, 777, torch.float16)  # a bucket no other test tunes
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # by default nothing is tuned or built in a capture: the instant choice runs
        y = matmul.matmul(x, w.T)
    graph.replay()
    assert relative_error(y, reference(x, w)) <= TOLERANCE[torch.float16]
    monkeypatch.setattr(api._chooser, "mode", "blocking")  # tuning in the caller cannot happen in a capture
    x, w = random_operands(5000, 3001, 1500, torch.float16)  # another bucket
    with pytest.raises(matmul.NotTunedError, match="before capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            matmul.matmul(x, w.T)


def test_gradients_match_torch():
    x, w = random_operands(1000, 1024, 4096, torch.float16)
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    weights = torch.randn(1000, 1024, device="cuda")
    (matmul.matmul(x, w.T).float() * weights).sum().backward()
    xf, wf = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ((xf @ wf.T) * weights).sum().backward()
    assert relative_error(x.grad, xf.grad) <= TOLERANCE[torch.float16]
    assert relative_error(w.grad, wf.grad) <= TOLERANCE[torch.float16]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_operands_on_another_gpu_than_the_current_one():
    a, w = random_operands(1000, 4095, 1024, torch.float16, device="cuda:1")
    with torch.cuda.device(0):
        out = matmul.matmul(a, w.T)
    assert out.device == a.device and relative_error(out, reference(a, w)) <= TOLERANCE[torch.float16]
    assert any(memo[0] == a.device for memo in api._chooser.entries)  # chosen for that GPU (its name in the key)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_seen_call_on_another_gpu_launches_a_version_there():
    """The native entry's launch route (allocation and program on the operands' GPU, not the current
    one): V3 fixed as the choice, so that a version runs whatever tuning would pick."""
    from matmul.call.launch import Plans
    from matmul.kernels import versions

    class V3Chosen:
        def get(self, device, dtype, m, n, k):
            return "sm_90a", {"version": "v3", "config": dict(versions.load("sm_90a", "v3").REPRESENTATIVE)}

    plans = Plans(V3Chosen())
    previous = api.use_plans(plans)
    try:
        a, w = random_operands(1000, 4095, 1024, torch.float16, device="cuda:1")
        with torch.cuda.device(0):
            first = matmul.matmul(a, w.T)  # through Python: the plan derived under cuda:1
            a2, w2 = random_operands(1000, 4095, 1024, torch.float16, device="cuda:1")
            second = matmul.matmul(a2, w2.T)  # a seen signature: the native entry's launch route
        if plans.direct is not None:
            assert plans.direct.kind(a, w.T) == "launch"
        for out, (x, y) in ((first, (a, w)), (second, (a2, w2))):
            assert out.device == a.device and relative_error(out, reference(x, y)) <= TOLERANCE[torch.float16]
    finally:
        api.use_plans(previous)


# A version launched from a thread that made no CUDA call of its own, as autograd's backward thread
# and a server's worker threads are (matmul.kernels.device_context), in a process of its own: without
# a current context the TMA descriptors are garbage and the fault kills the process's CUDA context.
# "control" turns the context check off: the launch must then fault, or this test could not tell.
FRESH_THREAD_CHILD = """
import sys, threading
import torch
import matmul
from matmul.kernels import device_context
from matmul.measure.correctness import poisoned_output, random_operands, reference, relative_error
arch, version, path = sys.argv[1], sys.argv[2], sys.argv[3]
if path == "control":
    device_context.make_current = lambda device: None
a, b = random_operands(200, 500, 1000, torch.float16)  # V7 takes up to 256 tokens
module = matmul.versions.load(arch, version)
matmul.versions.kernel(module, torch.float16, module.REPRESENTATIVE)  # built here, launched there
out = poisoned_output(200, 500, torch.float16)  # here too: any CUDA call on the thread would give it a context
torch.cuda.synchronize()
result = {}
def launch():
    result["out"] = matmul.versions.run(module, a, b, out, config=module.REPRESENTATIVE)
    torch.cuda.synchronize()
thread = threading.Thread(target=launch)
thread.start(); thread.join()
print("error", relative_error(result["out"], reference(a, b)))
"""


@pytest.mark.parametrize("path", ["run", "control"])
@pytest.mark.parametrize("version", ["v3", "v5", "v7"])
def test_a_version_launched_from_a_fresh_thread_is_correct(version, path):
    done = subprocess.run(
        [sys.executable, "-c", FRESH_THREAD_CHILD, ARCH, version, path], capture_output=True, text=True, timeout=600
    )
    lines = done.stdout.strip().splitlines()
    if path == "control":  # without the check the launch faults: the test sees the failure it guards against
        assert done.returncode != 0 or not lines or not lines[-1].startswith("error 0"), done.stdout[-500:]
        return
    assert done.returncode == 0, f"{version} from a fresh thread died: {done.stderr[-2000:]}"
    verdict, _, detail = lines[-1].partition(" ")
    assert verdict == "error" and float(detail) <= TOLERANCE[torch.float16], (version, detail)
