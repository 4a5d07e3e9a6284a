# fp8 and int6 at decode sizes: one consumer warpgroup a slab against two taking its K blocks in turn
# (interleave 2), in tiles of 8 and 16 tokens, on the Llama's weights and a larger square, both dtypes,
# L2 flushed (int4 gained 1.00-1.16x from it on square and deeper weights: ../int4-one-token/).
# Kernels built on the CPU machine (the same commands with --build-only) and carried.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/ch bash plots/h200/decode-interleave/run.sh
P=plots/h100/v8/probe_configs.py
S=1x4096x4096,8x4096x4096,16x4096x4096,1x6144x4096,16x6144x4096,1x8192x8192,16x8192x8192,1x4096x14336,16x4096x14336
for dtype in float16 bfloat16; do
    timeout 100 python $P "$OUT/fp8-$dtype" --no-prebuild --format fp8_e4m3 --dtype $dtype \
        --configs 8/1/2/4/32,8/1/2/4/32/2,16/1/2/4/32,16/1/2/4/32/2 --shapes $S > "$OUT/fp8-$dtype-log.txt" 2>&1
    timeout 100 python $P "$OUT/int6-$dtype" --no-prebuild --format int6 --dtype $dtype \
        --configs 8/1/2/4/64,8/1/2/4/64/2,16/1/2/4/64,16/1/2/4/64/2 --shapes $S > "$OUT/int6-$dtype-log.txt" 2>&1
done
