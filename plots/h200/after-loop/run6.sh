#!/bin/bash
# Follow-up of run5.sh: V6 with the pair side by side along N (128 x 256 tiles) where the pair along M
# has an odd number of M tiles (769, 896) and an even one (768, 1024); V7 over token counts between
# 64 and 128. float16, paired windows with cuBLAS, L2 flushed.
# Its kernels, built here first (no GPU needed):
#   MATMUL_CACHE_DIR=$PWD/.cache/c5 python -m matmul candidates --arch sm_90a --prebuild \
#       v6:block_m=128,block_n=256,block_k=64,stages=4,group=8 v6:block_m=128,block_n=256,block_k=64,stages=4,group=8,pair=n \
#       v7:block_m=64,warpgroups=1,split=1,stages=13,multicast=2 v7:block_m=128,warpgroups=1,split=2,stages=6,multicast=1
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$PWD/.cache/c5 && bash plots/h200/after-loop/run6.sh
OUT=${OUT:-/tmp/out}
timeout 90 python -m matmul candidates --rounds 3 --sizes 768x131072x4096,769x131072x4096,896x131072x4096,1024x131072x4096 \
    v6:block_m=128,block_n=256,block_k=64,stages=4,group=8 v6:block_m=128,block_n=256,block_k=64,stages=4,group=8,pair=n \
    > "$OUT/pair-n-odd.txt" 2>&1
timeout 90 python -m matmul candidates --rounds 3 --sizes 65x4096x4096,80x4096x4096,100x4096x4096,104x4096x4096,120x4096x4096,127x4096x4096 \
    v7:block_m=64,warpgroups=1,split=1,stages=13,multicast=2 v7:block_m=128,warpgroups=1,split=2,stages=6,multicast=1 \
    > "$OUT/v7-tokens.txt" 2>&1
