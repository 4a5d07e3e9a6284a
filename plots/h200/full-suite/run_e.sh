#!/bin/bash
# Not run yet (written when the device time of 2026-11-30 was spent): what the runs above left.
# The fixed CUDA graph test, the native entry's GPU tests with every result reported (-rA: the
# holding test's numbers), then the two groups of files the limits cut short, each whole.
#   tar xzf .cache/v8t.tgz -C .cache; tar xzf .cache/gpu.tgz -C .cache   (run_a.sh's and run_b.sh's caches)
#   source .gpu/env.sh && bash plots/h200/full-suite/run_e.sh 1   # about 9 minutes
#   source .gpu/env.sh && bash plots/h200/full-suite/run_e.sh 2   # about 8 minutes, a call of its own
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
if [ "${1:-1}" = 1 ]; then
    t cuda-graph v8t 100 tests/test_v8_gpu.py -k cuda_graph
    t native-entry gpu 220 tests/test_native_entry.py -k on_the_gpu
    t b-layout-epilogue-swiglu gpu 230 tests/test_b_layout_gpu.py tests/test_fused_epilogue_gpu.py tests/test_swiglu_gpu.py
else
    t api-linear gpu 480 tests/test_api_gpu.py tests/test_linear_gpu.py
fi
(cd "$OUT" && tar czf e.tgz e && rm -r e)
