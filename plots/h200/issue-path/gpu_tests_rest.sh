#!/bin/bash
# The rest of gpu_tests.sh (the first call's limits cut the ring, V7 and stream-K files short),
# then V7's configurations of the 128-token rows against cuBLAS with the change. Writes into $OUT.
set -u
t() {  # $1: name, $2: seconds, the rest: pytest arguments
    local name=$1 limit=$2; shift 2
    timeout "$limit" python -m pytest -q -m gpu -p no:cacheprovider "$@" > "$OUT/gpu-tests-$name.txt" 2>&1
    echo "$name: $(tail -1 "$OUT/gpu-tests-$name.txt")"
}
t ring 30 tests/test_pipeline.py -k ring
t stream-k 40 tests/test_stream_k_gpu.py -k "fused or in_place"
t multicast 100 tests/test_multicast_gpu.py
t slabs 60 tests/test_skinny_gpu.py -k slabs
timeout 100 python -m matmul candidates --rounds 3 --sizes 128x4096x4096,128x6144x4096,128x4096x14336 \
    v7:block_m=128,warpgroups=1,split=2,stages=6,multicast=1 v7:block_m=64,warpgroups=1,split=1,stages=13,multicast=2 \
    > "$OUT/v7-128.txt" 2>&1
grep "cuBLAS (" "$OUT/v7-128.txt"
