#!/bin/bash
# The H200 after the consumer's K loop was made short (plots/h200/README.md, "After the short loop"):
# the skinny table, the ping-pong squares and the float16 half of the shipped table, in one device
# call. Kernels prebuilt on a machine without a GPU and carried in $MATMUL_CACHE_DIR.
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$PWD/.cache/s21 && bash plots/h200/after-loop/run1.sh
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > "$OUT/machine.txt"
timeout 170 python plots/h100/skinny/multicast_bench.py --others > "$OUT/skinny.txt" 2>&1
echo "skinny exit $?" >> "$OUT/skinny.txt"
timeout 110 python plots/h100/pingpong/bench_pingpong.py --kernels plain-g8,pingpong-g8 --rounds 4 > "$OUT/pingpong.txt" 2>&1
echo "pingpong exit $?" >> "$OUT/pingpong.txt"
timeout 250 python -m matmul tune --model llama-3-8b --m 1,16,128,1024,2048,4096,8192 --dtype float16 --narrow \
    --out matmul/call/shipped/h200.json > "$OUT/shipped-tune-float16.log" 2>&1
echo "tune exit $?" >> "$OUT/shipped-tune-float16.log"
cp matmul/call/shipped/h200.json "$OUT/h200.json"
