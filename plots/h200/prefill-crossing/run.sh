# One device call: int6 and fp8 V8 (two warpgroups a CTA, no split: the call's configuration past 64
# tokens on these weights) against the widened path (the weight widened, then cuBLAS) and cuBLAS on the
# 16-bit weight, at 384-768 tokens on the Llama's weights, float16, L2 flushed. Where between 256 and
# 1024 tokens V8 stops beating the widened path (../packed-llama/prefill-probe/: ahead or level at 512,
# behind at 1024). Kernels built on the CPU machine (the same commands with --build-only) and carried.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/ch bash plots/h200/prefill-crossing/run.sh
S=""
for m in 384 512 640 768; do
    for w in 6144x4096 4096x4096 14336x4096 28672x4096 4096x14336; do S="$S,${m}x$w"; done
done
S="${S#,},512x128256x4096"
timeout 200 python plots/h100/v8/probe_configs.py "$OUT/int6" --no-prebuild --widened --format int6 \
    --configs 128/2/1/3/64 --shapes $S > "$OUT/crossing-int6-log.txt" 2>&1
timeout 200 python plots/h100/v8/probe_configs.py "$OUT/fp8" --no-prebuild --widened --format fp8_e4m3 \
    --configs 128/2/1/3/32 --shapes $S > "$OUT/crossing-fp8-log.txt" 2>&1
