# fp8 and int6 at 33-64 tokens: which V8 configuration? The call takes int4's (a tile of 64 tokens,
# one consumer warpgroup, the K range cut in 2); #25's table at this commit has fp8 there at
# 0.70-0.78x cuBLAS on the two wider weights (../v8-table/). Kernels built on the CPU machine first:
#   for f in fp8_e4m3 int6; do MATMUL_CACHE_DIR=$PWD/.cache/mid python plots/h100/v8/probe_configs.py \
#       /tmp/build --build-only --format $f --configs "$C" --shapes "$S"; done
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/mid bash plots/h200/mid-tokens/run.sh
C=64/1/2/4/32/1,64/1/2/4/32/2,64/1/4/4/32/1,64/1/4/4/32/2,64/2/2/4/32/1,64/2/2/3/32/1,64/1/2/8/32/1,32/1/2/4/32/1,32/1/2/4/32/2,16/1/2/4/32/1,128/1/2/4/32/1,128/2/2/2/32/1,128/2/1/3/32/1
S=64x4096x4096,64x6144x4096,64x28672x4096,64x4096x14336,40x6144x4096
for f in fp8_e4m3 int6; do
    timeout 200 python plots/h100/v8/probe_configs.py "$OUT/$f" --no-prebuild --format $f --configs "$C" --shapes "$S" \
        > "$OUT/probe-$f-log.txt" 2>&1
done
