# One device call: the drop-in Llama switched with packed weights, each format in float16, V8's kernels
# prebuilt on the CPU machine (prebuild.py) and carried in $MATMUL_CACHE_DIR.
#   source .gpu/env.sh && MATMUL_CACHE_DIR=$PWD/.cache/pl bash plots/h200/packed-llama/run.sh
nvidia-smi -L > "$OUT/machine.txt"
nvidia-smi --query-gpu=driver_version --format=csv,noheader >> "$OUT/machine.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/machine.txt"
for format in int6 fp8_e4m3 int4; do
    timeout 190 python -m matmul drop-in --parts "llama-$format" --rounds 5 --dtype float16 --out "$OUT" \
        > "$OUT/llama-$format-float16-log.txt" 2>&1
done
