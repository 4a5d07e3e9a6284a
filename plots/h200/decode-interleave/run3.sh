# The int6 rows run2 did not reach: the call at 1 and 16 tokens on the four bench weights against cuBLAS
# (bench_v8.py: L2 flushed, both dtypes), int6's kernels built on the CPU machine and carried:
#   MATMUL_CACHE_DIR=$PWD/.cache/pl python -c "import sys; sys.path.insert(0, 'plots/h100/v8'); \
#       import bench_v8; bench_v8.prebuild(['int6'], ['float16', 'bfloat16'])"
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/pl bash plots/h200/decode-interleave/run3.sh
timeout 420 python plots/h100/v8/bench_v8.py "$OUT/bench" --formats int6 --tokens 1,16 --no-prebuild > "$OUT/bench-log.txt" 2>&1
