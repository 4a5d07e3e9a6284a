# The rule the call took from run1 (prefill_pays with LARGE_TILE_WIDEN_ROWS, up to 512 tokens), checked
# at token counts run1 did not time: 320 and 448 (a last M tile half full), the same weights, float16,
# L2 flushed; then the GPU tests of the call past 64 tokens (a 300-token shape runs V8 now).
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/ch bash plots/h200/prefill-crossing/run2.sh
S=""
for m in 320 448; do
    for w in 6144x4096 4096x4096 14336x4096 28672x4096 4096x14336; do S="$S,${m}x$w"; done
done
S="${S#,}"
timeout 120 python plots/h100/v8/probe_configs.py "$OUT/int6-2" --no-prebuild --widened --format int6 \
    --configs 128/2/1/3/64 --shapes $S > "$OUT/crossing2-int6-log.txt" 2>&1
timeout 120 python plots/h100/v8/probe_configs.py "$OUT/fp8-2" --no-prebuild --widened --format fp8_e4m3 \
    --configs 128/2/1/3/32 --shapes $S > "$OUT/crossing2-fp8-log.txt" 2>&1
timeout 200 python -m pytest -v tests/test_v8_gpu.py -k "past_64 or the_call" > "$OUT/gpu-tests.txt" 2>&1
echo "exit $?" >> "$OUT/gpu-tests.txt"
