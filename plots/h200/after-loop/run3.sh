#!/bin/bash
# V7's GPU tests (test_skinny_gpu.py, every configuration of the space and the fused epilogues on
# ragged shapes), kernels prebuilt here and carried in $MATMUL_CACHE_DIR; then the drop-in Llama
# from an empty cache, as a user meets it with the shipped table of run2.sh.
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$PWD/.cache/c3 && bash plots/h200/after-loop/run3.sh
OUT=${OUT:-/tmp/out}
timeout 150 python -m pytest -q -m gpu tests/test_skinny_gpu.py -rfE > "$OUT/skinny-gpu-tests.txt" 2>&1
echo "tests exit $?" >> "$OUT/skinny-gpu-tests.txt"
MATMUL_CACHE_DIR=$(mktemp -d) timeout 400 python -m matmul drop-in --parts llama --rounds 5 --out "$OUT" > "$OUT/drop-in.log" 2>&1
echo "drop-in exit $?" >> "$OUT/drop-in.log"
