# #25's table on the H200 at one commit, part A: every V8 GPU test, then int4 in float16 at M in
# {1, 16, 64, 128, 256, 1024, 4096} on the four bench weights (bench_v8.py: L2 flushed and back to
# back, against cuBLAS on the 16-bit weight). Kernels built on the CPU machine and carried:
#   MATMUL_CACHE_DIR=$PWD/.cache/v8t python plots/h200/v8-scale-after/prebuild.py
#   MATMUL_CACHE_DIR=$PWD/.cache/v8t python -c "import sys; sys.path.insert(0, 'plots/h100/v8'); \
#       import bench_v8; bench_v8.prebuild(['int4', 'fp8_e4m3'], ['float16', 'bfloat16'])"
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/v8t bash plots/h200/v8-table/run_a.sh
nvidia-smi -L > "$OUT/machine.txt"
nvidia-smi --query-gpu=driver_version --format=csv,noheader >> "$OUT/machine.txt"
git rev-parse HEAD >> "$OUT/machine.txt" 2>/dev/null
timeout 290 python -m pytest -q -m gpu tests/test_v8_gpu.py > "$OUT/gpu-tests.txt" 2>&1
echo "exit $?" >> "$OUT/gpu-tests.txt"
timeout 250 python plots/h100/v8/bench_v8.py "$OUT/int4-float16" --formats int4 --dtypes float16 --no-prebuild \
    > "$OUT/int4-float16-log.txt" 2>&1
