#!/bin/bash
# Where V8's warps wait at decode sizes (H200): ncu's warp-state sampling per SASS instruction for
# V8 int4 8/1/2/4/64 (the call's configuration up to 8 tokens) at 1 x 4096 x 256 (one K block a
# CTA: little but the launch's fixed cost) and 1 x 4096 x 4096. Writes into $OUT.
set -u
export MATMUL_CACHE_DIR=${MATMUL_CACHE_DIR:-$PWD/.cache/pf}
for shape in 1x4096x256 1x4096x4096; do
    timeout 200 ncu --nvtx --nvtx-include "probe/" --section WarpStateStats --section SourceCounters \
        --warp-sampling-interval 0 --page source --print-source sass --csv \
        python plots/h100/v8/probe_configs.py /tmp/probe --ncu --configs 8/1/2/4/64/1 --no-prebuild \
        --shapes $shape > "$OUT/ncu-source-$shape.csv" 2>&1
    [ -n "${SOURCE_ONLY:-}" ] || timeout 100 ncu --nvtx --nvtx-include "probe/" --section WarpStateStats --section SpeedOfLight --section LaunchStats \
        --metrics sm__cycles_elapsed.max,smsp__cycles_active.avg,dram__bytes_read.sum \
        python plots/h100/v8/probe_configs.py /tmp/probe --ncu --configs 8/1/2/4/64/1 --no-prebuild \
        --shapes $shape > "$OUT/ncu-details-$shape.txt" 2>&1
done
