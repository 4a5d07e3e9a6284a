#!/bin/bash
# A/B of the tilus fix wgmma_uniform_descriptors on a GPU, one device call, from a checkout that has
# it: the same candidates from the tree before it ("before", git archive $BEFORE, fe3ea8d: the fix's
# parent) and from this tree ("after"), each kernel checked against float32 before it is timed (ragged shapes among them),
# paired windows with cuBLAS. One cache serves both: tilus's cache folder is named after the fixes'
# sources (choice_cache.tilus_fixes_key). Build it first, on a machine without a GPU (~15 s a kernel):
#   ALL="$(sed -n 's/^KERNELS="\(.*\)"$/\1/p' plots/h200/uniform-descriptors/ab.sh)"
#   MATMUL_CACHE_DIR=$PWD/.cache/ud python -m matmul candidates --arch sm_90a --prebuild $ALL
#   (git archive fe3ea8d | tar -x -C /tmp/before) && (cd /tmp/before && \
#       MATMUL_CACHE_DIR=$OLDPWD/.cache/ud python -m matmul candidates --arch sm_90a --prebuild $ALL)
# then: source .gpu/env.sh && bash plots/h200/uniform-descriptors/ab.sh   (carry .gpu and .cache/ud)
OUT=${OUT:-/tmp/out}
KERNELS="v5:block_m=128,block_n=96,block_k=64,stages=7,group=16 v6:block_m=128,block_n=256,block_k=64,stages=4,group=8 v6:block_m=128,block_n=128,block_k=64,stages=6,group=8,pingpong=true v7:block_m=128,warpgroups=1,split=1,stages=8,multicast=2 v7:block_m=64,warpgroups=1,split=1,stages=13,multicast=2 v7:block_m=128,warpgroups=1,split=2,stages=6,multicast=1"
export MATMUL_CACHE_DIR=$PWD/.cache/ud
pick() { tr ' ' '\n' <<< "$KERNELS" | grep "^$1"; }
run() {  # $1: label, in the tree to time
    timeout 100 python -m matmul candidates --rounds 3 --sizes 256x6144x4096,255x6144x4096,128x6144x4096 $(pick v5) \
        > "$OUT/$1-narrow.txt" 2>&1
    timeout 100 python -m matmul candidates --rounds 3 --sizes 4096,8192x8192x2048,4000x4000x4000 $(pick v6) \
        > "$OUT/$1-square.txt" 2>&1
    timeout 100 python -m matmul candidates --rounds 3 --sizes 256x4096x14336,128x6144x4096,128x4096x4096,100x4096x4096 \
        $(pick v7) > "$OUT/$1-skinny.txt" 2>&1
}
rm -rf /tmp/before && mkdir /tmp/before && git archive "${BEFORE:-fe3ea8d}" | tar -x -C /tmp/before && cp -r .gpu /tmp/before/ \
    && (cd /tmp/before && run before) || echo "no baseline: $?" > "$OUT/before-narrow.txt"
run after
grep -h "cuBLAS (" "$OUT"/*.txt | grep -v BEST
