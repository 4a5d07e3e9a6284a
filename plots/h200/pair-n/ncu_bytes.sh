#!/bin/bash
# Where the L2 bytes of qkv at 256 tokens go (H200): what the L2 serves to SMs (reads, requests),
# what crosses between the L2's two partitions, and what the SMs receive, for cuBLAS, V5, V6 paired
# along M and V6 paired along N (pair="n"), one launch each. Writes into $OUT.
set -u
N="block_m=128,block_n=96,block_k=64,stages=7"
KERNELS="v6:$N,group=8,pair=n v6:$N,group=16 v5:$N,group=16"
timeout 150 ncu --nvtx --nvtx-include "profile/" --metrics gpu__time_duration.sum,lts__t_bytes.sum,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,\
l1tex__m_xbar2l1tex_read_bytes.sum,sm__cycles_active.avg --csv \
    python -m matmul candidates --profile 1 --sizes 256x6144x4096 $KERNELS > "$OUT/ncu-bytes.csv" 2>&1
timeout 150 ncu --nvtx --nvtx-include "profile/" --metrics lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors.sum --csv \
    python -m matmul candidates --profile 1 --sizes 256x6144x4096 $KERNELS > "$OUT/ncu-fabric.csv" 2>&1
