"""Fast matrix multiplication in Tilus Script, one idea at a time.

``matmul.matmul(a, b)`` is ``a @ b`` with the fastest kernel for this GPU and shape
(``matmul.call``); ``matmul.linear(x, w, bias, activation)`` the same with the bias and activation
fused into the kernel's epilogue, and ``matmul.nn`` switches a model's ``nn.Linear`` layers to it;
``matmul.quantize(w)`` packs a weight in int4 for ``matmul(x, qw.T)``
(``matmul.quant``: Hopper V8 at small M); ``matmul.kernels`` holds the versions V0-V8 of each series (Blackwell sm_100a,
Hopper sm_90a) on their shared entry point; ``matmul.build`` compiles and inspects them for either
architecture on any machine; ``matmul.harness`` checks, times and plots them; ``python -m
matmul`` is the command line over all of it.
"""

# tilus 0.2.0 needs work-arounds before any kernel is built: applied here, where the package starts
from . import knobs, tilus_fixes

tilus_fixes.apply_all()
knobs.apply_logging()  # MATMUL_LOG=1: every decision of the call on stderr

from . import nn  # noqa: E402
from .call.api import NotTunedError, UnsupportedGPUError, choice, linear, matmul, tune  # noqa: E402
from .contract import MatmulInputError  # noqa: E402
from .kernels import versions  # noqa: E402
from .kernels.variant import gate_up  # noqa: E402
from .quant import QuantizedWeight, quantize  # noqa: E402

__all__ = [
    "matmul",
    "linear",
    "gate_up",
    "quantize",
    "QuantizedWeight",
    "nn",
    "choice",
    "tune",
    "versions",
    "MatmulInputError",
    "UnsupportedGPUError",
    "NotTunedError",
    "knobs",
]
