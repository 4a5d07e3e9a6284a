#!/bin/bash
# A/B of the candidate fix uniform_descriptors on a GPU, one device call: the same candidates from a
# cache built without it (.cache/ud-before) and one built with it (.cache/ud-after), each kernel
# checked against float32 before it is timed (ragged shapes among them), paired windows with cuBLAS.
# Build both caches first, on a machine without a GPU (about 15 s a kernel):
#   MATMUL_CACHE_DIR=$PWD/.cache/ud-before python -m matmul candidates --arch sm_90a --prebuild $ALL
#   MATMUL_CACHE_DIR=$PWD/.cache/ud-after python plots/h200/uniform-descriptors/with_fix.py matmul candidates \
#       --arch sm_90a --prebuild $ALL
# then: source .gpu/env.sh && bash plots/h200/uniform-descriptors/ab.sh   (carry .cache/ud-before, .cache/ud-after)
OUT=${OUT:-/tmp/out}
NARROW="v5:block_m=128,block_n=96,block_k=64,stages=7,group=16"
SQUARE="v6:block_m=128,block_n=256,block_k=64,stages=4,group=8 v6:block_m=128,block_n=128,block_k=64,stages=6,group=8,pingpong=true"
SKINNY="v7:block_m=128,warpgroups=1,split=1,stages=8,multicast=2 v7:block_m=64,warpgroups=1,split=1,stages=13,multicast=2 v7:block_m=128,warpgroups=1,split=2,stages=6,multicast=1"
FIX=plots/h200/uniform-descriptors/with_fix.py
for side in before after; do
    run="python -m matmul"; [ $side = after ] && run="python $FIX matmul"
    export MATMUL_CACHE_DIR=$PWD/.cache/ud-$side
    timeout 100 $run candidates --rounds 3 --sizes 256x6144x4096,255x6144x4096,128x6144x4096 $NARROW > "$OUT/$side-narrow.txt" 2>&1
    timeout 100 $run candidates --rounds 3 --sizes 4096,8192x8192x2048,4000x4000x4000 $SQUARE > "$OUT/$side-square.txt" 2>&1
    timeout 100 $run candidates --rounds 3 --sizes 256x4096x14336,128x6144x4096,128x4096x4096,100x4096x4096 $SKINNY \
        > "$OUT/$side-skinny.txt" 2>&1
done
grep -h "cuBLAS (" "$OUT"/*.txt | grep -v BEST
