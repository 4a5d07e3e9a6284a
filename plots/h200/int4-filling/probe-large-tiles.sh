# int6 and fp8 at 64-80 output tiles of 128 x 128: their split (LARGE_TILE_TWO_SLABS) against no split
# (LARGE_TILE_ONE_PASS), where the call's threshold moved from 80 tiles to int4's 67 (FILLING_TILES),
# float16, L2 flushed. Kernels built on the CPU machine (the same commands with --build-only), carried.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/ch bash plots/h200/int4-filling/probe-large-tiles.sh
S=128x8192x4096,256x4096x4096,128x8704x4096,256x4352x4096,128x9216x4096,128x10240x4096
P=plots/h100/v8/probe_configs.py
timeout 100 python $P "$OUT/int6-tiles" --no-prebuild --format int6 --configs 128/2/2/2/64,128/2/1/3/64 --shapes $S > "$OUT/large-tiles-int6-log.txt" 2>&1
timeout 100 python $P "$OUT/fp8-tiles" --no-prebuild --format fp8_e4m3 --configs 128/2/2/2/32,128/2/1/3/32 --shapes $S > "$OUT/large-tiles-fp8-log.txt" 2>&1
