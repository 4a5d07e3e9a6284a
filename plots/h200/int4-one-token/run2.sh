# After run.sh: the call takes two consumers a slab (interleave 2) for int4 up to 8 tokens on a weight
# as deep as it is wide or deeper. Its interleave 1 and 2 at 1 and 8 tokens on square and deeper
# weights (and one wider, where the call keeps 1), both dtypes, L2 flushed; then the GPU tests of the
# call's configurations (the ragged shapes' 200 x 384 weight now interleaves at 1 and 3 tokens).
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/ch bash plots/h200/int4-one-token/run2.sh
P=plots/h100/v8/probe_configs.py
S=1x4096x4096,8x4096x4096,1x4096x8192,1x8192x8192,8x8192x8192,1x2048x2048,1x6144x4096
for dtype in float16 bfloat16; do
    timeout 100 python $P "$OUT/square-$dtype" --no-prebuild --format int4 --dtype $dtype \
        --configs 8/1/2/4/64,8/1/2/4/64/2 --shapes $S > "$OUT/square-$dtype-log.txt" 2>&1
done
timeout 240 python -m pytest -v tests/test_v8_gpu.py -k "ragged or the_call or every_token_count or planted_bugs" > "$OUT/gpu-tests.txt" 2>&1
echo "exit $?" >> "$OUT/gpu-tests.txt"
