#!/bin/bash
# The drop-in Llama (prefill, decode eager and graphed, a training step) from an empty cache with the
# table of run1.sh (copy its h200.json into matmul/call/shipped/ first), and the ring's GPU tests.
#   source .gpu/env.sh && bash plots/h200/from-m/run2.sh
OUT=${OUT:-/tmp/out}
MATMUL_CACHE_DIR=$(mktemp -d) timeout 420 python -m matmul drop-in --parts llama --rounds 5 --out "$OUT" > "$OUT/drop-in.log" 2>&1
echo "drop-in exit $?" >> "$OUT/drop-in.log"
MATMUL_CACHE_DIR=$(mktemp -d) timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_pipeline.py -k ring \
    > "$OUT/ring-gpu-tests.txt" 2>&1
echo "ring exit $?" >> "$OUT/ring-gpu-tests.txt"
