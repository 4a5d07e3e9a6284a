"""CPU stand-ins for the versions' tilus scripts, so that the choice, the launch path and the harness
run without a GPU."""

import contextlib
import ctypes
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import torch

from matmul.call import tilus_autotune
from matmul.kernels import versions
from matmul.kernels.variant import PLAIN, Variant, torch_epilogue


def _tensor_at(pointer, rows, cols, ld, dtype):
    """The [rows, cols] matrix with row stride ``ld`` at a CPU address (what a launch function gets)."""
    if isinstance(pointer, torch.Tensor):
        return pointer.as_strided((rows, cols), (ld, 1))
    count = (rows - 1) * ld + cols
    buffer = (ctypes.c_char * (count * dtype.itemsize)).from_address(pointer)
    return torch.frombuffer(buffer, dtype=dtype, count=count).as_strided((rows, cols), (ld, 1))


class StandInKernel:
    """A version's tilus script (or its launch function) on the CPU, honouring the kernel contract:
    pointers (tensors, or addresses as the launch path passes them), row strides, B's layout and the
    epilogue of its variant (bias pointer, activation). ``wrong`` ones write zeros. ``launches``
    counts the calls, ``threads`` names the thread of each."""

    def __init__(self, version, config, wrong, dtype=torch.float16, variant=None):
        self.version, self.config, self.wrong, self.dtype = version, config, wrong, dtype
        self.variant = variant or PLAIN
        self.launches = 0
        self.threads = []

    def __call__(self, m, n, k, a_ptr, b_ptr, c_ptr, lda, ldb, ldc, bias_ptr=0):
        self.launches += 1
        self.threads.append(threading.current_thread().name)
        self.pointers = (a_ptr, b_ptr, c_ptr, bias_ptr)
        columns = self.variant.out_columns(n)
        c = _tensor_at(c_ptr, m, columns, ldc, self.dtype)
        a = _tensor_at(a_ptr, m, k, lda, c.dtype)
        if self.variant.b_layout == "nk":
            b = _tensor_at(b_ptr, n, k, ldb, c.dtype).float().T
        else:
            b = _tensor_at(b_ptr, k, n, ldb, c.dtype).float()
        bias = None
        if self.variant.bias:
            bias = _tensor_at(bias_ptr, 1, n, n, c.dtype).float()[0]
        c.copy_(torch.zeros(m, columns) if self.wrong else torch_epilogue(a.float() @ b, bias, self.variant.activation))


def install(monkeypatch, wrong=("v0",), arch="sm_90a", available=("v0", "v1")) -> list:
    """Versions ``available`` of ``arch`` as stand-ins; returns the list of (version, config) built."""
    built = []

    def kernel(module, dtype, config=None, variant=None):
        version = module.__name__.rsplit(".", 1)[1]
        built.append((version, config))
        return StandInKernel(version, config, wrong=version in wrong, dtype=dtype, variant=variant)

    monkeypatch.setattr(versions, "available", lambda arch: list(available))
    monkeypatch.setattr(versions, "kernel", kernel)
    monkeypatch.setattr(tilus_autotune, "prepare", lambda script, args=None: None)
    monkeypatch.setattr(tilus_autotune, "launch_function", lambda script: script)
    monkeypatch.setattr(
        tilus_autotune, "tuned_config", lambda script, args: dict(versions.load(arch, script.version).REPRESENTATIVE)
    )
    return built


def cpu_worker(arch, dtype, m, n, k, device):
    """A child-process tuner worker on the CPU: v0 is wrong, v3 kills the process while it is being
    prepared (as a kernel that faults leaves a CUDA context), v4 raises, the rest are correct."""
    import os

    from matmul.call import tuner

    def prepare(version):
        if version == "v3":
            os._exit(9)
        if version == "v4":
            raise RuntimeError("v4 does not build here")
        config = {} if version == tuner.VENDOR else dict(versions.load(arch, version).REPRESENTATIVE)
        return tuner.Candidate(version, config, 1.0 if version == "v0" else 1e-4, lambda: None)

    return prepare, lambda c: {"v1": 1.0, "v5": 0.5, tuner.VENDOR: 2.0}.get(c.version, 3.0)


def edge_worker(arch, dtype, m, n, k, device, configs=None):
    """A tuner worker where N says where versions win against cuBLAS (1.0): v1 at M >= N and v2 at
    M <= N (0.5; elsewhere 1.5), v5 everywhere (0.5): versions that win over a part of a bucket. A
    version's time comes from the configuration it is prepared with (``configs``), as the chooser
    fixes it: its "M" is the M it was chosen at."""
    from matmul.call import tuner

    def prepare(version):
        config = {} if version == tuner.VENDOR else dict((configs or {}).get(version) or {"M": m})
        return tuner.Candidate(version, config, 1e-4, lambda: None)

    def timer(candidate):
        wins = {"v1": m >= n, "v2": m <= n, "v5": True, tuner.VENDOR: False}[candidate.version]
        return 1.0 if candidate.version == tuner.VENDOR else 0.5 if wins else 1.5

    return prepare, timer


def niceness_worker(arch, dtype, m, n, k, device):
    """A tuner worker whose one candidate, cuBLAS, reports the child's niceness as its configuration."""
    import os

    from matmul.call import tuner

    return lambda version: tuner.Candidate(version, {"nice": os.nice(0)}, 1e-4, lambda: None), lambda c: 1.0


def sleeping_worker(arch, dtype, m, n, k, device):
    """A tuner worker that writes the child's pid to ``$MATMUL_TEST_PID_FILE`` and then takes a minute."""
    import time

    Path(os.environ["MATMUL_TEST_PID_FILE"]).write_text(str(os.getpid()))
    time.sleep(60)
    raise AssertionError("the child outlived its caller")


# --- kernels built outside the caller (matmul/call/building.py) -----------------------------------


def cpu_build(arch, dtype, version, config, variant) -> str:
    """A stand-in for ``building.build_kernel`` (the build child's builder): a directory that names
    the kernel, and the process and thread that "built" it."""
    folder = Path(tempfile.mkdtemp(prefix="matmul-stand-in-build-"))
    built_by = {
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    kernel = {"version": version, "config": config, "dtype": str(dtype).removeprefix("torch.")}
    (folder / "kernel.json").write_text(json.dumps({**kernel, "variant": variant.key(), **built_by}))
    return str(folder)


def load_built(program_dir) -> StandInKernel:
    """A stand-in for ``tilus_autotune.load``: the stand-in kernel ``cpu_build`` described, with
    ``built_by`` and ``loaded_by`` (pid, thread name) and the ``CUDA_VISIBLE_DEVICES`` it was built under."""
    found = json.loads((Path(program_dir) / "kernel.json").read_text())
    dtype, variant = getattr(torch, found["dtype"]), Variant.parse(found["variant"])
    kernel = StandInKernel(found["version"], found["config"], wrong=False, dtype=dtype, variant=variant)
    kernel.built_by = (found["pid"], found["thread"])
    kernel.visible_devices = found["visible_devices"]
    kernel.loaded_by = (os.getpid(), threading.current_thread().name)
    return kernel


def build_here(jobs, on_built) -> None:
    """A stand-in for ``building.build_in_child`` that builds in this process (for tests of the
    choice, not of where the build runs)."""
    for job in jobs:
        variant = Variant.parse(job["variant"])
        on_built(job["id"], cpu_build(job["arch"], job["dtype"], job["version"], job["config"], variant), None)


def cpu_build_failing(arch, dtype, version, config, variant) -> str:
    """A build child's builder where v4 does not build and v5 kills the child; the rest build."""
    if version == "v4":
        raise RuntimeError("ptxas: v4 does not build here")
    if version == "v5":
        os._exit(7)
    return cpu_build(arch, dtype, version, config, variant)


def cpu_build_raising(arch, dtype, version, config, variant) -> str:
    """A build child's builder for which no kernel builds."""
    raise RuntimeError(f"ptxas: {version} does not build here")


def cpu_build_dying(arch, dtype, version, config, variant) -> str:
    """A build child's builder that kills the child."""
    os._exit(7)


def failing_builders(version: str) -> list:
    """pytest params (builder, what the warning then says, the library loader or None) of the build
    child's builders with which ``version``'s kernel never comes: its build fails, the child dies, or
    the library it reports does not open (``cpu_build`` builds nothing that the real
    ``tilus_autotune.load``, ``OPEN_LIBRARY``, opens)."""
    import pytest

    return [
        pytest.param("stand_ins:cpu_build_raising", f"{version} does not build here", None, id="build fails"),
        pytest.param("stand_ins:cpu_build_dying", "exited with code 7", None, id="child dies"),
        pytest.param("stand_ins:cpu_build", "no built tilus program", OPEN_LIBRARY, id="library does not open"),
    ]


# --- the kernels on a packed weight (matmul/call/quantized.py, matmul/quant/widen.py) ---------------

OPEN_LIBRARY = tilus_autotune.load  # the real one (tests replace it): it opens no stand-in's "build"


def quantized_operands(m, n, k, weight_format, dtype=torch.float16):
    """x [m, k], a weight [n, k] packed in ``weight_format`` and the product of x with the weight
    widened by torch, as the call's widened path computes it (the stand-ins compute it too)."""
    from matmul.quant import quantize

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    x = torch.randn(m, k, generator=g).to(dtype)
    qw = quantize(w, format=weight_format)
    return x, qw, x @ qw.dequantize().T


class StandInWidening:
    """The widening kernel's launch function (``widen.widen`` calls it with n, k, the packed words,
    the scales and out) on the CPU: out = the weight's ``dequantize()``. ``launches`` counts the
    calls, ``threads`` names the thread of each; ``built_by``, ``loaded_by`` and
    ``visible_devices`` as ``load_built``'s kernels have them."""

    def __init__(self, found: dict):
        self.format, self.dtype = found["config"]["weight"], getattr(torch, found["dtype"])
        self.built_by = (found["pid"], found["thread"])
        self.visible_devices = found["visible_devices"]
        self.loaded_by = (os.getpid(), threading.current_thread().name)
        self.launches = 0
        self.threads = []

    def __call__(self, n, k, packed, scales, out):
        from matmul.quant import FORMATS, QuantizedWeight

        self.launches += 1
        self.threads.append(threading.current_thread().name)
        bits, group = FORMATS[self.format]
        weight = QuantizedWeight(self.format, bits, group or k, (n, k), self.dtype, packed, scales)
        out.copy_(weight.dequantize())


class StandInV8(StandInWidening):
    """Hopper V8's launch function (``quant_linear.v8`` calls it with m, n, k, x, the packed words,
    out, the three row strides, no bias and the scales) on the CPU: out = x @ the weight's
    ``dequantize()``.T, the widened path's product bit for bit; ``config`` as it was built."""

    def __init__(self, found: dict):
        super().__init__(found)
        self.config = {name: value for name, value in found["config"].items() if name != "weight"}

    def __call__(self, m, n, k, x, packed, out, lda, ldb, ldc, bias_ptr, scales):
        from matmul.quant import FORMATS, QuantizedWeight

        self.launches += 1
        self.threads.append(threading.current_thread().name)
        bits, group = FORMATS[self.format]
        weight = QuantizedWeight(self.format, bits, group or k, (n, k), self.dtype, packed, scales)
        torch.matmul(x, weight.dequantize().T, out=out)


def eventually(condition, timeout_s: float = 30.0) -> bool:
    """Whether ``condition()`` holds within ``timeout_s`` (what another thread is about to do)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def load_any(program_dir):
    """A stand-in for ``tilus_autotune.load`` of whatever ``cpu_build`` described: V8's launch
    function, the widening kernel's, or a version of the series."""
    found = json.loads((Path(program_dir) / "kernel.json").read_text())
    if found["version"] == "v8":
        return StandInV8(found)
    if found["version"] == "widen":
        return StandInWidening(found)
    return load_built(program_dir)


def chooser_building_in_children(monkeypatch, tmp_path, builder: str = "stand_ins:cpu_build", release=None, load=None):
    """``matmul.call.api._chooser`` replaced for this test by a fresh chooser (its own cache, nothing
    built, building or failed) whose build children are real processes running the stand-in
    ``builder``, each held back until the event ``release`` is set (if given), their libraries opened
    by ``load`` (``load_any`` by default), and no plan kept. Returns the chooser, with ``requests``:
    the jobs each child got, in order."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the child imports the stand-ins
    from matmul.call import api, building
    from matmul.call.choice_cache import ChoiceCache
    from matmul.call.chooser import Chooser

    requests = []

    def build_jobs(jobs, on_built):
        requests.append(jobs)
        assert release is None or release.wait(60)
        building.build_in_child(jobs, on_built, builder)

    chooser = Chooser(ChoiceCache(tmp_path / "choices"), build_jobs=build_jobs, load=load or load_any)
    chooser.requests = requests
    monkeypatch.setattr(api, "_chooser", chooser)
    monkeypatch.setattr(api._plans, "plans", {})  # a kept plan holds a kernel of the chooser replaced
    return chooser


def forbid_in_caller(monkeypatch, targets) -> list:
    """Each ``(owner, name)`` of ``targets`` (what would build a kernel in this process: a script
    class or maker, tilus's build) replaced by a function that records ``(name, thread name)`` and
    raises, so that a kernel built in the caller fails its test at once; returns the records."""
    found = []

    def watch(what):
        def watched(*args, **kwargs):
            found.append((what, threading.current_thread().name))
            raise AssertionError(f"{what} in the caller's process")

        return watched

    for owner, name in targets:
        monkeypatch.setattr(owner, name, watch(f"{getattr(owner, '__name__', owner)}.{name}"))
    return found


@contextlib.contextmanager
def caller_never_pausing(every_s: float = 0.002):
    """A caller that calls every ``every_s`` while the block runs: the process's word of its last call
    (matmul.call.yielding) stamped from a thread of its own."""
    from matmul.call import yielding

    assert yielding.shared_fd() is not None
    stop = threading.Event()

    def caller():
        while not stop.is_set():
            yielding.stamp_call()
            time.sleep(every_s)

    calls = threading.Thread(target=caller)
    calls.start()
    try:
        yield
    finally:
        stop.set()
        calls.join()
