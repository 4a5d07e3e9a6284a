#!/bin/bash
# The ring's GPU tests (their kernels are not in tests/gpu_kernels.py's list: built here), then the
# skinny table in three windows a row (its kernels prebuilt, as uniform-descriptors/skinny.sh says).
#   source .gpu/env.sh && bash plots/h200/from-m/run3.sh   (carry .gpu and .cache/sk)
OUT=${OUT:-/tmp/out}
MATMUL_CACHE_DIR=$(mktemp -d) timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_pipeline.py \
    > "$OUT/pipeline-gpu-tests.txt" 2>&1
echo "pipeline tests exit $?" >> "$OUT/pipeline-gpu-tests.txt"
MATMUL_CACHE_DIR=$PWD/.cache/sk timeout 300 python plots/h100/skinny/multicast_bench.py --others --rounds 3 \
    > "$OUT/skinny.txt" 2>&1
echo "skinny exit $?" >> "$OUT/skinny.txt"
