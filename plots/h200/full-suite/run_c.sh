#!/bin/bash
# Part C: the files run_a.sh's limits cut short, each again from its start with a longer limit
# (the same cache: run_a.sh's header).
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/gpu bash plots/h200/full-suite/run_c.sh
set -u
nvidia-smi -L > "$OUT/machine.txt"
mkdir -p "$OUT/c"
t() {  # $1: name, $2: seconds, the rest: pytest arguments
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" python -m pytest -q -m gpu -p no:cacheprovider --durations 5 "$@" > "$OUT/c/$name.txt" 2>&1
    echo "exit $? after $((SECONDS - start)) s (limit $limit)" >> "$OUT/c/$name.txt"
    echo "$name: $(tail -n 2 "$OUT/c/$name.txt" | tr '\n' ' ')"
}
t native-entry 40 tests/test_native_entry.py
t ring 50 tests/test_pipeline.py
t odd-inputs 100 tests/test_odd_inputs_gpu.py
t api-linear 120 tests/test_api_gpu.py tests/test_linear_gpu.py
t batched-building 80 tests/test_batched_gpu.py tests/test_building_gpu.py
t b-layout-epilogue-swiglu 150 tests/test_b_layout_gpu.py tests/test_fused_epilogue_gpu.py tests/test_swiglu_gpu.py
(cd "$OUT" && tar czf c.tgz c && rm -r c)
