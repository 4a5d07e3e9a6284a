"""The Hopper kernels the GPU tests launch, as ``python -m matmul compile --kernels`` takes them: a
GPU session's builds done on a machine without a GPU, the cache then carried to the GPU.

    python tests/gpu_kernels.py > kernels.txt
    MATMUL_CACHE_DIR=$PWD/.cache/gpu python -m matmul compile --arch sm_90a --kernels kernels.txt

One line a kernel, ``version|configuration json|dtype[|variant key]``. The lists come from the test
modules themselves (their spaces, configurations and variants), so a test that changes what it
launches changes this list; a kernel missing here is only built on the GPU machine, which costs device
time, not correctness. V8's other weight formats are built by the call's build child there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the test modules and their conftest

from matmul.call import quantized as quant_linear  # noqa: E402
from matmul.kernels import versions  # noqa: E402

ARCH = "sm_90a"
BOTH = ("float16", "bfloat16")


def kernels() -> list[str]:
    import test_b_layout_gpu
    import test_fused_epilogue_gpu
    import test_gpu_correctness
    import test_multicast_gpu
    import test_pingpong_gpu
    import test_skinny_gpu

    lines: list[str] = []

    def add(version: str, config: dict, dtypes=("float16",), key: str = "") -> None:
        for dtype in dtypes:
            line = f"{version}|{json.dumps(config, sort_keys=True)}|{dtype}" + (f"|{key}" if key else "")
            if line not in lines:
                lines.append(line)

    # test_gpu_correctness: each version's representative in both dtypes, every point of its space,
    # V5's and V6's narrow tiles in both dtypes (with V6's pair along N)
    for version in versions.available(ARCH):
        module = versions.load(ARCH, version)
        add(version, module.REPRESENTATIVE, BOTH)
        for config in versions.space(module):
            add(version, config)
    v5, v6, v7 = (versions.load(ARCH, v) for v in ("v5", "v6", "v7"))
    for version, module in (("v5", v5), ("v6", v6)):
        for config in test_gpu_correctness.narrow_configs(module):
            add(version, config, BOTH)
    # test_pingpong_gpu and test_stream_k_gpu
    for tile in test_pingpong_gpu.TILES:
        add("v6", getattr(v6, tile), BOTH)
    for key in ("kn", *test_pingpong_gpu.FUSED):
        add("v6", v6.PINGPONG, key=key)
    add("v5", v5.STREAM_K, BOTH)
    for key in ("kn", "bias+gelu_tanh"):
        add("v5", v5.STREAM_K, key=key)
    # test_skinny_gpu and test_multicast_gpu
    for config in versions.space(v7):
        add("v7", config, BOTH)
    for config in test_skinny_gpu.SPLIT_1:
        for key in test_skinny_gpu.EPILOGUES:
            add("v7", config, ("bfloat16",), key)
    for config in test_multicast_gpu.MULTICAST:
        add("v7", config, BOTH)
        add("v7", config, key="kn")
    # test_odd_inputs_gpu: V5 and V7 fixed as the choice, their representatives in each variant its cases ask for
    for module_name in ("v5", "v7"):
        module = versions.load(ARCH, module_name)
        for key in ("kn", "bias", "bias+silu", "bias+relu"):
            add(module_name, module.REPRESENTATIVE, key=key)
    # test_fused_epilogue_gpu: each version's representative in every epilogue and both dtypes, V5's
    # and V6's narrow tiles in three
    for version, dtype, key, _, config in test_fused_epilogue_gpu.cases():
        module = versions.load(ARCH, version)
        add(version, dict(config) if config else module.REPRESENTATIVE, (str(dtype).removeprefix("torch."),), key)
    # test_b_layout_gpu: each version reading b [K, N] in place, its representative in both dtypes and
    # every point of its space that builds for that layout
    for version in test_b_layout_gpu.VERSIONS:
        module = versions.load(ARCH, version)
        add(version, module.REPRESENTATIVE, BOTH, "kn")
        for config in versions.space(module, test_b_layout_gpu.KN):
            add(version, config, key="kn")
    # test_v8_gpu's fused q, k, v (int4, 16 tokens a tile)
    add("v8", quant_linear.kernel_config("int4", quant_linear.config_for(16, 1536, 1024, "int4")), BOTH)
    return lines


if __name__ == "__main__":
    print("\n".join(kernels()))
