"""Hopper V7 (skinny GEMMs) computes C = A @ B^T right on ragged shapes, in every configuration.

Fresh random operands for each call (never zeros), the output poisoned with NaN before the call,
M in {1, 3, 17, 100, 255} and N, K that are multiples of no tile (K = 63 is a single K block: the
other CTAs of a cluster read only zeros past K), both dtypes; compared with a float32 reference.
"""

import pytest
import torch
from conftest import gpu_arch

from matmul.kernels import versions
from matmul.measure.correctness import (
    TOLERANCE,
    poisoned_output,
    random_operands,
    reference,
    relative_error,
)

ARCH = "sm_90a"
TOKENS = (1, 3, 17, 100, 255)
# N, K odd, their padded rows multiples of 32 elements: one build per (dtype, M's divisibility)
WEIGHTS = ((4095, 1023), (1023, 4095), (31, 63))
DTYPES = (torch.float16, torch.bfloat16)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(gpu_arch() != ARCH, reason="needs a Hopper GPU (sm_90a)"),
]


def check(m, n, k, dtype, config=None):
    module = versions.load(ARCH, "v7")
    a, b = random_operands(m, n, k, dtype)
    out = poisoned_output(m, n, dtype)
    versions.run(module, a, b, out, config=config)
    error = relative_error(out, reference(a, b))
    assert error <= TOLERANCE[dtype], f"V7 {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autotuned_on_ragged_shapes(dtype):
    # tilus tunes over the whole space: every configuration is built (in parallel) and run here
    for m in TOKENS:
        for n, k in WEIGHTS:
            check(m, n, k, dtype)


@pytest.mark.parametrize(
    "config", versions.space(versions.load(ARCH, "v7")), ids=lambda c: "-".join(f"{v}" for v in c.values())
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_configuration(config, dtype):
    for m in (1, 17, 255):
        for n, k in WEIGHTS:
            check(m, n, k, dtype, config)


def test_a_tile_of_tokens_narrower_than_m():
    # M beyond the token tile takes further clusters, each re-reading the weight: slow, but right
    check(100, 1023, 4095, torch.float16, {"block_m": 16, "warpgroups": 1, "split": 4, "stages": 12})


# Without a split the warpgroups write their own slabs by TMA store, through the variant's epilogue
# (the transposed accumulator, pipeline.fused_epilogue's "wgmma_t"): with one and two warpgroups and
# with the weight multicast (every configuration's plain write-out: test_every_configuration)
SPLIT_1 = [
    c
    for c in versions.space(versions.load(ARCH, "v7"))
    if c["split"] == 1 and (c["warpgroups"] == 2 or (c["block_m"], c["multicast"]) in ((128, 1), (64, 2)))
]


EPILOGUES = ("kn", "bias+gelu_tanh", "swiglu", "bias+swiglu")


@pytest.mark.parametrize("config", SPLIT_1, ids=lambda c: "-".join(f"{v}" for v in c.values()))
@pytest.mark.parametrize("key", EPILOGUES)
def test_slabs_with_every_epilogue(config, key):
    from matmul.kernels import variant as variants

    module = versions.load(ARCH, "v7")
    var = variants.Variant.parse(key)
    dtype = torch.bfloat16
    kernel = versions.kernel(module, dtype, config, var)
    for m, n, k in ((1, 1000, 1000), (255, 4095, 1024)):  # C's edges ragged (K's are the main loop's)
        a = torch.randn(m, k, dtype=dtype, device="cuda")
        weight = torch.randn(n, k, dtype=dtype, device="cuda") / k**0.5
        if var.activation == "swiglu":  # gate and up rows interleaved in groups (variant.gate_up)
            weight = variants.gate_up(weight[: n // 2], weight[n // 2 : 2 * (n // 2)])
        bias = torch.randn(weight.shape[0], dtype=dtype, device="cuda") if var.bias else None
        out = poisoned_output(m, var.out_columns(weight.shape[0]), dtype)
        if key == "kn":  # torch's b [K, N] (rows padded to 16 bytes), read in place
            b = torch.empty(k, n + (-n) % 8, dtype=dtype, device="cuda")[:, :n]
            b.copy_(weight.T)
            kernel(*versions.launch_args(a, b, out, b_layout="kn"))
        else:
            kernel(*versions.launch_args(a, weight, out, bias))
        product = a.float() @ weight.float().T
        expected = variants.torch_epilogue(product, None if bias is None else bias.float(), var.activation)
        error = relative_error(out, expected)
        assert error <= TOLERANCE[dtype], f"V7 {config} {key} {m}x{n}x{k}: relative error {error:.3g}"
