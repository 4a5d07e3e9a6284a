"""Run a module as ``python -m`` does, with the candidate fix ``uniform_descriptors`` applied first:

    python plots/h200/uniform-descriptors/with_fix.py matmul candidates --sizes ... v5:...

Kernels built in this process or in processes it forks carry the fix (``candidates`` builds that
way); a child started afresh (the call's tuning and build children) does not. Point
``MATMUL_CACHE_DIR`` at a cache of its own: tilus's cache key does not see the fix.
"""

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import uniform_descriptors  # noqa: E402

uniform_descriptors.make().apply()
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
