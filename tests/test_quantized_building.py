"""The kernels of the quantized call (``matmul.call.quantized``: Hopper V8, the widening kernel) are
built as every kernel of the call is: by the chooser's build children (``Chooser.kernel``,
``Chooser.build_now``), one kernel per dtype, format and configuration, each library then opened in
the caller, which never transpiles. Until V8 is built the call runs the weight widened (by torch
until the widening kernel is built), for good where a build fails; inside a CUDA graph capture no
build starts. ``nn.convert(weights=...)`` builds them all before it returns.

On the CPU, which stands in for a Hopper GPU here: real build children whose builder is a stand-in
(``tests/stand_ins.py``: it records the process that built) and stand-in launch functions that
compute the widened path's product; the last tests build the real kernels for Hopper in a child
(``tests/test_v8_gpu.py`` runs them on the GPU)."""

import contextlib
import copy
import gc
import json
import logging
import os
import threading
import types
import weakref
from pathlib import Path

import pytest
import stand_ins
import torch

import matmul
from matmul.call import api, building, chooser, tilus_autotune
from matmul.call import quantized as quant_linear
from matmul.call.launch import PackedPlan
from matmul.kernels import device_context, versions
from matmul.kernels.variant import PLAIN, Variant
from matmul.quant import widen

FORMATS = ("int4", "int6", "fp8_e4m3")
M, N, K = 16, 200, 256  # tokens: few enough for V8
PAST_V8 = 1600  # tokens: more than V8 takes in any format, so the weight is widened
CHILD_S = 120  # a build child's time to start and report (the CPU may be busy)


def operands(weight_format, dtype=torch.float16, m=M):
    return stand_ins.quantized_operands(m, N, K, weight_format, dtype)  # the product: the widened path's


def call_config(weight_format, m=M):
    """The configuration the call builds for ``operands``' product."""
    return quant_linear.kernel_config(weight_format, quant_linear.config_for(m, N, K, weight_format))


def program(dtype, weight_format, config):
    return chooser.program_key(quant_linear.ARCH, dtype, quant_linear.v8_entry(weight_format, config), PLAIN)


def widening_program(dtype, weight_format):
    return chooser.program_key(quant_linear.ARCH, dtype, quant_linear.widen_entry(weight_format), PLAIN)


@pytest.fixture
def hopper(monkeypatch, tmp_path):
    """This CPU as a Hopper GPU on which V8 and the widening kernel run once built, with a fresh
    chooser. Returns ``child(builder="stand_ins:cpu_build", release=None, load=None)``: that chooser,
    its build children running the stand-in ``builder`` from now on (``stand_ins``'s
    ``chooser_building_in_children``). ``widened`` counts the calls that widened the weight by torch."""
    monkeypatch.setattr(versions, "local_arch", lambda: quant_linear.ARCH)
    monkeypatch.setattr(quant_linear, "runs_here", lambda device: True)
    monkeypatch.setattr(device_context, "on_device", lambda device: contextlib.nullcontext())

    def child(builder="stand_ins:cpu_build", release=None, load=None):
        return stand_ins.chooser_building_in_children(monkeypatch, tmp_path, builder, release, load)

    child.widened = 0
    by_torch = widen.widen

    def counted(weight, out=None, kernel=None):
        child.widened += kernel is None
        return by_torch(weight, out, kernel)

    monkeypatch.setattr(widen, "widen", counted)
    return child


@pytest.fixture
def caller_transpiles(monkeypatch):
    """What this process did towards building a kernel itself: a script made (tilus transpiles it at
    its first call), a tilus build or JIT instance. Each raises here too, so that a kernel built in
    the caller fails its test at once."""
    tilus = ((tilus_autotune, name) for name in ("build", "jit_instance", "launch_function"))
    makers = [(versions, "kernel"), (versions, "_fixed_kernel_class"), (widen, "WidenKernel")]
    return stand_ins.forbid_in_caller(monkeypatch, [*makers, *tilus])


@pytest.mark.parametrize("weight_format", FORMATS)
def test_the_widened_path_runs_until_v8_built_by_a_child_takes_over(hopper, caller_transpiles, weight_format):
    """The first calls widen the weight while a child builds V8 (asked once, for this dtype, format
    and configuration); once its library is opened (on the builder's thread), the call launches V8,
    on the caller's thread, with the same product. The child saw no GPU; the caller built nothing."""
    release = threading.Event()
    chosen = hopper(release=release)
    x, qw, expected = operands(weight_format)
    config = call_config(weight_format)
    key = program(torch.float16, weight_format, config)
    for _ in range(2):  # the second while the first's build is still held back: not asked again
        assert torch.equal(quant_linear.linear(x, qw), expected)
    assert caller_transpiles == [] and hopper.widened >= 2  # both calls widened the weight
    assert stand_ins.eventually(lambda: key in chosen.building) and key not in chosen.programs  # (the builder's thread)
    why = matmul.choice(x, qw.T)
    assert (
        why["version"] == "widened" and why["building"] == "v8" and why["chosen"]["config"]["weight"] == weight_format
    )

    release.set()
    assert quant_linear.wait_until_built(torch.float16, weight_format, config, CHILD_S), chosen.failed
    jobs = [job for request in chosen.requests for job in request if job["version"] == "v8"]
    assert len(jobs) == 1, chosen.requests  # asked once, by the first call
    assert jobs[0]["arch"] == "sm_90a" and jobs[0]["dtype"] == "float16" and jobs[0]["variant"] == Variant().key()
    assert jobs[0]["config"] == {"weight": weight_format, **config}
    kernel = chosen.programs[key]
    assert kernel.launches == 0 and (kernel.format, kernel.config) == (weight_format, config)
    widened = hopper.widened
    out = torch.full((M, N), float("nan"), dtype=torch.float16)
    quant_linear.linear(x, qw, out=out)  # V8 writes the product into out
    assert torch.equal(out, expected)
    assert torch.equal(matmul.matmul(x, qw.T), expected)  # the public call takes the same path
    assert kernel.launches == 2 and kernel.threads == [threading.current_thread().name] * 2
    assert hopper.widened == widened  # V8 ran: the weight was not widened again
    assert matmul.choice(x, qw.T) == {**quant_linear.v8_entry(weight_format, config), "format": weight_format,
                                      "source": "rules", "key": f"{M}x{N}x{K}", "built": True}  # fmt: skip
    child_pid, _ = kernel.built_by
    assert child_pid != os.getpid() and kernel.visible_devices == ""  # built in a child that sees no GPU
    assert kernel.loaded_by[0] == os.getpid() and kernel.loaded_by[1] != threading.current_thread().name
    assert caller_transpiles == []


@pytest.mark.parametrize("weight_format", [*FORMATS, "int4_channel"])
def test_past_v8s_tokens_torch_widens_until_the_widening_kernel_takes_over(hopper, caller_transpiles, weight_format):
    """Past the tokens V8 takes the weight is widened, then cuBLAS: by torch until a child has built
    the widening kernel for this format and dtype (asked once), by that kernel afterwards."""
    release = threading.Event()
    chosen = hopper(release=release)
    x, qw, expected = operands(weight_format, m=PAST_V8)
    assert not quant_linear.uses_v8(PAST_V8, qw)
    for _ in range(2):
        assert torch.allclose(quant_linear.linear(x, qw), expected, atol=1e-2, rtol=1e-3)
    assert hopper.widened == 2 and caller_transpiles == []
    release.set()
    assert quant_linear.widening_built(torch.float16, weight_format, CHILD_S), chosen.failed
    assert [job["version"] for request in chosen.requests for job in request] == ["widen"]
    kernel = chosen.programs[widening_program(torch.float16, weight_format)]
    assert torch.allclose(quant_linear.linear(x, qw), expected, atol=1e-2, rtol=1e-3)
    assert kernel.launches == 1 and hopper.widened == 2 and kernel.built_by[0] != os.getpid()
    assert matmul.choice(x, qw.T)["version"] == "widened" and "past V8's tokens" in matmul.choice(x, qw.T)["reason"]


def test_a_seen_signature_runs_its_kept_plan_and_every_other_call_the_full_path(hopper, monkeypatch):
    """Once V8 ran a ``linear`` call without ``out``, a later call with the same signature (x's shape,
    strides, dtype, device; the weight's format and sizes) runs the plan kept for it
    (``launch.PackedPlan`` in ``api._plans``), none of the checks and choices of the full path, with
    the same product and the bias and activation applied after it; on another weight of the same
    sizes, that weight's product. Calls with another signature, with ``out``, or whose input is not
    16-byte aligned take the full path; a plan keeps no weight alive."""
    chosen = hopper()
    x, qw, expected = operands("int4")
    assert quant_linear.wait_until_built(torch.float16, "int4", call_config("int4"), CHILD_S)
    kernel = chosen.programs[program(torch.float16, "int4", call_config("int4"))]
    x3 = x.view(2, M // 2, K)  # the model's form: [batch, tokens, hidden]
    assert torch.equal(quant_linear.linear(x3, qw), expected.view(2, M // 2, N))  # the full path: kept
    full_path = []
    v8_kernel = quant_linear.v8_kernel
    monkeypatch.setattr(quant_linear, "v8_kernel", lambda *args: full_path.append(1) or v8_kernel(*args))
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
    assert full_path == [1, 1] and packed_plans() == 1
    quant_linear.linear(x3b.view(M, K), qw)  # another shape, the same tokens: its own full path, then kept
    assert full_path == [1, 1, 1] and packed_plans() == 2
    other = matmul.quantize(torch.randn(N, K, dtype=torch.float16) * 0.05, format="int4")  # the same sizes
    assert torch.equal(quant_linear.linear(x3b, other), quant_linear.widened(x3b.view(M, K), other).view(y.shape))
    assert full_path == [1, 1, 1] and packed_plans() == 2
    other_packed = weakref.ref(other.packed)
    del other
    gc.collect()
    assert other_packed() is None  # the plan read the weight's tensors for its call and kept none


def packed_plans() -> int:
    return sum(isinstance(plan, PackedPlan) for plan in api._plans.plans.values())


def test_each_configuration_is_its_own_kernel(hopper, caller_transpiles):
    """A configuration given to ``v8`` (a benchmark's) is built and waited for as the call's is,
    separately; the call's own is not built by it."""
    chosen = hopper()
    x, qw, expected = operands("int4")
    other = {**call_config("int4"), "stages": 6}
    assert quant_linear.wait_until_built(torch.float16, "int4", other, CHILD_S)
    out = torch.empty(M, N, dtype=torch.float16)
    assert torch.equal(quant_linear.v8(x, qw, out, other), expected)
    assert chosen.programs[program(torch.float16, "int4", other)].launches == 1
    assert hopper.widened == 0 and len(chosen.requests) == 1
    assert program(torch.float16, "int4", call_config("int4")) not in chosen.programs  # not built by it
    assert quant_linear.wait_until_built(torch.float16, "int4", call_config("int4"), CHILD_S)
    assert chosen.requests[-1][0]["config"]["stages"] == 4 and caller_transpiles == []


@pytest.mark.parametrize("builder, reason, load", stand_ins.failing_builders("v8"))
def test_a_v8_kernel_that_does_not_build_leaves_the_widened_path_in_place(
    hopper, caller_transpiles, caplog, builder, reason, load
):
    """The build fails once, with a warning that names the widened path; it is not tried again, and
    ``choice`` says so."""
    chosen = hopper(builder, load=load)
    x, qw, expected = operands("int4", torch.bfloat16)
    config = call_config("int4")
    key = program(torch.bfloat16, "int4", config)
    with caplog.at_level(logging.WARNING, logger=chooser.__name__):
        for _ in range(2):  # the second after the failure: the widened path stays, V8 is not asked again
            assert torch.equal(quant_linear.linear(x, qw), expected)
            assert not quant_linear.wait_until_built(torch.bfloat16, "int4", config, CHILD_S)
    assert key in chosen.failed and key not in chosen.programs and caller_transpiles == []
    assert [job["version"] for request in chosen.requests for job in request].count("v8") == 1
    warnings = [
        r.getMessage() for r in caplog.records if r.name == chooser.__name__ and "building v8" in r.getMessage()
    ]
    assert len(warnings) == 1 and reason in warnings[0] and "widened for cuBLAS" in warnings[0], warnings
    assert reason in matmul.choice(x, qw.T)["build_failed"]


@pytest.mark.parametrize("builder, reason, load", stand_ins.failing_builders("widen"))
def test_a_widening_kernel_that_does_not_build_leaves_torch_in_place(
    hopper, caller_transpiles, caplog, builder, reason, load
):
    chosen = hopper(builder, load=load)
    x, qw, expected = operands("int4", torch.bfloat16, m=PAST_V8)
    with caplog.at_level(logging.WARNING, logger=chooser.__name__):
        assert torch.allclose(quant_linear.linear(x, qw), expected, atol=1e-2, rtol=1e-3)
        assert not quant_linear.widening_built(torch.bfloat16, "int4", CHILD_S)
    assert list(chosen.failed) == [widening_program(torch.bfloat16, "int4")]
    assert reason in caplog.text and "torch's dequantize" in caplog.text
    assert torch.allclose(quant_linear.linear(x, qw), expected, atol=1e-2, rtol=1e-3)  # torch's stays
    assert len(chosen.requests) == 1 and caller_transpiles == [] and hopper.widened == 2


def test_nothing_starts_inside_a_cuda_graph_capture(hopper, caller_transpiles, monkeypatch):
    """Captured, a call whose V8 is not built widens the weight and starts no build (neither V8's nor
    the widening kernel's); after the capture the next call starts V8's; once built, a captured call
    runs it."""
    chosen = hopper()
    captured = [True]
    monkeypatch.setattr(chooser, "capturing", lambda device: captured[0])  # (the CPU is never captured)
    x, qw, expected = operands("int4")
    config = call_config("int4")
    key = program(torch.float16, "int4", config)
    for _ in range(2):
        assert torch.equal(quant_linear.linear(x, qw), expected)
    assert chosen.requests == [] and not chosen.building and hopper.widened == 2 and not chosen.programs

    captured[0] = False
    assert torch.equal(quant_linear.linear(x, qw), expected)
    assert quant_linear.wait_until_built(torch.float16, "int4", config, CHILD_S)
    assert "v8" in [job["version"] for request in chosen.requests for job in request]
    captured[0] = True
    assert torch.equal(quant_linear.linear(x, qw), expected)
    assert chosen.programs[key].launches == 1 and caller_transpiles == []


def test_capturing_is_a_capture_of_the_current_cuda_stream(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert chooser.capturing(torch.device("cuda", 0))
    assert not chooser.capturing(torch.device("cpu"))  # (torch would raise here without CUDA)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert not chooser.capturing(torch.device("cuda", 0))


def test_where_v8_does_not_run_the_weight_is_widened_and_nothing_builds(monkeypatch, tmp_path):
    """This CPU as it is (not a Hopper GPU): ``v8`` itself widens the weight, and no build starts."""
    chosen = stand_ins.chooser_building_in_children(monkeypatch, tmp_path)
    x, qw, expected = operands("int4")
    out = torch.empty(M, N, dtype=torch.float16)
    assert not quant_linear.uses_v8(M, qw) and quant_linear.kernels_for(qw) == []
    assert torch.equal(quant_linear.v8(x, qw, out), expected) and torch.equal(out, expected)
    assert not quant_linear.wait_until_built(torch.float16, "int4", call_config("int4"), CHILD_S)
    assert chosen.requests == [] and not chosen.building and not chosen.failed
    assert matmul.choice(x, qw.T)["reason"] == "V8 does not run here"


def test_prepare_builds_every_kernel_a_weight_can_run_once(hopper, caller_transpiles):
    """``prepare``: V8 in every configuration the call may take on the weight (each token count up to
    the format's limit) and the widening kernel, each built once in the build children, and waited
    for; afterwards no call of any token count widens by torch or builds."""
    chosen = hopper()
    _, qw, _ = operands("int4")
    kernels = quant_linear.kernels_for(qw)
    configs = {quant_linear.kernel_config("int4", quant_linear.config_for(m, N, K, "int4"))["block_m"]
               for m in range(1, 257)}  # fmt: skip
    assert len(kernels) >= len(configs) + 1 and kernels[-1][2]["version"] == "widen"
    assert quant_linear.prepare([qw, qw], progress=False)
    built = [job for request in chosen.requests for job in request]
    assert len(built) == len(kernels)  # each once, the second weight's being the first's
    requests = len(chosen.requests)
    for m in (1, 8, 9, 16, 17, 33, 64, 65, 128, 200, 256, PAST_V8):
        x, _, _ = stand_ins.quantized_operands(m, N, K, "int4")
        assert torch.allclose(quant_linear.linear(x, qw), x @ qw.dequantize().T, atol=1e-2, rtol=1e-3)
    assert hopper.widened == 0 and len(chosen.requests) == requests and caller_transpiles == []


class _Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(K, N, bias=False).half()
        self.down = torch.nn.Linear(N * 2, K).half()  # rows of 400: a K the groups of 128 do not divide

    def forward(self, x):
        return self.up(x)


@pytest.mark.parametrize("build", [True, False])
def test_convert_with_packed_weights_returns_with_every_kernel_built(hopper, monkeypatch, build):
    """``nn.convert(model, weights=...)`` builds every kernel its packed layers can run before it
    returns: the first call runs V8, and a graph captured then would hold it. ``build=False`` returns
    at once; the first call widens the weight."""
    chosen = hopper()
    monkeypatch.setattr(matmul.nn, "eligible", lambda layer: None)  # the CPU's layers as a GPU's
    model = _Decoder()
    conversion = matmul.nn.convert(model, weights="int4", build=build)
    assert isinstance(model.up, matmul.nn.QuantizedLinear) and "down" in conversion.skipped
    assert bool(chosen.programs) == build and not chosen.building
    x = torch.randn(M, K).half()
    assert torch.allclose(model(x), x @ model.up.weight.dequantize().T, atol=1e-2, rtol=1e-3)
    assert hopper.widened == (0 if build else 1)
    assert matmul.choice(x, model.up.weight.T).get("built") is (True if build else None)


def test_the_build_child_builds_v8_and_the_widening_kernel():
    """The real child (no GPU) builds V8 for Hopper in the call's configuration for 16 tokens and the
    int4 float16 widening kernel, and reports their programs."""
    reports = []
    config = quant_linear.kernel_config("int4", quant_linear.config_for(16))
    jobs = [
        building.job("v8", "sm_90a", torch.float16, quant_linear.v8_entry("int4", config), PLAIN),
        building.job("widen", "sm_90a", torch.float16, quant_linear.widen_entry("int4"), PLAIN),
    ]
    building.build_in_child(jobs, lambda *report: reports.append(report))
    assert len(reports) == 2 and all(failure is None for _, _, failure in reports), reports
    assert all((Path(program_dir) / "module").is_dir() for _, program_dir, _ in reports)


@pytest.mark.full_space
def test_the_build_child_builds_v8_in_another_format():
    reports = []
    config = quant_linear.kernel_config("fp8_e4m3", quant_linear.config_for(16))
    jobs = [building.job("v8", "sm_90a", torch.float16, quant_linear.v8_entry("fp8_e4m3", config), PLAIN)]
    building.build_in_child(jobs, lambda *report: reports.append(report))
    assert len(reports) == 1 and reports[0][2] is None, reports


def test_the_decision_log_tells_what_a_packed_product_runs(hopper, caplog):
    """``MATMUL_LOG``'s logger: each product's decision once, V8 building, then built."""
    hopper()
    x, qw, _ = operands("int4")
    quant_linear._logged.clear()
    with caplog.at_level(logging.INFO, logger="matmul.choices"):
        for _ in range(2):
            quant_linear.linear(x, qw)
        assert quant_linear.wait_until_built(torch.float16, "int4", call_config("int4"), CHILD_S)
        quant_linear.linear(x, qw)  # V8 first runs this signature on the full path, which logs
    lines = [r.getMessage() for r in caplog.records if r.name == "matmul.choices" and r.getMessage().startswith("int4")]
    assert len(lines) == 2 and "building" in lines[0] and lines[1].endswith("(rules), built"), lines
    assert lines[0].startswith(f"int4 {M}x{N}x{K} float16: v8 ")


def test_the_rules_are_read_from_shipped_v8_json(monkeypatch):
    """``config_for`` applies the data of ``shipped/rules/v8.json``: an edited table gives another choice."""
    table = json.loads(quant_linear.RULES_FILE.read_text())
    assert quant_linear.rules() == table
    assert quant_linear.config_for(1, 4096, 4096, "int4")["block_m"] == 8
    edited = copy.deepcopy(table)
    edited["rules"] = [rule for rule in edited["rules"] if rule.get("set") != {"block_m": 8}]
    monkeypatch.setattr(quant_linear, "rules", lambda: edited)
    assert quant_linear.config_for(1, 4096, 4096, "int4")["block_m"] == 16  # the token tier's own tile


def test_the_sm_count_is_the_devices_and_changes_the_choice(hopper, monkeypatch):
    """V8's wave arithmetic takes the SM count of the GPU the call runs on: 200 tokens on a 4096 x
    4096 weight fill 132 SMs' waves in two slabs a tile, but 78 SMs' without a split; the call
    builds the configuration of the device's count."""
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(multi_processor_count=78)
    )
    quant_linear._sms.cache_clear()
    try:
        assert quant_linear.sm_count(torch.device("cuda", 0)) == 78
    finally:
        quant_linear._sms.cache_clear()
    on_78 = quant_linear.config_for(200, 4096, 4096, "int4", sms=78)
    on_132 = quant_linear.config_for(200, 4096, 4096, "int4", sms=132)
    assert (on_78["split"], on_132["split"]) == (1, 2)
    chosen = hopper()
    monkeypatch.setattr(quant_linear, "sm_count", lambda device: 78)
    x, qw, expected = stand_ins.quantized_operands(200, 4096, 256, "int4")
    assert (
        quant_linear.choice(x, qw)["chosen"]["config"]["split"]
        == quant_linear.config_for(200, 4096, 256, "int4", sms=78)["split"]
    )
    quant_linear.linear(x, qw)
    assert stand_ins.eventually(lambda: chosen.requests)
    assert chosen.requests[0][0]["config"] == {
        "weight": "int4",
        **quant_linear.config_for(200, 4096, 256, "int4", sms=78),
    }
