# After run2: int6 at 33 tokens on the long-K weight ran slower interleaved (30.7 us) than at 64 (23.7),
# and fp8 at 33 on it slower than at 64 too. Interleaved or not at 33 and 48 tokens (.cache/mid, run.sh's kernels):
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/mid bash plots/h200/mid-tokens/run3.sh
timeout 80 python plots/h100/v8/probe_configs.py "$OUT/int6" --no-prebuild --format int6 \
    --configs 64/1/2/4/32/1,64/1/2/4/32/2,32/1/2/4/32/1 --shapes 33x4096x14336,48x4096x14336 > "$OUT/probe3-int6-log.txt" 2>&1
timeout 60 python plots/h100/v8/probe_configs.py "$OUT/fp8" --no-prebuild --format fp8_e4m3 \
    --configs 64/1/2/4/32/1,32/1/2/4/32/1 --shapes 33x4096x14336,48x4096x14336 > "$OUT/probe3-fp8-log.txt" 2>&1
