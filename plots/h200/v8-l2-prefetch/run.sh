#!/bin/bash
# V8 with and without its weight prefetch into L2, on the GPU; kernels built here first by
# build.sh and carried (.cache/l2p). Writes under $OUT.
set -u
# the prefetch knob these configurations name was taken out after the runs (README.md): at 171f613
grep -q "prefetch: int = 0" matmul/kernels/hopper/v8.py || { echo "check out 171f613 first: V8's prefetch knob is gone" >&2; exit 2; }
export MATMUL_CACHE_DIR=$PWD/.cache/l2p
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
CONFIGS=8/1/2/4/64/1,8/1/2/4/64/1/4,8/1/2/4/64/1/8,8/1/2/2/64/1/4,8/1/2/4/64/2,8/1/2/4/64/2/4,16/1/2/4/64/1,16/1/2/4/64/1/4,16/1/2/4/64/1/8,16/1/2/4/64/4,16/1/2/4/64/4/4
SHAPES=1x4096x4096,1x6144x4096,1x28672x4096,1x4096x14336,16x4096x4096,16x6144x4096,16x28672x4096,16x4096x14336
timeout 400 python plots/h100/v8/probe_configs.py "$OUT" --no-prebuild --configs $CONFIGS --shapes $SHAPES > "$OUT/flushed-log.txt" 2>&1
echo "flushed exit $?" >> "$OUT/flushed-log.txt"
timeout 150 python plots/h200/v8-l2-prefetch/chain.py --out "$OUT/chain.json" > "$OUT/chain-log.txt" 2>&1
echo "chain exit $?" >> "$OUT/chain-log.txt"
