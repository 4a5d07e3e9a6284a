# One device call: fp8 with two consumer warpgroups past 64 tokens (quant.linear.LARGE_TILE_FORMATS).
# Kernels built on the CPU machine and carried (.cache/p8: tests/test_v8_gpu.py's through
# plots/h200/v8-scale-after/prebuild.py --formats fp8_e4m3, and the bench's through
# plots/h100/v8/probe_configs.py --build-only --format fp8_e4m3 --dtype D --configs 128/1/2/4/32,128/2/1/3/32,128/2/2/2/32).
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/p8 bash plots/h200/fp8-two-slabs/run.sh
nvidia-smi -L > "$OUT/machine.txt"
timeout 300 python -m pytest -v tests/test_v8_gpu.py -k "past_64 or (ragged_shapes and fp8) or (the_call and fp8)" \
    > "$OUT/gpu-tests.txt" 2>&1
timeout 200 python plots/h100/v8/bench_v8.py "$OUT" --formats fp8_e4m3 --tokens 128,256 --no-prebuild > "$OUT/bench-log.txt" 2>&1
