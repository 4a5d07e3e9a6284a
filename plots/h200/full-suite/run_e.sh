#!/bin/bash
# Not run yet (written when the device time of 2026-11-30 was spent): what the runs above left.
# Part 1: the fixed CUDA graph test and V8's test cases added since (int4_channel past 64 tokens), then
# the native entry's GPU tests with every result reported (-rA: the holding test's numbers); parts 2
# and 3: the two groups of files the limits cut short, each whole. A call each (a part's limits add
# up to under 600 s), each carrying its cache:
#   part 1: tar xzf .cache/v8t.tgz -C .cache   (run_b.sh's; the native entry's tests make their own)
#   parts 2, 3: tar xzf .cache/gpu.tgz -C .cache   (run_a.sh's)
#   source .gpu/env.sh && bash plots/h200/full-suite/run_e.sh 1   # then 2, then 3
# A cache beside the working tree and .gpu passes the 64 MiB a call carries unless .gpu's transformers,
# tokenizers, huggingface_hub, safetensors and regex wheels are moved out of .gpu/wheels for the call
# (no GPU test imports them).
set -u
nvidia-smi -L > "$OUT/machine.txt"
mkdir -p "$OUT/e"
t() {  # $1: name, $2: cache, $3: seconds, the rest: pytest arguments
    local name=$1 cache=$2 limit=$3; shift 3
    local start=$SECONDS
    MATMUL_CACHE_DIR=$PWD/.cache/$cache timeout "$limit" python -m pytest -q -m gpu -p no:cacheprovider -rA "$@" \
        > "$OUT/e/$name.txt" 2>&1
    echo "exit $? after $((SECONDS - start)) s (limit $limit)" >> "$OUT/e/$name.txt"
    echo "$name: $(tail -n 2 "$OUT/e/$name.txt" | tr '\n' ' ')"
}
case "${1:-1}" in
    1)
        t v8-since v8t 200 tests/test_v8_gpu.py -k "cuda_graph or (large_tiles_past_64 and int4_channel)"
        t native-entry v8t 300 tests/test_native_entry.py -k on_the_gpu
        ;;
    2) t api-linear gpu 540 tests/test_api_gpu.py tests/test_linear_gpu.py ;;
    3) t b-layout-epilogue-swiglu gpu 300 tests/test_b_layout_gpu.py tests/test_fused_epilogue_gpu.py tests/test_swiglu_gpu.py ;;
esac
(cd "$OUT" && tar czf e.tgz e && rm -r e)
