# One device call with the call's new decode tiles for int6 and fp8 (quant.linear.config_for): their GPU
# tests, then the drop-in Llama packed in each. Kernels built on the CPU machine and carried (.cache/p9:
# plots/h200/v8-scale-after/prebuild.py --formats int6,fp8_e4m3 and
# plots/h200/packed-llama/prebuild.py --formats int6,fp8_e4m3 --dtypes float16).
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/p9 bash plots/h200/decode-tiles/run.sh   # its files: after/
nvidia-smi -L > "$OUT/machine.txt"
timeout 240 python -m pytest -v tests/test_v8_gpu.py \
    -k "(other_formats_ragged_shapes or the_call or past_64) and (int6 or fp8)" > "$OUT/gpu-tests.txt" 2>&1
for format in int6 fp8_e4m3; do
    timeout 150 python -m matmul drop-in --parts "llama-$format" --rounds 5 --dtype float16 --out "$OUT" \
        > "$OUT/llama-$format-float16-log.txt" 2>&1
done
