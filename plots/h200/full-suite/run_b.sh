#!/bin/bash
# Part B, V8's GPU test files at the same commit (run_a.sh: the others), every V8 kernel they wait for
# built on the CPU machine first and carried:
#   MATMUL_CACHE_DIR=$PWD/.cache/v8t python plots/h200/v8-scale-after/prebuild.py
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/v8t bash plots/h200/full-suite/run_b.sh
set -u
nvidia-smi -L > "$OUT/machine.txt"
start=$SECONDS
timeout 480 python -m pytest -q -m gpu -p no:cacheprovider --durations 15 tests/test_v8_gpu.py > "$OUT/v8-gpu.txt" 2>&1
echo "exit $? after $((SECONDS - start)) s (limit 480)" >> "$OUT/v8-gpu.txt"
start=$SECONDS
timeout 60 python -m pytest -q -m gpu -p no:cacheprovider tests/test_v8_prefill_gpu.py > "$OUT/v8-prefill-gpu.txt" 2>&1
echo "exit $? after $((SECONDS - start)) s (limit 60)" >> "$OUT/v8-prefill-gpu.txt"
tail -n 3 "$OUT/v8-gpu.txt" "$OUT/v8-prefill-gpu.txt"
