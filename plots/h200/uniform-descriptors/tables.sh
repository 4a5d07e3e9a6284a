#!/bin/bash
# The H200's shipped table again after the tilus fix wgmma_uniform_descriptors: every kernel's code
# changed, so every choice's fingerprint did (a cuBLAS choice is stale when a version it was timed
# against changes); each bucket is measured again, narrowed by its earlier measurement. Candidates
# are built on the device (an empty cache).
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$(mktemp -d) && bash plots/h200/uniform-descriptors/tables.sh
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > "$OUT/machine.txt"
timeout 560 python -m matmul tune --model llama-3-8b --m 1,16,128,1024,2048,4096,8192 --dtype float16,bfloat16 --narrow \
    --out matmul/call/shipped/h200.json > "$OUT/shipped-tune.log" 2>&1
echo "tune exit $?" >> "$OUT/shipped-tune.log"
cp matmul/call/shipped/h200.json "$OUT/h200.json"
