# After the change (fp8 wider than deep: two consumer warpgroups a CTA at 33-64 tokens; int6 on a long K:
# two consumers a slab): the new GPU test on ragged shapes, then the call at 33 and 64 tokens against
# cuBLAS (bench_v8.py, L2 flushed, both dtypes). Kernels built on the CPU machine and carried
# (../v8-table/run_a.sh's header, and the MID_TOKENS kernels of tests/test_v8_gpu.py):
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/v8t bash plots/h200/mid-tokens/run2.sh
timeout 150 python -m pytest -q -m gpu tests/test_v8_gpu.py -k "mid_token" > "$OUT/gpu-tests.txt" 2>&1
echo "exit $?" >> "$OUT/gpu-tests.txt"
timeout 250 python plots/h100/v8/bench_v8.py "$OUT/bench" --formats fp8_e4m3,int6 --tokens 33,64 --no-prebuild \
    > "$OUT/bench-log.txt" 2>&1
