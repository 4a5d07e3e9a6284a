#!/bin/bash
# The model benchmark (matmul() back to back as a model calls it, and a transformer block) with the
# H200's shipped table made after the tilus fix wgmma_uniform_descriptors (tables.sh), from an empty
# cache, as a user meets it.
#   source .gpu/env.sh && bash plots/h200/uniform-descriptors/model.sh
OUT=${OUT:-/tmp/out}
MATMUL_CACHE_DIR=$(mktemp -d) timeout 300 python -m matmul model --out "$OUT/model" > "$OUT/model.log" 2>&1
echo "model exit $?" >> "$OUT/model.log"
