#!/bin/bash
# #26's skinny table (V7 with and without multicast, V5 and V6's spaces, cuBLAS, at 64, 128 and 256
# tokens on the five decode weights, both dtypes) after the tilus fix wgmma_uniform_descriptors.
# Kernels prebuilt on a machine without a GPU and carried:
#   MATMUL_CACHE_DIR=$PWD/.cache/sk python plots/h100/skinny/multicast_bench.py --others --prebuild
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$PWD/.cache/sk && bash plots/h200/uniform-descriptors/skinny.sh
OUT=${OUT:-/tmp/out}
timeout 200 python plots/h100/skinny/multicast_bench.py --others > "$OUT/skinny.txt" 2>&1
echo "skinny exit $?" >> "$OUT/skinny.txt"
