#!/bin/bash
# The model benchmark in bfloat16 from an empty cache, with the H200 table's bfloat16 half as run1.sh left it.
#   source .gpu/env.sh && bash plots/h200/from-m/run5.sh
OUT=${OUT:-/tmp/out}
MATMUL_CACHE_DIR=$(mktemp -d) timeout 500 python -m matmul model --dtype bfloat16 --out "$OUT/model" > "$OUT/model-bf16.log" 2>&1
echo "model exit $?" >> "$OUT/model-bf16.log"
