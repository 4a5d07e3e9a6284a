#!/bin/bash
# One device call (H200, 2026-11-28): V6's GPU tests after the pairing change (pair="n" and the
# default path), the ping-pong tests, the packed fused q, k, v test, then pair="n" timed against
# V6 paired along M, V5 and cuBLAS on the skinny shapes, and the qkv row under ncu. Kernels
# prebuilt on the CPU machine and carried in $MATMUL_CACHE_DIR. Writes into $OUT.
set -u
nvidia-smi -L > "$OUT/gpu.txt"
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_correctness.py -k v6 \
    tests/test_pingpong_gpu.py > "$OUT/gpu-tests.txt" 2>&1
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/test_v8_gpu.py -k fused_qkv >> "$OUT/gpu-tests.txt" 2>&1
N="block_m=128,block_n=96,block_k=64,stages=7"
timeout 200 python -m matmul candidates --rounds 5 \
    --sizes 256x6144x4096,128x6144x4096,256x4096x4096,256x28672x4096,256x4096x14336 \
    v6:$N,group=8,pair=n v6:$N,group=16,pair=n v6:$N,group=16 v5:$N,group=16 > "$OUT/candidates.txt" 2>&1
timeout 120 ncu --nvtx --nvtx-include "profile/" --metrics gpu__time_duration.sum,sm__cycles_elapsed.max,\
sm__cycles_active.avg,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__cluster_dim_x \
    --csv python -m matmul candidates --profile 1 --sizes 256x6144x4096 \
    v6:$N,group=8,pair=n v6:$N,group=16 v5:$N,group=16 > "$OUT/ncu-qkv256.csv" 2>&1
echo done >> "$OUT/gpu.txt"
