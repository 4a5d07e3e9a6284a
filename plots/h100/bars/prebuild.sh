#!/bin/bash
# Builds, on a machine without a GPU, every kernel run1.sh-run3.sh time or tune first, into
# $MATMUL_CACHE_DIR (default .cache/h100b), to be carried to the H100. From the checkout's root.
set -eu
export MATMUL_CACHE_DIR=${MATMUL_CACHE_DIR:-$PWD/.cache/h100b}
python plots/h100/skinny/multicast_bench.py --others --prebuild
python plots/h100/pingpong/bench_pingpong.py --kernels plain-g8,pingpong-g8 --prebuild
python -c "import torch, matmul; from matmul.harness import roofline; from matmul.kernels import versions; \
  m = versions.load('sm_90a', 'v8'); roofline.prebuild(m, versions.space(m), [torch.float16, torch.bfloat16])"
LIST=1 bash plots/h100/first-calls/remake-table.sh > /tmp/table-kernels.txt
python -m matmul compile --arch sm_90a --kernels /tmp/table-kernels.txt
find "$MATMUL_CACHE_DIR" \( -name source.cu -o -name "*.ptx" -o -name "*.sass" \) -delete
rm -rf "$MATMUL_CACHE_DIR/entry"
du -sh "$MATMUL_CACHE_DIR"
