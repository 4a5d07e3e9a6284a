# int4 past 64 tokens between 64 and 96 output tiles of 128 x 128, where the call splits K over two
# warpgroups' slabs (TWO_SLABS: 128/2/2/3) and from 96 tiles runs without a split (ONE_PASS: 128/2/1/4);
# int6 and fp8 moved that threshold to 80 (plots/h200/decode-tiles/). Both dtypes, L2 flushed.
# Kernels built on the CPU machine (the same command with --build-only) and carried.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/ch bash plots/h200/int4-filling/probe.sh
S=256x4096x4096,128x9216x4096,256x5120x4096,128x10240x4096,200x5504x4096,128x11008x4096,256x5632x4096,128x12032x4096,128x12288x4096
P=plots/h100/v8/probe_configs.py
for dtype in float16 bfloat16; do
    timeout 120 python $P "$OUT/int4-$dtype" --no-prebuild --format int4 --dtype $dtype \
        --configs 128/2/2/3/64,128/2/1/4/64 --shapes $S > "$OUT/int4-filling-$dtype-log.txt" 2>&1
done
