#!/bin/bash
# The GPU tests of every Hopper kernel the change touches (the ring's advance: every version with a
# Pipeline; the descriptors: every wgmma), kernels prebuilt on the CPU machine into $MATMUL_CACHE_DIR
# (since: `python tests/gpu_kernels.py > k.txt; python -m matmul compile --arch sm_90a --kernels k.txt`).
# Each file under its own limit, so that what ran comes back.
# Writes $OUT/gpu-tests-*.txt.
set -u
t() {  # $1: name, $2: seconds, the rest: pytest arguments
    local name=$1 limit=$2; shift 2
    timeout "$limit" python -m pytest -q -m gpu -p no:cacheprovider "$@" > "$OUT/gpu-tests-$name.txt" 2>&1
    echo "$name: $(tail -1 "$OUT/gpu-tests-$name.txt")"
}
t correctness 230 tests/test_gpu_correctness.py
t ring 40 tests/test_pipeline.py
t skinny 120 tests/test_skinny_gpu.py tests/test_multicast_gpu.py
t pingpong-stream-k 80 tests/test_pingpong_gpu.py tests/test_stream_k_gpu.py
t v8 90 tests/test_v8_gpu.py -k "fused_qkv or the_call or ragged"
