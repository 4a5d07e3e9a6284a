# After run.sh: int6 and fp8 up to 16 tokens take two consumers a slab on a weight as deep as wide.
# The GPU tests of the call's configurations (ragged shapes: the 200 x 384 and 1000 x 4096 weights now
# interleave in both formats), then the call at 1 and 16 tokens on the four bench weights against
# cuBLAS (bench_v8.py: L2 flushed, both dtypes). Kernels built on the CPU machine and carried.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/ch bash plots/h200/decode-interleave/run2.sh
timeout 200 python -m pytest -v tests/test_v8_gpu.py -k "ragged or the_call or every_token_count or planted_bugs or interleaved" \
    > "$OUT/gpu-tests.txt" 2>&1
echo "exit $?" >> "$OUT/gpu-tests.txt"
timeout 200 python plots/h100/v8/bench_v8.py "$OUT/bench" --formats fp8_e4m3,int6 --tokens 1,16 --no-prebuild > "$OUT/bench-log.txt" 2>&1
