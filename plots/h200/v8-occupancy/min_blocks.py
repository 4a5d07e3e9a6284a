"""Would V8 at 28672 x 4096 gain from fitting its grid in one wave? A probe, patching tilus in its
own process only: every kernel it builds is declared ``__launch_bounds__(threads, MIN_BLOCKS)``, so
ptxas holds its registers to what MIN_BLOCKS CTAs an SM need (V8's 160 threads at 71 registers fit
5 CTAs an SM, 660 on an H200, and its 28672-row grid is 896 CTAs: 1.36 waves; at 7 an SM, which
its 28.7 KiB of shared memory allows, 924: one wave). Then it runs ``probe_configs.py`` with the
arguments given. tilus names a program by its IR, which the patch leaves alone: a cache built with
it must be one of its own.

    # on the CPU machine
    MATMUL_CACHE_DIR=$PWD/.cache/minb7 python plots/h200/v8-occupancy/min_blocks.py 7 OUT --build-only \
        --configs ... --shapes ...
    # on the GPU, the cache carried
    MATMUL_CACHE_DIR=$PWD/.cache/minb7 python plots/h200/v8-occupancy/min_blocks.py 7 OUT --no-prebuild \
        --configs ... --shapes ...
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path


def patch(min_blocks: int) -> None:
    from tilus.hidet.ir.builders import func_builder

    init = func_builder.FunctionBuilder.__init__

    @functools.wraps(init)
    def with_min_blocks(self, name, kind, *args, **kwargs):
        if kind == "cuda_kernel":
            kwargs["min_blocks"] = min_blocks
        init(self, name, kind, *args, **kwargs)

    func_builder.FunctionBuilder.__init__ = with_min_blocks


def main() -> int:
    if "MATMUL_CACHE_DIR" not in os.environ:
        raise SystemExit("set MATMUL_CACHE_DIR to a cache of its own")
    min_blocks = int(sys.argv[1])
    patch(min_blocks)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "h100" / "v8"))
    import probe_configs

    probe_configs.main(sys.argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
