# One device call: the Llama's gate and up projections (14336 x 4096, 112 output tiles of 128 x 128 at
# 128 tokens) in fp8 and int6, the call's configurations before and after two warpgroups, float16.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/pl bash plots/h200/decode-tiles/probe-14336.sh
P=plots/h100/v8/probe_configs.py
S=128x14336x4096,100x14336x4096,128x11008x4096,128x8192x4096
timeout 120 python $P "$OUT/fp8" --no-prebuild --format fp8_e4m3 --configs 128/1/2/4/32,128/2/1/3/32,128/2/2/2/32 --shapes $S > "$OUT/fp8-14336-log.txt" 2>&1
timeout 120 python $P "$OUT/int6" --no-prebuild --format int6 --configs 128/1/2/4/64,128/2/1/3/64,128/2/2/2/64 --shapes $S > "$OUT/int6-14336-log.txt" 2>&1
