#!/bin/bash
# The H200's shipped table for the kernel sources after the short loop, both dtypes: a cuBLAS choice
# is now stale when a version it was timed against changes (tuner.choice_fingerprint), so every
# bucket but the V7 ones of run1.sh is measured again, narrowed by its earlier measurement.
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$(mktemp -d) && bash plots/h200/after-loop/run2.sh
OUT=${OUT:-/tmp/out}
timeout 540 python -m matmul tune --model llama-3-8b --m 1,16,128,1024,2048,4096,8192 --dtype float16,bfloat16 --narrow \
    --out matmul/call/shipped/h200.json > "$OUT/shipped-tune.log" 2>&1
echo "tune exit $?" >> "$OUT/shipped-tune.log"
cp matmul/call/shipped/h200.json "$OUT/h200.json"
