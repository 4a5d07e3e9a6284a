"""Build V8's int6 two-warpgroup kernels (the call's LARGE_TILE_TWO_SLABS and LARGE_TILE_ONE_PASS) in both dtypes,
beside the representative int4 and int6 ones, and print each program's hash: run it with
``plant-second-slab-rows.patch`` applied to prebuild the planted kernels for ``run-past-64.sh``; the
representative kernels' hashes, unchanged by the plant, show that nothing else needs building."""

import tilus

from matmul import build
from matmul.kernels import versions
from matmul.quant import linear as quant_linear

V8 = versions.load("sm_90a", "v8")
for dtype in (tilus.float16, tilus.bfloat16):
    for config, weights in (
        (V8.REPRESENTATIVE, ("int4", "int6")),
        (quant_linear.LARGE_TILE_TWO_SLABS, ("int6",)),
        (quant_linear.LARGE_TILE_ONE_PASS, ("int6",)),
    ):
        for weight in weights:
            built = build.build_script(V8.Kernel, "sm_90a", {"dtype": dtype, **config, "weight": weight}, version="v8")
            print(weight, dtype.name, config, built.program_dir.name if built.program_dir else built.error[-300:])
