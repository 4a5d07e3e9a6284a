#!/bin/bash
# #26 and #25's decode rows on an H100, one device call (~8 minutes): the skinny table (M 64, 128,
# 256 on the five decode weights, both dtypes, the best of the series per row against cuBLAS), the
# big squares with V6 and its ping-pong option, and V8's int4 and fp8 calls at 1 and 16 tokens.
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$PWD/.cache/h100b && bash plots/h100/bars/run1.sh
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > "$OUT/machine.txt"
timeout 200 python plots/h100/skinny/multicast_bench.py --others > "$OUT/skinny.txt" 2>&1
echo "skinny exit $?" >> "$OUT/skinny.txt"
timeout 110 python plots/h100/pingpong/bench_pingpong.py --kernels plain-g8,pingpong-g8 --rounds 4 > "$OUT/squares.txt" 2>&1
echo "squares exit $?" >> "$OUT/squares.txt"
timeout 200 python plots/h100/v8/bench_v8.py "$OUT/v8" --formats int4,fp8_e4m3 --tokens 1,16 > "$OUT/v8-bench-log.txt" 2>&1
echo "v8 exit $?" >> "$OUT/v8-bench-log.txt"
