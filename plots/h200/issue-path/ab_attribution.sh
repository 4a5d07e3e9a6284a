#!/bin/bash
# Which of the two changes of the consumer's issue path pays (H200), in one call: the tree at HEAD
# (before), HEAD with only the ring's compare-and-select advance (select), and the working tree with
# the descriptor fix as well (both), each from its own prebuilt cache. Writes into $OUT.
set -u
N="block_m=128,block_n=96,block_k=64,stages=7"
HERE=$PWD
tree() {  # $1: directory, $2: pipeline.py to use (empty: HEAD's)
    rm -rf "$1" && mkdir "$1" && git archive HEAD | tar -x -C "$1" && cp -r .gpu "$1"/
    if [ -n "$2" ]; then cp "$2" "$1/pipeline/pipeline.py"; fi
}
run() {  # $1: label, $2: directory, $3: cache
    (cd "$2" && MATMUL_CACHE_DIR=$3 timeout 150 python -m matmul candidates --rounds 5 \
        --sizes 256x6144x4096,256x28672x4096,128x6144x4096 v5:$N,group=16 v6:$N,group=16 v6:$N,group=8,pair=n \
        > "$OUT/$1.txt" 2>&1)
}
tree /tmp/before "" && tree /tmp/select "$HERE/pipeline/pipeline.py"
run before /tmp/before "$HERE/.cache/s20"
run select /tmp/select "$HERE/.cache/exa"
run both "$HERE" "$HERE/.cache/exab"
for f in before select both; do echo "== $f"; grep "cuBLAS (" "$OUT/$f.txt" | sed 's/ block_m=128 block_n=96 block_k=64 stages=7//; s/TFLOPS.*cuBLAS (windows/x (windows/'; done
