#!/bin/bash
# On the H100, from the checkout's root, after `source .gpu/env.sh`: smoke-test each Hopper version
# in its own process under a timeout (a hang or an illegal instruction stops only that version),
# then run the GPU correctness tests of the versions that passed. Logs go to OUTDIR.
#
#   notes/hopper_gpu_check.sh OUTDIR [v0 v1 ...]
#
# Kernels built beforehand on a machine without a GPU (every configuration of the spaces, nvcc 13.0
# like the GPU machine's; only lib.so, program.txt and options.txt of each tilus cache entry, in
# .cache/hopper-gpu/programs) are copied into $TILUS_CACHE_DIR first when present, so that the
# GPU's time is not spent compiling. tilus finds them by the hash of the program text.
# Extra environment: SMOKE_TIMEOUT (seconds per version, default 100), TEST_TIMEOUT (default 330).
set -o pipefail
out=${1:?usage: notes/hopper_gpu_check.sh OUTDIR [versions]}
shift
wanted=${*:-v0 v1 v2 v3 v4 v5 v6}
mkdir -p "$out" "${TILUS_CACHE_DIR:?set TILUS_CACHE_DIR}"
if [ -d .cache/hopper-gpu/programs ]; then
  cp -r --update=none .cache/hopper-gpu/programs "$TILUS_CACHE_DIR"/
  # linked without a driver library, they find cuTensorMapEncodeTiled only in a global libcuda
  export LD_PRELOAD=libcuda.so.1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,driver_version \
  --format=csv | tee "$out/gpu.txt"

passed=()
for v in $wanted; do
  if timeout ${SMOKE_TIMEOUT:-100} python notes/hopper_smoke.py "$v" 2>&1 | grep -v "│\|─" | tee -a "$out/smoke.log"; then
    passed+=("$v")
  else
    echo "$v: smoke test FAILED or timed out" | tee -a "$out/smoke.log"
  fi
done
echo "smoke passed: ${passed[*]}" | tee -a "$out/smoke.log"
[ ${#passed[@]} -eq 0 ] && exit 1

select=$(printf " or %s" "${passed[@]}")
timeout ${TEST_TIMEOUT:-330} python -m pytest tests/test_gpu_correctness.py -q -rA -p no:cacheprovider -k "${select:4}" 2>&1 \
  | grep -v "│\|─" | tee "$out/pytest.log"
