"""Fast matrix multiplication in Tilus Script, one idea at a time.

``matmul.matmul(a, b)`` is ``a @ b`` with the fastest kernel for this GPU and shape
(``matmul.call``); ``matmul.kernels`` holds the versions V0-V6 of each series (Blackwell sm_100a,
Hopper sm_90a) on their shared entry point; ``matmul.build`` compiles and inspects them for either
architecture on any machine; ``matmul.harness`` checks, times and plots them; ``python -m
matmul`` is the command line over all of it.
"""

# tilus 0.2.0 needs work-arounds before any kernel is built: applied here, where the package starts
from . import tilus_fixes

tilus_fixes.apply_all()

from .call.api import NotTunedError, UnsupportedGPUError, choice, matmul, tune  # noqa: E402
from .contract import MatmulInputError  # noqa: E402
from .kernels import versions  # noqa: E402

__all__ = ["matmul", "choice", "tune", "versions", "MatmulInputError", "UnsupportedGPUError", "NotTunedError"]
