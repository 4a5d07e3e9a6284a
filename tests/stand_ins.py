"""CPU stand-ins for the versions' tilus scripts, so that the choice and the harness run without a GPU."""

import torch

from matmul.call import tilus_autotune
from matmul.kernels import versions


class StandInKernel:
    """A version's tilus script on the CPU, honouring the kernel contract: pointers (here the
    tensors they point into) and row strides. ``wrong`` ones write zeros."""

    def __init__(self, version, config, wrong):
        self.version, self.config, self.wrong = version, config, wrong

    def __call__(self, m, n, k, a_ptr, b_ptr, c_ptr, lda, ldb, ldc):
        a, b = a_ptr.as_strided((m, k), (lda, 1)), b_ptr.as_strided((n, k), (ldb, 1))
        c = c_ptr.as_strided((m, n), (ldc, 1))
        c.copy_(torch.zeros(m, n) if self.wrong else a.float() @ b.float().T)


def install(monkeypatch, wrong=("v0",), arch="sm_90a") -> list:
    """Versions v0 and v1 of ``arch`` as stand-ins; returns the list of (version, config) built."""
    built = []

    def kernel(module, dtype, config=None):
        version = module.__name__.rsplit(".", 1)[1]
        built.append((version, config))
        return StandInKernel(version, config, wrong=version in wrong)

    monkeypatch.setattr(versions, "available", lambda arch: ["v0", "v1"])
    monkeypatch.setattr(versions, "kernel", kernel)
    monkeypatch.setattr(tilus_autotune, "prepare", lambda script, args=None: None)
    monkeypatch.setattr(tilus_autotune, "tuned_config",
                        lambda script, args: dict(versions.load(arch, script.version).REPRESENTATIVE))
    return built
