set -x
nvidia-smi -L > $OUT/machine.txt; nvidia-smi --query-gpu=driver_version --format=csv >> $OUT/machine.txt
P=plots/h200/int6-pairs/plant-second-slab-rows.patch
timeout 150 python -m pytest -v tests/test_v8_gpu.py -k "past_64" > $OUT/past64-clean.txt 2>&1
git apply $P && timeout 200 python -m pytest -v tests/test_v8_gpu.py -k "past_64 or (ragged_shapes and int6) or (the_call and int6)" > $OUT/plant-slab-tests.txt 2>&1
git apply -R $P; git status --short >> $OUT/plant-slab-tests.txt
timeout 200 python plots/h100/v8/probe_configs.py $OUT/probe --no-prebuild --widened --format int6 --dtype bfloat16 --configs 128/1/2/4/64,128/2/2/2/64,128/2/1/3/64 --shapes 128x6144x4096,128x28672x4096,128x4096x4096,128x4096x14336,192x4096x4096,192x6144x4096,256x4096x4096,256x4096x14336,256x6144x4096,256x28672x4096 > $OUT/probe-bf16-log.txt 2>&1
ls -R $OUT
