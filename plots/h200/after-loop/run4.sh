#!/bin/bash
# The model benchmark (matmul() back to back as a model calls it, and a transformer block) with the
# H200's new shipped table, from an empty cache; then V8's int4 call at 1 and 16 tokens (#25's decode
# rows), both activation dtypes.
#   source .gpu/env.sh && bash plots/h200/after-loop/run4.sh
OUT=${OUT:-/tmp/out}
MATMUL_CACHE_DIR=$(mktemp -d) timeout 290 python -m matmul model --out "$OUT/model" > "$OUT/model.log" 2>&1
echo "model exit $?" >> "$OUT/model.log"
MATMUL_CACHE_DIR=$(mktemp -d) timeout 240 python plots/h100/v8/bench_v8.py "$OUT/v8" --formats int4 --tokens 1,16 \
    > "$OUT/v8-bench-log.txt" 2>&1
echo "v8 exit $?" >> "$OUT/v8-bench-log.txt"
