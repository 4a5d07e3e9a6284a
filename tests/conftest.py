import functools
import os
import tempfile

# Under pytest-xdist (the GPU suite runs its files in parallel: CONTRIBUTING.md), each worker keeps its
# own cache (below MATMUL_CACHE_DIR, or the system's temporary folder), set before the package is
# imported: two processes never build one kernel into one folder.
if os.environ.get("PYTEST_XDIST_WORKER"):
    base = os.environ.get("MATMUL_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "matmul-xdist")
    os.environ["MATMUL_CACHE_DIR"] = os.path.join(base, os.environ["PYTEST_XDIST_WORKER"])

import pytest  # noqa: E402
import torch  # noqa: E402

from matmul import build  # noqa: E402
from matmul.call import api  # noqa: E402
from matmul.call.launch import Plans  # noqa: E402
from matmul.contract import check_call  # noqa: E402
from matmul.kernels import variant as variants  # noqa: E402
from matmul.kernels import versions  # noqa: E402
from matmul.kernels.variant import PLAIN  # noqa: E402

gpu_arch = versions.local_arch


def require_gpu(arch: str) -> None:
    """Skip unless this machine has a GPU that runs the ``arch`` series."""
    here = gpu_arch()
    if here != arch:
        pytest.skip(
            f"needs a {versions.ARCH_NAMES[arch]} GPU ({arch}); this machine has {'none' if here is None else here}"
        )


@functools.cache
def representative_build(arch: str, version: str) -> build.BuildResult:
    """Each version's representative configuration, built once per test session."""
    module = versions.load(arch, version)
    return build.build_config(module, arch, module.REPRESENTATIVE)


@pytest.fixture(autouse=True)
def _fresh_cuda_errors():
    yield
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # a fault in a kernel shows up in the test that launched it


class FixedChooser:
    """Every bucket runs ``version`` (its representative configuration) where it supports the variant
    and the shape (with ``check_fits``; without, everywhere: the CPU tests' stand-in kernels), else
    cuBLAS, as does ``version`` cuBLAS; records what was asked, ``(m, n, k, variant, runs)``. The
    tests' way to run the kernels themselves through the call, with no tuning."""

    mode = "blocking"  # every call runs its plan: no unseen call is deferred to torch's ops

    def __init__(self, version, arch=None, check_fits=True):
        self.version, self.arch, self.check_fits = version, arch, check_fits
        self.asked = []

    def on_change(self, callback):  # choices never change here
        pass

    def get(self, device, dtype, m, n, k, variant=PLAIN):
        arch = self.arch or gpu_arch()
        runs = self.version != versions.CUBLAS
        if runs:
            module = versions.load(arch, self.version)
            if self.check_fits:
                runs = variants.supported(module, variant) and versions.fits(module, m, n, k, variant=variant)
        self.asked.append((m, n, k, variant, runs))
        if not runs:
            return arch, {"version": versions.CUBLAS, "config": {}}
        return arch, {"version": self.version, "config": dict(module.REPRESENTATIVE)}


@pytest.fixture
def fixed(request):
    """The process's plans with ``request.param`` fixed as every bucket's choice (indirect)."""
    require_gpu(gpu_arch() or "sm_90a")
    plans = Plans(FixedChooser(request.param), check=check_call)
    previous = api.use_plans(plans)
    yield plans
    api.use_plans(previous)


class QKVAttention(torch.nn.Module):
    """q, k and v as a grouped-query attention has them (k and v narrower than q), with biases as
    Qwen2's; ``forward(x, memory)`` reads k and v from ``memory`` (a cross-attention) if given: what
    ``matmul.nn.convert(fuse_qkv=True)`` fuses, in the CPU and the GPU tests."""

    def __init__(self, hidden: int, kv: int):
        super().__init__()
        self.q_proj = torch.nn.Linear(hidden, hidden)
        self.k_proj = torch.nn.Linear(hidden, kv)
        self.v_proj = torch.nn.Linear(hidden, kv)

    def forward(self, x, memory=None):
        source = x if memory is None else memory
        return self.q_proj(x), self.k_proj(source), self.v_proj(source)


def widened_int4(words: torch.Tensor, dtype: str = "float16") -> torch.Tensor:
    """What ``pipeline.widen.int4_pairs`` computes of packed int4 ``words`` (any shape), emulated on
    the CPU from its table of steps (``PAIR_STEPS``): [..., 8] float32, a word's 8 values in the
    order of the 16-bit registers the kernel views them as (pair p: registers 2 p and 2 p + 1)."""
    from pipeline.widen import PAIR_STEPS

    half_dtype = getattr(torch, dtype)
    w = words.to(torch.int64) & 0xFFFFFFFF

    def halves(x: torch.Tensor) -> torch.Tensor:  # 32 bits -> [..., 2] (low half first) as float32
        parts = torch.stack([x & 0xFFFF, x >> 16], dim=-1)
        return torch.where(parts >= 2**15, parts - 2**16, parts).to(torch.int16).view(half_dtype).float()

    pairs = []
    for shift, mask, constant, instruction, operands in PAIR_STEPS[dtype]:
        a = halves(((w >> shift) & mask) ^ constant)
        b, *c = (halves(torch.tensor(v, dtype=torch.int64)) for v in operands)
        pairs.append(a - b if instruction.startswith("sub") else a * b + c[0])
    return torch.stack(pairs, dim=-2).flatten(-2)
