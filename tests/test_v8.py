"""Hopper V8 (int4 weights) without a GPU: the quantizer against plain torch, the packed layout
against the kernel's reading of it (thread, word, nibble -> row, column), the errors, and the
representative build with its PTX markers; the same for the fp8 e4m3 and int6 formats; the widening
kernel (``matmul.quant.widen``) built for sm_90a (tests/test_v8_gpu.py runs all of them)."""

import functools
import re

import pytest
import tilus
import torch
from conftest import representative_build, widened_int4

import matmul
from matmul import MatmulInputError, build
from matmul.call import quantized as quant_linear
from matmul.kernels import versions
from matmul.quant import fp8, int4, int6, widen
from matmul.tilus_fixes.wgmma_register_a import a_fragment

V8 = versions.load("sm_90a", "v8")
NAMED = quant_linear.rules()["configs"]  # the configurations shipped/rules/v8.json names
LARGE_TILE_FORMATS = ("int6", "fp8_e4m3")  # the formats whose tiles are 6 and 8 KiB a slab


def weight(n, k, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.05).to(dtype)


def plain_int4(w, group=128):
    """The format in the plainest torch: per row and group, scale = absmax / 7 (rounded to w's
    dtype, 1 where the group is zero), q = round(w / scale) in -8..7."""
    n, k = w.shape
    q = torch.empty(n, k, dtype=torch.int8)
    s = torch.empty(n, k // group, dtype=w.dtype)
    for r in range(n):
        for g in range(k // group):
            block = w[r, g * group : (g + 1) * group].float()
            scale = (block.abs().max() / 7).to(w.dtype)
            scale = torch.ones((), dtype=w.dtype) if scale == 0 else scale
            s[r, g] = scale
            q[r, g * group : (g + 1) * group] = torch.round(block / scale.float()).clamp(-8, 7).to(torch.int8)
    return q, s


def kernel_reads(words, n_pad, k, dtype="float16"):
    """q [N_pad, K] as V8's threads read the packed words: a thread's 4 words of a half (v8.py's
    docstring) widened as ``pipeline.widen.int4_pairs`` does (emulated from its table of steps),
    each 16-bit value placed where the kernel's A fragment layout puts that register."""
    q = torch.empty(n_pad, k, dtype=torch.int8)
    fragment = a_fragment(64, 64)
    place = [
        [tuple(int(x) for x in fragment.get_global(spatial_index=t, local_index=i)) for i in range(32)]
        for t in range(128)
    ]
    w = words.view(torch.int32)
    for i in range(n_pad // 64):
        for b in range(k // 128):
            tile = w[16 * i : 16 * i + 16, 64 * b : 64 * b + 64].reshape(2, 128, 4)  # [half][thread][word]
            values = widened_int4(tile, dtype).reshape(2, 128, 32).to(torch.int8)  # registers in order
            for h in range(2):
                for t in range(128):
                    for register, (row, col) in enumerate(place[t]):
                        q[64 * i + row, 128 * b + 64 * h + col] = values[h, t, register]
    return q


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_quantize_matches_plain_torch(dtype):
    w = weight(70, 256, dtype)
    w[3, :128] = 0  # an all-zero group: scale 1, q 0
    qw = matmul.quantize(w)
    q, s = plain_int4(w)
    assert (qw.format, qw.bits, qw.group, qw.shape, qw.dtype) == ("int4", 4, 128, (70, 256), dtype)
    assert torch.equal(qw.q(), q)
    assert torch.equal(qw.group_scales(), s)
    assert torch.equal(qw.dequantize(), q.to(dtype) * s.repeat_interleave(128, dim=1))
    assert qw.dequantize().dtype == dtype
    # the quantization error is that of 4 bits: at most half a step per value
    step = s.float().repeat_interleave(128, dim=1)
    assert ((qw.dequantize().float() - w.float()).abs() <= step * 0.5 + 1e-3).all()


def test_pack_unpack_round_trip():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-8, 8, (200, 384), generator=g, dtype=torch.int8)
    words = int4.pack(q)
    assert words.shape == (256 // 4, 384 // 2) and words.dtype == torch.int32
    assert torch.equal(int4.unpack(words, 200), q)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_packed_layout_is_what_the_kernel_reads(dtype):
    g = torch.Generator().manual_seed(2)
    q = torch.randint(-8, 8, (100, 256), generator=g, dtype=torch.int8)
    read = kernel_reads(int4.pack(q), 128, 256, dtype)
    assert torch.equal(read[:100], q)
    assert (read[100:] == 0).all()  # padding rows


def test_the_widening_makes_every_nibble_exact():
    """Each pair of ``pipeline.widen.PAIR_STEPS``, on words holding every nibble value in every place:
    nibbles p and p + 4 of a word, as -8..7, in registers 2 p and 2 p + 1."""
    nibbles = torch.arange(16, dtype=torch.int64)
    for place in range(8):
        words = (nibbles << (4 * place)) | (((nibbles + 5) % 16) << (4 * ((place + 3) % 8)))
        expected = torch.zeros(16, 8)
        for e in range(8):
            u = (words >> (4 * e)) & 0xF
            expected[:, 2 * (e % 4) + e // 4] = (torch.where(u >= 8, u - 16, u)).float()
        for dtype in ("float16", "bfloat16"):
            assert torch.equal(widened_int4(words, dtype), expected), (place, dtype)


def test_fragment_is_the_ptx_a_layout():
    layout = a_fragment(64, 64)
    for t in range(128):
        warp, g, c = t // 32, (t % 32) // 4, t % 4
        for i in range(32):
            step, e = i // 8, i % 8
            row, col = (int(x) for x in layout.get_global(spatial_index=t, local_index=i))
            assert row == 16 * warp + g + 8 * ((e // 2) % 2)
            assert col == 16 * step + 2 * c + e % 2 + 8 * (e // 4)


def test_errors():
    with pytest.raises(MatmulInputError, match="multiple of the group"):
        matmul.quantize(weight(64, 200))
    with pytest.raises(MatmulInputError, match="float16 or bfloat16"):
        matmul.quantize(weight(64, 256).float())
    with pytest.raises(MatmulInputError, match="format"):
        matmul.quantize(weight(64, 256), format="int3")
    with pytest.raises(MatmulInputError, match="group"):
        matmul.quantize(weight(64, 256), group=64)
    qw = matmul.quantize(weight(64, 256))
    with pytest.raises(MatmulInputError, match="K differs"):
        matmul.linear(torch.zeros(2, 128, dtype=torch.float16), qw)
    with pytest.raises(MatmulInputError, match="quantized for"):
        matmul.matmul(torch.zeros(2, 256, dtype=torch.bfloat16), qw.T)
    with pytest.raises(MatmulInputError, match=r"pass its transpose, matmul\(a, qw.T\)"):  # the weight as stored
        matmul.matmul(torch.zeros(2, 256, dtype=torch.float16), qw)
    with pytest.raises(MatmulInputError, match=r"linear\(x, qw\)"):  # and linear's the other way round
        matmul.linear(torch.zeros(2, 256, dtype=torch.float16), qw.T)


def test_supports_and_configs():
    assert V8.supports(1, 4096, 4096) and V8.supports(256, 100, 128) and V8.supports(1536, 4096, 4096)
    assert not V8.supports(16, 4096, 4000)  # K a multiple of the group
    assert not V8.supports(2**19, 4096, 4096) and V8.supports(2**19 - 1, 4096, 4096)  # C past 2^31 elements
    for name in ("tile_16", "tile_64", "tile_128", "tile_128_whole_k"):  # the token tiers' own
        assert NAMED[name] in versions.space(V8)
    int4 = quant_linear.configs("int4")
    for config in int4:  # every configuration the int4 call may run is checked on the GPU (the space)
        assert config in versions.space(V8)
    assert {c["block_m"] for c in int4} >= {8, 16} and {c["interleave"] for c in int4} >= {1, 2, 4}
    assert quant_linear.config_for(1, 4096, 14336, "int4")["interleave"] == 2  # a down projection's long K
    assert quant_linear.config_for(16, 4096, 14336, "int4")["interleave"] == 4
    assert quant_linear.config_for(1, 14336, 4096, "int4")["interleave"] == 1
    # up to 8 tokens a square weight interleaves too, a weight wider than deep does not
    assert [quant_linear.config_for(m, 4096, 4096, "int4")["interleave"] for m in (1, 8, 9)] == [2, 2, 1]
    assert quant_linear.config_for(1, 6144, 4096, "int4")["interleave"] == 1
    # up to 8 tokens on a weight 4x wider than deep: no split (N a multiple of 8), else split in 2
    assert [quant_linear.config_for(m, 28672, 4096, "int4")["split"] for m in (1, 8, 9)] == [1, 1, 2]
    assert quant_linear.config_for(1, 28676, 4096, "int4")["split"] == 2
    assert quant_linear.config_for(1, 14336, 4096, "int4")["split"] == 2
    two_slabs = {**quant_linear.config_for(256), **NAMED["two_slabs"]}
    assert quant_linear.config_for(128, 6144, 4096, "int4") == two_slabs  # past 64 tokens, a wide weight
    assert quant_linear.config_for(200, 4096, 14336, "int4") == two_slabs  # and anything past 128
    assert quant_linear.config_for(128, 4096, 4096, "int4")["warpgroups"] == 1
    one_pass = {**quant_linear.config_for(256), **NAMED["one_pass"]}
    assert one_pass in versions.space(V8) and quant_linear.writes_slabs(one_pass, "int4")
    assert not quant_linear.writes_slabs(two_slabs, "int4")
    # without a split from FILLING_TILES tiles of 128 x 128 (past one wave of the split's CTAs), N a multiple of 8
    assert quant_linear.config_for(128, 28672, 4096, "int4") == one_pass  # 224 tiles
    assert quant_linear.config_for(256, 6144, 4096, "int4") == one_pass  # 96 tiles
    assert quant_linear.config_for(256, 4096, 4096, "int4") == two_slabs  # 64 tiles: 128 CTAs, one wave
    assert quant_linear.config_for(128, 9216, 4096, "int4") == one_pass  # 72 tiles: the split's 144 CTAs, two
    assert quant_linear.config_for(1024, 4096, 4096, "int4") == one_pass
    assert quant_linear.config_for(1024, 4100, 4096, "int4") == two_slabs  # rows of 8200 bytes
    fp8_tile = quant_linear.config_for(200, 6148, 1024, "fp8_e4m3")  # 98 tiles: fp8 keeps the exchange
    assert fp8_tile["split"] == 1 and not quant_linear.writes_slabs(fp8_tile, "fp8_e4m3")
    assert quant_linear.config_for(64, 4096, 14336, "int4")["interleave"] == 2  # a long K at 17-64 tokens
    assert quant_linear.config_for(64, 14336, 4096, "int4")["interleave"] == 1
    for n, k in ((4096, 4096), (28672, 4096)):  # 17-32 tokens: a tile of 32, but on a long K
        assert [quant_linear.config_for(m, n, k, "int4")["block_m"] for m in (16, 17, 32, 33)] == [16, 32, 32, 64]
    assert quant_linear.config_for(17, 4096, 14336, "int4") == quant_linear.config_for(64, 4096, 14336, "int4")
    assert quant_linear.config_for(256, 6144, 4096, "fp8_e4m3")["warpgroups"] == 2  # measured for fp8 too
    for weight_format in ("fp8_e4m3", "int6", "int4_channel"):  # each one V8 declares (built, protocol-checked)
        extras = [
            {k: v for k, v in c.items() if k != "weight"} for c in V8.EXTRA_CONFIGS if c["weight"] == weight_format
        ]
        declared = [{"interleave": 1, **c} for c in (*versions.space(V8), *extras)]
        for config in quant_linear.configs(weight_format):
            assert {**config, "chunk": 64} in declared or config in declared, config
    fp8 = functools.partial(quant_linear.config_for, weight_format="fp8_e4m3")
    assert fp8(16, 6144, 4096) == quant_linear.config_for(16) and fp8(1, 4096, 4096)["block_m"] == 8
    assert fp8(1, 4096, 14336)["interleave"] == fp8(16, 4096, 14336)["interleave"] == 2  # a long K
    assert fp8(1, 4096, 4096)["interleave"] == fp8(16, 4096, 4096)["interleave"] == 2  # and a square one
    assert fp8(1, 6144, 4096)["interleave"] == fp8(16, 6144, 4096)["interleave"] == 1  # not a wider one
    int6 = functools.partial(quant_linear.config_for, weight_format="int6")
    assert [int6(m, 4096, n)["interleave"] for m in (1, 16, 17) for n in (4096, 14336)] == [2, 2, 2, 2, 1, 1]
    assert int6(1, 6144, 4096)["interleave"] == int6(16, 6144, 4096)["interleave"] == 1
    assert fp8(1, 28672, 4096)["interleave"] == 2 and fp8(16, 28672, 4096)["split"] == 4  # a wide weight
    # 33-64 tokens: fp8 on a weight wider than deep two consumer warpgroups a CTA, int6 on a long K two a slab
    assert [fp8(m, 6144, 4096)["warpgroups"] for m in (32, 33, 64, 65)] == [1, 2, 2, 2]
    assert fp8(64, 4096, 4096)["warpgroups"] == fp8(64, 4096, 14336)["warpgroups"] == 1
    assert [int6(m, 4096, 14336)["interleave"] for m in (32, 33, 64, 65)] == [1, 2, 2, 1]
    assert int6(64, 4096, 4096)["interleave"] == int6(64, 6144, 4096)["interleave"] == 1
    for m, n, k in ((1, 28672, 4096), (1, 4096, 14336), (16, 4096, 4096), (1024, 4096, 4096)):  # int4's rules
        assert quant_linear.config_for(m, n, k, "int4_channel") == quant_linear.config_for(m, n, k, "int4")
    for config in versions.space(V8):
        assert V8.shared_bytes(**config) <= build.SHARED_MEMORY_LIMIT["sm_90a"] - 1024, config


@pytest.mark.parametrize("weight_format", sorted(quant_linear.rules()["max_tokens"]))
def test_configs_hold_every_configuration_the_call_takes(weight_format):
    """``configs`` is what prebuilds, the protocol's declared space and the benches build from: a
    configuration the call takes and it misses is built on the user's first call instead."""
    listed = [quant_linear.kernel_config(weight_format, c) for c in quant_linear.configs(weight_format)]
    tokens = [*range(1, 80), 96, 127, 128, 129, 200, 255, 256, 257, 300, 511, 512, 513, 1024, 1535, 1536]
    weights = [(n, k) for n in (64, 200, 1000, 4096, 4100, 6144, 12288, 28672, 28676) for k in (128, 1024, 4096, 14336)]
    for m in (t for t in tokens if t <= quant_linear.max_tokens(weight_format)):
        for n, k in weights:
            config = quant_linear.kernel_config(weight_format, quant_linear.config_for(m, n, k, weight_format))
            assert config in listed, (m, n, k, config)


def test_representative_build_and_markers():
    result = representative_build("sm_90a", "v8")
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0
    assert 0 <= result.shared_bytes - V8.shared_bytes(**V8.REPRESENTATIVE) < 1024
    found = build.markers_found(result, V8.PTX_MARKERS)
    assert all(found.values()), found
    # A from registers: four 32-bit registers where V7 has a shared-memory descriptor
    ptx = result.ptx()
    assert re.search(r"m64n16k16\.f32\.f16\.f16 \{[^}]*\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+", ptx)
    assert ptx.count("wgmma.mma_async") == 8  # 8 K steps of 16: one 128-column group a K block
    # the widening of a thread's 8 words a K block (pipeline.widen.int4_pairs): a lop3 and one
    # 16-bit-pair instruction a pair of values, the magic number with the sign's offset folded in,
    # and no prmt (the packed order is the registers' order)
    assert (ptx.count("lop3.b32"), ptx.count("sub.f16x2"), ptx.count("fma.rn.f16x2")) == (32, 16, 16)
    assert "prmt" not in ptx
    assert "1678271496u" in (result.program_dir / "module" / "source.cu").read_text()  # 0x64086408


# --- fp8 e4m3 with per-row scales: quantizer, layout and build (run: tests/test_v8_gpu.py) ---


def plain_fp8(w):
    scale = w.float().abs().amax(dim=1) / 448
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (w.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def kernel_reads_fp8(words, n_pad, k):
    """q [N_pad, K] bytes as V8's fp8 path reads the packed words (matmul.quant.fp8's docstring)."""
    q = torch.empty(n_pad, k, dtype=torch.uint8)
    data = words.contiguous().view(torch.uint8).view(n_pad // 2, k * 2)  # 4 bytes a word, little-endian
    for i in range(n_pad // 64):
        for b in range(k // 128):
            tile = data[32 * i : 32 * i + 32, 256 * b : 256 * b + 256].reshape(-1)  # byte 256 r + column
            for p in range(4):
                for t in range(128):
                    warp, g, c = t // 32, (t % 32) // 4, t % 4
                    for value in range(16):
                        step, e = value // 8, value % 8
                        row = 64 * i + 16 * warp + g + 8 * ((e // 2) % 2)
                        col = 128 * b + 32 * p + 16 * step + 2 * c + e % 2 + 8 * (e // 4)
                        q[row, col] = tile[(p * 128 + t) * 16 + value]
    return q


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fp8_quantize_matches_plain_torch(dtype):
    w = weight(70, 256, dtype)
    w[5] = 0
    qw = matmul.quantize(w, format="fp8_e4m3")
    q, s = plain_fp8(w)
    assert (qw.format, qw.bits, qw.group, qw.shape, qw.dtype) == ("fp8_e4m3", 8, 256, (70, 256), dtype)
    assert torch.equal(qw.q().view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(qw.group_scales()[:, 0], s)
    assert torch.equal(qw.dequantize(), (q.float() * s[:, None]).to(dtype))


def test_fp8_packed_layout_is_what_the_kernel_reads():
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(100, 256, generator=g) * 50).to(torch.float8_e4m3fn)
    words = fp8.pack(q)
    assert words.shape == (128 // 2, 256 // 2) and words.dtype == torch.int32
    assert torch.equal(fp8.unpack(words, 100).view(torch.uint8), q.view(torch.uint8))
    read = kernel_reads_fp8(words, 128, 256)
    assert torch.equal(read[:100], q.view(torch.uint8)) and (read[100:] == 0).all()


def test_fp8_errors():
    with pytest.raises(MatmulInputError, match="one scale per row"):
        matmul.quantize(weight(64, 256), format="fp8_e4m3", group=64)
    with pytest.raises(MatmulInputError, match="multiple of 128"):
        matmul.quantize(weight(64, 200), format="fp8_e4m3")


@pytest.mark.parametrize("dtype", [tilus.float16, pytest.param(tilus.bfloat16, marks=pytest.mark.full_space)], ids=str)
def test_fp8_path_builds(dtype):
    schedule = {"dtype": dtype, **V8.REPRESENTATIVE, "weight": "fp8_e4m3"}
    result = build.build_script(V8.Kernel, "sm_90a", schedule, version="v8")
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0
    ptx = result.ptx()
    assert ptx.count("wgmma.mma_async") == 8 and ptx.count("ld.shared.v4") >= 4  # 4 parts of 16 bytes
    # the weight tile is one TMA box of 8 KiB; no group scales come through the ring
    assert re.search(r"m64n16k16\.f32\.\w+\.\w+ \{[^}]*\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+", ptx)


# --- int4 with one scale per row (int4_channel): quantizer, errors and build (run: tests/test_v8_gpu.py) ---


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_int4_channel_quantize_matches_plain_torch(dtype):
    """One group the whole row (``plain_int4`` with group K), its scale kept in float32 as fp8's; the
    values packed as int4's, so the kernel reads them as it reads int4's (the layout test above)."""
    w = weight(70, 256, dtype)
    w[5] = 0
    qw = matmul.quantize(w, format="int4_channel")
    assert (qw.format, qw.bits, qw.group, qw.shape, qw.dtype) == ("int4_channel", 4, 256, (70, 256), dtype)
    scale = w.float().abs().amax(dim=1) / 7
    scale[5] = 1
    q = torch.round(w.float() / scale[:, None]).clamp(-8, 7).to(torch.int8)
    assert torch.equal(qw.q(), q) and torch.equal(qw.packed, int4.pack(q))
    assert qw.scales.dtype == torch.float32 and qw.scales.shape == (128,) and (qw.scales[70:] == 0).all()
    assert torch.equal(qw.group_scales()[:, 0], scale)
    assert torch.equal(qw.dequantize(), (q.float() * scale[:, None]).to(dtype))
    assert qw.dequantize()[5].eq(0).all()


def test_int4_channel_errors():
    with pytest.raises(MatmulInputError, match="one scale per row"):
        matmul.quantize(weight(64, 256), format="int4_channel", group=64)
    with pytest.raises(MatmulInputError, match="multiple of 128"):
        matmul.quantize(weight(64, 200), format="int4_channel")
    with pytest.raises(MatmulInputError, match="format='int4_channel'"):  # the way to one scale a row
        matmul.quantize(weight(64, 256), format="int4", group=None)
    assert matmul.quantize(weight(64, 256), format="int4_channel", group=256).group == 256


@pytest.mark.parametrize("dtype", [tilus.float16, pytest.param(tilus.bfloat16, marks=pytest.mark.full_space)], ids=str)
def test_int4_channel_path_builds(dtype):
    """int4's consumer without group scales: the same widening of the integers (int4's instructions,
    no scale in them), no scales' box in the ring, and the float32 row scales read once from global
    memory for the partial tile."""
    schedule = {"dtype": dtype, **V8.REPRESENTATIVE, "weight": "int4_channel"}
    result = build.build_script(V8.Kernel, "sm_90a", schedule, version="v8")
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0
    grouped = build.build_script(V8.Kernel, "sm_90a", {"dtype": dtype, **V8.REPRESENTATIVE}, version="v8")
    ptx, int4_ptx = result.ptx(), grouped.ptx()
    assert ptx.count("wgmma.mma_async") == 8
    for instruction in ("lop3.b32", "sub.f16x2", "fma.rn.f16x2", "sub.bf16x2", "fma.rn.bf16x2"):
        assert ptx.count(instruction) == int4_ptx.count(instruction), instruction
    assert ptx.count("cp.async.bulk.tensor") == int4_ptx.count("cp.async.bulk.tensor") - 1  # no scales' box
    assert "ld.global" in ptx and "ld.global" not in int4_ptx  # the row scales, once
    assert "mul.f16" not in ptx and "mul.ftz.f32" in ptx  # no value scaled in 16 bits; the sum in float32


# --- int6 (an odd width), group scales as int4's: quantizer, layout and build (run: tests/test_v8_gpu.py) ---


def kernel_reads_int6(words, n_pad, k):
    """u [N_pad, K] (q + 32) as V8's int6 path reads the packed words (matmul.quant.int6's docstring):
    each 32-bit word two whole pairs 16 bits apart, and a group's shared word the split pairs' high bits."""
    u = torch.empty(n_pad, k, dtype=torch.int64)
    for i in range(n_pad // 64):
        for b in range(k // 128):
            tile = words[32 * i : 32 * i + 32, 48 * b : 48 * b + 48].reshape(-1)  # word 48 r + column
            for h in range(2):
                for t in range(128):
                    warp, g, c = t // 32, (t % 32) // 4, t % 4
                    mine = [int(tile[(h * 128 + t) * 6 + j]) & 0xFFFFFFFF for j in range(6)]
                    pairs = []  # pair 8 group + 4 own + s (own: the group's word)
                    for group in range(2):
                        top = mine[4 + group]  # the group's shared word
                        for own in range(2):
                            word = mine[2 * group + own]
                            pairs += [(word & 0x3F, (word >> 16) & 0x3F), ((word >> 6) & 0x3F, (word >> 22) & 0x3F)]
                            high = top >> (12 + 2 * own)
                            pairs.append(
                                (((word >> 12) & 0xF) | ((high & 3) << 4), (word >> 28) | (((high >> 16) & 3) << 4))
                            )
                            pairs.append(((top >> (6 * own)) & 0x3F, (top >> (16 + 6 * own)) & 0x3F))
                    for value in range(32):
                        step, e = value // 8, value % 8
                        row = 64 * i + 16 * warp + g + 8 * ((e // 2) % 2)
                        col = 128 * b + 16 * (4 * h + step) + 2 * c + e % 2 + 8 * (e // 4)
                        u[row, col] = pairs[value // 2][value % 2]
    return u


def test_the_call_runs_v8_only_up_to_its_formats_limit(monkeypatch):
    """Never a call slower than widening the weight and calling cuBLAS (issue #25): every format
    runs V8 up to 256 tokens (int6 beat the widened path at 192 and 256 tokens on the H200 once it
    widened two values at a time: plots/h200/v8-configs/int6-past-64/), then where its tiles fill their
    waves well enough (``prefill_pays``), int4 up to 1536 tokens (plots/h200/v8-configs/int4-prefill/), int6 and
    fp8 up to 512 with a cheaper widening to beat (plots/h200/v8-configs/prefill-crossing/). (This CPU is made
    to look like a Hopper GPU: only the choice of path is checked.)"""
    monkeypatch.setattr(quant_linear, "runs_here", lambda device: True)
    for fmt, limit in (("int4", 1536), ("fp8_e4m3", 512), ("int6", 512)):
        qw = matmul.quantize(weight(256, 256), format=fmt)
        assert quant_linear.max_tokens(fmt) == limit
        assert [quant_linear.uses_v8(m, qw) for m in (1, 128, 129, 256, 257)] == [
            True,
            True,
            limit > 128,
            limit > 128,
            False,  # 256 rows: widening is cheaper than V8's wave of 6 CTAs
        ], fmt
    pays = quant_linear.prefill_pays
    assert pays(384, 4096) and pays(1024, 4096) and pays(1536, 4096) and pays(512, 6144)  # measured faster
    assert not pays(768, 4096)  # 192 tiles: a last wave 45% full, measured slower than widening
    assert not pays(1024, 4100)  # no TMA stores into rows of 8200 bytes
    qw = matmul.quantize(weight(4096, 256), format="int4")
    assert [quant_linear.uses_v8(m, qw) for m in (257, 768, 1024, 1536, 1537)] == [True, False, True, True, False]
    for fmt in LARGE_TILE_FORMATS:  # each measured at 384 and 512 tokens on the Llama's weights
        faster = [(384, 4096), (384, 14336), (384, 28672), (512, 4096), (512, 14336), (512, 28672), (512, 128256)]
        assert all(pays(m, n, fmt) for m, n in faster), fmt
        assert not pays(384, 6144, fmt) and not pays(512, 6144, fmt)  # a last wave a tenth or a half full
        qw = matmul.quantize(weight(4096, 256), format=fmt)
        assert [quant_linear.uses_v8(m, qw) for m in (257, 384, 512, 513, 640)] == [True, True, True, False, False]


@pytest.mark.parametrize("weight_format", LARGE_TILE_FORMATS)
def test_large_tile_decode_tiles(weight_format):
    """int6 and fp8 at decode sizes: a token tile of 32 at 17-32 tokens, on every weight (a long K
    too); int6 up to 8 tokens a tile of 8 but on a weight 4x wider than deep, a tile of 16 from 9
    (the faster of the two tiles probed on the H200: plots/h200/v8-configs/decode-tiles/)."""
    for n, k in ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)):
        assert quant_linear.config_for(16, n, k, weight_format)["block_m"] == 16
        for m in (17, 32):
            assert quant_linear.config_for(m, n, k, weight_format) == {**quant_linear.config_for(m), "block_m": 32}
        assert quant_linear.config_for(33, n, k, weight_format)["block_m"] == 64
    if weight_format == "int6":
        for m in (1, 8):
            square = {**quant_linear.config_for(16), "block_m": 8, "interleave": 2}
            assert quant_linear.config_for(m, 4096, 4096, "int6") == square
            assert quant_linear.config_for(m, 4096, 14336, "int6")["block_m"] == 8
            assert quant_linear.config_for(m, 28672, 4096, "int6") == quant_linear.config_for(16)  # 7x wider
        assert quant_linear.config_for(9, 4096, 4096, "int6") == {**quant_linear.config_for(16), "interleave": 2}


@pytest.mark.parametrize("weight_format", LARGE_TILE_FORMATS)
def test_large_tile_configurations_past_64_tokens(weight_format):
    """int6 and fp8 from 65 tokens: two consumer warpgroups a CTA where the weight is wider than deep
    or past 128 tokens, without a split where the output's 128 x 128 tiles fill the GPU (int4's
    rule, ``config_for``), with the stages their tiles leave room for; one warpgroup on a square
    or long-K weight at up to 128 tokens (each the fastest probed on the H200, in both formats:
    plots/h200/v8-configs/int6-past-64/, plots/h200/v8-configs/fp8-past-64/)."""
    base = quant_linear.config_for(128)
    expected = {
        (128, 6144, 4096): NAMED["large_two_slabs"],  # 48 output tiles
        (128, 28672, 4096): NAMED["large_one_pass"],  # 224
        (128, 4096, 4096): base,
        (128, 4096, 14336): base,
        (192, 4096, 4096): NAMED["large_two_slabs"],  # 64
        (192, 6144, 4096): NAMED["large_one_pass"],  # 96
        (128, 11008, 4096): NAMED["large_one_pass"],  # 86
        (128, 8704, 4096): NAMED["large_one_pass"],  # 68: the split's 136 CTAs take two waves
        (128, 8192, 4096): NAMED["large_two_slabs"],  # 64
        (256, 4096, 14336): NAMED["large_two_slabs"],  # 64
        (256, 28672, 4096): NAMED["large_one_pass"],
    }
    for shape, config in expected.items():
        chosen = quant_linear.config_for(*shape, weight_format)
        assert {key: chosen[key] for key in config} == config, shape
    at_64 = quant_linear.config_for(64, 28672, 4096, weight_format)  # fp8 wider than deep: two consumers a CTA
    assert at_64 == {**quant_linear.config_for(64), "warpgroups": 2 if weight_format == "fp8_e4m3" else 1}


def test_int6_quantize_and_layout():
    w = weight(100, 256, torch.bfloat16)
    qw = matmul.quantize(w, format="int6")
    assert (qw.format, qw.bits, qw.group) == ("int6", 6, 128) and qw.packed.shape == (64, 96)
    q, s = int6.reference(w)
    assert q.min() >= -32 and q.max() <= 31 and torch.equal(qw.q(), q)
    assert torch.equal(qw.dequantize(), q.to(torch.bfloat16) * s.repeat_interleave(128, dim=1))
    read = kernel_reads_int6(qw.packed, 128, 256)
    assert torch.equal(read[:100] - 32, q.to(torch.int64)) and (read[100:] == 32).all()  # padding: q = 0


@pytest.mark.parametrize("dtype", [tilus.float16, pytest.param(tilus.bfloat16, marks=pytest.mark.full_space)], ids=str)
def test_int6_path_builds(dtype):
    """Each pair of values is made by one 16-bit-pair instruction after the masks (``int6_pairs``),
    in either dtype: no value goes through a conversion (bfloat16 once went through float16,
    ``cvt.f32.f16``, and tilus's generic 6-bit cast took two to three ``lop3`` a pair)."""
    schedule = {"dtype": dtype, **V8.REPRESENTATIVE, "weight": "int6"}
    result = build.build_script(V8.Kernel, "sm_90a", schedule, version="v8")
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0
    ptx = result.ptx()
    assert ptx.count("wgmma.mma_async") == 8
    pair = "sub.f16x2" if dtype == tilus.float16 else "fma.rn.bf16x2"
    assert ptx.count(pair) == 32  # two halves of 16 pairs (one K block: the loop is not unrolled)
    assert ptx.count("lop3.b32") == 32  # a pair's mask and magic number in one lop3
    assert "cvt.f32.f16" not in ptx  # no float16 step on the way to bfloat16


# --- the widening kernel (matmul.quant.widen): built for sm_90a here, checked bit for bit on the GPU ---


@pytest.mark.parametrize(
    "weight, dtype",
    [
        ("int4", tilus.float16),
        ("int4_channel", tilus.float16),
        pytest.param("int4", tilus.bfloat16, marks=pytest.mark.full_space),
        pytest.param("int4_channel", tilus.bfloat16, marks=pytest.mark.full_space),
        pytest.param("int6", tilus.float16, marks=pytest.mark.full_space),
        pytest.param("int6", tilus.bfloat16, marks=pytest.mark.full_space),
        pytest.param("fp8_e4m3", tilus.float16, marks=pytest.mark.full_space),
        pytest.param("fp8_e4m3", tilus.bfloat16, marks=pytest.mark.full_space),
    ],
    ids=str,
)
def test_widening_kernel_builds(weight, dtype):
    result = build.build_script(widen.WidenKernel, "sm_90a", {"dtype": dtype, "weight": weight}, version="widen")
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0 and result.threads == 128
    assert result.shared_bytes == 64 * 128 * 2  # a staging buffer per part: the tile's 16 KiB
    ptx = result.ptx()
    # a thread's words of a part come in vector loads (16 bytes; int6's 24 in 8-byte pieces), never
    # word by word; the tile is written by TMA stores of the staged parts, never by st.global
    assert re.search(r"ld\.global\.nc\.v[24]\.u32", ptx) and not re.search(r"ld\.global\.nc\.[us]32", ptx)
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx and "stmatrix" in ptx
    assert "st.global" not in ptx


def test_widening_falls_back_to_torch_without_a_gpu():
    qw = matmul.quantize(weight(100, 256))
    assert not quant_linear.runs_here(qw.device)
    assert torch.equal(quant_linear.widen(qw), qw.dequantize())
    out = torch.empty(100, 256, dtype=torch.float16)
    assert quant_linear.widen(qw, out=out) is out and torch.equal(out, qw.dequantize())
    assert not matmul.call.api._chooser.building, "a build was started where the kernel does not run"
    assert quant_linear.kernel_config("fp8_e4m3", {"chunk": 64})["chunk"] == 32
    assert quant_linear.kernel_config("int6", {"chunk": 32})["chunk"] == 64
    assert quant_linear.kernel_config("int4", {"chunk": 32})["chunk"] == 32


@pytest.mark.parametrize("weight_format", ["int4", "fp8_e4m3"])
def test_a_quantized_layer_compiles_fullgraph_into_one_operator(weight_format):
    """dynamo cannot trace ``linear``'s own Python on a quantized weight (it reads data pointers): it
    traces ``torch.ops.tilus_matmul.quantized_linear``, whose body is that path, and the epilogue
    after it, in one graph. The compiled layer gives the eager layer's result, ``matmul(x, qw.T)`` and
    ``out=`` too (on the CPU the operator runs the widened path)."""
    weight = torch.randn(200, 256, dtype=torch.float16)
    layer = matmul.nn.QuantizedLinear(matmul.quantize(weight, format=weight_format), torch.randn(200).half())
    qw = layer.weight
    traced = []

    def backend(gm, inputs):
        traced.append([str(node.target) for node in gm.graph.nodes if node.op == "call_function"])
        return gm

    def product_into(x, out):
        return matmul.matmul(x, qw.T, out=out)

    x = torch.randn(2, 5, 256, dtype=torch.float16)
    out = torch.full((10, 200), float("nan"), dtype=torch.float16)
    with torch.no_grad():
        assert torch.equal(torch.compile(layer, backend=backend, fullgraph=True)(x), layer(x))
        compiled = torch.compile(product_into, backend=backend, fullgraph=True)
        assert compiled(x.view(10, 256), out) is out and torch.equal(out, quant_linear.widened(x.view(10, 256), qw))
    assert traced[0] == ["tilus_matmul.quantized_linear", "<built-in function add>"]
    assert traced[1][0] == "tilus_matmul.quantized_linear" and len(traced) == 2


def test_a_packed_weight_passes_gradients_to_its_input_and_bias():
    """A quantized layer is frozen, but what feeds it still learns (the layers before it, low-rank
    adapters on a frozen quantized model): dX = dY W with W the widened weight, the bias's gradient the sum of dY, and
    none for the packed weight. On the CPU the operator runs the widened path."""
    qw = matmul.quantize(torch.randn(200, 256, dtype=torch.float16))
    x = torch.randn(2, 5, 256, dtype=torch.float16, requires_grad=True)
    bias = torch.randn(200, dtype=torch.float16, requires_grad=True)
    grad = torch.randn(2, 5, 200)
    matmul.linear(x, qw, bias, "silu").float().backward(grad)
    xr, br = x.detach().float().requires_grad_(), bias.detach().float().requires_grad_()
    torch.nn.functional.silu(xr @ qw.dequantize().float().T + br).backward(grad)
    for ours, theirs in ((x.grad, xr.grad), (bias.grad, br.grad)):
        assert ours.dtype == torch.float16 and (ours.float() - theirs).norm() / theirs.norm() < 4e-3
    with pytest.raises(MatmulInputError, match="automatic differentiation"):
        matmul.matmul(x.view(10, 256), qw.T, out=torch.empty(10, 200, dtype=torch.float16))
    bias.grad = None  # a bias that learns under a frozen input: its gradient through torch's add
    frozen = x.detach()
    matmul.linear(frozen, qw, bias).float().backward(grad)
    expected = grad.sum((0, 1))
    assert (bias.grad.float() - expected).norm() / expected.norm() < 2e-3


@pytest.mark.parametrize("weight_format", ["int4", "int6", "fp8_e4m3"])
def test_a_weight_with_an_infinity_or_nan_is_refused_and_zero_groups_are_exact(weight_format):
    """A non-finite weight would make its group's scale inf or NaN and lose all 128 values of the
    group (torch's fp16 product loses only the outputs it touches): refused at packing. A group of
    zeros (a pruned row) has scale 0 and dequantizes to exact zeros, not NaN."""
    w = torch.randn(64, 256, dtype=torch.float16)
    w[3], w[5, :128] = 0, 0
    dequantized = matmul.quantize(w, format=weight_format).dequantize()
    assert torch.isfinite(dequantized).all() and not dequantized[3].any() and not dequantized[5, :128].any()
    for value in (float("inf"), float("nan")):
        bad = w.clone()
        bad[7, 9] = value
        with pytest.raises(MatmulInputError, match="1 infinite or NaN"):
            matmul.quantize(bad, format=weight_format)


def test_a_packed_weights_bias_and_out_are_checked_as_a_dense_ones():
    qw = matmul.quantize(torch.randn(200, 256, dtype=torch.float16))
    x = torch.randn(5, 256, dtype=torch.float16)
    with pytest.raises(MatmulInputError, match="like x"):
        matmul.linear(x, qw, torch.randn(200))  # float32: torch refuses to add it to a float16 product
    with pytest.raises(MatmulInputError, match=r"\[N\] = \[200\]"):
        matmul.linear(x, qw, torch.randn(201).half())
    with pytest.raises(MatmulInputError, match="several places"):
        matmul.matmul(x, qw.T, out=torch.empty(1, 200, dtype=torch.float16).expand(5, 200))
    matmul.linear(x, qw)  # keeps the launch for this signature where V8 runs; the bias is still checked
    with pytest.raises(MatmulInputError, match="like x"):
        matmul.linear(x, qw, torch.randn(200))
    out = torch.full((5, 200), float("nan"), dtype=torch.float16)
    assert matmul.matmul(x, qw.T, out=out) is out and not out.isnan().any()  # out itself, as torch's out=
    x3 = x.view(5, 1, 256)
    out3 = torch.full((5, 1, 200), float("nan"), dtype=torch.float16)
    assert quant_linear.linear(x3, qw, out=out3) is out3 and not out3.isnan().any()


def test_a_packed_products_out_must_not_share_memory_with_what_it_reads():
    """V8 reads x, the packed words and the scales while it writes out: an out over any of them is
    refused (as the dense path's), one beside them is written."""
    qw = matmul.quantize(torch.randn(200, 256, dtype=torch.float16))
    buffer = torch.randn(2, 5, 456, dtype=torch.float16)
    x = buffer[..., :256]
    with pytest.raises(MatmulInputError, match="out overlaps x"):
        matmul.matmul(x[0], qw.T, out=buffer[0, :, 200:400])  # x's last 56 columns
    with pytest.raises(MatmulInputError, match="out overlaps x"):
        quant_linear.linear(x, qw, out=buffer[..., 200:400])  # 3-D, as x
    with pytest.raises(MatmulInputError, match="out overlaps the packed weight"):
        matmul.matmul(x[0], qw.T, out=qw.packed.view(torch.float16).view(-1)[:1000].view(5, 200))
    long = matmul.quantize(torch.randn(200, 1280, dtype=torch.float16))  # scales [10, 256]: room for an out
    with pytest.raises(MatmulInputError, match="out overlaps the weight's scales"):
        matmul.matmul(torch.randn(5, 1280).half(), long.T, out=long.scales.view(-1)[:1000].view(5, 200))
    out = buffer[0, :, 256:456]  # beside x in the same rows
    assert matmul.matmul(x[0], qw.T, out=out) is out
    torch.testing.assert_close(out.float(), x[0].float() @ qw.dequantize().float().T, atol=2e-2, rtol=2e-2)


def test_a_packed_layers_gradients_under_torch_compile_are_the_eager_ones():
    """The operator's autograd formula is what a compiled training step differentiates (aot_eager:
    the graph torch.compile makes, run by torch); fullgraph: no break at the packed layer."""
    qw = matmul.quantize(torch.randn(200, 256, dtype=torch.float16))
    bias = torch.randn(200, dtype=torch.float16, requires_grad=True)
    x = torch.randn(2, 5, 256, dtype=torch.float16, requires_grad=True)

    def loss(x, bias):
        return matmul.linear(x, qw, bias, "silu").float().sum()

    torch.compile(loss, backend="aot_eager", fullgraph=True)(x, bias).backward()
    compiled = (x.grad.clone(), bias.grad.clone())
    x.grad = bias.grad = None
    loss(x, bias).backward()
    assert torch.equal(compiled[0], x.grad) and torch.equal(compiled[1], bias.grad)
