"""Hopper V8 computes C = A @ dequantize(W)^T right on ragged shapes (int4: in every configuration,
and the interleaved ones on K block counts that leave a CTA's last stage partly past K; fp8_e4m3 and
int6: in two, which the call's configurations share, and two interleaved; fp8, int6 and
int4_channel also in their configurations past 64 tokens, and fp8 and int6 in their own at 33-64
tokens), the call ``matmul.matmul(x,
qw.T)`` takes it (or widens the weight for cuBLAS), and the widening kernel (``matmul.quant.widen``)
gives ``qw.dequantize()`` bit for bit.

V8 is built by the call's build child (``matmul.call.quantized``): each test waits for the kernels it
checks (``quant_linear.wait_until_built``), since the widened path that runs meanwhile is correct too.

Fresh random operands for each call, the output poisoned with NaN before the call, M in {1, 3, 17,
100, 255}, N a multiple of no tile, K a multiple of the group (128) but of no split (K = 128 is a
single K block: the other CTA of a cluster reads only zeros past K), both dtypes, compared with a
float32 reference computed from ``qw.dequantize()``. Planted bugs (the nibbles of the wrong rows, a
word's nibbles in the fragment's order instead of the widening's pairs, the scales of the wrong
group; fp8: each row's scale taken from the next row; int6: the bits of each 6-bit value in the wrong
order) are shown caught by the same check.
"""

import dataclasses

import pytest
import torch
from conftest import QKVAttention, gpu_arch

import matmul
from matmul.call import api
from matmul.call import quantized as quant_linear
from matmul.call.launch import PackedPlan
from matmul.kernels import versions
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error
from matmul.quant import int4, int6

ARCH = "sm_90a"
TOKENS = (1, 3, 17, 100, 255)
WEIGHTS = ((4095, 1024), (1000, 4096), (31, 128), (200, 384))
DTYPES = (torch.float16, torch.bfloat16)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),
    pytest.mark.skipif(gpu_arch() != ARCH, reason="needs a Hopper GPU (sm_90a)"),
]


# fp8_e4m3, int6 and int4_channel: the call's configurations up to 32 tokens (tiles of 8, 16 and 32
# tokens, by the weight's shape), and past them one of 64 tokens a tile with two warpgroups (M = 100
# and 255 span several); each costs a build per dtype
OTHER_FORMATS = ("fp8_e4m3", "int6", "int4_channel")
SMALL = quant_linear.config_for(16)
WIDE = {"block_m": 64, "warpgroups": 2, "split": 2, "stages": 4, "chunk": 64}


# and a weight 4 times wider than deep, for which fp8's call cuts the K range finer, at 12 tokens too
# (a tile of 16: ``config_for``)
FORMAT_WEIGHTS = (*WEIGHTS, (4097, 1024))
FORMAT_TOKENS = (*TOKENS, 12)


# int6 and fp8 past 64 tokens (``("int6", "fp8_e4m3")``, ``config_for``): two consumer
# warpgroups a CTA with a split of K (33 and 16 output tiles) and without one (98 tiles), on ragged
# shapes; past 256 tokens where V8's tiles fill the GPU (``prefill_pays``: 99 tiles)
PAST_64 = ((100, 4097, 1024), (255, 1000, 1152), (200, 6150, 1024), (300, 4104, 1152))
# (warpgroups, split) the call takes on each, per format: int4_channel takes int4's rules, whose
# slabs TMA stores only on rows of whole 16-byte units (6150 is not a multiple of 8: a split there)
PAST_64_CONFIGS = {
    **{f: [(2, 2), (2, 2), (2, 1), (2, 1)] for f in ("int6", "fp8_e4m3")},
    "int4_channel": [(2, 2), (2, 2), (2, 2), (2, 1)],
}

# fp8 and int6 at 33-64 tokens (``config_for``): fp8 on a weight wider than deep two consumer
# warpgroups a CTA, int6 on a long K two consumers a slab; M from just past a tile of 32 to a full 64
MID_TOKENS = (("fp8_e4m3", 4097, 1024), ("int6", 1000, 4096))


def call_config(m, n, k, format):
    """The call's configuration up to 32 tokens (shape-aware), else two warpgroups of 64 tokens."""
    return quant_linear.config_for(m, n, k, format) if m <= 32 else WIDE


def the_calls_kernels() -> list[tuple]:
    """The V8 kernels (dtype, format, configuration) the tests of the call's configurations check,
    but the one the CUDA graph test must find unbuilt."""
    kernels = []
    for dtype in DTYPES:
        kernels += [(dtype, "int4", quant_linear.config_for(m, n, k, "int4")) for m in TOKENS for n, k in WEIGHTS]
        kernels += [(dtype, f, c) for f in OTHER_FORMATS for c in (SMALL, WIDE)]
        kernels += [
            (dtype, f, call_config(m, n, k, f)) for f in OTHER_FORMATS for m in FORMAT_TOKENS for n, k in FORMAT_WEIGHTS
        ]
        kernels += [(dtype, f, quant_linear.config_for(m, 1000, 1024, f)) for f in BUGS.values() for m in (1, 16)]
        kernels += [(dtype, "int4", quant_linear.config_for(1, n, 1024, "int4")) for n in (4104, 4100)]
        kernels += [(dtype, f, quant_linear.config_for(*shape, f)) for f in PAST_64_CONFIGS for shape in PAST_64]
        kernels += [(dtype, f, quant_linear.config_for(64, n, k, f)) for f, n, k in MID_TOKENS]
    return list({quant_linear.v8_program(*kernel): kernel for kernel in kernels}.values())


# built first, a build child a core at once: waited for one by one, the kernels' builds on a fresh
# machine outlast any run (each test still waits for its own: ``v8_built``)
@pytest.fixture(scope="module")
def calls_kernels_built():
    quant_linear.wait_until_all_built(the_calls_kernels())


# the configurations whose consumer warpgroups take a slab's K blocks in turn (``interleave``), each
# once (chunk 64), and two of them in every format
INTERLEAVED = [c for c in versions.space(versions.load(ARCH, "v8")) if c["interleave"] > 1 and c["chunk"] == 64]
INTERLEAVED_FORMATS = [
    (f, c)
    for f in ("int4", *OTHER_FORMATS)
    for c in INTERLEAVED
    if f == "int4" or (c["block_m"] == 16 and c["split"] == 2)
]


@pytest.fixture(scope="module")
def interleaved_built():
    quant_linear.wait_until_all_built((dtype, f, c) for dtype in DTYPES for f, c in INTERLEAVED_FORMATS)


@pytest.fixture(scope="module")
def space_built():
    space = versions.space(versions.load(ARCH, "v8"))
    quant_linear.wait_until_all_built((dtype, "int4", c) for dtype in DTYPES for c in space)


def operands(m, n, k, dtype, format="int4"):
    x = torch.empty(m, k, dtype=dtype, device="cuda").uniform_(-1, 1)
    w = torch.empty(n, k, dtype=dtype, device="cuda").normal_(0, 0.05)
    return x, matmul.quantize(w, format=format)


def reference(x, qw):
    return x.float() @ qw.dequantize().float().T


def v8_built(x, qw, config=None):
    """Wait for V8's kernel in ``config`` (the call's without one) to be built by the call's build
    child: until then ``v8`` and the call run the widened path, which would pass every check here."""
    m, k = x.shape
    config = config or quant_linear.config_for(m, qw.shape[0], k, qw.format)
    assert quant_linear.wait_until_built(x.dtype, qw.format, config), f"V8 {qw.format} {config} {x.dtype} did not build"


def v8_error(x, qw, config=None, ref=None):
    v8_built(x, qw, config)
    out = poisoned_output(x.shape[0], qw.shape[0], x.dtype)
    quant_linear.v8(x, qw, out, config)
    return relative_error(out, reference(x, qw) if ref is None else ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ragged_shapes(dtype, calls_kernels_built):
    for m in TOKENS:
        for n, k in WEIGHTS:
            x, qw = operands(m, n, k, dtype)
            config = quant_linear.config_for(m, n, k, "int4")
            error = v8_error(x, qw, config)
            assert error <= TOLERANCE[dtype], f"V8 {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_token_count_of_a_tile(dtype, calls_kernels_built):
    """Every count of tokens a tile of 32 and of 128 can hold, and past it (the last tile partial):
    each count's rows come in their own set of boxes (``pipeline.token_boxes``), every box size and
    position, the one-row tail and the group tail."""
    n, k = 200, 384
    for m in range(1, 257):
        x, qw = operands(m, n, k, dtype)
        config = quant_linear.config_for(17 if m <= 32 else 100, n, k, "int4")  # tiles of 32, of 128
        error = v8_error(x, qw, config)
        assert error <= TOLERANCE[dtype], f"V8 {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize(
    "config", versions.space(versions.load(ARCH, "v8")), ids=lambda c: "-".join(f"{v}" for v in c.values())
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_configuration(config, dtype, space_built):
    for m in (1, 17, 255):
        for n, k in ((1000, 4096), (31, 128)):
            x, qw = operands(m, n, k, dtype)
            error = v8_error(x, qw, config)
            assert error <= TOLERANCE[dtype], f"V8 {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize(
    "format, config", INTERLEAVED_FORMATS, ids=lambda c: c if isinstance(c, str) else "-".join(map(str, c.values()))
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_interleaved_consumers(format, config, dtype, interleaved_built):
    """K block counts that no split times interleave divides (5, 9; 1: one CTA's range is all past
    K), so a CTA's last stage holds blocks past K, and ranks whose ranges end in one."""
    for m in (1, 17, 100):
        for n, k in ((1000, 640), (31, 1152), (200, 128)):
            x, qw = operands(m, n, k, dtype, format)
            error = v8_error(x, qw, config)
            assert error <= TOLERANCE[dtype], f"V8 {format} {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


@pytest.mark.parametrize("format", OTHER_FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_other_formats_ragged_shapes(format, dtype, calls_kernels_built):
    for m in FORMAT_TOKENS:
        for n, k in FORMAT_WEIGHTS:
            config = call_config(m, n, k, format)
            x, qw = operands(m, n, k, dtype, format)
            error = v8_error(x, qw, config)
            assert error <= TOLERANCE[dtype], f"V8 {format} {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"


def check_the_calls_configuration(m, n, k, dtype, format) -> dict:
    """V8 in the call's configuration for this shape, then the call itself (which runs that
    configuration), both against float32; the configuration, for the test to say which it was."""
    x, qw = operands(m, n, k, dtype, format)
    assert quant_linear.uses_v8(m, qw)
    config = quant_linear.config_for(m, n, k, format)
    error = v8_error(x, qw, config)
    assert error <= TOLERANCE[dtype], f"V8 {format} {config} {m}x{n}x{k} {dtype}: relative error {error:.3g}"
    y = matmul.linear(x, qw)
    assert relative_error(y, reference(x, qw)) <= TOLERANCE[dtype], f"the call {format} {m}x{n}x{k} {dtype}"
    return config


@pytest.mark.parametrize("format", PAST_64_CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_tiles_past_64_tokens(format, dtype, calls_kernels_built):
    """Two consumer warpgroups a CTA with a split of K and without one (int4_channel: its row scales
    applied before the exchange, or before its slabs' TMA stores)."""
    configs = [check_the_calls_configuration(m, n, k, dtype, format) for m, n, k in PAST_64]
    assert [(c["warpgroups"], c["split"]) for c in configs] == PAST_64_CONFIGS[format]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mid_token_configurations(dtype, calls_kernels_built):
    for format, n, k in MID_TOKENS:
        for m in (33, 50, 64):
            config = check_the_calls_configuration(m, n, k, dtype, format)
            assert (config["warpgroups"], config["interleave"]) == ((2, 1) if format == "fp8_e4m3" else (1, 2))


@pytest.mark.parametrize("format", ["int4", *OTHER_FORMATS])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_call(format, dtype, calls_kernels_built):
    for m in (1, 16, 300):  # V8 up to its format's limit, the weight widened on the GPU and cuBLAS above
        x, qw = operands(m, 1000, 1024, dtype, format)
        # past 256 tokens only where V8's tiles fill the GPU (prefill_pays): not 24 tiles here
        expected = m <= quant_linear.max_tokens(format) and (
            m <= quant_linear.rules()["v8_max_tokens"] or quant_linear.prefill_pays(m, 1000, format)
        )
        assert expected == (m <= quant_linear.rules()["v8_max_tokens"])
        assert quant_linear.uses_v8(m, qw) == expected
        if quant_linear.uses_v8(m, qw):
            v8_built(x, qw)  # the call's V8, not the widened path that runs while it builds
        ref = reference(x, qw)
        for y in (matmul.matmul(x, qw.T), matmul.linear(x, qw)):
            assert y.shape == (m, 1000) and y.dtype == dtype
            assert relative_error(y, ref) <= TOLERANCE[dtype]
        out = poisoned_output(m, 1000, dtype)  # the product written into it, on either path
        quant_linear.linear(x, qw, out=out)
        assert relative_error(out, ref) <= TOLERANCE[dtype]
    x, qw = operands(16, 1000, 1024, dtype, format)
    x3 = x.view(2, 8, 1024)
    bias = torch.randn(1000, dtype=dtype, device="cuda")
    y = matmul.linear(x3, qw, bias, "silu")
    expected = torch.nn.functional.silu(reference(x, qw) + bias.float()).view(2, 8, 1000)
    assert relative_error(y.float().view(16, 1000), expected.view(16, 1000)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_wide_weight_at_decode_runs_without_a_split(dtype, calls_kernels_built):
    """Up to 8 tokens on a weight four times wider than deep the call takes no split of K (each CTA
    writes its slab of C by a TMA store), unless C's rows are no whole 16-byte units; the call's
    product checked into a new output and into an out at an unaligned base."""
    for n, split in ((4104, 1), (4100, 2)):
        for m in (1, 3, 8):
            x, qw = operands(m, n, 1024, dtype)
            config = quant_linear.config_for(m, n, 1024, "int4")
            assert (config["block_m"], config["split"]) == (8, split), config
            v8_built(x, qw)
            ref = reference(x, qw)
            assert relative_error(matmul.linear(x, qw), ref) <= TOLERANCE[dtype], (m, n)
            shifted = torch.full((m * n + 1,), float("nan"), dtype=dtype, device="cuda")[1:].view(m, n)
            assert quant_linear.linear(x, qw, out=shifted) is shifted
            assert relative_error(shifted, ref) <= TOLERANCE[dtype], (m, n)


# --- int4 in ONE_PASS (no split: each warpgroup writes its slab of C by a TMA store), up to prefill ---
ONE_PASS = {**quant_linear.config_for(256), **quant_linear.rules()["configs"]["one_pass"]}
# N not a multiple of the tile (4104, 1000), nor of 8 (4095, 31: rows TMA cannot write, so ``v8``
# writes a padded buffer and copies it), K of 35, 8 and 1 blocks
PREFILL_WEIGHTS = ((4104, 4480), (1000, 1024), (4095, 1024), (31, 128))


@pytest.fixture(scope="module")
def one_pass_built():
    quant_linear.wait_until_all_built((dtype, f, ONE_PASS) for dtype in DTYPES for f in ("int4", "int4_channel"))


@pytest.mark.parametrize("format", ("int4", "int4_channel"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_pass_on_prefill_shapes(dtype, format, one_pass_built):
    """Token counts of one partial tile, of several tiles and a partial one (1000: 8 tiles), into
    a dense out, one whose rows are padded and one whose base is not 16-byte aligned; int4's group
    scales and its row scales."""
    for m in (1, 129, 1000):
        for n, k in PREFILL_WEIGHTS:
            x, qw = operands(m, n, k, dtype, format)
            error = v8_error(x, qw, ONE_PASS)
            assert error <= TOLERANCE[dtype], f"V8 {ONE_PASS} {m}x{n}x{k} {dtype}: relative error {error:.3g}"
    x, qw = operands(300, 1000, 1024, dtype, format)
    ref = reference(x, qw)
    padded = torch.full((300, 1008), float("nan"), dtype=dtype, device="cuda")[:, :1000]
    shifted = torch.full((300 * 1000 + 1,), float("nan"), dtype=dtype, device="cuda")[1:].view(300, 1000)
    for out in (padded, shifted):
        assert quant_linear.v8(x, qw, out, ONE_PASS) is out
        assert relative_error(out, ref) <= TOLERANCE[dtype]
    assert torch.isnan(padded.as_strided((300, 8), (1008, 1), 1000)).all()  # nothing past N


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_call_past_256_tokens(dtype, one_pass_built):
    """The call runs V8 at 1000 tokens where its tiles fill the GPU (264 here), into a new output
    and into an out TMA cannot write (a copy then), with the product's bias and activation."""
    x, qw = operands(1000, 4104, 4480, dtype)
    assert quant_linear.uses_v8(1000, qw) and quant_linear.config_for(1000, 4104, 4480, "int4") == ONE_PASS
    ref = reference(x, qw)
    assert relative_error(matmul.linear(x, qw), ref) <= TOLERANCE[dtype]
    assert relative_error(matmul.matmul(x.view(8, 125, 4480), qw.T).view(1000, 4104), ref) <= TOLERANCE[dtype]
    shifted = torch.full((1000 * 4104 + 1,), float("nan"), dtype=dtype, device="cuda")[1:].view(1000, 4104)
    assert quant_linear.linear(x, qw, out=shifted) is shifted and relative_error(shifted, ref) <= TOLERANCE[dtype]
    bias = torch.randn(4104, dtype=dtype, device="cuda")
    expected = torch.nn.functional.gelu(ref + bias.float())
    assert relative_error(matmul.linear(x, qw, bias, "gelu_erf"), expected) <= TOLERANCE[dtype]


def planted(qw, bug):
    """``qw`` with a bug planted in what the kernel reads."""
    if bug == "nibble order":  # the two rows of a word's nibble pairs swapped (g <-> g + 8)
        q = qw.q()
        n_pad = int4.padded_rows(qw.shape[0])
        full = q.new_zeros((n_pad, q.shape[1]))
        full[: q.shape[0]] = q
        swapped = full.view(n_pad // 64, 4, 2, 8, -1).flip(2).reshape(n_pad, -1)
        return dataclasses.replace(qw, packed=int4.pack(swapped)[: qw.packed.shape[0]])
    if bug == "pair order":  # each word's nibbles in the fragment's order (value v in nibble v, as
        # tilus's int4 cast reads them), not in the pairs the widening makes (matmul.quant.int4)
        words = qw.packed.to(torch.int64) & 0xFFFFFFFF
        fragment = sum(((words >> (4 * (v // 2 + 4 * (v % 2)))) & 0xF) << (4 * v) for v in range(8))
        fragment = torch.where(fragment >= 2**31, fragment - 2**32, fragment).to(torch.int32)
        return dataclasses.replace(qw, packed=fragment)
    if bug == "scale group":  # each group's scales taken from the next group
        return dataclasses.replace(qw, scales=qw.scales.roll(1, dims=0).contiguous())
    if bug in ("row scale", "channel scale"):  # fp8, int4_channel: each row's scale taken from the next row
        return dataclasses.replace(qw, scales=qw.scales.roll(-1, dims=0).contiguous())
    if bug == "bit order":  # int6: each value's 6 bits read from the other end
        u = (qw.q().to(torch.int64) - int6.QMIN).cpu()
        reversed_bits = sum(((u >> b) & 1) << (int6.BITS - 1 - b) for b in range(int6.BITS))
        q = (reversed_bits + int6.QMIN).to(torch.int8).to(qw.device)
        return dataclasses.replace(qw, packed=int6.pack(q))
    raise ValueError(bug)


BUGS = {
    "nibble order": "int4",
    "pair order": "int4",
    "scale group": "int4",
    "row scale": "fp8_e4m3",
    "bit order": "int6",
    "channel scale": "int4_channel",
}


@pytest.mark.parametrize("bug", list(BUGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_planted_bugs_are_caught(bug, dtype, calls_kernels_built):
    x, qw = operands(16, 1000, 1024, dtype, BUGS[bug])
    ref = reference(x, qw)
    assert v8_error(x, qw, ref=ref) <= TOLERANCE[dtype]
    error = v8_error(x, planted(qw, bug), ref=ref)
    assert error > TOLERANCE[dtype], f"planted {bug}: relative error {error:.3g} passes"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_seen_signature_runs_v8_through_its_kept_launch(dtype):
    """After V8 ran a call, later calls with its signature run the kept plan
    (``launch.PackedPlan``): fresh inputs each time, the block the caching allocator hands out
    poisoned first, a model's [batch, tokens, K] input, a bias and an activation after it, a
    poisoned ``out``, and a CUDA graph that captures the kept plan (it launches on the capturing
    stream) and replays it on new data."""
    m, n, k = 16, 1000, 1024
    x, qw = operands(m, n, k, dtype)
    v8_built(x, qw)
    x3 = x.view(2, m // 2, k)
    matmul.linear(x3, qw)  # the full path, which keeps the launch
    assert isinstance(api._plans.packed_plan(x3, qw), PackedPlan)
    bias = torch.randn(n, dtype=dtype, device="cuda")
    for activation in (None, None, "gelu_tanh"):
        fresh = torch.empty_like(x3).uniform_(-1, 1)
        torch.full((2, m // 2, n), float("nan"), dtype=dtype, device="cuda")  # freed: the next output's block
        y = matmul.linear(fresh, qw) if activation is None else matmul.linear(fresh, qw, bias, activation)
        ref = reference(fresh.view(m, k), qw)
        if activation is not None:
            ref = torch.nn.functional.gelu(ref + bias.float(), approximate="tanh")
        assert y.shape == (2, m // 2, n) and relative_error(y.view(m, n), ref) <= TOLERANCE[dtype], activation
    out = poisoned_output(m, n, dtype)  # a dense out: the kept plan writes it
    assert quant_linear.linear(fresh, qw, out=out.view(2, m // 2, n)).data_ptr() == out.data_ptr()
    assert relative_error(out, reference(fresh.view(m, k), qw)) <= TOLERANCE[dtype]
    static = torch.empty_like(x3).uniform_(-1, 1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = quant_linear.linear(static, qw)
    static.uniform_(-1, 1)
    graph.replay()
    torch.cuda.synchronize()
    assert relative_error(captured.view(m, n), reference(static.view(m, k), qw)) <= TOLERANCE[dtype]


def test_a_quantized_layer_under_torch_compile_runs_v8():
    """``torch.compile(fullgraph=True)`` (inductor) of a layer with a packed weight: the graph calls
    ``torch.ops.tilus_matmul.quantized_linear``, which runs V8; its result, bias and activation after
    it, against float32 on fresh inputs."""
    m, n, k = 16, 1000, 1024
    x, qw = operands(m, n, k, torch.float16)
    v8_built(x, qw)
    bias = torch.randn(n, dtype=torch.float16, device="cuda")
    layer = matmul.nn.QuantizedLinear(qw, bias)
    compiled = torch.compile(lambda t: torch.nn.functional.silu(layer(t)), fullgraph=True)
    with torch.no_grad():
        for _ in range(2):
            fresh = torch.empty(2, m // 2, k, dtype=torch.float16, device="cuda").uniform_(-1, 1)
            expected = torch.nn.functional.silu(reference(fresh.view(m, k), qw) + bias.float())
            assert relative_error(compiled(fresh).view(m, n), expected) <= TOLERANCE[torch.float16]


def test_a_cuda_graph_captures_the_widened_path_until_v8_is_built():
    """Captured before its V8 kernel is built (a key no other test builds: int6, bfloat16, the call's
    configuration for 100 tokens on a square weight, one warpgroup a tile of 128), the call widens the
    weight and starts no build; once the build child has built it, a capture runs V8. Each graph's
    replay gives the product."""
    m, n, k = 100, 1000, 1024
    x, qw = operands(m, n, k, torch.bfloat16, "int6")
    key = quant_linear.v8_program(x.dtype, "int6", quant_linear.config_for(m, n, k, "int6"))
    built_by_others = [*the_calls_kernels(), *((d, f, c) for d in DTYPES for f, c in INTERLEAVED_FORMATS)]
    assert key not in {quant_linear.v8_program(*kernel) for kernel in built_by_others}, (
        f"{key} is among the kernels other tests build first: take a shape whose kernel no other test builds"
    )
    ref = reference(x, qw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # torch's own kernels and handles warmed up on the capturing stream
        torch.matmul(x, qw.dequantize().T)
    torch.cuda.current_stream().wait_stream(stream)
    for built in (False, True):
        assert (key in api._chooser.programs) == built and key not in api._chooser.building
        out = poisoned_output(m, n, x.dtype)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            quant_linear.linear(x, qw, out=out)
        assert key not in api._chooser.building  # nothing started while captured
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out, ref) <= TOLERANCE[x.dtype], f"replay with V8 built: {built}"
        if not built:
            v8_built(x, qw)


# --- the widening kernel: dequantize() bit for bit, nothing written past N ---


@pytest.fixture(scope="module")
def widening_built():
    """Every widening kernel built by the call's build child and opened here: from then on
    ``widen`` launches it (until then it returns torch's ``dequantize``, which would pass)."""
    for format in ("int4", *OTHER_FORMATS):
        for dtype in DTYPES:
            assert quant_linear.widening_built(dtype, format), f"the widening kernel {format} {dtype} did not build"


@pytest.mark.parametrize("format", ["int4", *OTHER_FORMATS])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_widening_is_dequantize(format, dtype, widening_built):
    for n, k in WEIGHTS:
        _, qw = operands(1, n, k, dtype, format)
        # rows past N of the buffer stay NaN: the kernel writes [N, K] and no padding row
        buffer = torch.full((n + 64, k), float("nan"), dtype=dtype, device="cuda")
        widened = quant_linear.widen(qw, out=buffer[:n])
        expected = qw.dequantize()
        assert torch.equal(widened.view(torch.int16), expected.view(torch.int16)), f"{format} {n}x{k} {dtype}"
        assert buffer[n:].isnan().all()
        assert quant_linear.runs_here(qw.device)  # the call's path above 256 tokens is this kernel


@pytest.mark.parametrize("bug", ["scale group", "row scale", "bit order"])
def test_widening_planted_bugs_are_caught(bug, widening_built):
    _, qw = operands(1, 1000, 1024, torch.float16, BUGS[bug])
    assert torch.equal(quant_linear.widen(qw), qw.dequantize())
    assert not torch.equal(quant_linear.widen(planted(qw, bug)), qw.dequantize()), f"planted {bug} passes"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_qkv_with_packed_weights(dtype):
    """``convert(weights="int4", fuse_qkv=True)`` on the GPU: one V8 product of the stacked packed
    weight for q, k and v (a grouped-query attention's, k and v narrower, with biases), and a
    cross-attention's k and v from the whole product of their own input, each against float32 from
    its own layer's dequantized rows; V8 built first, so that the widened path is not what is checked."""
    torch.manual_seed(0)
    model = QKVAttention(1024, 256).cuda().to(dtype)
    layers = list(model.children())
    rows = [matmul.quantize(layer.weight.detach(), format="int4").dequantize().float() for layer in layers]
    biases = [layer.bias.detach().float() for layer in layers]
    conversion = matmul.nn.convert(model, weights="int4", fuse_qkv=True)
    packed = conversion.fused[0][1].packed
    assert packed.shape == (1536, 1024)
    x = torch.empty(2, 8, 1024, dtype=dtype, device="cuda").uniform_(-1, 1)
    memory = torch.empty(3, 5, 1024, dtype=dtype, device="cuda").uniform_(-1, 1)
    for tokens in (16, 15):
        assert quant_linear.uses_v8(tokens, packed)
        assert quant_linear.wait_until_built(dtype, "int4", quant_linear.config_for(tokens, 1536, 1024, "int4"))
    with torch.no_grad():
        for source in (None, memory):
            sources = (x, x, x) if source is None else (x, memory, memory)
            for result, read, weight, bias in zip(model(x, source), sources, rows, biases):
                expected = torch.nn.functional.linear(read.float(), weight, bias)
                assert result.shape == expected.shape
                assert relative_error(result, expected) <= TOLERANCE[dtype]
