#!/bin/bash
# Builds, on a machine without a GPU, what ab.sh times: the tree before the fix ($BEFORE, default
# the fix's parent) into .cache/before, then both trees' kernels into .cache/pf. Run from the root.
set -eu
ROOT=$PWD
rm -rf .cache/before && mkdir -p .cache/before .cache/pf
git archive "${BEFORE:-HEAD~1}" matmul pipeline plots/h100/v8/probe_configs.py pyproject.toml | tar -x -C .cache/before
export MATMUL_CACHE_DIR=$ROOT/.cache/pf
SHAPES=1x4096x4096,16x4096x4096,1x6144x4096,1x28672x4096,1x4096x14336,16x4096x14336,1x4096x256
V7="v7:block_m=16,warpgroups=1,split=2,stages=8,multicast=1 v7:block_m=16,warpgroups=1,split=2,stages=20,multicast=1 v7:block_m=32,warpgroups=1,split=2,stages=12,multicast=1 v7:block_m=64,warpgroups=1,split=1,stages=13,multicast=2"
for tree in "$ROOT/.cache/before" "$ROOT"; do
    (cd "$tree" && PYTHONPATH=$tree python plots/h100/v8/probe_configs.py /tmp/probe-build --build-only --configs chosen \
        --shapes $SHAPES && PYTHONPATH=$tree python -m matmul candidates --arch sm_90a --prebuild $V7)
done
