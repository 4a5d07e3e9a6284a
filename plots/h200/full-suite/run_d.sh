#!/bin/bash
# Part D: the two files run_c.sh's limits still cut short, with the device time left.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/gpu bash plots/h200/full-suite/run_d.sh
mkdir -p "$OUT/d"
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider --durations 5 tests/test_native_entry.py > "$OUT/d/native-entry.txt" 2>&1
echo "exit $?" >> "$OUT/d/native-entry.txt"
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider --durations 10 tests/test_api_gpu.py tests/test_linear_gpu.py \
    > "$OUT/d/api-linear.txt" 2>&1
echo "exit $?" >> "$OUT/d/api-linear.txt"
tail -n 4 "$OUT"/d/*.txt
