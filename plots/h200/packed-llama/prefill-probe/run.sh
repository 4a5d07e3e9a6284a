# One device call: int6 and fp8 V8 at 512 and 1024 tokens against cuBLAS and the widened path, on the
# Llama's weights, float16, L2 flushed (kernels built on the CPU machine with --build-only, carried).
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/pl bash plots/h200/packed-llama/prefill-probe/run.sh
S=512x6144x4096,512x4096x4096,512x14336x4096,512x4096x14336,1024x6144x4096,1024x4096x4096,1024x14336x4096,1024x4096x14336,1024x128256x4096
timeout 280 python plots/h100/v8/probe_configs.py "$OUT/int6" --no-prebuild --widened --format int6 \
    --configs 128/2/1/3/64,128/2/2/2/64 --shapes $S > "$OUT/probe-int6-log.txt" 2>&1
timeout 280 python plots/h100/v8/probe_configs.py "$OUT/fp8" --no-prebuild --widened --format fp8_e4m3 \
    --configs 128/1/1/4/32,128/2/1/3/32,128/2/2/2/32 --shapes $S > "$OUT/probe-fp8-log.txt" 2>&1
