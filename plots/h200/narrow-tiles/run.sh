#!/bin/bash
# On the GPU machine, carrying .gpu and .cache/nt.tgz (the probe's kernels, built on the CPU machine
# with `MATMUL_CACHE_DIR=$PWD/.cache/nt python plots/h200/narrow-tiles/narrow_probe.py /tmp/nt --build-only`):
#   source .gpu/env.sh && bash plots/h200/narrow-tiles/run.sh
set -u
mkdir -p .cache/nt && tar xzf .cache/nt.tgz -C .cache
export MATMUL_CACHE_DIR=$PWD/.cache/nt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > "$OUT/machine.txt"
timeout 420 python plots/h200/narrow-tiles/narrow_probe.py "$OUT" --rounds 3 --no-prebuild > "$OUT/narrow-log.txt" 2>&1
echo "exit $?" >> "$OUT/narrow-log.txt"
tail -40 "$OUT/narrow-log.txt"
