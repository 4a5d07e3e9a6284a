"""How long a shipped cuBLAS choice's fingerprint takes in a fresh process (timed against Hopper
V3-V7: every version's sources and the pipeline modules they import), with the import scan as it
is and as it was before ``tuner._imports`` (at 0526c87, read from git); the version modules are
imported first, apart. On any machine (no GPU needed), from the project's root:

    python plots/h200/first-call-profile/fingerprint_time.py old
    python plots/h200/first-call-profile/fingerprint_time.py new
"""

from __future__ import annotations

import ast
import subprocess
import sys
import time

from matmul.call import tuner
from matmul.kernels import versions

BEFORE = "0526c87"
VERSIONS = ("v3", "v4", "v5", "v6", "v7")


def use_old_scan() -> None:
    command = ["git", "show", f"{BEFORE}:matmul/call/tuner.py"]
    source = subprocess.run(command, capture_output=True, text=True, check=True)
    wanted = ("_sibling_imports", "_pipeline_imports")
    functions = [n for n in ast.parse(source.stdout).body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    namespace = dict(vars(tuner))
    exec(compile(ast.Module(body=functions, type_ignores=[]), BEFORE, "exec"), namespace)  # noqa: S102
    tuner._sibling_imports, tuner._pipeline_imports = (namespace[name] for name in wanted)


def main() -> int:
    if sys.argv[1:] == ["old"]:
        use_old_scan()
    for version in VERSIONS:
        versions.load("sm_90a", version)
    begin = time.perf_counter()
    fingerprint = tuner.choice_fingerprint("sm_90a", tuner.VENDOR, list(VERSIONS))
    print(f"{sys.argv[1]}: {(time.perf_counter() - begin) * 1e3:.1f} ms, fingerprint {fingerprint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
