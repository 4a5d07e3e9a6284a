#!/bin/bash
# Where the warps of qkv at 256 tokens wait (H200): ncu's warp-state sampling per SASS instruction
# for cuBLAS and V5 128 x 96 (one launch each), to tell a consumer starved of stages (its wait on
# a full barrier) from a tensor core kept busy (its wgmma wait). Writes into $OUT.
set -u
N="block_m=128,block_n=96,block_k=64,stages=7"
timeout 250 ncu --nvtx --nvtx-include "profile/" --section WarpStateStats --section SourceCounters \
    --page source --print-source sass --csv \
    python -m matmul candidates --profile 1 --sizes 256x6144x4096 v5:$N,group=16 > "$OUT/ncu-source.csv" 2>&1
timeout 120 ncu --nvtx --nvtx-include "profile/" --section WarpStateStats --csv \
    python -m matmul candidates --profile 1 --sizes 256x6144x4096 v5:$N,group=16 > "$OUT/ncu-warp-state.csv" 2>&1
