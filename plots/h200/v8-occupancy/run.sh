#!/bin/bash
# V8 as built (.cache/l2p) and with __launch_bounds__(threads, 7) (.cache/minb7), each in a process of
# its own beside cuBLAS, L2 flushed by reading; kernels built here first (README.md), caches carried.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
SHAPES=1x28672x4096,16x28672x4096,1x4096x4096,16x4096x4096
for round in 1 2; do
  MATMUL_CACHE_DIR=$PWD/.cache/l2p timeout 200 python plots/h100/v8/probe_configs.py /tmp/as-built-$round --no-prebuild \
    --configs 8/1/2/4/64/1,16/1/2/4/64/1 --shapes $SHAPES > "$OUT/as-built-$round.txt" 2>&1
  MATMUL_CACHE_DIR=$PWD/.cache/minb7 timeout 200 python plots/h200/v8-occupancy/min_blocks.py 7 /tmp/min-blocks-7-$round --no-prebuild \
    --configs 8/1/2/4/64/1,16/1/2/4/64/1 --shapes $SHAPES > "$OUT/min-blocks-7-$round.txt" 2>&1
done
