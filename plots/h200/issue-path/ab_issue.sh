#!/bin/bash
# The consumer's issue path, before and after (H200): the ring's stage advance by compare and
# select instead of a remainder by the ring depth, and the wgmma descriptors as the tile's base
# descriptor plus a constant (tilus fix ``wgmma_descriptor_offsets``). The same candidates, first
# from a copy of the tree at HEAD (prebuilt in .cache/s20), then from the working tree (.cache/exab),
# in one call. Writes into $OUT.
set -u
N="block_m=128,block_n=96,block_k=64,stages=7"
CANDIDATES="v5:$N,group=16 v6:$N,group=16 v6:$N,group=8,pair=n"
SQUARE="v6:block_m=128,block_n=256,block_k=64,stages=4,group=8"
run() {  # $1: label, in the current directory with MATMUL_CACHE_DIR set
    timeout 120 python -m matmul candidates --rounds 5 --sizes 256x6144x4096,256x28672x4096 $CANDIDATES \
        v6:block_m=128,block_n=224,block_k=64,stages=4,group=16 > "$OUT/$1-skinny.txt" 2>&1
    timeout 120 python -m matmul candidates --rounds 5 --sizes 4096,8192x8192x2048 $SQUARE > "$OUT/$1-squares.txt" 2>&1
}
HERE=$PWD
rm -rf /tmp/base && mkdir /tmp/base && git archive HEAD | tar -x -C /tmp/base && cp -r .gpu .cache /tmp/base/ \
    && (cd /tmp/base && MATMUL_CACHE_DIR=$HERE/.cache/s20 run before) || echo "no baseline: $?" > "$OUT/before-skinny.txt"
MATMUL_CACHE_DIR=$HERE/.cache/exab run after
grep -h "cuBLAS (" "$OUT"/*.txt | grep -v BEST
