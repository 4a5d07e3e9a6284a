# One device call: int6 and fp8 V8 in a token tile that holds M at most twice, against the tile the call
# ran them in (int6: 16 tokens at 1-8, both: 64 at 17-32), on the Llama's weights, bfloat16, L2 flushed.
# Kernels built on the CPU machine (the same commands with --build-only) and carried in .cache/tb.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/tb bash plots/h200/decode-tiles/probe-bf16.sh
S8=1x6144x4096,1x4096x4096,1x28672x4096,1x4096x14336,8x6144x4096,8x4096x4096,8x28672x4096,8x4096x14336
S32=17x6144x4096,17x4096x4096,17x28672x4096,17x4096x14336,32x6144x4096,32x4096x4096,32x28672x4096,32x4096x14336
P=plots/h100/v8/probe_configs.py
timeout 150 python $P "$OUT/int6-8-bf16" --no-prebuild --dtype bfloat16 --format int6 --configs 8/1/2/4/64,16/1/2/4/64 --shapes $S8 > "$OUT/int6-1-8-bfloat16-log.txt" 2>&1
timeout 150 python $P "$OUT/int6-32-bf16" --no-prebuild --dtype bfloat16 --format int6 --configs 32/1/2/4/64,64/1/2/4/64 --shapes $S32 > "$OUT/int6-17-32-bfloat16-log.txt" 2>&1
timeout 150 python $P "$OUT/fp8-32-bf16" --no-prebuild --dtype bfloat16 --format fp8_e4m3 --configs 32/1/2/4/32,64/1/2/4/32 --shapes $S32 > "$OUT/fp8-17-32-bfloat16-log.txt" 2>&1
