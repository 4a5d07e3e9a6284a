"""matmul()'s native entry (matmul/call/entry.cpp): the table of routes, which calls it runs and which it
hands to Python, and the Python entry where it cannot be built. CPU tensors and Python stand-ins for
the routes: the entry itself does not care which device a route runs on."""

import logging
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import matmul
from matmul.call import api, native_entry
from matmul.kernels import variant as variants

native = api._native
built = pytest.mark.skipif(native is None, reason="matmul()'s native entry is not built here")


def operands(m=24, n=16, k=40):
    return torch.randn(m, k).half(), torch.randn(n, k).half().T  # x and w.T, as a linear layer calls it


class Recorder:
    """A route or a fallback that records its calls and returns a marker."""

    def __init__(self, name):
        self.name, self.calls = name, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.name


@pytest.fixture
def routed():
    """The process's entry routed to a fresh table and a recording fallback; restored afterwards."""
    table, fallback = native.DirectTable(), Recorder("python")
    native.route(table, fallback, fallback)
    yield table, fallback
    api.use_plans(api._plans)


@built
def test_routes_are_kept_by_the_whole_signature():
    table = native.DirectTable()
    a, b = operands()
    function = Recorder("series")
    table.put(a, b, function, tag=0)
    assert table.get(a, b) is function and table.kind(a, b) == "python" and len(table) == 1
    assert table.get(*operands()) is function  # new data, the same signature
    others = [
        (a, b.contiguous()),  # b's strides
        (a.T.contiguous().T, b),  # a's strides
        (a, b.bfloat16()),  # b's dtype
        (a.bfloat16(), b),  # a's dtype
        (a.to("meta"), b),  # a's device
        (a, b.to("meta")),  # b's device
        (a[:20], b),  # a's shape
        (a[:, :32], b[:32]),  # K
        (a.unsqueeze(0), b),  # not a matrix
    ]
    for x, y in others:
        assert table.get(x, y) is None
    with pytest.raises(ValueError, match="two strided matrices"):
        table.put(a.unsqueeze(0), b, function)
    table.drop([0])
    assert len(table) == 0 and table.get(a, b) is None


@built
def test_a_route_serves_the_rows_it_was_put_for_within_its_bucket():
    """One route a bucket (97-128 here), serving every M of it unless put for a part: the side of a
    choice's from_m that its plan was derived on (``launch.rows_served``)."""
    table = native.DirectTable()
    a, b = operands(m=120)
    table.put_vendor(a, b, Recorder("below"), min_rows=0, max_rows=111)
    assert table.kind(*operands(m=100)) == "vendor" and table.get(*operands(m=112)) is None
    table.put_vendor(a, b, Recorder("from 112"), min_rows=112)
    assert table.get(*operands(m=128)).name == "from 112" and table.get(*operands(m=111)) is None
    table.put_vendor(a, b, Recorder("all"))
    assert table.get(*operands(m=97)).name == table.get(*operands(m=128)).name == "all" and len(table) == 1


@built
def test_drop_removes_the_routes_of_its_tags_only_in_every_variants_table():
    table = native.DirectTable()
    (a, b), (a2, b2), (a3, b3) = operands(), operands(n=24), operands(n=32)
    silu = table.variant(True, "silu")
    table.put(a, b, Recorder("one"), tag=1)
    table.put_vendor(a2, b2, Recorder("two"), tag=2)
    table.put(a3, b3, Recorder("untagged"))
    silu.put(a, b, Recorder("one, silu"), tag=1)
    silu.put(a2, b2, Recorder("two, silu"), tag=2)
    table.drop([1, 7])
    assert table.get(a, b) is None and silu.get(a, b) is None
    assert table.kind(a2, b2) == "vendor" and silu.get(a2, b2).name == "two, silu"
    assert table.get(a3, b3).name == "untagged" and len(table) == 2 and len(silu) == 1
    table.drop([2])
    assert len(table) == 1 and len(silu) == 0


@built
def test_a_seen_call_runs_its_route_and_every_other_call_goes_to_python(routed):
    table, fallback = routed
    a, b = operands()
    series = Recorder("series")
    table.put(a, b, series)
    assert matmul.matmul(a, b) == "series" and series.calls[-1][0] == (a, b)
    with torch.no_grad():  # parameters require gradients; inference records none
        assert matmul.matmul(a, b.clone().requires_grad_()) == "series"
    assert matmul.matmul(a, b.T.contiguous().T) == "series"  # the same strides, a copy

    class Subclass(torch.Tensor):
        pass

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    others = [
        ((a, b.contiguous()), {}),  # not seen
        ((a, b), {"out": torch.empty(24, 16).half()}),
        ((a, b), {"out": None}),  # keywords of any kind: Python parses them
        ((a,), {}),
        ((a, b, None), {}),
        (([[1.0]], b), {}),  # not a tensor
        ((a.as_subclass(Subclass), b), {}),  # a subclass may override torch functions
        ((a, b.clone().requires_grad_()), {}),  # autograd must record it
    ]
    for args, kwargs in others:
        fallback.calls.clear()
        assert matmul.matmul(*args, **kwargs) == "python"
        assert len(fallback.calls) == 1 and fallback.calls[0][0] == args and fallback.calls[0][1] == kwargs
    with Mode():  # a torch function mode sees torch's calls: matmul() leaves them to Python
        assert matmul.matmul(a, b) == "python"
    assert len(series.calls) == 3


@built
def test_a_vendor_route_runs_at_mm_on_the_callers_tensors(routed, monkeypatch):
    table, fallback = routed
    a, b = operands()
    function = Recorder("vendor")
    table.put_vendor(a, b, function)
    a2, b2 = operands()
    monkeypatch.setattr(torch, "mm", lambda *args, **kwargs: pytest.fail("the vendor route called torch.mm"))
    dispatched = []

    class Watch(torch.utils._python_dispatch.TorchDispatchMode):  # what reaches the dispatcher
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            dispatched.append((func, [t.data_ptr() for t in args]))
            return func(*args, **(kwargs or {}))

    with Watch():
        c = matmul.matmul(a2, b2)
    assert torch.equal(c, a2 @ b2) and function.calls == [] and fallback.calls == []
    assert dispatched == [(torch.ops.aten.mm.default, [a2.data_ptr(), b2.data_ptr()])]


@built
def test_a_call_autograd_records_runs_torchs_own_op_where_cubLAS_is_its_route(routed):
    """Training: where cuBLAS is the route (or the miss hook takes the call), torch's own op runs and
    records the gradient, at torch's host cost; where a kernel is the route, Python records it."""
    table, fallback = routed
    a, b = operands()
    vendor = Recorder("vendor")
    table.put_vendor(a, b, vendor)
    a2, b2 = a.clone().requires_grad_(), b.clone().requires_grad_()
    c = matmul.matmul(a2, b2)
    assert type(c.grad_fn).__name__ == "MmBackward0" and fallback.calls == [] and vendor.calls == []
    c.float().sum().backward()
    assert torch.equal(a2.grad, torch.ones(24, 16).half() @ b.T) and b2.grad is not None
    # linear: its variant's table, torch's linear recorded, the activation after it
    x, weight, bias = a.clone().requires_grad_(), b.T.clone().requires_grad_(), torch.randn(16).half()
    table.variant(True, "relu").put_vendor(x.detach(), weight.detach().T, vendor)
    y = matmul.linear(x, weight, bias.requires_grad_(), "relu")
    assert fallback.calls == [] and torch.equal(y, torch.relu(torch.nn.functional.linear(x, weight, bias)))
    y.float().sum().backward()
    assert weight.grad is not None and bias.grad is not None and x.grad is not None
    # a kernel's route: Python records it (its autograd.Function)
    series = Recorder("series")
    table.put(a, b.T.contiguous().T, series)
    assert matmul.matmul(a2, b2.detach().T.contiguous().T.requires_grad_()) == "python" and series.calls == []


@built
@pytest.mark.parametrize("n", [16, 17])  # 17: rows padded to 24 elements (16 bytes), a view returned
def test_a_launch_route_allocates_the_output_and_calls_the_program(routed, n):
    from stand_ins import StandInKernel

    table, fallback = routed
    a, b = operands(n=n)
    row = -(-n // 8) * 8
    program, plan = StandInKernel("v4", {}, wrong=False), Recorder("plan")
    table.put_launch(a, b, plan, program, n, 40, 40, 40, row, row, 16)
    assert table.kind(a, b) == "launch"
    a2, b2 = operands(n=n)
    c = matmul.matmul(a2, b2)
    assert torch.allclose(c.float(), a2.float() @ b2.float(), atol=1e-2, rtol=1e-2)
    assert c.shape == (24, n) and c.stride() == (row, 1) and c.dtype == a.dtype
    assert program.launches == 1 and plan.calls == [] and fallback.calls == []

    # the same signature, a's base 8 bytes off: the plan runs, which refuses it with the fix
    buffer = torch.empty(24 * 40 + 4).half()
    shifted = buffer[4 : 4 + 24 * 40].view(24, 40).copy_(a2)
    assert table.kind(shifted, b2) == "launch"
    assert matmul.matmul(shifted, b2) == "plan" and plan.calls[0][0] == (shifted, b2) and program.launches == 1


@built
def test_a_route_may_change_the_routing_while_it_runs(routed):
    table, fallback = routed
    a, b = operands()

    def reroute(x, y):  # drops its own route (as Plans.forget does), then calls through the entry
        native.route(None, fallback, fallback)
        table.drop([3])
        return matmul.matmul(x, y)

    table.put(a, b, reroute, tag=3)
    del reroute
    assert matmul.matmul(a, b) == "python" and len(table) == 0


@built
def test_an_error_in_a_route_reaches_the_caller(routed):
    table, _ = routed
    a, b = operands()

    def fails(x, y):
        raise matmul.MatmulInputError("a's data pointer is not 16-byte aligned")

    table.put(a, b, fails)
    with pytest.raises(matmul.MatmulInputError, match="not 16-byte aligned"):
        matmul.matmul(a, b)
    table.put_vendor(a, b.float(), Recorder("unused"))
    with pytest.raises(RuntimeError, match="same dtype"):  # at::mm's own error, as a Python exception
        matmul.matmul(a, b.float())


def test_matmul_pickles_by_name():  # as a function handed to another process
    assert pickle.loads(pickle.dumps(matmul.matmul)) is matmul.matmul


def test_without_the_native_entry_matmul_is_the_python_function(tmp_path):
    code = (
        "import matmul; from matmul.call import api; assert matmul.matmul is api.python_matmul, matmul.matmul\n"
        "import torch\n"
        "try:\n    matmul.matmul(torch.randn(8, 8).half(), torch.randn(8, 8).half())\n"
        "except matmul.MatmulInputError as e:\n    print('refused:', e)\n"
    )
    env = {**os.environ, native_entry.SWITCH: "0", "MATMUL_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: " in proc.stdout and "CUDA tensors" in proc.stdout
    assert not (tmp_path / "entry").exists()  # no build attempted


def test_a_failed_build_leaves_the_python_entry_with_a_warning(monkeypatch, caplog):
    from torch.utils import cpp_extension

    def fails(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "load", fails)
    with caplog.at_level(logging.WARNING):
        assert native_entry.load() is None
    assert "native entry is not available" in caplog.text and "Ninja is required" in caplog.text


@built
def test_linear_without_bias_or_activation_runs_the_route_of_its_flattened_input(routed):
    table, fallback = routed
    x, w = torch.randn(2, 3, 40).half(), torch.randn(16, 40).half()
    table.put_vendor(x.view(6, 40), w.T, Recorder("vendor plan"))
    y = matmul.linear(x, w)  # the vendor route: at::mm on x [6, 40] @ w.T, seen as [2, 3, 16]
    assert y.shape == (2, 3, 16) and torch.allclose(y.float(), x.float() @ w.float().T, atol=1e-2)
    assert matmul.linear(x, w, None, None).shape == (2, 3, 16) and fallback.calls == []
    for call in (
        lambda: matmul.linear(x, w, torch.zeros(16).half()),  # a bias
        lambda: matmul.linear(x, w, None, "relu"),  # an activation
        lambda: matmul.linear(x.transpose(0, 1), w),  # not contiguous: Python's reshape copies it
        lambda: matmul.linear(x[0], w),  # another signature
    ):
        before = len(fallback.calls)
        assert call() == "python" and len(fallback.calls) == before + 1
    recorded = matmul.linear(x, w.clone().requires_grad_())  # a gradient to record: torch's linear records it
    assert recorded.shape == (2, 3, 16) and recorded.grad_fn is not None and len(fallback.calls) == 4


@built
@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh", "gelu_erf", "silu", "swiglu"])
def test_linear_with_an_epilogue_runs_the_route_of_its_variant(routed, activation):
    table, fallback = routed
    x, w, bias = torch.randn(2, 3, 48), torch.randn(32, 48), torch.randn(32)  # float32: the CPU's at::addmm
    x2 = x.view(6, 48)
    table.variant(True, activation or "").put_vendor(x2, w.T, Recorder("vendor plan"))
    expected = variants.torch_epilogue(x2 @ w.T, bias, activation).view(2, 3, -1)
    y = matmul.linear(x, w, bias, activation)  # the variant's vendor route: at::addmm, then torch's activation
    assert fallback.calls == [] and torch.allclose(y, expected, atol=1e-5)
    for call in (
        lambda: matmul.linear(x, w, None, activation),  # no bias: another variant, not routed
        lambda: matmul.linear(x, w, bias[:16].clone(), activation),  # a bias of the wrong size: Python names it
        lambda: matmul.linear(x, w, torch.randn(64)[::2], activation),  # a strided bias
        lambda: matmul.linear(x, w, bias, activation=activation),  # keywords
    ):
        before = len(fallback.calls)
        assert call() == "python" and len(fallback.calls) == before + 1


@built
def test_a_vendor_or_launch_route_serves_every_m_of_its_bucket_a_python_route_only_its_own(routed):
    from stand_ins import StandInKernel

    table, fallback = routed
    a, b = operands(m=24)  # the bucket of M = 24 (tuner.bucket) is 17..24
    table.put_vendor(a, b, Recorder("vendor"))
    assert [table.kind(operands(m=m)[0], b) for m in (17, 20, 24, 25, 16)] == ["vendor"] * 3 + [None, None]
    # a launch route takes M from the call: the program is launched with it, the output [M, N]
    program = StandInKernel("v4", {}, wrong=False)
    table.put_launch(a, b, Recorder("plan"), program, 16, 40, 40, 40, 16, 16, 16)
    a20, b20 = operands(m=20)
    c = matmul.matmul(a20, b20)
    assert c.shape == (20, 16) and torch.allclose(c.float(), a20.float() @ b20.float(), atol=1e-2, rtol=1e-2)
    assert program.launches == 1 and fallback.calls == []
    # a Python route may have fixed M in its plan: only its own M
    table.put(a, b, Recorder("series"))
    assert table.kind(a, b) == "python" and table.kind(a20, b) is None
    assert matmul.matmul(a20, b20) == "python"


@built
def test_an_unseen_call_goes_to_python_unless_the_miss_hook_takes_it(routed):
    table, fallback = routed
    hook = Recorder(True)
    native.route(table, fallback, fallback, hook)
    a, b = operands()
    assert matmul.matmul(a, b) == "python" and hook.calls == []  # CPU tensors: not a call cuBLAS may run now
    with pytest.raises(TypeError, match="callable"):
        native.route(table, fallback, fallback, 3)


# --- the caller's last call, for the tuning child (matmul/call/yielding.py) ------------------------


@pytest.fixture
def stamped():
    """A word the native entry stamps (an int64 of this process), and the Python paths' word; both
    put back afterwards."""
    import ctypes
    import time

    from matmul.call import yielding

    word = ctypes.c_int64(0)
    native.stamp_calls_into(ctypes.addressof(word))
    yield word, time.monotonic_ns
    process_word = yielding._last_call
    native.stamp_calls_into(0 if process_word is None else process_word.address)


@built
def test_every_call_of_the_native_entry_stamps_the_time_of_its_last_call(routed, stamped):
    table, fallback = routed
    word, clock = stamped
    a, b = operands()
    table.put_vendor(a, b, Recorder("vendor"))
    calls = [
        lambda: matmul.matmul(a, b),  # a vendor route
        lambda: matmul.matmul(a, b.contiguous()),  # unseen: the Python function
        lambda: matmul.matmul(a, b, out=None),  # keywords: the Python function
        lambda: matmul.linear(a, b.T),  # linear's route of the same table
        lambda: matmul.linear(a, b.T, None, "relu"),  # linear's Python function
    ]
    for call in calls:
        word.value = 0
        before = clock()
        call()
        assert before <= word.value <= clock()  # CLOCK_MONOTONIC, as time.monotonic_ns reads it


@built
def test_once_a_tuning_child_is_started_every_call_stamps_the_shared_word(routed):
    from matmul.call import yielding

    table, fallback = routed
    assert yielding.shared_fd() is not None  # what tuner.tune_in_child hands the child
    word = yielding._last_call
    a, b = operands()
    table.put_vendor(a, b, Recorder("vendor"))
    import time

    for call in (lambda: matmul.matmul(a, b), lambda: api.python_matmul(a, b)):
        before = time.monotonic_ns()
        try:
            call()
        except matmul.MatmulInputError:  # the Python function's checks: CPU tensors (after the stamp)
            pass
        assert before <= word.read_ns() <= time.monotonic_ns()


@built
@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh", "gelu_erf", "silu", "swiglu"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_an_unseen_linear_call_the_hook_takes_runs_torchs_ops_at_once(routed, activation, with_bias):
    table, fallback = routed
    hook, matmul_hook = Recorder(True), Recorder(True)
    native.route(table, fallback, fallback, matmul_hook, hook, "cpu")  # CPU calls offered, as CUDA ones are
    x, w = torch.randn(2, 3, 48).half(), torch.randn(32, 48).half()
    bias = torch.randn(32).half() if with_bias else None
    y = matmul.linear(x, w, bias, activation)
    expected = variants.torch_epilogue(x.view(6, 48).float() @ w.float().T, bias, activation).view(2, 3, -1)
    assert fallback.calls == [] and torch.allclose(y.float(), expected, atol=2e-2, rtol=1e-2)
    ((args, kwargs),) = hook.calls  # the plan's operands: x seen as [M, K], weight.T, bias, activation
    assert args[0].shape == (6, 48) and args[0].data_ptr() == x.data_ptr() and torch.equal(args[1], w.T)
    assert args[2] is bias and args[3] == activation and matmul_hook.calls == []


@built
def test_an_unseen_linear_call_goes_to_python_where_the_hook_declines_or_is_not_asked(routed):
    table, fallback = routed
    declines = Recorder(False)
    native.route(table, fallback, fallback, None, declines, "cpu")
    x, w, bias = torch.randn(6, 48).half(), torch.randn(32, 48).half(), torch.randn(32).half()
    assert matmul.linear(x, w, bias, "relu") == "python" and len(declines.calls) == 1
    takes = Recorder(True)
    native.route(table, fallback, fallback, None, takes, "cpu")
    for call in (
        lambda: matmul.linear(x, w, bias, "gelu"),  # Python's name: linear's Python function maps it
        lambda: matmul.linear(x.float(), w.float(), bias.float(), "relu"),  # a dtype no kernel takes
        lambda: matmul.linear(x, w[:, :40], bias, "relu"),  # K does not match
        lambda: matmul.linear(x, w, bias[:16].clone(), "relu"),  # a bias of the wrong size
    ):
        before = len(fallback.calls)
        assert call() == "python" and len(fallback.calls) == before + 1
    assert takes.calls == []
    # a gradient to record, taken by the hook: torch's own ops record it at once
    before = len(fallback.calls)
    y = matmul.linear(x, w.clone().requires_grad_(), bias, "relu")
    assert type(y.grad_fn).__name__ == "ReluBackward0" and len(fallback.calls) == before and len(takes.calls) == 1
    takes.calls.clear()
    native.route(table, fallback, fallback, None, takes)  # CUDA calls only: CPU ones go to Python
    assert matmul.linear(x, w, bias, "relu") == "python" and takes.calls == []


@built
def test_an_unseen_linear_call_gets_its_plan_on_the_planners_thread_and_a_route(monkeypatch):
    """Through the process's own paths: the hook is the plans' ``defer_linear``; a stand-in v4 won."""
    import functools

    from stand_ins import install

    from matmul.call.launch import Plans, fused_signature
    from matmul.contract import check_call
    from matmul.kernels import versions
    from matmul.kernels.variant import Variant

    install(monkeypatch, wrong=(), available=("v4",))

    class Chosen:  # every bucket's choice: a stand-in v4, built
        mode = "background"

        def on_change(self, listener):
            pass

        def get(self, device, dtype, m, n, k, variant):
            return "sm_90a", {"version": "v4", "config": dict(versions.load("sm_90a", "v4").REPRESENTATIVE)}

    chooser = Chosen()
    plans = Plans(chooser, check=functools.partial(check_call, require_cuda=False))
    previous = api.use_plans(plans)
    try:
        native.route(plans.direct, api.python_matmul, api.python_linear, plans.defer, plans.defer_linear, "cpu")
        x, w, bias = torch.randn(2, 3, 48).half(), torch.randn(32, 48).half(), torch.randn(32).half()
        expected = variants.torch_epilogue(x.view(6, 48).float() @ w.float().T, bias, "silu").view(2, 3, -1)
        y = matmul.linear(x, w, bias, "silu")  # torch's ops now
        assert torch.allclose(y.float(), expected, atol=2e-2, rtol=1e-2)
        assert plans.planner.wait(10)
        key = fused_signature(x.view(6, 48), w.T, None, bias, Variant("nk", True, "silu"))
        assert key in plans.plans and plans.direct.variant(True, "silu").kind(x.view(6, 48), w.T) == "launch"
        assert plans.defer_linear(x.view(6, 48), w.T, bias, "silu") is False  # derived: nothing more to defer
        y = matmul.linear(x, w, bias, "silu")  # the route: the stand-in v4's launch, bias pointer and all
        assert plans.plans[key].launch.launches == 1
        assert torch.allclose(y.float(), expected, atol=2e-2, rtol=1e-2) and y.shape == (2, 3, 32)
    finally:
        api.use_plans(previous)


# --- on a GPU: python -m pytest -m gpu tests/test_native_entry.py ----------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a Hopper or Blackwell GPU")

DEFERRED_LINEAR_CHILD = """
import torch
import matmul
from matmul.call import api
from matmul.kernels.variant import torch_epilogue
from matmul.measure.correctness import TOLERANCE, random_operands, reference, relative_error
x, w = random_operands(100, 384, 512, torch.float16)
bias = torch.randn(384, device="cuda", dtype=torch.float16)
routes = api._plans.direct.variant(True, "gelu_tanh")
assert routes.kind(x, w.T) is None
y = matmul.linear(x, w, bias, "gelu_tanh")  # unseen: F.linear and torch's GELU at once, the plan on the planner
expected = torch_epilogue(reference(x, w), bias.float(), "gelu_tanh")
assert relative_error(y, expected) <= TOLERANCE[torch.float16]
assert api._plans.planner.wait(60)
kind = routes.kind(x, w.T)
x2 = random_operands(97, 384, 512, torch.float16)[0]  # M = 97 and 100 share the bucket of 128
assert kind is not None and routes.kind(x2, w.T) == kind, kind
expected2 = torch_epilogue(reference(x2, w), bias.float(), "gelu_tanh")
assert relative_error(matmul.linear(x2, w, bias, "gelu_tanh"), expected2) <= TOLERANCE[torch.float16]
print("route", kind)
"""


@pytest.mark.gpu
@needs_gpu
def test_on_the_gpu_an_unseen_linear_call_runs_torch_at_once_and_its_bucket_gets_a_route(tmp_path):
    env = dict(os.environ, MATMUL_CACHE_DIR=str(tmp_path), MATMUL_TUNE="off")
    done = subprocess.run(
        [sys.executable, "-c", DEFERRED_LINEAR_CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and "route" in done.stdout, done.stderr[-3000:]


# The caller times its calls one by one (synchronized, as the trace does) for CALLING_S while a
# tuning child measures cuBLAS on another shape (no kernel to build: it reaches the GPU within
# seconds of its start). It prints the share of calls over 1.5x the median, the seconds the child
# waited, and whether the child's result came only after the calls stopped.
YIELDING_CHILD = """
import json, statistics, threading, time
import torch
import matmul
from matmul.call import api, tuner
from matmul.measure.correctness import random_operands
CALLING_S = 20.0
x, w = random_operands(8192, 4096, 4096, torch.float16)  # calls of about half a millisecond
matmul.matmul(x, w.T)  # its plan, and the build of the kernel chosen, settled before anything is timed
assert api._plans.planner.wait(600) and api._chooser.wait(600)
for _ in range(10):
    matmul.matmul(x, w.T)
device = torch.device("cuda", torch.cuda.current_device())
job = {"key": "yield test", "m": 4096, "n": 4096, "k": 4096, "names": [tuner.VENDOR]}
found = {}
def tune():
    found.update(tuner.tune_in_child(tuner.versions.local_arch(), torch.float16, device, [job]))
    found["at"] = time.monotonic()
thread = threading.Thread(target=tune)
thread.start()
times, begin = [], time.monotonic()
while time.monotonic() - begin < CALLING_S:
    torch.cuda.synchronize()
    start = time.perf_counter()
    matmul.matmul(x, w.T)
    torch.cuda.synchronize()
    times.append((time.perf_counter() - start, time.monotonic() - begin))
stopped = time.monotonic()
thread.join(600)
median = statistics.median(t for t, _ in times)
slow = [at for t, at in times if t > 1.5 * median]
print(json.dumps({
    "slow_share": len(slow) / len(times),
    "yielded_s": found["yield test"]["yielded_s"],
    "after_the_calls": found["at"] > stopped,
    # where a failure's cause shows: how many calls, how slow, when the slow ones came (seconds into
    # the calls) and when the child's result did (seconds after the calls stopped)
    "calls": len(times),
    "median_ms": round(1e3 * median, 3),
    "max_ms": round(1e3 * max(t for t, _ in times), 3),
    "slow_at_s": [round(at, 2) for at in slow[:10]] + [round(at, 2) for at in slow[10:][-5:]],
    "result_after_stop_s": round(found["at"] - stopped, 2),
}))
"""


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("max_hold_s", ["inf", "0"])  # "0": never held, the control that shows a collision
def test_on_the_gpu_the_tuning_child_waits_while_the_process_calls(tmp_path, max_hold_s):
    import json

    env = dict(os.environ, MATMUL_CACHE_DIR=str(tmp_path), MATMUL_TUNE="off", MATMUL_TUNE_MAX_HOLD_S=max_hold_s)
    done = subprocess.run([sys.executable, "-c", YIELDING_CHILD], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if max_hold_s == "inf":  # held until the calls stopped, and no call slowed by the child's kernels
        assert found["after_the_calls"] and found["yielded_s"] > 1.0 and found["slow_share"] <= 0.005, found
    else:  # measured while the calls ran: some of them waited for the GPU
        assert not found["after_the_calls"] and found["yielded_s"] == 0 and found["slow_share"] > 0.005, found


# --- the build directory's locks -----------------------------------------------------------------


def test_a_lock_left_by_a_killed_build_does_not_make_later_imports_wait(tmp_path, monkeypatch, caplog):
    """torch's builder waits without a limit while its ``lock`` file exists; a process killed in a
    build leaves it behind. Holding the package's own lock, a process removes it and goes on."""
    (tmp_path / "lock").write_text("")  # as a Ctrl-C during a first import leaves it
    with caplog.at_level(logging.WARNING), native_entry.builder_lock(tmp_path, wait_s=5):
        assert not (tmp_path / "lock").exists()
    assert "did not finish" in caplog.text
    seen = {}

    def load(name, sources, build_directory, **kwargs):  # torch's builder, as the package calls it
        seen["lock"] = (Path(build_directory) / "lock").exists()
        return "built"

    monkeypatch.setattr("torch.utils.cpp_extension.load", load)
    monkeypatch.setattr(native_entry, "default_dir", lambda: tmp_path)
    monkeypatch.delenv(native_entry.SWITCH, raising=False)
    directory = tmp_path / "entry" / native_entry.module_name()
    directory.mkdir(parents=True)
    (directory / "lock").write_text("")
    assert native_entry.load() == "built" and seen["lock"] is False


def test_a_build_under_way_in_another_process_is_waited_for_then_given_up(tmp_path, caplog):
    """The package's lock is the system's (flock): held by a live process, it is waited for, at
    most ``wait_s``; then the Python entry serves (``load`` catches the error)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(30)",
            str(tmp_path / ".builder"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        (tmp_path / "lock").write_text("")  # the live builder's own: not to be removed
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="building the native entry"):
            with native_entry.builder_lock(tmp_path, wait_s=0.5):
                pass
        assert 0.5 <= time.monotonic() - start < 5 and (tmp_path / "lock").exists()
    finally:
        holder.kill()
        holder.wait()
    with native_entry.builder_lock(tmp_path, wait_s=5):  # its holder gone, the lock is the system's to give
        pass
