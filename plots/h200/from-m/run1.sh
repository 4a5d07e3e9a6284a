#!/bin/bash
# The H200 table's split buckets measured again with split_probe's points (one row into a tile, an
# odd number of 128-row tiles): every bucket whose version lost at the least M (lost_at) or was kept
# from some M up (from_m), both dtypes; then the model benchmark from an empty cache with the whole
# table, as a user meets it. Those entries are marked stale in this copy of the table first, so that
# `tune --out` measures those sixteen and keeps the other 82 (cli.still_to_tune).
# The tune's candidates (kernels.txt: those within the tuner's PRUNE of the best in each marked
# entry) built here first, and carried:
#   MATMUL_CACHE_DIR=$PWD/.cache/fm python -m matmul compile --arch sm_90a --kernels plots/h200/from-m/kernels.txt
#   source .gpu/env.sh && bash plots/h200/from-m/run1.sh   (carry .gpu and .cache/fm)
OUT=${OUT:-/tmp/out}
TABLE=matmul/call/shipped/h200.json
python - "$TABLE" <<'PY'
import json, sys
table = json.load(open(sys.argv[1]))
stale = [key for key, entry in table["entries"].items() if entry.get("lost_at") or entry.get("from_m")]
for key in stale:
    table["entries"][key]["fingerprint"] = "0" * 16
json.dump(table, open(sys.argv[1], "w"), indent=1)
print(len(stale), "buckets to measure again")
PY
MATMUL_CACHE_DIR=$PWD/.cache/fm timeout 280 python -m matmul tune --model llama-3-8b --m 1,16,128,1024,2048,4096,8192 \
    --dtype float16,bfloat16 --narrow --out $TABLE > "$OUT/shipped-tune-split.log" 2>&1
echo "tune exit $?" >> "$OUT/shipped-tune-split.log"
cp $TABLE "$OUT/h200.json"
MATMUL_CACHE_DIR=$(mktemp -d) timeout 300 python -m matmul model --out "$OUT/model" > "$OUT/model.log" 2>&1
echo "model exit $?" >> "$OUT/model.log"
