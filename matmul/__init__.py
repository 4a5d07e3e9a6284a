"""Fast matrix multiplication in Tilus Script, one idea at a time.

``matmul.matmul(a, b)`` is ``a @ b`` with the fastest version for this GPU and shape (``matmul.api``);
``matmul.versions`` lists and runs the versions V0-V6 of each series (Blackwell sm_100a, Hopper
sm_90a); ``matmul.build`` compiles them for either architecture on any machine; ``python -m matmul``
is the command line.
"""

from . import versions
from .api import UnsupportedGPUError, matmul
from .contract import MatmulInputError

__all__ = ["matmul", "versions", "MatmulInputError", "UnsupportedGPUError"]
