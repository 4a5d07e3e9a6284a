"""``x @ qw.T`` for a ``QuantizedWeight``: Hopper V8 up to ``V8_MAX_M`` tokens, else the weight
widened once per call (on a Hopper GPU by ``matmul.quant.widen``'s kernel once the call's build
child has built it, until then and elsewhere by torch) and cuBLAS (``matmul.quant``'s module doc).

V8's configuration is picked by token count (for int4, int6 and fp8, also by the weight's shape:
``config_for``) from what was fastest on the H100 and the H200 over the bench's weights
(``plots/h100/v8/``, ``plots/h200/``), not tuned per call: the tuner and its cache belong to
``matmul.call``. Up to 256 tokens V8 was faster than the widened path on every int4 and fp8 weight
measured, and on every int6 weight measured on the H200 (the widening costs more than the product:
``matmul.quant.widen`` says when widen-once pays). int4 goes on to ``INT4_MAX_M`` tokens where
V8's tiles fill the GPU's waves well enough to beat widening (``prefill_pays``): there V8 runs
``ONE_PASS``, a CTA of 128 x 128 that writes its slabs of C by TMA stores as V7 does
(``plots/h200/v8-prefill/``); int6 and fp8 go on the same way to ``LARGE_TILE_MAX_M``
(``plots/h200/prefill-crossing/``).

V8's kernels are built off the caller's path, as the call's other kernels are: by the call's build
child (``matmul.call.building.v8_in_child``, one kernel per dtype, format and configuration as
``kernel_config`` builds it; tilus caches the build on disk), the caller only opening the library.
The first call that needs a kernel starts its build; until it is ready, and for good if it did not
build (with a warning), that call and the next run the widened path above, which computes the same
product, so no call waits for a compiler. A call inside a CUDA graph capture starts no build: it
runs V8 if its kernel is built, else the widened path. Tests and benchmarks that time V8, capture it
or check its output wait for its build first (``wait_until_built``).

At decode sizes V8's kernel takes a few microseconds, less than the host takes to decide what to
launch, so a model run without CUDA graphs would wait on the host: a call whose input signature
V8 has run before runs the launch kept for it (``_launches``), none of the checks and choices of the
first.
"""

from __future__ import annotations

import logging
import weakref
from typing import Optional

import torch

from ..contract import MatmulInputError, check_apart, check_bias, check_no_internal_overlap, empty_padded
from ..kernels import device_context, versions
from ..kernels.child_built import ChildBuilt, capturing
from ..kernels.variant import torch_epilogue
from . import INT4_PACKED, QuantizedWeight, TransposedWeight
from . import widen as device_widen

# the most tokens V8 takes in every format whatever the weight's shape (its widest configuration: two
# tiles of 128); past it only where its tiles fill the GPU's waves (``prefill_pays``), up to the
# format's ``MAX_TOKENS``
V8_MAX_M = 256
# int4 past V8_MAX_M tokens, where ``prefill_pays``: up to 1536 tokens V8 in ONE_PASS was faster than
# the widened path wherever its tiles fill their waves (0.87-0.92x cuBLAS fp16 at 1024-1536 tokens on
# the H200, against widen + cuBLAS's 0.79-0.84x); at 2048 the two were even in float16 and widening
# ahead in bfloat16 (0.86 against 0.88x), as it is ever more from there (plots/h200/v8-prefill/)
INT4_MAX_M = 1536
# int6, widened two values at a time, with two consumer warpgroups a CTA past 128 tokens, beat the
# widened path at 192 and 256 tokens on every weight probed (plots/h200/int6-pairs/probe/)
# int4 with row scales (``int4_channel``) runs int4's packed tiles and consumer with less work a K
# block (no group scales): it takes int4's token counts and configurations (``config_for``)
# int6 and fp8 past V8_MAX_M tokens, where ``prefill_pays`` with their own price of widening: at 384
# and 512 tokens on the Llama's weights V8 (LARGE_TILE_ONE_PASS) was 1.05-1.32x faster than the
# widened path wherever the rule takes it and 0.78-0.96x where it widens (the 6144-row weight, its
# last wave a tenth or a half full); checked at 320 and 448 tokens after, the rule was on the faster
# side on 19 of 20 (fp8 at 320 x 4096 x 4096: V8 0.93x); at 640-768 tokens V8 was level or behind
# on most weights, and the rule would still have taken it on some (plots/h200/prefill-crossing/)
LARGE_TILE_MAX_M = 512
MAX_TOKENS = {"int4": INT4_MAX_M, "int4_channel": INT4_MAX_M, "int6": LARGE_TILE_MAX_M, "fp8_e4m3": LARGE_TILE_MAX_M}
ARCH = "sm_90a"

log = logging.getLogger(__name__)

# (largest M, configuration), first match wins
CONFIGS = (
    (16, {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1}),
    (64, {"block_m": 64, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1}),
    (128, {"block_m": 128, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1}),
    (256, {"block_m": 128, "warpgroups": 1, "split": 1, "stages": 4, "chunk": 64, "interleave": 1}),
)
# int4 at decode sizes (plots/h100/v8/probe/): up to 8 tokens a tile of 8 (half the zero-filled
# token rows of a 16-token tile: 1.08x at 1 x 6144 x 4096), and where K is long against N (a
# down projection: few weight row tiles, each a long K range) two or four consumer warpgroups a
# slab taking its K blocks in turn (``interleave``: 1.10x at 4096 x 14336 against the K range cut
# in 8, plots/h100/v8/interleave/)
NARROW_M = 8
# int4 at 17-32 tokens: a tile of 32 (half the 64-token tile's wgmma work: 31.7 against 44.2 us at
# 17 x 28672 x 4096 on the H200, 1.1-1.4x on the three weights it was measured on; a long K keeps two
# consumers a slab in a tile of 64, against which it was not measured, plots/h200/v8-tokens/)
MID_M = 32
LONG_K = 3  # K >= LONG_K * N
# fp8 at decode sizes (plots/h100/v8/fp8-configs/): its 8 KiB tiles want a long K range interleaved
# over two consumer warpgroups, as int4's, and a wide weight (an MLP's gate-up) more CTAs: up to 8
# tokens two consumers a slab (50.0 against 53.4 us at 1 x 28672 x 4096), at 16 the K range cut in 4
# (49.7 against 50.4); on the H200 a square weight takes two consumers a slab too (1.12-1.13x at
# 1-8 tokens on 4096 x 4096, 1.05x at 16; level on 8192 x 8192, 0.98-1.01x: plots/h200/decode-interleave/)
WIDE_N = 4  # N >= WIDE_N * K
# int4 up to 8 tokens on such a weight: no split of K, each CTA's slab of C written by a TMA store
# (``v8.Kernel.writes_slabs``): an MLP's gate-up (448 row tiles) has CTAs enough without one, and
# the exchange and cluster barriers go (22.7 against 26.2 us at 1 x 28672 x 4096 on the H200; at 16
# tokens level, on the narrower weights the split's CTAs were faster: plots/h200/v8-prefill/decode/)
# int4 at 17-64 tokens on a long K: two consumers a slab, as at decode (1.22x at 64 x 4096 x 14336
# on the H200, plots/h200/v8-128-256/probe-decode-64/). Past 64 tokens (plots/h200/v8-128-256/): two
# consumer warpgroups a CTA (128 weight rows, the K range cut in 2, a 3-stage ring to fit) where one
# tile of 128 tokens meets a weight wider than deep (1.21-1.33x at 128 tokens on 6144 x 4096 and
# 28672 x 4096), and at every shape from 129 tokens (1.15-1.28x); a square or long-K weight at 128
# tokens keeps one warpgroup, which was as fast or faster
TWO_SLABS = {"block_m": 128, "warpgroups": 2, "split": 2, "stages": 3}
# The same CTA without the split, where there are output tiles enough to go round the SMs without
# it: no float32 partial tile to exchange, each warpgroup writes its slab of C by a TMA store as V7's
# (``v8.Kernel.writes_slabs``) and a 4-stage ring takes the room. On the H200 at 128-256 tokens:
# 1.30x cuBLAS at 128 x 28672 x 4096 (TWO_SLABS 1.00x), 0.87x at 256 x 6144 x 4096 (0.66x: 96
# tiles); with 64 tiles or fewer the split's CTAs were faster (256 x 4096 x 14336: 1.01x against
# 0.63x). TMA writes C only where its rows are whole 16-byte units: N a multiple of 8
ONE_PASS = {"block_m": 128, "warpgroups": 2, "split": 1, "stages": 4}
SMS = 132  # an H100's or H200's SMs: a wave of ONE_PASS's or TWO_SLABS's CTAs (one fits an SM)
# ONE_PASS from the tile count at which TWO_SLABS's CTAs (two a tile) no longer fit one wave: past
# SMS / 2 tiles the split takes two waves where ONE_PASS, half as many CTAs, takes one. On the H200
# at 64-96 tiles of 4096 deep (int4, both dtypes): TWO_SLABS 20.7 us at 64 tiles and 36 us from 72,
# ONE_PASS 28 us throughout, so 1.28x faster from 72 tiles and 0.75x at 64; int6 and fp8 1.15-1.32x
# at 86, 0.68-0.80x at 64 (plots/h200/int4-filling/, plots/h200/decode-tiles/)
FILLING_TILES = SMS // 2 + 1
# Widening an N x K weight (then cuBLAS on it) costs about what N / WIDEN_ROWS waves of ONE_PASS's
# tiles over the same K take (H200: 12.6 us to widen 4096 x 4096 beside 27 us a wave of 4096-deep
# tiles, 80 us for 28672 rows): the price a partial last wave of V8 is weighed against (prefill_pays)
WIDEN_ROWS = 9700
# ... and of int6's and fp8's LARGE_TILE_ONE_PASS, whose waves are slower than int4's against the
# same widening: the value that puts every shape measured at 384 and 512 tokens on its faster side
# (plots/h200/prefill-crossing/)
LARGE_TILE_WIDEN_ROWS = 12000
# int6 and fp8 past 64 tokens: int4's rule, with the stages their larger tiles (6 and 8 KiB a slab
# against int4's 4) leave room for (three stages of TWO_SLABS and four of ONE_PASS overflow shared
# memory); on the H200 the fastest configuration probed on every shape, in both formats, a square or
# long-K weight at up to 128 tokens keeping one warpgroup: against one warpgroup a CTA, 1.1-1.3x at
# 128-256 tokens in fp8 (plots/h200/int6-pairs/probe/, plots/h200/fp8-two-slabs/)
LARGE_TILE_FORMATS = ("int6", "fp8_e4m3")
LARGE_TILE_TWO_SLABS = {**TWO_SLABS, "stages": 2}
LARGE_TILE_ONE_PASS = {**ONE_PASS, "stages": 3}
# The same formats at decode sizes take token tiles that hold M at most twice, as int4 does: at 17-32
# tokens a tile of 32 (1.03-1.34x the tile of 64 in int6, 1.06-1.66x in fp8, on every weight probed,
# a long K included), and int6 up to 8 tokens a tile of 8 but on a weight 4x wider than deep
# (0.98-1.12x the tile of 16 on the others, 0.86x on 28672 x 4096), as fp8 already had it
# (plots/h200/decode-tiles/)
# At 33-64 tokens (a tile of 64), on the H200: fp8 on a weight wider than deep two consumer
# warpgroups a CTA (64 weight rows each: 1.27-1.28x at 64 and 40 x 6144 x 4096, 1.21x at
# 64 x 28672 x 4096; on the square and the long-K weights 0.78x and 0.75x, kept as they were), int6
# on a long K two consumers a slab (1.18x at 64 x 4096 x 14336, level on the square), as int4 does
# (plots/h200/mid-tokens/)


def v8_module():
    return versions.load(ARCH, "v8")


def config_for(m: int, n: int = 0, k: int = 0, weight_format: str = "") -> dict:
    """V8's configuration for M tokens and, by format, the weight's N x K (the constants above say
    what each choice was measured against). In short, as tokens a tile / consumer warpgroups / split
    ("long K": K >= 3 N; "wide": N >= 4 K):

    - 1-8 tokens: 8 / 1 / 2. int4: K >= N interleaved over 2 warpgroups, a wide weight split 1;
      int6: K >= N interleaved over 2, a wide weight in tiles of 16; fp8: K >= N or a wide weight
      interleaved over 2.
    - 9-16: 16 / 1 / 2. int4: a long K interleaved over 4; int6 and fp8: K >= N over 2; fp8: a wide
      weight split 4.
    - 17-32: 32 / 1 / 2 (int4 on a long K: 64 / 1 / 2 interleaved over 2). 33-64: 64 / 1 / 2 (the same,
      int6's too; fp8 on a weight wider than deep: 64 / 2 / 2).
    - 65-128: 128 / 1 / 2, and past 128 tokens or on a weight wider than deep two warpgroups a CTA:
      without a split from ``FILLING_TILES`` output tiles of 128 x 128 (67: more than half the SMs;
      int6 and fp8 with their stages), else split 2.

    Past the format's token limit (``max_tokens``) the call widens the weight instead."""
    config = next((dict(config) for limit, config in CONFIGS if m <= limit), dict(CONFIGS[-1][1]))
    long_k = bool(n) and k >= LONG_K * n
    if weight_format in INT4_PACKED:
        if m <= 16:
            if m <= NARROW_M:
                config["block_m"] = NARROW_M
            if m <= NARROW_M and n and k >= n:  # a long K, or one as deep as N is wide: 1.00-1.16x
                config["interleave"] = 2  # on every such weight probed (plots/h200/int4-one-token/)
            elif long_k:
                config["interleave"] = 4
            elif m <= NARROW_M and n >= WIDE_N * k:
                config["split"] = 1  # many row tiles: no exchange (above)
        elif m <= 64:
            if long_k:
                config["interleave"] = 2
            elif m <= MID_M:
                config["block_m"] = MID_M
        elif m > 128 or n > k:
            config.update(ONE_PASS if output_tiles(m, n) >= FILLING_TILES and n % 8 == 0 else TWO_SLABS)
    if weight_format == "int6" and m <= NARROW_M and n and n < WIDE_N * k:
        config["block_m"] = NARROW_M
    if weight_format in LARGE_TILE_FORMATS and m <= 16 and n and k >= n:  # as deep as wide: two consumers
        config["interleave"] = 2  # a slab (int6 1.00-1.31x, fp8 0.98-1.27x: plots/h200/decode-interleave/)
    if weight_format in LARGE_TILE_FORMATS and 16 < m <= MID_M:
        config["block_m"] = MID_M
    if weight_format == "fp8_e4m3" and MID_M < m <= 64 and n > k:  # wider than deep: two consumers a CTA
        config["warpgroups"] = 2
    if weight_format == "int6" and MID_M < m <= 64 and long_k:  # int4's rule: two consumers a slab
        config["interleave"] = 2
    if weight_format in LARGE_TILE_FORMATS and m > 64 and (m > 128 or n > k):
        filled = output_tiles(m, n) >= FILLING_TILES
        config.update(LARGE_TILE_ONE_PASS if filled else LARGE_TILE_TWO_SLABS)
    if weight_format == "fp8_e4m3" and m <= 16 and n:
        if m <= NARROW_M:
            config["block_m"] = NARROW_M
        if m <= NARROW_M and n >= WIDE_N * k:
            config["interleave"] = 2
        elif n >= WIDE_N * k:
            config["split"] = 4
    if writes_slabs(config, weight_format) and n % 8:  # C's rows are no whole 16-byte units for TMA
        config["split"] = 2
    return config


def output_tiles(m: int, n: int) -> int:
    """The 128 x 128 tiles of an M x N output (ONE_PASS's CTAs)."""
    return -(-m // 128) * -(-n // 128)


def writes_slabs(config: dict, weight_format: str) -> bool:
    """Whether V8 in ``config`` writes C by TMA stores (``v8.writes_slabs``), which need C's rows and
    base 16-byte aligned (``tma_storable``)."""
    return v8_module().writes_slabs(config["split"], config.get("interleave", 1), weight_format)


def tma_storable(out: torch.Tensor) -> bool:
    """Whether TMA may write ``out`` [M, N]: unit column stride, rows and base 16-byte aligned."""
    return out.stride(1) == 1 and (out.stride(0) * out.element_size()) % 16 == 0 and out.data_ptr() % 16 == 0


def prefill_pays(m: int, n: int, weight_format: str = "int4") -> bool:
    """Whether V8 (ONE_PASS) beats widening the weight then cuBLAS at M tokens past V8_MAX_M: its
    ``ceil(tiles / SMS)`` waves against the ``tiles / SMS`` waves of work cuBLAS does, plus the
    widening's ``N / WIDEN_ROWS`` (``LARGE_TILE_WIDEN_ROWS`` for int6 and fp8; N a multiple of 8,
    for int4's TMA stores). All the measured shapes fall on the faster side: for int4 768 x 4096 x
    4096 (192 tiles, a last wave 45% full) widens, 512 x 6144 x 4096 (as many tiles, a dearer
    widening) runs V8 (plots/h200/v8-prefill/); for int6 and fp8 that one widens
    (plots/h200/prefill-crossing/)."""
    tiles = output_tiles(m, n)
    widen_rows = LARGE_TILE_WIDEN_ROWS if weight_format in LARGE_TILE_FORMATS else WIDEN_ROWS
    return n % 8 == 0 and -(-tiles // SMS) <= tiles / SMS + n / widen_rows


def configs(weight_format: str) -> list[dict]:
    """Every configuration the call may build for a format (``config_for``'s, as ``kernel_config`` builds
    them): M at each token boundary of its rules, on a weight of each kind they tell apart (square, wider
    than deep, wide, with a long K, with rows TMA cannot store, and with output tiles enough to fill
    the SMs without a split at 65 tokens)."""
    tokens = (1, NARROW_M, MID_M, *(limit for limit, _ in CONFIGS), max_tokens(weight_format))
    k = 1024
    n_filling = 128 * FILLING_TILES
    weights = ((k, k), (2 * k, k), (WIDE_N * k, k), (k, LONG_K * k), (2 * k + 4, k), (n_filling, k), (n_filling + 4, k))
    shapes = [(m, n, k) for m in tokens for n, k in weights]
    chosen = (kernel_config(weight_format, config_for(m, n, k, weight_format)) for m, n, k in shapes)
    return list({tuple(sorted(c.items())): c for c in chosen}.values())


def kernel_config(weight_format: str, config: dict) -> dict:
    """``config`` as the kernel builds it for the format: fp8 widens 32 K columns a wgmma group and
    int6 64 whatever ``chunk`` says, so one build serves both values."""
    fixed = {"fp8_e4m3": 32, "int6": 64}.get(weight_format)
    return config if fixed is None else {**config, "chunk": fixed}


def runs_here(device: torch.device) -> bool:
    """Whether V8 runs on ``device`` (a Hopper GPU) once built, else the widened path runs."""
    return device.type == "cuda" and versions.local_arch() == ARCH


def max_tokens(weight_format: str) -> int:
    """The most tokens for which the call runs V8 on a weight of ``weight_format``."""
    return MAX_TOKENS.get(weight_format, V8_MAX_M)


def uses_v8(m: int, weight: QuantizedWeight) -> bool:
    """Whether ``x @ qw.T`` with M tokens runs V8 here (else: widened once, then cuBLAS)."""
    return (
        m <= max_tokens(weight.format)
        and runs_here(weight.device)
        and v8_module().supports(m, weight.shape[0], weight.shape[1])
        and (m <= V8_MAX_M or prefill_pays(m, weight.shape[0], weight.format))
    )


# the kernels, keyed ``kernel_key``, built by the call's build child: the call installs its builder
# (``matmul.call.building.v8_in_child``) when the package is imported; none: the widened path
builds = ChildBuilt(log, "Hopper V8 %s did not build (%s); the weight is widened for cuBLAS")


def set_builder(builder) -> None:
    """Build V8's kernels with ``builder`` from now on (``child_built.Builder``)."""
    builds.set_builder(builder)


def kernel_key(dtype: torch.dtype, weight_format: str, config: dict) -> tuple:
    """What identifies a built V8 kernel: the activations' dtype, the weight's format and the
    configuration as ``kernel_config`` builds it (sorted items)."""
    return (dtype, weight_format, tuple(sorted(kernel_config(weight_format, config).items())))


def script(dtype: torch.dtype, weight_format: str, config: dict):
    """V8's tilus script for a kernel key's parts, fixed to ``config`` (not transpiled yet: the build
    child builds it, ``matmul.call.building.build_v8``)."""
    module = v8_module()
    if weight_format == "int4":  # the kernel's own default format
        return versions.kernel(module, dtype, config)
    cls = versions._fixed_kernel_class(module.Kernel, tuple(sorted(config.items())))
    return cls(dtype=versions.TILUS_DTYPES[dtype], weight=weight_format)


def v8(x: torch.Tensor, weight: QuantizedWeight, out: torch.Tensor, config: Optional[dict] = None) -> torch.Tensor:
    """V8 on x [M, K] (row-major, 16-byte aligned rows) into out [M, N] (unit column stride), in
    ``config`` (``config_for``'s without one), once the build child has built that kernel; until then
    (its build started here, unless a CUDA graph is being captured), where it did not build and where
    V8 does not run, the widened path into out: the same product (module doc; ``wait_until_built``
    waits for V8). A configuration that writes C by TMA stores (``writes_slabs``) into an ``out`` TMA
    may not write (``tma_storable``) writes a padded buffer, then copies it into out."""
    config = config or config_for(x.shape[0], weight.shape[0], x.shape[1], weight.format)
    kernel = built_kernel(x, weight, config) if runs_here(x.device) else None
    if kernel is None:
        return widened(x, weight, out=out)
    if writes_slabs(config, weight.format) and not tma_storable(out):
        staged = empty_padded(*out.shape, out.dtype, out.device)
        run(kernel, x, weight.packed, weight.scales, staged)
        return out.copy_(staged)
    run(kernel, x, weight.packed, weight.scales, out)
    return out


def built_kernel(x: torch.Tensor, weight: QuantizedWeight, config: Optional[dict] = None):
    """V8's launch function for ``x @ weight.T`` in ``config`` (``config_for``'s without one) where V8
    runs here (``runs_here``, which the caller has asked), or None while its kernel is not built (its
    build started, unless a CUDA graph is being captured) and where it did not build."""
    m, k = x.shape
    key = kernel_key(x.dtype, weight.format, config or config_for(m, weight.shape[0], k, weight.format))
    return builds.launch(key, start=not capturing(x.device))


def run(kernel, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    """``kernel`` (V8's launch function) on x [M, K] into out [M, N], under x's GPU."""
    m, k = x.shape
    args = (m, out.shape[1], k, x, packed, out, x.stride(0), packed.stride(0), out.stride(0), 0, scales)
    device_context.launch_on(_gpu_index(x.device), kernel, *args)


def _gpu_index(device: torch.device) -> Optional[int]:
    """``device``'s index for ``device_context.launch_on``: None off a GPU (the tests' stand-in kernels)."""
    return device.index if device.type == "cuda" else None


# The V8 launches of ``linear`` calls, kept per weight and input signature (shape, strides, dtype,
# device) once that kernel ran a call of it: a later call with the signature (without
# ``out``, or with a dense one of the product's shape and dtype and no epilogue) runs its launch at
# once, skipping the checks and choices every step of which is host time an eager decode step pays
# per projection (the format, the token count, the configuration, the kernel's key). What the
# signature does not fix, the input's alignment and ``out``, is checked per call. Weak in the
# weight: a launch holds the weight's tensors, not the weight, so a weight let go takes its launches
# with it.
_launches: "weakref.WeakKeyDictionary[QuantizedWeight, dict]" = weakref.WeakKeyDictionary()
MOST_SIGNATURES = 256  # a weight's launches, at most: past it they are dropped and kept again as met


def _keep_launch(weight: QuantizedWeight, x: torch.Tensor, kernel) -> None:
    """Keep the launch of ``kernel`` (built, just run) for ``linear`` calls of ``x``'s signature on
    ``weight`` whose input needs no copy (``x`` as [M, K] is dense and aligned)."""
    packed, scales, n = weight.packed, weight.scales, weight.shape[0]
    k = x.shape[-1]
    m, shape, ldw = x.numel() // k, (*x.shape[:-1], n), packed.stride(0)
    device = _gpu_index(x.device)

    def launch(x: torch.Tensor, y: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Into ``y`` (dense, of ``out_shape``), or a new output."""
        if y is None:
            y = x.new_empty(shape)  # dense: rows of n, as x's are rows of k
        device_context.launch_on(device, kernel, m, n, k, x, packed, y, k, ldw, n, 0, scales)
        return y

    launch.out_shape = shape

    launches = _launches.setdefault(weight, {})
    if len(launches) >= MOST_SIGNATURES:
        launches.clear()
    launches[(x.shape, x.stride(), x.dtype, x.device)] = launch


def _kept_launch(weight: QuantizedWeight, x: torch.Tensor, out: Optional[torch.Tensor]):
    """The launch kept for ``x``'s signature on ``weight`` (``_launches``) where this call may take it:
    x 16-byte aligned, and ``out`` None or a dense tensor of the product's shape and dtype on x's
    device (any other ``out``: the full path writes it, a copy of the product); else None, also for
    operands that are not tensors, which the full path then names."""
    try:
        launch = _launches.get(weight, {}).get((x.shape, x.stride(), x.dtype, x.device))
        if launch is None or x.data_ptr() % 16 or (out is not None and out.data_ptr() % 16):
            return None  # (V8 may write C by TMA stores: ``writes_slabs``)
        if out is None or (
            out.shape == launch.out_shape and out.dtype == x.dtype and out.device == x.device and out.is_contiguous()
        ):
            return launch
    except AttributeError:
        pass
    return None


def wait_until_built(dtype: torch.dtype, weight_format: str, config: dict, timeout_s: float = 300.0) -> bool:
    """Start the build of V8's kernel for ``dtype``, ``weight_format`` and ``config`` (the call's for M
    tokens: ``config_for``) if it has not started, and wait for it (tests, benchmarks: before timing
    V8, capturing it or checking its output); False where it does not run or did not build in time."""
    return versions.local_arch() == ARCH and builds.wait(kernel_key(dtype, weight_format, config), timeout_s)


def wait_until_all_built(kernels, timeout_s: float = 600.0) -> list[bool]:
    """``wait_until_built`` for each of ``kernels`` ((dtype, weight format, configuration) triples),
    at most one build child a core at once (tests and benchmarks that need many kernels: one after
    another, each child's start and build would add up); whether each was built, in order."""
    import concurrent.futures
    import os

    kernels = list(kernels)
    with concurrent.futures.ThreadPoolExecutor(max(min(len(kernels), os.cpu_count() or 1), 1)) as pool:
        return list(pool.map(lambda item: wait_until_built(*item, timeout_s=timeout_s), kernels))


def widened(x: torch.Tensor, weight: QuantizedWeight, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The weight widened to 16 bits once (``matmul.quant.widen``: its kernel once the build child has
    built it, torch's ``dequantize`` until then), then cuBLAS: x [M, K] @ w.T."""
    return torch.matmul(x, device_widen.widen(weight).T, out=out)


def linear(
    x: torch.Tensor,
    weight: QuantizedWeight,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``activation(x @ weight.T + bias)`` for x [..., K]; bias and activation are torch's (V8's
    epilogue is plain)."""
    if not isinstance(weight, QuantizedWeight):
        raise MatmulInputError(f"weight must be a matmul.quant.QuantizedWeight, got {type(weight).__name__}")
    fused = bias is not None or activation is not None
    traced = torch.compiler.is_compiling()
    if traced or recorded(x):  # the operator: dynamo cannot trace the eager path; autograd
        weight.check_for(x)  # differentiates it (the packed weight has no gradient, x does)
        check_bias(bias, x, weight.shape[0])
        if out is not None and not traced:
            raise MatmulInputError(
                "out= does not support automatic differentiation (as torch's out= functions); call "
                "without out, or under torch.no_grad()"
            )
        y = torch.ops.tilus_matmul.quantized_linear(
            x, weight.packed, weight.scales, weight.format, weight.bits, weight.group, weight.shape[0]
        )
        y = torch_epilogue(y, bias, activation) if fused else y
        if out is None:
            return y
        check_out(out, y.shape, x)
        return out.copy_(y)
    launch = _kept_launch(weight, x, out) if out is None or not fused else None
    if launch is not None:  # a signature seen before: at once
        if out is not None:
            check_out_apart(out, x, weight)
            return launch(x, out)
        if bias is not None:  # the one operand the signature does not fix that the epilogue reads
            check_bias(bias, x, weight.shape[0])
        y = launch(x)
        return torch_epilogue(y, bias, activation) if fused else y
    weight.check_for(x)
    check_bias(bias, x, weight.shape[0])
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    dense = x2.is_contiguous() and x2.data_ptr() % 16 == 0  # TMA reads x: dense rows, 16-byte aligned
    if not dense:
        x2 = x2.contiguous() if x2.data_ptr() % 16 == 0 else x2.clone()
    m, n = x2.shape[0], weight.shape[0]
    target = None if fused else out
    if out is not None:
        check_out(out, (*lead, n), x)
        check_out_apart(out, x, weight)
    config = config_for(m, n, k, weight.format) if m and uses_v8(m, weight) else None
    kernel = built_kernel(x2, weight, config) if config else None
    y2 = target.view(m, n) if target is not None and target.is_contiguous() else None  # out, where dense
    if y2 is not None and kernel is not None and writes_slabs(config, weight.format) and not tma_storable(y2):
        y2 = None  # TMA cannot write it (``writes_slabs``): a new output, copied into out
    if m == 0:
        y = x2.new_empty((0, n))
    elif kernel is not None:
        y = y2 if y2 is not None else x2.new_empty((m, n))
        run(kernel, x2, weight.packed, weight.scales, y)
        if dense and x2.data_ptr() == x.data_ptr():
            _keep_launch(weight, x, kernel)
    else:  # into ``out`` where it is dense: no copy of the product afterwards
        y = widened(x2, weight, out=y2)
    y = y.view(*lead, n)
    if fused:
        y = torch_epilogue(y, bias, activation)
    if out is not None:
        if y.data_ptr() != out.data_ptr():
            out.copy_(y)
        return out  # out itself, as torch's out= functions return it (not the view written through)
    return y


def check_out(out: torch.Tensor, shape, x: torch.Tensor) -> None:
    """MatmulInputError unless ``out`` is a tensor of ``shape`` of x's dtype on x's device, no element
    of it in two places."""
    if not isinstance(out, torch.Tensor):
        raise MatmulInputError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != x.dtype or out.device != x.device:
        raise MatmulInputError(
            f"out must be {x.dtype} of shape {list(shape)} on {x.device}, got {out.dtype} {list(out.shape)} on "
            f"{out.device}"
        )
    check_no_internal_overlap(out)


def check_out_apart(out: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight) -> None:
    """MatmulInputError if ``out`` shares memory with what V8 reads while it writes ``out``."""
    check_apart(out, (("x", x), ("the packed weight", weight.packed), ("the weight's scales", weight.scales)))


def recorded(x: torch.Tensor) -> bool:
    """Whether autograd must record the product ``x @ qw.T``: a gradient for x. (The bias's gradient
    comes through torch's add after the product on every path: a layer whose bias is a parameter,
    run without ``torch.no_grad``, keeps the kept launch.)"""
    try:
        return torch.is_grad_enabled() and x.requires_grad
    except AttributeError:  # not tensors: the full path's checks name the problem
        return False


@torch.library.custom_op("tilus_matmul::quantized_linear", mutates_args=())
def traced_linear(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, weight_format: str, bits: int, group: int, n: int
) -> torch.Tensor:
    """``x @ qw.T`` for the ``QuantizedWeight`` of these fields, as ``linear`` runs it: what
    ``torch.compile`` traces in place of ``linear``'s own Python, which reads data pointers (a
    compiled graph runs this, and this the eager path)."""
    weight = QuantizedWeight(weight_format, bits, group, (n, x.shape[-1]), x.dtype, packed, scales)
    with torch.no_grad():  # the product itself; autograd records the operator around it
        return linear(x, weight)


@traced_linear.register_fake
def _(x, packed, scales, weight_format, bits, group, n):
    return x.new_empty((*x.shape[:-1], n))


def _keep_weight(ctx, inputs, output):
    x, packed, scales, weight_format, bits, group, n = inputs
    ctx.weight = QuantizedWeight(weight_format, bits, group, (n, x.shape[-1]), x.dtype, packed, scales)


def _input_gradient(ctx, grad):
    """dX = dY W: the weight widened once (``widened``'s widening), then cuBLAS. The packed weight
    and scales have no gradient: a quantized layer is frozen (what feeds it still learns: the layers
    before it, low-rank adapters on a frozen quantized model)."""
    return torch.matmul(grad, device_widen.widen(ctx.weight)), None, None, None, None, None, None


traced_linear.register_autograd(_input_gradient, setup_context=_keep_weight)


def matmul(a: torch.Tensor, b: TransposedWeight, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a @ qw.T`` (``matmul.matmul``'s form)."""
    if not isinstance(b, TransposedWeight):
        raise MatmulInputError(f"b must be qw.T for a QuantizedWeight qw, got {type(b).__name__}")
    return linear(a, b.weight, out=out)
