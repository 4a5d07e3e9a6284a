"""The widening kernel (``matmul.quant.widen``, the call's path above ``V8_MAX_M`` tokens) is built as
the call's chosen kernels are: by a build child (``matmul.call.building.widen_in_child``, put in
``widen``'s hands when the call is imported), its library then opened in the caller, which never
transpiles it. Until it is ready, and if its build fails, the call widens with torch's
``dequantize``.

On the CPU, which stands in for a Hopper GPU here: a real build child whose builder is a stand-in
(``tests/stand_ins.py``: it records the process that built) and a stand-in launch function that
widens with ``dequantize``; the last test builds the real kernel for Hopper in the child
(``tests/test_v8_gpu.py`` runs it on the GPU)."""

import contextlib
import functools
import logging
import os
import threading
from pathlib import Path

import pytest
import stand_ins
import torch

from matmul.call import building, tilus_autotune
from matmul.kernels import device_context, versions
from matmul.kernels.variant import Variant
from matmul.quant import linear as quant_linear
from matmul.quant import widen

FORMATS = ("int4", "int4_channel", "int6", "fp8_e4m3")
M = quant_linear.V8_MAX_M + 44  # tokens: more than V8 takes, so the weight is widened for the product
N, K = 200, 256


def operands(weight_format, dtype=torch.float16):
    return stand_ins.quantized_operands(M, N, K, weight_format, dtype)


@pytest.fixture
def hopper(monkeypatch):
    """This CPU as a Hopper GPU on which the widening kernel runs once built, nothing of it built,
    building or failed yet, and its build child able to import the stand-ins. Returns
    ``child(builder)``: the build child's stand-in builder from now on, and the requests it gets."""
    monkeypatch.setattr(versions, "local_arch", lambda: widen.ARCH)
    monkeypatch.setattr(widen, "runs_here", lambda weight: True)
    monkeypatch.setattr(device_context, "on_device", lambda device: contextlib.nullcontext())
    stand_ins.forget_builds(monkeypatch, widen.builds)
    monkeypatch.setattr(tilus_autotune, "load", stand_ins.load_widening)
    return functools.partial(stand_ins.build_children, monkeypatch)


@pytest.fixture
def caller_transpiles(monkeypatch):
    """What this process did towards building a kernel itself: a widening kernel made (tilus
    transpiles it at its first call), a tilus build or JIT instance. Each raises here too, so that a
    kernel built in the caller fails its test at once."""
    names = ("build", "jit_instance", "launch_function")
    return stand_ins.forbid_in_caller(monkeypatch, [(widen, "WidenKernel"), *((tilus_autotune, n) for n in names)])


def test_the_build_childs_builder_is_installed_when_the_call_is_imported():
    assert widen.builds.builder is building.widen_in_child


@pytest.mark.parametrize("weight_format", FORMATS)
def test_torch_widens_until_the_kernel_built_by_the_child_takes_over(hopper, caller_transpiles, weight_format):
    """The first calls widen with torch while the child builds (asked once, for this format and
    dtype); once its library is opened (on the builder's thread), the call launches the kernel, on
    the caller's thread, with the same product. The child saw no GPU; the caller built nothing."""
    release = threading.Event()
    requests = hopper("stand_ins:cpu_build", release)
    x, qw, expected = operands(weight_format)
    key = (torch.float16, weight_format)
    for _ in range(2):  # the second while the first's build is still held back: not asked again
        assert torch.equal(quant_linear.linear(x, qw), expected)
    assert caller_transpiles == [] and len(requests) == 1, (caller_transpiles, requests)
    ((job,), builder) = requests[0]
    assert builder == "matmul.call.building:build_widen"
    expected_job = {"id": "widen", "arch": "sm_90a", "dtype": "float16", "version": "widen"}
    assert job == {**expected_job, "config": {"weight": weight_format}, "variant": Variant().key()}
    assert key not in widen.builds.launches  # torch widened both calls

    release.set()
    assert widen.wait_until_built(torch.float16, weight_format, timeout_s=120), widen.builds.failed
    kernel = widen.builds.launches[key]
    assert kernel.launches == 0
    assert torch.equal(quant_linear.linear(x, qw), expected)
    assert kernel.launches == 1 and kernel.threads == [threading.current_thread().name]
    child_pid, _ = kernel.built_by
    assert child_pid != os.getpid() and kernel.visible_devices == ""  # built in a child that sees no GPU
    assert kernel.loaded_by[0] == os.getpid() and kernel.loaded_by[1] != threading.current_thread().name
    assert caller_transpiles == [] and len(requests) == 1


@pytest.mark.parametrize("builder, reason, load", stand_ins.failing_builders("widen"))
def test_a_widening_kernel_that_does_not_build_leaves_torch_in_place(
    hopper, caller_transpiles, caplog, builder, reason, load
):
    requests = hopper(builder, load=load)
    x, qw, expected = operands("int4", torch.bfloat16)
    key = (torch.bfloat16, "int4")
    with caplog.at_level(logging.WARNING, logger=widen.__name__):
        assert torch.equal(quant_linear.linear(x, qw), expected)
        assert not widen.wait_until_built(*key, timeout_s=120)
    assert key in widen.builds.failed and key not in widen.builds.launches
    assert reason in caplog.text and "torch's dequantize widens" in caplog.text
    assert torch.equal(quant_linear.linear(x, qw), expected)  # torch's path stays; the build is not tried again
    assert len(requests) == 1 and caller_transpiles == []


def test_the_build_child_builds_the_widening_kernel():
    """The real child (no GPU) builds the int4 float16 widening kernel for Hopper and reports its program."""
    reports = []
    job = {"id": "widen", "arch": "sm_90a", "dtype": "float16", "version": "widen",
           "config": {"weight": "int4"}, "variant": Variant().key()}  # fmt: skip
    building.build_in_child([job], lambda *report: reports.append(report), "matmul.call.building:build_widen")
    assert len(reports) == 1 and reports[0][2] is None, reports
    assert (Path(reports[0][1]) / "module").is_dir()
