#!/bin/bash
# The drop-in Llama (prefill, decode eager and graphed, a training step) from an empty cache with the
# table of run1.sh (copy its h200.json into matmul/call/shipped/ first).
#   source .gpu/env.sh && bash plots/h200/from-m/run2.sh
OUT=${OUT:-/tmp/out}
MATMUL_CACHE_DIR=$(mktemp -d) timeout 420 python -m matmul drop-in --parts llama --rounds 5 --out "$OUT" > "$OUT/drop-in.log" 2>&1
echo "drop-in exit $?" >> "$OUT/drop-in.log"
