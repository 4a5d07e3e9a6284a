#!/bin/bash
# A/B of the tilus fix tensormap_prefetch on a GPU, one device call: the decode kernels the call
# runs (V8 int4 in the call's configurations, V7 in the H200 table's) from the tree before the fix
# ($BEFORE_TREE: `git archive` of its parent, matmul/, pipeline/ and the probe) and from this tree,
# alternated twice; each kernel checked against float32 before it is timed in paired windows with
# cuBLAS, L2 flushed by reading (V8) or as the bench does (V7). Then one launch of each under Nsight
# Compute (its caches flushed first), for elapsed cycles. One cache serves both trees: tilus's cache
# folder is named after the fixes' sources. Build it first, on a machine without a GPU:
#   bash plots/h200/tensormap-prefetch/build.sh
# then: source .gpu/env.sh && bash plots/h200/tensormap-prefetch/ab.sh   (carry .gpu, .cache/pf, .cache/before)
set -u
OUT=${OUT:-/tmp/out}
export MATMUL_CACHE_DIR=$PWD/.cache/pf
BEFORE_TREE=${BEFORE_TREE:-$PWD/.cache/before}
SHAPES=1x4096x4096,16x4096x4096,1x6144x4096,1x28672x4096,1x4096x14336,16x4096x14336
V7_DECODE="v7:block_m=16,warpgroups=1,split=2,stages=8,multicast=1 v7:block_m=16,warpgroups=1,split=2,stages=20,multicast=1 v7:block_m=32,warpgroups=1,split=2,stages=12,multicast=1"
V7_128="v7:block_m=64,warpgroups=1,split=1,stages=13,multicast=2"
in_tree() {  # $1: tree, then the command
    local tree=$1; shift
    (cd "$tree" && PYTHONPATH=/tmp/site:$tree "$@")
}
run() {  # $1: label, $2: tree
    {
        in_tree "$2" timeout 150 python plots/h100/v8/probe_configs.py /tmp/probe-$1 --configs chosen --no-prebuild \
            --shapes $SHAPES
        in_tree "$2" timeout 150 python -m matmul candidates --rounds 3 \
            --sizes 1x4096x4096,1x6144x4096,1x4096x14336,16x4096x4096,32x4096x14336 $V7_DECODE
        in_tree "$2" timeout 60 python -m matmul candidates --rounds 3 --sizes 128x4096x4096,128x1024x4096 $V7_128
    } > "$OUT/$1.txt" 2>&1
}
profile() {  # $1: label, $2: tree
    {
        in_tree "$2" timeout 120 ncu --nvtx --nvtx-include "probe/" --csv \
            --metrics gpu__time_duration.sum,sm__cycles_elapsed.max \
            python plots/h100/v8/probe_configs.py /tmp/ncu-$1 --ncu --configs chosen --no-prebuild \
            --shapes 1x4096x256,1x4096x4096,1x4096x14336
        in_tree "$2" timeout 120 ncu --nvtx --nvtx-include "profile/" --csv \
            --metrics gpu__time_duration.sum,sm__cycles_elapsed.max \
            python -m matmul candidates --profile 1 --sizes 1x4096x4096,1x4096x14336 \
            v7:block_m=16,warpgroups=1,split=2,stages=8,multicast=1
    } > "$OUT/ncu-$1.csv" 2>&1
}
run before1 "$BEFORE_TREE"
run after1 "$PWD"
run before2 "$BEFORE_TREE"
run after2 "$PWD"
profile before "$BEFORE_TREE"
profile after "$PWD"
grep -h '"x_cublas"\|cuBLAS (' "$OUT"/*.txt | head -80
