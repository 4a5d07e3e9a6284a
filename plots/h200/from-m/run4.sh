#!/bin/bash
# A bucket kept from an M up, on the GPU end to end (tests/test_api_gpu.py -k kept_from): cuBLAS
# below from_m and the version from it up, through the Python path and the native entry's routes,
# in both orders of first calls; then the same test with launch.rows_served planted to serve every
# M of the bucket (one route for both sides), which it must fail.
#   source .gpu/env.sh && bash plots/h200/from-m/run4.sh
OUT=${OUT:-/tmp/out}
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/test_api_gpu.py -k kept_from > "$OUT/kept-from-gpu-test.txt" 2>&1
echo "test exit $?" >> "$OUT/kept-from-gpu-test.txt"
cp matmul/call/launch.py /tmp/launch.py.orig
python - <<'PY'
from pathlib import Path
path = Path("matmul/call/launch.py")
text = path.read_text()
start = text.index('    if "below" in entry:\n        return ALL_ROWS[0], entry["below"] - 1\n')
path.write_text(text[:start] + "    return ALL_ROWS  # planted: one route serves both sides of from_m\n" + text[start:])
PY
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_api_gpu.py -k "kept_from and above" > "$OUT/kept-from-planted.txt" 2>&1
echo "planted test exit $? (1 expected)" >> "$OUT/kept-from-planted.txt"
cp /tmp/launch.py.orig matmul/call/launch.py
