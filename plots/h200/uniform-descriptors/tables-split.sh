#!/bin/bash
# The shipped table's sixteen buckets whose version lost at the bucket's least M (lost_at), measured
# again once a version could keep the bucket from where it wins (tuner.held_across_the_bucket's
# from_m). Those entries were marked stale first (their fingerprint zeroed, in the tree carried), so
# the run keeps the other 82 and measures these, narrowed by their own earlier times.
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$(mktemp -d) && bash plots/h200/uniform-descriptors/tables-split.sh
OUT=${OUT:-/tmp/out}
timeout 230 python -m matmul tune --model llama-3-8b --m 1,16,128,1024,2048,4096,8192 --dtype float16,bfloat16 --narrow \
    --out matmul/call/shipped/h200.json > "$OUT/shipped-tune-split.log" 2>&1
echo "tune exit $?" >> "$OUT/shipped-tune-split.log"
cp matmul/call/shipped/h200.json "$OUT/h200.json"
