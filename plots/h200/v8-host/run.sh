#!/bin/bash
# V8's host path on the GPU: the host time of an int4 call with its launch kept, against the full
# path and torch's fp16 call (host_probe.py); the kept launch's GPU tests; then the int4 decoder
# layer's decode step, in CUDA graphs and eager (plots/h100/v8/decode_block.py, eager_* the new rows).
# The five V8 kernels they launch (kernels.txt) built here first, and carried:
#   MATMUL_CACHE_DIR=$PWD/.cache/v8h python -m matmul compile --arch sm_90a --kernels plots/h200/v8-host/kernels.txt
#   source .gpu/env.sh && bash plots/h200/v8-host/run.sh   (carry .gpu and .cache/v8h)
OUT=${OUT:-/tmp/out}
export MATMUL_CACHE_DIR=${MATMUL_CACHE_DIR:-$PWD/.cache/v8h}
timeout 200 python plots/h200/v8-host/host_probe.py "$OUT" > "$OUT/host-probe.log" 2>&1
echo "host probe exit $?" >> "$OUT/host-probe.log"
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_v8_gpu.py -k "kept_launch or torch_compile" > "$OUT/kept-launch-gpu-test.txt" 2>&1
echo "test exit $?" >> "$OUT/kept-launch-gpu-test.txt"
timeout 240 python plots/h100/v8/decode_block.py "$OUT" --rounds 6 > "$OUT/decode-block.log" 2>&1
echo "decode block exit $?" >> "$OUT/decode-block.log"
