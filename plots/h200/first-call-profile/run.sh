#!/bin/bash
# The first call profiled on a fresh machine, each process from empty caches: with MATMUL_TUNE=off
# (no tuning child; the build children still start) and as the call runs by default, alternated
# ROUNDS times (default 1; the first process on a fresh machine also reads torch's libraries from
# disk). Writes under $OUT.
set -u
for round in $(seq 1 "${ROUNDS:-1}"); do
  for mode in off default; do
    dir="$OUT/$mode-$round"
    mkdir -p "$dir"
    if [ $mode = off ]; then tune=off; else tune=background; fi
    MATMUL_TUNE=$tune MATMUL_CACHE_DIR=$(mktemp -d) timeout 200 python plots/h200/first-call-profile/profile_first_call.py \
      "$dir" > "$dir/log.txt" 2>&1
    code=$?
    # at most 8 files come back from the device: the log only where the run failed, no cProfile
    if [ $code = 0 ]; then rm -f "$dir/log.txt"; else echo "exit $code" >> "$dir/log.txt"; fi
    rm -f "$dir/profile.txt"
  done
done
