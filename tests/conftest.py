import functools

import pytest
import torch

from matmul import build
from matmul.kernels import versions

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
