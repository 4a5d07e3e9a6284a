#!/bin/bash
# The kernels run.sh times, built on a machine without a GPU into .cache/l2p (carry it).
set -eu
# the prefetch knob these configurations name was taken out after the runs (README.md): at 171f613
grep -q "prefetch: int = 0" matmul/kernels/hopper/v8.py || { echo "check out 171f613 first: V8's prefetch knob is gone" >&2; exit 2; }
export MATMUL_CACHE_DIR=$PWD/.cache/l2p
CONFIGS=$(grep '^CONFIGS=' plots/h200/v8-l2-prefetch/run.sh | cut -d= -f2)
python plots/h100/v8/probe_configs.py /tmp/l2p-build --build-only --configs "$CONFIGS" --shapes 1x4096x4096,16x4096x4096,1x4096x14336,16x4096x14336
python plots/h200/v8-l2-prefetch/chain.py --build-only
