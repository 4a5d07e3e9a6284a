#!/bin/bash
# Makes a shipped table again on this GPU (matmul/call/shipped/h100.json by default): every bucket
# the README's models and `python -m matmul drop-in` meet, narrowed (each bucket timed among the
# candidates that came close in its earlier measurement or a relative's), resumable (`--out` keeps
# the entries already made with these sources, so a run cut short by a device call's time limit
# goes on where it stopped when started again). From the checkout's root, on a fresh machine:
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/h100t bash plots/h100/first-calls/remake-table.sh
# The kernels its first builds need are listed in table-kernels.txt (`--list-kernels`, below); build
# them on a machine without the GPU first and carry the cache:
#   LIST=1 bash plots/h100/first-calls/remake-table.sh > plots/h100/first-calls/table-kernels.txt
#   MATMUL_CACHE_DIR=$PWD/.cache/h100t python -m matmul compile --arch sm_90a --kernels plots/h100/first-calls/table-kernels.txt
set -u
TABLE=${TABLE:-matmul/call/shipped/h100.json}
GPU=${GPU:-NVIDIA H100 80GB HBM3}
SWIGLU=$(printf '%sx28672x4096,' 1 8 16 32 128 1024 2048 4096 8192)
# the backward's dX = dY W of a training step at 1024 tokens, W [N, K] read in place as b [K, N]
KN=1024x4096x6144,1024x4096x4096,1024x4096x28672,1024x14336x4096,1024x4096x128256
COMMANDS=(
    "--model llama-3-8b --m 1,8,16,32,128,1024,2048,4096,8192 --dtype float16,bfloat16"
    "--shapes ${SWIGLU%,} --variant swiglu --dtype float16,bfloat16"
    "--shapes $KN --variant kn --dtype float16,bfloat16"
)
if [ -n "${LIST:-}" ]; then
    for arguments in "${COMMANDS[@]}"; do
        python -m matmul tune $arguments --narrow --list-kernels --gpu "$GPU" 2>/dev/null
    done | sort -u
else
    for arguments in "${COMMANDS[@]}"; do
        python -m matmul tune $arguments --narrow --out "$TABLE" || exit $?
    done
fi
