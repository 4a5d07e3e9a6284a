"""On a GPU of the series: a chosen kernel is built by a build child (matmul/call/building.py) and
runs in the caller, which never transpiles it. Each case runs in a process of its own with an
empty cache directory, so that nothing was built before. Skipped without a Hopper or Blackwell GPU.
"""

import os
import subprocess
import sys

import pytest
from conftest import gpu_arch

ARCH = gpu_arch()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(ARCH is None, reason="needs a Hopper or Blackwell GPU"),
]

# A shipped table names V3 for one bucket; the first call runs cuBLAS while a build child builds V3's
# kernel; once it is loaded, the bucket's route launches V3, and its result is checked. tilus's
# transpiler, watched in this process, never runs here.
BUILT_ELSEWHERE_CHILD = """
import json, os, tempfile
from pathlib import Path
import torch
import matmul
from matmul.call import api, tilus_autotune, tuner
from matmul.call.choice_cache import ShippedTable, write_shipped
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, random_operands, reference, relative_error

arch = versions.local_arch()
m, n, k = 1000, 1024, 512
transpiled = []
original = tilus_autotune.jit_instance
tilus_autotune.jit_instance = lambda *args: transpiled.append(args) or original(*args)
key = tuner.choice_key(arch, torch.cuda.get_device_name(), torch.float16, m, n, k)
v3 = dict(versions.load(arch, "v3").REPRESENTATIVE)
entry = {"version": "v3", "config": v3, "ms": 1.0, "fingerprint": tuner.fingerprint(arch, "v3")}
path = Path(tempfile.mkdtemp()) / "shipped.json"
write_shipped(path, {key: entry}, command="test", machine={})
api._chooser.shipped = ShippedTable([path])

a, w = random_operands(m, n, k, torch.float16)
assert relative_error(matmul.matmul(a, w.T), reference(a, w)) <= TOLERANCE[torch.float16]  # cuBLAS now
assert api._plans.wait_for_background(900)
assert api.choice(a, w.T)["version"] == "v3", api.choice(a, w.T)
matmul.matmul(a, w.T)  # its plan derived again on the planner's thread, from the loaded kernel
assert api._plans.planner.wait(60) and api._plans.direct.kind(a, w.T) == "launch"
a2 = random_operands(m, n, k, torch.float16)[0]
assert relative_error(matmul.matmul(a2, w.T), reference(a2, w)) <= TOLERANCE[torch.float16]
print(json.dumps({"transpiled_here": len(transpiled)}))
"""


def test_a_kernel_built_by_the_build_child_runs_in_the_caller_which_never_transpiles_it(tmp_path):
    import json

    env = dict(os.environ, MATMUL_CACHE_DIR=str(tmp_path), MATMUL_TUNE="off")
    env.pop("TILUS_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", BUILT_ELSEWHERE_CHILD], env=env, capture_output=True, text=True, timeout=1100
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"transpiled_here": 0}
