#!/bin/bash
# Every GPU test file but V8's, at one commit, each under a limit of its own so that what ran comes
# back (gpu-tests-*.txt). Kernels the lists name built on the CPU machine first and carried:
#   python tests/gpu_kernels.py > k.txt
#   MATMUL_CACHE_DIR=$PWD/.cache/gpu python -m matmul compile --arch sm_90a --kernels k.txt
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/gpu bash plots/h200/full-suite/run_a.sh
# Part B (run_b.sh) runs V8's files.
set -u
nvidia-smi -L > "$OUT/machine.txt"
nvidia-smi --query-gpu=driver_version --format=csv,noheader >> "$OUT/machine.txt"
python -c "import torch, tilus; print('torch', torch.__version__, 'tilus', tilus.__version__)" >> "$OUT/machine.txt"
mkdir -p "$OUT/a"
t() {  # $1: name, $2: seconds, the rest: pytest arguments
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" python -m pytest -q -m gpu -p no:cacheprovider "$@" > "$OUT/a/$name.txt" 2>&1
    echo "exit $? after $((SECONDS - start)) s (limit $limit)" >> "$OUT/a/$name.txt"
    echo "$name: $(tail -n 2 "$OUT/a/$name.txt" | tr '\n' ' ')"
}
t correctness 100 tests/test_gpu_correctness.py
t ring 30 tests/test_pipeline.py
t skinny-multicast 130 tests/test_skinny_gpu.py tests/test_multicast_gpu.py
t pingpong-stream-k 60 tests/test_pingpong_gpu.py tests/test_stream_k_gpu.py
t native-entry 20 tests/test_native_entry.py
t b-layout-epilogue-swiglu 90 tests/test_b_layout_gpu.py tests/test_fused_epilogue_gpu.py tests/test_swiglu_gpu.py
t batched-building 40 tests/test_batched_gpu.py tests/test_building_gpu.py
t api-linear 60 tests/test_api_gpu.py tests/test_linear_gpu.py
t odd-inputs 40 tests/test_odd_inputs_gpu.py
(cd "$OUT" && tar czf a.tgz a && rm -r a)
