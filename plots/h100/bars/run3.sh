#!/bin/bash
# #23's Llama switched in one line, from an empty cache as a user meets it (with the table of
# run2.sh in the tree), then #25's decode block (int4 through matmul() against the fp16 block).
#   source .gpu/env.sh && bash plots/h100/bars/run3.sh
OUT=${OUT:-/tmp/out}
MATMUL_CACHE_DIR=$(mktemp -d) timeout 330 python -m matmul drop-in --parts llama --rounds 5 --out "$OUT" \
    > "$OUT/drop-in.log" 2>&1
echo "drop-in exit $?" >> "$OUT/drop-in.log"
MATMUL_CACHE_DIR=$(mktemp -d) timeout 200 python plots/h100/v8/decode_block.py "$OUT/decode-block" --rounds 5 \
    > "$OUT/decode-block.log" 2>&1
echo "decode block exit $?" >> "$OUT/decode-block.log"
