"""Hopper V8 (``matmul.quant.linear``, the call's path up to ``V8_MAX_M`` tokens) is built as the
call's chosen kernels are: by a build child (``matmul.call.building.v8_in_child``, put in
``quant.linear``'s hands when the call is imported), one kernel per dtype, format and configuration,
its library then opened in the caller, which never transpiles it. Until it is ready, and for good if
its build fails, the call runs the widened path (the weight widened, then cuBLAS); inside a CUDA
graph capture no build starts.

On the CPU, which stands in for a Hopper GPU here: a real build child whose builder is a stand-in
(``tests/stand_ins.py``: it records the process that built) and a stand-in launch function that
computes the widened path's product; the last test builds the real kernel for Hopper in the child
(``tests/test_v8_gpu.py`` runs V8 on the GPU)."""

import contextlib
import functools
import gc
import logging
import os
import threading
from pathlib import Path

import pytest
import stand_ins
import torch

import matmul
from matmul.call import building, tilus_autotune
from matmul.kernels import child_built, device_context, versions
from matmul.kernels.variant import Variant
from matmul.quant import linear as quant_linear
from matmul.quant import widen

FORMATS = ("int4", "int6", "fp8_e4m3")
M, N, K = 16, 200, 256  # tokens: few enough for V8
CHILD_S = 120  # a build child's time to start and report (the CPU may be busy)


def operands(weight_format, dtype=torch.float16):
    return stand_ins.quantized_operands(M, N, K, weight_format, dtype)  # the product: the widened path's


def call_config(weight_format):
    """The configuration the call builds for ``operands``' product."""
    return quant_linear.kernel_config(weight_format, quant_linear.config_for(M, N, K, weight_format))


@pytest.fixture
def hopper(monkeypatch):
    """This CPU as a Hopper GPU on which V8 runs once built, nothing of it built, building or failed
    yet; the widening done by torch (its own kernel is ``test_widening``'s). Returns
    ``child(builder, release=None)``: the build child's stand-in builder from now on, and the
    requests it gets. ``widened`` counts the calls that widened the weight."""
    monkeypatch.setattr(versions, "local_arch", lambda: quant_linear.ARCH)
    monkeypatch.setattr(quant_linear, "runs_here", lambda device: True)
    monkeypatch.setattr(device_context, "on_device", lambda device: contextlib.nullcontext())
    stand_ins.forget_builds(monkeypatch, quant_linear.builds)
    monkeypatch.setattr(tilus_autotune, "load", stand_ins.load_v8)
    child = functools.partial(stand_ins.build_children, monkeypatch)
    child.widened = 0
    widen_here = widen.widen

    def counted(weight, out=None):
        child.widened += 1
        return widen_here(weight, out)

    monkeypatch.setattr(widen, "widen", counted)
    return child


@pytest.fixture
def caller_transpiles(monkeypatch):
    """What this process did towards building V8 itself: its script made (tilus transpiles it at its
    first call), a tilus build or JIT instance. Each raises here too, so that V8 built in the caller
    fails its test at once."""
    tilus = ((tilus_autotune, name) for name in ("build", "jit_instance", "launch_function"))
    return stand_ins.forbid_in_caller(monkeypatch, [(versions, "kernel"), (versions, "_fixed_kernel_class"), *tilus])


def test_the_build_childs_builder_is_installed_when_the_call_is_imported():
    assert quant_linear.builds.builder is building.v8_in_child


@pytest.mark.parametrize("weight_format", FORMATS)
def test_the_widened_path_runs_until_v8_built_by_the_child_takes_over(hopper, caller_transpiles, weight_format):
    """The first calls widen the weight while the child builds V8 (asked once, for this dtype, format
    and configuration); once its library is opened (on the builder's thread), the call launches V8,
    on the caller's thread, with the same product. The child saw no GPU; the caller built nothing."""
    release = threading.Event()
    requests = hopper("stand_ins:cpu_build", release)
    x, qw, expected = operands(weight_format)
    config = call_config(weight_format)
    key = quant_linear.kernel_key(torch.float16, weight_format, config)
    for _ in range(2):  # the second while the first's build is still held back: not asked again
        assert torch.equal(quant_linear.linear(x, qw), expected)
    assert caller_transpiles == [] and hopper.widened == 2  # both calls widened the weight
    assert key in quant_linear.builds.building and key not in quant_linear.builds.launches

    release.set()
    assert quant_linear.wait_until_built(torch.float16, weight_format, config, CHILD_S), quant_linear.builds.failed
    assert len(requests) == 1, requests  # asked once, by the first call
    ((job,), builder) = requests[0]
    assert builder == "matmul.call.building:build_v8"
    expected_job = {"id": "v8", "arch": "sm_90a", "dtype": "float16", "version": "v8"}
    assert job == {**expected_job, "config": {"weight": weight_format, **config}, "variant": Variant().key()}
    kernel = quant_linear.builds.launches[key]
    assert kernel.launches == 0 and (kernel.format, kernel.config) == (weight_format, config)
    out = torch.full((M, N), float("nan"), dtype=torch.float16)
    quant_linear.linear(x, qw, out=out)  # V8 writes the product into out
    assert torch.equal(out, expected)
    assert torch.equal(matmul.matmul(x, qw.T), expected)  # the public call takes the same path
    assert kernel.launches == 2 and kernel.threads == [threading.current_thread().name] * 2
    assert hopper.widened == 2  # V8 ran: the weight was not widened again
    child_pid, _ = kernel.built_by
    assert child_pid != os.getpid() and kernel.visible_devices == ""  # built in a child that sees no GPU
    assert kernel.loaded_by[0] == os.getpid() and kernel.loaded_by[1] != threading.current_thread().name
    assert caller_transpiles == [] and len(requests) == 1


def test_a_seen_signature_runs_its_kept_launch_and_every_other_call_the_full_path(hopper, monkeypatch):
    """Once V8 ran a ``linear`` call without ``out``, a later call with the same input signature (shape,
    strides, dtype, device) on the same weight runs the kept launch (``quant_linear._launches``),
    none of the checks and choices of the full path, with the same product and the bias and
    activation applied after it. Calls with another signature, with ``out``, or whose input is not
    16-byte aligned take the full path; a weight let go takes its launches with it."""
    hopper("stand_ins:cpu_build")
    gc.collect()  # the weights of earlier tests gone from the table: it changes here only as this test does
    weights_kept = len(quant_linear._launches)
    x, qw, expected = operands("int4")
    assert quant_linear.wait_until_built(torch.float16, "int4", call_config("int4"), CHILD_S)
    kernel = quant_linear.builds.launches[quant_linear.kernel_key(torch.float16, "int4", call_config("int4"))]
    x3 = x.view(2, M // 2, K)  # the model's form: [batch, tokens, hidden]
    assert torch.equal(quant_linear.linear(x3, qw), expected.view(2, M // 2, N))  # the full path: kept
    full_path = []
    built_kernel = quant_linear.built_kernel
    monkeypatch.setattr(quant_linear, "built_kernel", lambda *args: full_path.append(1) or built_kernel(*args))
    launches = kernel.launches
    x3b = stand_ins.quantized_operands(M, N, K, "int4")[0].view(2, M // 2, K)  # fresh data, the same signature
    y = quant_linear.linear(x3b, qw)
    assert torch.equal(y, quant_linear.widened(x3b.view(M, K), qw).view(2, M // 2, N)) and full_path == []
    bias = torch.randn(N, dtype=torch.float16)
    fused = quant_linear.linear(x3b, qw, bias, "silu")
    assert torch.equal(fused, torch.nn.functional.silu(y + bias)) and full_path == []
    assert kernel.launches == launches + 2
    out = torch.full((2, M // 2, N), float("nan"), dtype=torch.float16)
    assert quant_linear.linear(x3b, qw, out=out) is out and torch.equal(out, y) and full_path == []  # dense out
    wrong = torch.empty(2, M // 2, N + 1, dtype=torch.float16)
    with pytest.raises(matmul.MatmulInputError, match="out must be"):  # the full path names it
        quant_linear.linear(x3b, qw, out=wrong)
    out = torch.full((N, 2, M // 2), float("nan"), dtype=torch.float16).permute(1, 2, 0)  # not dense
    assert quant_linear.linear(x3b, qw, out=out) is out and torch.equal(out, y) and full_path == [1]
    full_path.clear()
    assert quant_linear.linear(x3b, qw, bias, "silu", out=out) is out and torch.equal(out, fused)
    dense = torch.full((2, M // 2, N), float("nan"), dtype=torch.float16)
    assert quant_linear.linear(x3b, qw, bias, "silu", out=dense) is dense and torch.equal(dense, fused)
    assert full_path == [1, 1]  # out= and an epilogue: the full path
    full_path.clear()
    unaligned = torch.empty(M * K + 1, dtype=torch.float16)[1:].view(2, M // 2, K)
    unaligned.copy_(x3b)
    assert torch.equal(quant_linear.linear(unaligned, qw), y) and full_path == [1]  # copied, then V8
    strided = torch.randn(2, M, K, dtype=torch.float16)[:, ::2]  # every other row: copied per call, never kept
    assert torch.equal(
        quant_linear.linear(strided, qw), quant_linear.widened(strided.reshape(M, K), qw).view(2, M // 2, N)
    )
    assert full_path == [1, 1] and len(quant_linear._launches[qw]) == 1
    quant_linear.linear(x3b.view(M, K), qw)  # another shape, the same tokens: its own full path, then kept
    assert full_path == [1, 1, 1] and len(quant_linear._launches[qw]) == 2
    other = stand_ins.quantized_operands(M, N, K, "int4")[1]  # another weight: the full path, its own launches
    quant_linear.linear(x3b, other)
    assert full_path == [1, 1, 1, 1] and len(quant_linear._launches) == weights_kept + 2
    del other
    gc.collect()
    assert len(quant_linear._launches) == weights_kept + 1 and qw in quant_linear._launches


def test_each_configuration_is_its_own_kernel(hopper, caller_transpiles):
    """A configuration given to ``v8`` (a benchmark's) is built and waited for as the call's is,
    separately; the call's own is not built by it."""
    requests = hopper("stand_ins:cpu_build")
    x, qw, expected = operands("int4")
    other = {**call_config("int4"), "stages": 6}
    assert quant_linear.wait_until_built(torch.float16, "int4", other, CHILD_S)
    out = torch.empty(M, N, dtype=torch.float16)
    assert torch.equal(quant_linear.v8(x, qw, out, other), expected)
    assert quant_linear.builds.launches[quant_linear.kernel_key(torch.float16, "int4", other)].launches == 1
    assert hopper.widened == 0 and len(requests) == 1
    assert torch.equal(quant_linear.linear(x, qw), expected)  # the call's configuration: not built yet
    assert hopper.widened == 1
    assert quant_linear.wait_until_built(torch.float16, "int4", call_config("int4"), CHILD_S)
    assert len(requests) == 2 and requests[1][0][0]["config"]["stages"] == 4 and caller_transpiles == []


@pytest.mark.parametrize("builder, reason, load", stand_ins.failing_builders("v8"))
def test_a_v8_kernel_that_does_not_build_leaves_the_widened_path_in_place(
    hopper, caller_transpiles, caplog, builder, reason, load
):
    """The build fails once, with a warning that names the widened path; it is not tried again."""
    requests = hopper(builder, load=load)
    x, qw, expected = operands("int4", torch.bfloat16)
    config = call_config("int4")
    for call in range(2):  # the second after the failure: the widened path stays, nothing is asked for
        with caplog.at_level(logging.WARNING, logger=quant_linear.__name__):
            assert torch.equal(quant_linear.linear(x, qw), expected)
            assert not quant_linear.wait_until_built(torch.bfloat16, "int4", config, CHILD_S)
        assert len(requests) == 1 and hopper.widened == call + 1 and not quant_linear.builds.is_building()
    assert quant_linear.builds.failed == {quant_linear.kernel_key(torch.bfloat16, "int4", config)}
    assert quant_linear.builds.launches == {} and caller_transpiles == []
    warnings = [r.getMessage() for r in caplog.records if r.name == quant_linear.__name__]
    assert len(warnings) == 1 and reason in warnings[0] and "widened for cuBLAS" in warnings[0], warnings


def test_nothing_starts_inside_a_cuda_graph_capture(hopper, caller_transpiles, monkeypatch):
    """Captured, a call whose V8 is not built widens the weight and starts no build (neither V8's nor
    the widening kernel's); after the capture the next call starts V8's; once built, a captured call
    runs it."""
    requests = hopper("stand_ins:cpu_build")
    captured = [True]
    monkeypatch.setattr(widen, "runs_here", lambda weight: captured[0])  # its kernel too, while captured
    stand_ins.forget_builds(monkeypatch, widen.builds)
    for module in (quant_linear, widen):  # (the CPU's tensors are never captured: child_built.capturing's test)
        monkeypatch.setattr(module, "capturing", lambda device: captured[0])
    x, qw, expected = operands("int4")
    config = call_config("int4")
    key = quant_linear.kernel_key(torch.float16, "int4", config)
    for _ in range(2):
        assert torch.equal(quant_linear.linear(x, qw), expected)
    assert requests == [] and not quant_linear.builds.is_building() and not widen.builds.is_building()
    assert hopper.widened == 2 and quant_linear.builds.launches == {} and quant_linear.builds.failed == set()

    captured[0] = False
    assert torch.equal(quant_linear.linear(x, qw), expected)
    assert key in quant_linear.builds.building
    assert quant_linear.wait_until_built(torch.float16, "int4", config, CHILD_S)
    assert [asked_for for _, asked_for in requests] == ["matmul.call.building:build_v8"]
    captured[0] = True
    assert torch.equal(quant_linear.linear(x, qw), expected)
    assert quant_linear.builds.launches[key].launches == 1 and hopper.widened == 3
    assert caller_transpiles == []


def test_capturing_is_a_capture_of_the_current_cuda_stream(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert child_built.capturing(torch.device("cuda", 0))
    assert not child_built.capturing(torch.device("cpu"))  # (torch would raise here without CUDA)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert not child_built.capturing(torch.device("cuda", 0))


def test_without_a_builder_nothing_builds_and_the_weight_is_widened(hopper, monkeypatch):
    monkeypatch.setattr(quant_linear.builds, "builder", None)
    x, qw, expected = operands("fp8_e4m3")
    assert torch.equal(quant_linear.linear(x, qw), expected)
    assert not quant_linear.wait_until_built(torch.float16, "fp8_e4m3", call_config("fp8_e4m3"), CHILD_S)
    assert hopper.widened == 1 and not quant_linear.builds.is_building()


def test_where_v8_does_not_run_the_weight_is_widened_and_nothing_builds(monkeypatch):
    """This CPU as it is (not a Hopper GPU): ``v8`` itself widens the weight, and no build starts."""
    stand_ins.forget_builds(monkeypatch, quant_linear.builds)
    x, qw, expected = operands("int4")
    out = torch.empty(M, N, dtype=torch.float16)
    assert not quant_linear.uses_v8(M, qw)
    assert torch.equal(quant_linear.v8(x, qw, out), expected) and torch.equal(out, expected)
    assert not quant_linear.wait_until_built(torch.float16, "int4", call_config("int4"), CHILD_S)
    assert not quant_linear.builds.is_building() and quant_linear.builds.failed == set()


@pytest.mark.parametrize("weight_format", ["int4", pytest.param("fp8_e4m3", marks=pytest.mark.full_space)])
def test_the_build_child_builds_v8(weight_format):
    """The real child (no GPU) builds V8 for Hopper in the call's configuration for 16 tokens and
    reports its program (int4: ``versions.kernel``'s script; the other formats name theirs)."""
    reports = []
    config = {"weight": weight_format, **quant_linear.kernel_config(weight_format, quant_linear.config_for(16))}
    job = {"id": "v8", "arch": "sm_90a", "dtype": "float16", "version": "v8", "config": config,
           "variant": Variant().key()}  # fmt: skip
    building.build_in_child([job], lambda *report: reports.append(report), "matmul.call.building:build_v8")
    assert len(reports) == 1 and reports[0][2] is None, reports
    assert (Path(reports[0][1]) / "module").is_dir()
