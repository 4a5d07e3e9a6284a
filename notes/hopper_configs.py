"""Time every configuration of the Hopper versions' autotune spaces against cuBLAS (fp16, square
shapes), each checked against the float32 reference first: to see what a space should hold.
Rough numbers for choosing; the bench (``python -m matmul bench``) is the measurement to report.
Kept for the command in plots/hopper-series/COMMAND.txt; it is ``notes/hopper_candidates.py``
with bare version names, timed in one round.

    python notes/hopper_configs.py [v1 v2 ...] [--sizes=4096,8192]
"""

import sys

from hopper_candidates import measure, parse

if __name__ == "__main__":
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or [f"v{i}" for i in range(1, 7)]
    sizes = [4096, 8192]
    for a in sys.argv[1:]:
        if a.startswith("--sizes="):
            sizes = [int(x) for x in a.split("=", 1)[1].split(",")]
    measure([candidate for name in names for candidate in parse(name)], [(s, s, s) for s in sizes], rounds=1)
