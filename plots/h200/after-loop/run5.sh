#!/bin/bash
# Why the tuner's bucket edges lose: the chosen kernel at the bucket's M and at its least M, float16,
# paired windows with cuBLAS, L2 flushed (the H200 table's 1024 x 131072 x 4096 bucket: V6 1404 us at
# 1024 tokens but 1474 at 769; 128 x 4096 x 4096: V7 multicast 16.7 us at 128, 20.5 at 97).
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$PWD/.cache/c5 && bash plots/h200/after-loop/run5.sh
OUT=${OUT:-/tmp/out}
timeout 150 python -m matmul candidates --rounds 3 --sizes 768x131072x4096,769x131072x4096,896x131072x4096,1024x131072x4096 \
    v6:block_m=128,block_n=256,block_k=64,stages=4,group=8 > "$OUT/edges-v6.txt" 2>&1
timeout 100 python -m matmul candidates --rounds 3 --sizes 96x4096x4096,97x4096x4096,112x4096x4096,128x4096x4096 \
    v7:block_m=64,warpgroups=1,split=1,stages=13,multicast=2 v7:block_m=128,warpgroups=1,split=2,stages=6,multicast=1 \
    > "$OUT/edges-v7.txt" 2>&1
