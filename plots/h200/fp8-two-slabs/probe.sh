# One device call: fp8 V8 at 128-256 tokens in the call's configurations (one warpgroup) and in the two
# warpgroup ones int6 takes there, against cuBLAS and the widened path, float16, L2 flushed.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/pl bash plots/h200/fp8-two-slabs/probe.sh
S=128x6144x4096,128x28672x4096,128x4096x4096,128x4096x14336,192x4096x4096,192x6144x4096,256x4096x4096,256x4096x14336,256x6144x4096,256x28672x4096
timeout 280 python plots/h100/v8/probe_configs.py "$OUT/fp8-128-256" --no-prebuild --widened --format fp8_e4m3 \
    --configs 128/1/2/4/32,128/1/1/4/32,128/2/1/3/32,128/2/2/2/32 --shapes $S > "$OUT/probe-fp8-128-256-log.txt" 2>&1
