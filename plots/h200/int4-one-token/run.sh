# int4 at one token, bfloat16: V8's space swept on the two weights where torch's int4 kernel (tinygemm)
# ran faster than the call (plots/h200/after-loop/v8/bench.md: 0.88x and 0.98x its speed), plus a
# split of 4 at a tile of 8 (not in the space), then the fastest three of each beside tinygemm and the
# call's configuration in one window on those two weights. Kernels built on the CPU machine with the
# same probe_configs.py commands and --build-only, carried.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/ch bash plots/h200/int4-one-token/run.sh
P=plots/h100/v8/probe_configs.py
S=1x4096x4096,1x6144x4096
timeout 200 python $P "$OUT/sweep" --no-prebuild --format int4 --dtype bfloat16 --configs all --shapes $S > "$OUT/sweep-log.txt" 2>&1
timeout 60 python $P "$OUT/split4" --no-prebuild --format int4 --dtype bfloat16 \
    --configs 8/1/4/4/64,8/1/4/4/64/2,8/1/4/4/32,8/2/4/4/64 --shapes $S > "$OUT/split4-log.txt" 2>&1
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = json.load(open(f"{out}/sweep/probe_configs.json")) + json.load(open(f"{out}/split4/probe_configs.json"))
json.dump(rows, open(f"{out}/sweep-all.json", "w"), indent=1)
PY
timeout 200 python plots/h200/int4-one-token/vs_tinygemm.py "$OUT" --sweep "$OUT/sweep-all.json" --top 3 > "$OUT/vs-tinygemm-log.txt" 2>&1
