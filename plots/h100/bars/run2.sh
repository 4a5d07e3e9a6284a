#!/bin/bash
# The H100's shipped table made again (plots/h100/first-calls/remake-table.sh: resumable, so run it
# again in a second call if this one's limit cuts it), in a cache with no measured choices.
#   source .gpu/env.sh && export MATMUL_CACHE_DIR=$PWD/.cache/h100t && bash plots/h100/bars/run2.sh
OUT=${OUT:-/tmp/out}
timeout ${TUNE_S:-540} bash plots/h100/first-calls/remake-table.sh > "$OUT/remake-table.log" 2>&1
echo "remake exit $?" >> "$OUT/remake-table.log"
cp matmul/call/shipped/h100.json "$OUT/h100.json"
