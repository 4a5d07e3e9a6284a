# Part B, right after part A on the same machine: int4 in bfloat16 (torch's int4 kernel beside it),
# then fp8 e4m3 in float16, the same M and weights.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/v8t bash plots/h200/v8-table/run_b.sh
timeout 270 python plots/h100/v8/bench_v8.py "$OUT/int4-bfloat16" --formats int4 --dtypes bfloat16 --no-prebuild \
    > "$OUT/int4-bfloat16-log.txt" 2>&1
timeout 270 python plots/h100/v8/bench_v8.py "$OUT/fp8-float16" --formats fp8_e4m3 --dtypes float16 --no-prebuild \
    > "$OUT/fp8-float16-log.txt" 2>&1
