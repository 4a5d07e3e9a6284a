"""``x @ qw.T`` for a packed weight (``matmul.quant``: int4, int4_channel, int6, fp8_e4m3): what the
call runs, and how it is built and kept.

* **Hopper V8** (``kernels/hopper/v8.py``) up to the format's token limit, in the configuration the
  rules of ``shipped/rules/v8.json`` give for the format, the tokens (M) and the weight's N x K
  (``config_for``). Past ``v8_max_tokens`` it runs only where its 128 x 128 tiles fill the GPU's
  waves well enough to beat widening (``prefill_pays``, a formula over this GPU's SM count).
* Else **the weight widened once** (``quant.widen``'s kernel), then cuBLAS: the same product.

Every kernel is built as the series' are: by the chooser's build child (``Chooser.kernel``), never in
the caller, which only opens the library. Until a kernel is built the call runs the widened path
(and torch's ``dequantize`` until the widening kernel is), so no call waits for a compiler; inside a
CUDA graph capture no build starts. ``prepare`` builds every kernel a weight can run and waits
(``nn.convert(weights=...)`` calls it): a model converted is fast from its first call, and a graph
captured after it holds V8.

A call of a signature V8 has run before (x's shape, strides, dtype and device, the weight's format
and sizes) runs the plan kept for it (``launch.PackedPlan``, in the process's ``Plans`` beside the
16-bit call's): at decode sizes V8 takes a few microseconds, less than the host takes to choose.

Autograd: the weight is frozen; dX = dY W through the widened weight. Eager autograd runs
``_QuantizedProduct`` (an ``autograd.Function``); ``torch.compile`` traces the custom operator
``tilus_matmul::quantized_linear``: the call's one policy (``torch_op``), the operator only where the
compiler needs it.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Optional

import torch

from .. import knobs
from ..contract import MatmulInputError, check_apart, check_bias, check_no_internal_overlap, empty_padded
from ..kernels import device_context, versions
from ..kernels.variant import PLAIN, torch_epilogue
from ..quant import FORMATS, QuantizedWeight, TransposedWeight
from ..quant import widen as widening
from . import api
from .chooser import program_key
from .tuner import VENDOR

ARCH = "sm_90a"  # V8 and the widening kernel run on Hopper; elsewhere torch widens for cuBLAS
RULES_FILE = Path(__file__).with_name("shipped") / "rules" / "v8.json"
DEFAULT_SMS = 132  # where the call runs on no GPU (the CPU tests): a full Hopper part's


@functools.cache
def rules() -> dict:
    """``shipped/rules/v8.json``: the token limits, the widening's price and V8's configuration rules."""
    return json.loads(RULES_FILE.read_text())


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: Optional[torch.device]) -> int:
    """The streaming multiprocessors of ``device`` (a wave of V8's 128 x 128 CTAs: one fits an SM)."""
    if device is not None and device.type == "cuda":
        return _sms(device.index if device.index is not None else torch.cuda.current_device())
    return DEFAULT_SMS


def output_tiles(m: int, n: int) -> int:
    """The 128 x 128 tiles of an M x N output (the CTAs of V8's largest configurations)."""
    return -(-m // 128) * -(-n // 128)


def _weight_holds(name: str, m: int, n: int, k: int, sms: int) -> bool:
    """Whether the predicate ``name`` of the rules holds for M tokens on an N x K weight (none without
    a shape: ``n`` = 0)."""
    if not n:
        return False
    table = rules()
    negated = name.startswith("not_")
    base = name.removeprefix("not_")
    if base == "deep":
        held = k >= n
    elif base == "long_k":
        held = k >= table["long_k"] * n
    elif base == "wide":
        held = n >= table["wide"] * k
    elif base == "wider_than_deep":
        held = n > k
    elif base == "fills":  # more tiles than half the SMs: a split's two CTAs a tile would take two waves
        held = output_tiles(m, n) >= sms // 2 + 1
    elif base == "storable":  # TMA stores C's rows: whole 16-byte units
        held = n % 8 == 0
    else:
        raise ValueError(f"shipped/rules/v8.json: unknown weight predicate {name!r}")
    return held != negated


def config_for(m: int, n: int = 0, k: int = 0, weight_format: str = "", sms: int = DEFAULT_SMS) -> dict:
    """V8's configuration for M tokens on an N x K weight of ``weight_format`` on a GPU of ``sms`` SMs:
    the rules of ``shipped/rules/v8.json`` in order. Without a shape or format, the configuration of the
    token tier alone. A configuration that writes C by TMA stores on a weight whose rows TMA cannot
    store splits K instead (``writes_slabs``)."""
    table = rules()
    config: dict = {}
    for rule in table["rules"]:
        low, high = rule["tokens"]
        if not (low <= m and (high is None or m <= high)):
            continue
        if "formats" in rule and weight_format not in rule["formats"]:
            continue
        if not all(_weight_holds(name, m, n, k, sms) for name in rule.get("weight", ())):
            continue
        update = rule["set"]
        config.update(table["configs"][update] if isinstance(update, str) else update)
    if weight_format and writes_slabs(config, weight_format) and n % 8:
        config["split"] = 2
    return config


def writes_slabs(config: dict, weight_format: str) -> bool:
    """Whether V8 in ``config`` writes C by TMA stores (``v8.writes_slabs``), which need C's rows and
    base 16-byte aligned (``tma_storable``)."""
    return v8_module().writes_slabs(config["split"], config.get("interleave", 1), weight_format)


def tma_storable(out: torch.Tensor) -> bool:
    """Whether TMA may write ``out`` [M, N]: unit column stride, rows and base 16-byte aligned."""
    return out.stride(1) == 1 and (out.stride(0) * out.element_size()) % 16 == 0 and out.data_ptr() % 16 == 0


def prefill_pays(m: int, n: int, weight_format: str = "int4", sms: int = DEFAULT_SMS) -> bool:
    """Whether V8 beats widening the weight then cuBLAS at M tokens past ``v8_max_tokens``: its
    ``ceil(tiles / sms)`` waves against the ``tiles / sms`` waves of work cuBLAS does plus the
    widening's ``N / widen_rows`` (N a multiple of 8, for its TMA stores)."""
    tiles = output_tiles(m, n)
    return n % 8 == 0 and -(-tiles // sms) <= tiles / sms + n / rules()["widen_rows"][weight_format]


def max_tokens(weight_format: str) -> int:
    """The most tokens for which the call runs V8 on a weight of ``weight_format``."""
    return rules()["max_tokens"].get(weight_format, rules()["v8_max_tokens"])


def kernel_config(weight_format: str, config: dict) -> dict:
    """``config`` as the kernel builds it for the format: fp8 widens 32 K columns a wgmma group and
    int6 64 whatever ``chunk`` says, so one build serves both values."""
    fixed = {"fp8_e4m3": 32, "int6": 64}.get(weight_format)
    return config if fixed is None else {**config, "chunk": fixed}


def configs(weight_format: str) -> list[dict]:
    """Every configuration the call may build for a format (``config_for``'s, as ``kernel_config``
    builds them): M at each token boundary of the rules, on a weight of each kind they tell apart
    (square, wider than deep, wide, with a long K, with rows TMA cannot store, and with output tiles
    enough to fill the SMs without a split past 64 tokens)."""
    table = rules()
    bounds = {1, max_tokens(weight_format)}
    for rule in table["rules"]:
        bounds |= {bound for bound in rule["tokens"] if bound is not None}
    k = 1024
    n_filling = 128 * (DEFAULT_SMS // 2 + 1)
    weights = ((k, k), (2 * k, k), (table["wide"] * k, k), (k, table["long_k"] * k), (2 * k + 4, k))
    weights += ((n_filling, k), (n_filling + 4, k))
    shapes = [(m, n, k) for m in sorted(bounds) if m <= max_tokens(weight_format) for n, k in weights]
    chosen = (kernel_config(weight_format, config_for(m, n, k, weight_format)) for m, n, k in shapes)
    return list({tuple(sorted(c.items())): c for c in chosen}.values())


def v8_module():
    return versions.load(ARCH, "v8")


def runs_here(device: torch.device) -> bool:
    """Whether V8 and the widening kernel run on ``device`` (a Hopper GPU) once built."""
    return device.type == "cuda" and versions.local_arch() == ARCH


def uses_v8(m: int, weight: QuantizedWeight) -> bool:
    """Whether ``x @ qw.T`` with M tokens runs V8 here (else: widened once, then cuBLAS)."""
    n, k = weight.shape
    return (
        m <= max_tokens(weight.format)
        and runs_here(weight.device)
        and v8_module().supports(m, n, k)
        and (m <= rules()["v8_max_tokens"] or prefill_pays(m, n, weight.format, sm_count(weight.device)))
    )


# --- the kernels, built by the chooser's build child -----------------------------------------------


def v8_entry(weight_format: str, config: dict) -> dict:
    """The chooser's entry for V8 in ``config`` on ``weight_format`` (``building.OUTSIDE``)."""
    return {"version": "v8", "config": {"weight": weight_format, **kernel_config(weight_format, config)}}


def widen_entry(weight_format: str) -> dict:
    return {"version": "widen", "config": {"weight": weight_format}}


def v8_script(dtype: torch.dtype, config: dict):
    """V8's tilus script fixed to ``config`` (with its ``weight`` format): what the build child builds."""
    config = dict(config)
    weight_format = config.pop("weight")
    module = v8_module()
    if weight_format == "int4":  # the kernel's own default format
        return versions.fixed_kernel(module, dtype, config)
    return versions.fixed_kernel(module, dtype, config, weight=weight_format)


def v8_kernel(dtype: torch.dtype, weight_format: str, config: dict, device: torch.device):
    """V8's launch function in ``config`` where built, else None (its build asked for, but inside a
    CUDA graph capture)."""
    return api._chooser.kernel(ARCH, dtype, v8_entry(weight_format, config), device=device)


def widen(weight: QuantizedWeight, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``weight.dequantize()``: the widening kernel once built (here, on a Hopper GPU), torch's meanwhile."""
    kernel = None
    if runs_here(weight.device) and widening.takes(weight):
        entry = widen_entry(weight.format)
        kernel = api._chooser.kernel(ARCH, weight.dtype, entry, device=weight.device)
    return widening.widen(weight, out, kernel)


def widened(x: torch.Tensor, weight: QuantizedWeight, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The weight widened once (``widen``), then cuBLAS: x [M, K] @ w.T."""
    return torch.matmul(x, widen(weight).T, out=out)


def kernels_for(weight: QuantizedWeight, dtype: Optional[torch.dtype] = None) -> list[tuple]:
    """Every kernel the call may run on ``weight`` (V8 at every token count it takes, the widening
    kernel past them), as ``Chooser.build_now`` takes them; none where they do not run."""
    dtype = dtype or weight.dtype
    if not runs_here(weight.device):
        return []
    n, k = weight.shape
    sms = sm_count(weight.device)
    found = {}
    for m in range(1, max_tokens(weight.format) + 1):
        if uses_v8(m, weight):
            entry = v8_entry(weight.format, config_for(m, n, k, weight.format, sms))
            found[json.dumps(entry, sort_keys=True)] = (ARCH, dtype, entry, PLAIN)
    kernels = list(found.values())
    if widening.takes(weight):
        kernels.append((ARCH, dtype, widen_entry(weight.format), PLAIN))
    return kernels


def prepare(weights, progress: Optional[bool] = None, timeout_s: float = 900.0) -> bool:
    """Build every kernel the call may run on each of ``weights`` (``kernels_for``, each once) in
    parallel build children, and wait (a tqdm bar: ``progress``): whether all were built."""
    kernels, seen = {}, set()
    for weight in weights:
        kind = (weight.shape, weight.format, weight.dtype, weight.device)  # a model's layers share a few
        if kind in seen:
            continue
        seen.add(kind)
        for kernel in kernels_for(weight):
            kernels[(kernel[1], json.dumps(kernel[2], sort_keys=True))] = kernel
    built = api._chooser.build_now(kernels.values(), progress=progress, desc="[build V8]", timeout_s=timeout_s)
    return all(built)


def wait_until_built(dtype: torch.dtype, weight_format: str, config: dict, timeout_s: float = 300.0) -> bool:
    """Build V8's kernel for ``dtype``, ``weight_format`` and ``config`` now and wait (tests,
    benchmarks: before timing V8, capturing it or checking its output); False where it does not run
    or did not build in time."""
    return wait_until_all_built([(dtype, weight_format, config)], timeout_s)[0]


def wait_until_all_built(kernels, timeout_s: float = 600.0) -> list[bool]:
    """``wait_until_built`` for each of ``kernels`` ((dtype, weight format, configuration) triples),
    built in parallel build children; whether each was built, in order."""
    kernels = list(kernels)
    if versions.local_arch() != ARCH:
        return [False] * len(kernels)
    entries = [(ARCH, dtype, v8_entry(fmt, config), PLAIN) for dtype, fmt, config in kernels]
    return api._chooser.build_now(entries, progress=False, timeout_s=timeout_s)


def widening_built(dtype: torch.dtype, weight_format: str, timeout_s: float = 300.0) -> bool:
    """Build the widening kernel for ``dtype`` and ``weight_format`` now and wait; False where it does
    not run or did not build in time."""
    if versions.local_arch() != ARCH:
        return False
    kernel = (ARCH, dtype, widen_entry(weight_format), PLAIN)
    return api._chooser.build_now([kernel], progress=False, timeout_s=timeout_s)[0]


def choice(x: torch.Tensor, weight: QuantizedWeight) -> dict:
    """What ``linear(x, weight)`` runs now and why, in ``matmul.choice``'s form: ``version`` "v8" with
    its ``config`` (``source`` "rules": ``shipped/rules/v8.json``) and ``built``, or the widened path
    (``version`` "widened", the ``reason``; ``building``: the V8 kernel built meanwhile)."""
    weight.check_for(x)
    m, k = x.numel() // x.shape[-1], x.shape[-1]
    n = weight.shape[0]
    common = {"format": weight.format, "source": "rules", "key": f"{m}x{n}x{k}"}
    if not m or not uses_v8(m, weight):
        return {"version": "widened", "config": {}, **common, "reason": why_widened(weight), "then": VENDOR}
    config = config_for(m, n, k, weight.format, sm_count(weight.device))
    program = v8_program(weight.dtype, weight.format, config)
    entry = v8_entry(weight.format, config)
    if program in api._chooser.programs:
        return {**entry, **common, "built": True}
    failed = api._chooser.failed.get(program)
    why = {"build_failed": failed} if failed else {"building": "v8"}
    return {"version": "widened", "config": {}, **common, **why, "chosen": entry, "then": VENDOR}


def why_widened(weight: QuantizedWeight) -> str:
    """Why a product on ``weight`` that V8 does not take is widened (``uses_v8`` is False)."""
    return "V8 does not run here" if not runs_here(weight.device) else f"past V8's tokens for {weight.format}"


def v8_program(dtype: torch.dtype, weight_format: str, config: dict) -> tuple:
    """The chooser's key of V8's kernel for ``dtype``, ``weight_format`` and ``config`` (in its
    ``programs`` once built, ``building`` meanwhile, ``failed`` if its build failed)."""
    return program_key(ARCH, dtype, v8_entry(weight_format, config), PLAIN)


# --- the call ------------------------------------------------------------------------------------


def v8(x: torch.Tensor, weight: QuantizedWeight, out: torch.Tensor, config: Optional[dict] = None) -> torch.Tensor:
    """V8 on x [M, K] (row-major, 16-byte aligned rows) into out [M, N] (unit column stride), in
    ``config`` (``config_for``'s without one), once its kernel is built; until then, where it did not
    build and where V8 does not run, the widened path into out: the same product. A configuration
    that writes C by TMA stores into an ``out`` TMA may not write writes a padded buffer, then copies."""
    config = config or config_for(x.shape[0], weight.shape[0], x.shape[1], weight.format, sm_count(x.device))
    kernel = v8_kernel(x.dtype, weight.format, config, x.device) if runs_here(x.device) else None
    if kernel is None:
        return widened(x, weight, out=out)
    if writes_slabs(config, weight.format) and not tma_storable(out):
        staged = empty_padded(*out.shape, out.dtype, out.device)
        run(kernel, x, weight.packed, weight.scales, staged)
        return out.copy_(staged)
    run(kernel, x, weight.packed, weight.scales, out)
    return out


def run(kernel, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    """``kernel`` (V8's launch function) on x [M, K] into out [M, N], under x's GPU."""
    m, k = x.shape
    args = (m, out.shape[1], k, x, packed, out, x.stride(0), packed.stride(0), out.stride(0), 0, scales)
    device_context.launch_on(device_context.launch_index(x.device), kernel, *args)


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
    if traced or recorded(x):  # the product through autograd, or the operator dynamo traces
        weight.check_for(x)
        check_bias(bias, x, weight.shape[0])
        if out is not None and not traced:
            raise MatmulInputError(
                "out= does not support automatic differentiation (as torch's out= functions); call "
                "without out, or under torch.no_grad()"
            )
        fields = (weight.format, weight.bits, weight.group, weight.shape[0])
        if traced:
            y = torch.ops.tilus_matmul.quantized_linear(x, weight.packed, weight.scales, *fields)
        else:
            y = _QuantizedProduct.apply(x, weight)
        y = torch_epilogue(y, bias, activation) if fused else y
        if out is None:
            return y
        check_out(out, y.shape, x)
        return out.copy_(y)
    plan = api._plans.packed_plan(x, weight, out) if out is None or not fused else None
    if plan is not None:  # a signature seen before: at once
        if out is not None:
            check_out_apart(out, x, weight)
            return plan(x, weight, out)
        if bias is not None:  # the one operand the signature does not fix that the epilogue reads
            check_bias(bias, x, weight.shape[0])
        y = plan(x, weight)
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
    config = config_for(m, n, k, weight.format, sm_count(x.device)) if m and uses_v8(m, weight) else None
    kernel = v8_kernel(x2.dtype, weight.format, config, x2.device) if config else None
    y2 = target.view(m, n) if target is not None and target.is_contiguous() else None  # out, where dense
    if y2 is not None and kernel is not None and writes_slabs(config, weight.format) and not tma_storable(y2):
        y2 = None  # TMA cannot write it (``writes_slabs``): a new output, copied into out
    if m == 0:
        y = x2.new_empty((0, n))
    elif kernel is not None:
        y = y2 if y2 is not None else x2.new_empty((m, n))
        run(kernel, x2, weight.packed, weight.scales, y)
        if dense and x2.data_ptr() == x.data_ptr():
            api._plans.keep_packed(kernel, x, weight)
    else:  # into ``out`` where it is dense: no copy of the product afterwards
        y = widened(x2, weight, out=y2)
    if knobs.decisions.isEnabledFor(logging.INFO):
        _log_decision(x2, weight, config, kernel is not None)
    y = y.view(*lead, n)
    if fused:
        y = torch_epilogue(y, bias, activation)
    if out is not None:
        if y.data_ptr() != out.data_ptr():
            out.copy_(y)
        return out  # out itself, as torch's out= functions return it (not the view written through)
    return y


_logged: set = set()  # the decisions the log has told (each once)


def _log_decision(x: torch.Tensor, weight: QuantizedWeight, config: Optional[dict], built: bool) -> None:
    """The decision log's line for this product (``MATMUL_LOG``): V8 in its configuration, built or
    building, or the weight widened and why."""
    (m, k), n = x.shape, weight.shape[0]
    told = (m, n, k, weight.format, x.dtype, config is not None and json.dumps(config, sort_keys=True), built)
    if told in _logged:
        return
    _logged.add(told)
    call = f"{weight.format} {m}x{n}x{k} {str(x.dtype).removeprefix('torch.')}"
    if config is None:
        knobs.decisions.info("%s: the weight widened, then cuBLAS (%s)", call, why_widened(weight))
    else:
        state = "built" if built else "building: the weight widened, then cuBLAS, meanwhile"
        knobs.decisions.info("%s: v8 %s (rules), %s", call, json.dumps(config, sort_keys=True), state)


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
    run without ``torch.no_grad``, keeps the kept plan.)"""
    try:
        return torch.is_grad_enabled() and x.requires_grad
    except AttributeError:  # not tensors: the full path's checks name the problem
        return False


def _input_gradient(weight: QuantizedWeight, grad: torch.Tensor) -> torch.Tensor:
    """dX = dY W: the weight widened once (``widen``), then cuBLAS. The packed weight has no gradient:
    a quantized layer is frozen (what feeds it still learns: the layers before it, low-rank adapters
    on a frozen quantized model)."""
    return torch.matmul(grad, widen(weight))


class _QuantizedProduct(torch.autograd.Function):
    """``x @ qw.T`` for eager autograd: the call's own path forward, ``_input_gradient`` backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
        ctx.weight = weight
        with torch.no_grad():
            return linear(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _input_gradient(ctx.weight, grad), None


@torch.library.custom_op("tilus_matmul::quantized_linear", mutates_args=())
def traced_linear(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, weight_format: str, bits: int, group: int, n: int
) -> torch.Tensor:
    """``x @ qw.T`` for the ``QuantizedWeight`` of these fields, as ``linear`` runs it: what
    ``torch.compile`` traces in place of ``linear``'s own Python, which reads data pointers."""
    weight = QuantizedWeight(weight_format, bits, group, (n, x.shape[-1]), x.dtype, packed, scales)
    with torch.no_grad():  # the product itself; autograd records the operator around it
        return linear(x, weight)


@traced_linear.register_fake
def _(x, packed, scales, weight_format, bits, group, n):
    return x.new_empty((*x.shape[:-1], n))


def _keep_weight(ctx, inputs, output):
    x, packed, scales, weight_format, bits, group, n = inputs
    ctx.weight = QuantizedWeight(weight_format, bits, group, (n, x.shape[-1]), x.dtype, packed, scales)


def _traced_gradient(ctx, grad):
    return _input_gradient(ctx.weight, grad), None, None, None, None, None, None


traced_linear.register_autograd(_traced_gradient, setup_context=_keep_weight)


def matmul(a: torch.Tensor, b: TransposedWeight, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a @ qw.T`` (``matmul.matmul``'s form)."""
    if not isinstance(b, TransposedWeight):
        raise MatmulInputError(f"b must be qw.T for a QuantizedWeight qw, got {type(b).__name__}")
    return linear(a, b.weight, out=out)


__all__ = ["linear", "matmul", "choice", "prepare", "config_for", "FORMATS"]
