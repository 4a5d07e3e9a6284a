#!/bin/bash
# Builds, on a machine without a GPU, every kernel run1.sh times into .cache/h100b and every kernel
# run2.sh's tuning builds first into .cache/h100t, each to be carried to the H100 with .gpu (the two
# together pass the 64 MiB a call carries). From the checkout's root.
set -eu
export MATMUL_CACHE_DIR=$PWD/.cache/h100b
python plots/h100/skinny/multicast_bench.py --others --prebuild
python plots/h100/pingpong/bench_pingpong.py --kernels plain-g8,pingpong-g8 --prebuild
python -c "import torch, matmul; from matmul.harness import roofline; from matmul.kernels import versions; \
  m = versions.load('sm_90a', 'v8'); roofline.prebuild(m, versions.space(m), [torch.float16, torch.bfloat16])"
LIST=1 bash plots/h100/first-calls/remake-table.sh > /tmp/table-kernels.txt
MATMUL_CACHE_DIR=$PWD/.cache/h100t python -m matmul compile --arch sm_90a --kernels /tmp/table-kernels.txt
for cache in .cache/h100b .cache/h100t; do
    find "$cache" \( -name source.cu -o -name "*.ptx" -o -name "*.sass" \) -delete
    rm -rf "$cache/entry"
done
du -sh .cache/h100b .cache/h100t
