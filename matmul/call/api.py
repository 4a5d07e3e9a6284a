"""``matmul(a, b, *, out=None)``: ``a @ b`` with the fastest kernel of the series for this GPU and shape.

Semantics are torch's for 2-D operands: a [M, K] @ b [K, N] -> [M, N], float16 or bfloat16, float32
accumulation, the result in the inputs' dtype. The kernels compute A @ B^T with B [N, K] row-major:

* ``b = w.T`` (the transposed view of a row-major [N, K] weight, as in a linear layer): read in place.
* ``b`` row-major [K, N]: a version of the series reads it through a temporary [N, K] copy per call;
  cuBLAS reads it as it is. Keep weights as [N, K] and pass ``w.T``.
* any other strides: ``MatmulInputError``; pass ``b.contiguous()``.

Where no kernel applies, ``MatmulInputError`` names the problem and the fix and nothing runs
(``matmul.contract`` has every rule): CPU tensors, other dtypes, mismatched shapes, rows or base not
16-byte aligned, an ``out`` that overlaps an operand or holds an element twice, and GPUs other than
Hopper (sm_90a) or Blackwell (sm_100a) (``UnsupportedGPUError``): no silent fallback. An empty
product (M, N or K = 0) is torch's result (``shapes.empty_product``). ``linear`` takes its input in
any strides (copied once where TMA cannot read it). Where N is not a multiple of 8, a version's
result is a view of rows padded to 16 bytes.

Which kernel runs: ``chooser`` and ``tuner`` (``matmul/call/README.md``); ``tune(shapes)`` tunes
ahead of time, ``choice(a, b)`` names the winner. A seen signature takes ``launch``'s short path;
without ``out`` it does not even pass through Python: ``matmul`` is the builtin of a small C++
extension (``native_entry``) that looks the signature up and runs its route; other calls reach
``python_matmul``, which is also ``matmul`` where the extension cannot be built. ``matmul`` is also
the custom operator ``torch.ops.tilus_matmul.mm`` (``torch_op``), traced by ``torch.compile`` and
differentiated by autograd through the same kernels. CUDA graphs capture the launch; tuning cannot
happen inside a capture (``NotTunedError``: call once, or ``tune``, before capturing).
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from ..contract import TORCH_ONLY, MatmulInputError, check_bias, check_call, check_empty_call, readable
from ..kernels import versions
from ..kernels.variant import PLAIN, SWIGLU_GROUP, Variant, activate, activation_name
from ..quant import QuantizedWeight, TransposedWeight
from . import batched, native_entry, shapes, torch_op, yielding
from .choice_cache import Entry
from .chooser import Chooser, NotTunedError
from .launch import Plans
from .tuner import VENDOR

__all__ = [
    "matmul",
    "linear",
    "python_matmul",
    "choice",
    "tune",
    "use_plans",
    "MatmulInputError",
    "UnsupportedGPUError",
    "NotTunedError",
    "VENDOR",
]


class UnsupportedGPUError(MatmulInputError):
    """The GPU is not one the series has kernels for."""


def device_arch(device: torch.device) -> str:
    """The series that runs on ``device``: 'sm_90a' (Hopper) or 'sm_100a' (Blackwell)."""
    capability = torch.cuda.get_device_capability(device)
    arch = versions.ARCH_BY_CAPABILITY.get(capability)
    if arch is None:
        raise UnsupportedGPUError(
            f"{torch.cuda.get_device_name(device)} ({device}) has compute capability "
            f"{capability[0]}.{capability[1]}; the kernels of this project need a Hopper GPU (9.0, e.g. "
            "H100/H200) or a Blackwell B200/GB200 (10.0). Use torch.matmul(a, b) on this GPU"
        )
    if not versions.available(arch):
        raise UnsupportedGPUError(f"no version of the series exists yet for {arch}; use torch.matmul(a, b)")
    return arch


_chooser = Chooser(arch_of=device_arch)
_plans = Plans(_chooser)
torch_op.plans_of = lambda: _plans  # the operators run the plans ``use_plans`` last set
_is_compiling = torch.compiler.is_compiling  # looked up once: every call pays for every lookup


def python_matmul(a: torch.Tensor, b: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a @ b`` (a [M, K], b [K, N]) into ``out`` [M, N] if given; see the module's docstring."""
    if not _is_compiling():  # the tuning child waits for calls to pause; a traced call stamps in the operator
        yielding.stamp_call()
    if isinstance(b, TransposedWeight):  # qw.T of a quantized weight: its own path (matmul.quant)
        from . import quantized as quant_linear

        return quant_linear.matmul(a, b, out=out)
    try:
        if b.dim() > 2 and isinstance(a, torch.Tensor):  # a batch of products: one batched launch
            return batched.matmul(_chooser, a, b, out)
        if a.dim() != 2 or b.dim() != 2:  # torch.matmul's rules for other shapes, on the 2-D call
            return shapes.general(matmul, a, b, out)
        if shapes.is_empty(a, b):  # nothing for a kernel to do: torch's (empty or zero) result
            return shapes.empty_product(a, b, out)
    except AttributeError:  # not tensors: the checks of the launch path name the problem
        pass
    if _is_compiling():  # traced: the custom operator, which the compiler sees through
        return torch_op.traced(a, b, out)
    try:
        recorded = (a.requires_grad or b.requires_grad) and torch.is_grad_enabled()
    except AttributeError:  # not tensors: the checks of the launch path name the problem
        recorded = False
    if recorded:
        return torch_op.with_grad(a, b, out)
    return _plans.launch(a, b, out)


_native = native_entry.module()


def use_plans(plans: Plans) -> Plans:
    """Make ``plans`` the ones ``matmul`` uses, its table of routes included; the previous ones. For
    the tuner, which times a candidate through ``matmul`` itself, and for tests with stand-in kernels."""
    global _plans
    previous, _plans = _plans, plans
    if _native is not None:
        _native.route(plans.direct, python_matmul, python_linear, plans.defer, plans.defer_linear)
    return previous


def python_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: Optional[str] = None
) -> torch.Tensor:
    """``activation(x @ weight.T + bias)``: ``torch.nn.functional.linear`` followed by the activation,
    computed in one kernel whose epilogue adds the bias and applies the activation to the float32
    tile before it is written (``matmul.kernels.variant``).

    ``x`` [..., K], ``weight`` [N, K], ``bias`` [N] or None, all float16 or all bfloat16 on one GPU;
    ``activation``: None, "relu", "gelu_tanh", "gelu_erf" ("gelu" is the exact, erf form, as in
    torch), "silu", or "swiglu": then ``weight`` is ``matmul.gate_up(gate, up)``'s fused weight
    [2 I', K] and the result is ``silu(x @ gate.T) * (x @ up.T)`` [..., I'], written once. The
    kernel for each (shape bucket, bias, activation) is chosen and cached as ``matmul()``'s is;
    cuBLAS followed by torch's activation is always a candidate. With gradients recorded, the
    product and bias run through ``torch.ops.tilus_matmul.linear`` (backward through the same
    kernels) and the activation in torch, which keeps what its derivative needs."""
    if not _is_compiling():  # the tuning child waits for calls to pause; a traced call stamps in the operator
        yielding.stamp_call()
    activation = activation_name(activation)
    if isinstance(weight, QuantizedWeight):  # a quantized weight: its own path (matmul.quant)
        from . import quantized as quant_linear

        return quant_linear.linear(x, weight, bias, activation)
    try:
        variant = Variant("nk", bias is not None, activation or None)
    except ValueError as e:
        raise MatmulInputError(str(e)) from None
    _check_linear(x, weight, bias, variant)
    x2 = shapes.flatten_rows(x)
    if shapes.is_empty(x2, weight):  # nothing for a kernel to do: torch's result, of torch's shape
        check_empty_call(x2, weight.T)
        return activate(torch.nn.functional.linear(x, weight, bias), variant.activation)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    recorded = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if not (recorded or _is_compiling()):  # x of any strides, as torch takes it: copied once where TMA
        x2 = readable(x2)  # cannot read it (the operators' bodies do the same: torch_op._linear_product)
    if recorded:
        y = torch_op.linear_with_grad(x2, weight, bias, variant.activation)
    elif _is_compiling():
        y = torch.ops.tilus_matmul.linear(x2, weight, bias, variant.activation or "")
    elif variant == PLAIN:
        y = matmul(x2, weight.T)
    else:
        y = _plans.launch_fused(x2, weight.T, bias, variant)
    return y.view(*x.shape[:-1], y.shape[-1])


use_plans(_plans)  # the native entry reads the process's plans
if _native is None:
    matmul, linear = python_matmul, python_linear
else:
    # seen calls run from the native entry's table; found here, not in the extension (which is not
    # importable by name): they pickle. torch.compile cannot look into a builtin: it traces the
    # Python function in its place.
    matmul, linear = _native.matmul, _native.linear
    for _builtin, _function in ((matmul, python_matmul), (linear, python_linear)):
        _builtin.__module__ = __name__
        torch.compiler.substitute_in_graph(_builtin)(_function)


def _check_linear(x, weight, bias, variant: Variant) -> None:
    if isinstance(weight, TransposedWeight):
        raise MatmulInputError(
            f"weight is qw.T, a quantized weight transposed to [K, N] = {list(weight.shape)}: linear takes the "
            "weight as nn.Linear stores it, linear(x, qw)"
        )
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise MatmulInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() < 1 or weight.dim() != 2:
        raise MatmulInputError(
            f"linear takes x [..., K] and weight [N, K], got shapes {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise MatmulInputError(
            f"x's last dimension ({x.shape[-1]}) must equal weight's second ({weight.shape[1]}): "
            f"weight is [N, K] = {list(weight.shape)}, as nn.Linear stores it"
        )
    check_bias(bias, x, weight.shape[0])
    if variant.activation == "swiglu" and weight.shape[0] % (2 * SWIGLU_GROUP):
        raise MatmulInputError(
            f"swiglu takes the fused gate-up weight of matmul.gate_up(gate, up), whose rows are a multiple "
            f"of {2 * SWIGLU_GROUP}; got weight {list(weight.shape)}"
        )


def choice(a: torch.Tensor, b: torch.Tensor) -> Entry:
    """The choice ``matmul(a, b)`` runs now, and where it came from; never waits for tuning.

    The entry (``version``, ``config``; for a measured one its timings, ``candidates`` and
    ``rejected``) with ``source``: "measured" (tuned on this machine, in ``choices.json``),
    "shipped" (the package's table, ``shipped/``), "nearest" (the nearest measured
    bucket of the same N x K, named by ``nearest``) or "fallback" (cuBLAS: nothing measured); ``key``
    (the bucket's); ``stale`` (made with other kernel sources: measured again); ``pending`` (a
    background tuning of the bucket is queued or under way); ``building`` (the version whose
    kernel is being built while cuBLAS runs; ``chosen`` is its entry); ``below`` (the M from which
    the bucket's version won when it was tuned: this smaller M runs cuBLAS; ``chosen`` is its entry).
    See ``chooser``. For a batched
    b (more than two dimensions) the batched kernels' choice, or cuBLAS with the ``reason`` (``batched``).
    For ``qw.T`` of a packed weight the quantized call's (``quantized.choice``: V8's configuration from
    the rules of ``shipped/rules/v8.json``, or the widened path and why)."""
    if isinstance(b, TransposedWeight):  # qw.T: the quantized call's choice
        from . import quantized as quant_linear

        return quant_linear.choice(a, b.weight)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and b.dim() > 2:
        return batched.choice(_chooser, a, b)
    operand, b_layout, _ = check_call(a, b)
    m, k = a.shape
    n = operand.shape[0] if b_layout == "nk" else operand.shape[1]
    if b_layout == TORCH_ONLY:  # as launch.Plans.derive: only cuBLAS takes them
        reason = "TMA cannot read these operands in place (rows or base not 16-byte aligned)"
        return {"version": VENDOR, "config": {}, "source": "fallback", "reason": reason}
    return _chooser.get(a.device, a.dtype, m, n, k, variant=Variant(b_layout))[1]


def tune(
    shapes: Iterable[tuple[int, int, int]],
    dtype: torch.dtype = torch.float16,
    device: Optional[torch.device] = None,
    *,
    variant: Variant = PLAIN,
    use_shipped: bool = True,
    progress: Optional[bool] = None,
    on_entry=None,
    narrow: bool = False,
) -> dict[tuple[int, int, int], Entry]:
    """Tune now, in a child process, every (M, N, K) of ``shapes`` whose bucket has no fresh choice
    on ``device`` (default: the current GPU) (measured here, or shipped where ``use_shipped``),
    and build the chosen kernels: afterwards no call of these shapes waits or runs an instant
    choice. The entries by shape (``choice``'s form). Before capturing a CUDA graph, or to pay
    for a model's tuning up front (``python -m matmul tune``). ``progress``: a tqdm bar over the
    buckets tuned (None: where stderr is a terminal); ``on_entry(key, entry)`` as each arrives.
    ``narrow``: time each bucket only among the candidates that came close in its own earlier
    measurement or in its nearest relative (the same bucket in the other dtype or without the
    variant, or the nearest M), as the background tuning does: seconds a bucket instead of many;
    the entry names what narrowed it (``narrowed_from``)."""
    device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    shapes = [tuple(int(x) for x in s) for s in shapes]
    for m, n, k in shapes:
        if min(m, n, k) < 1:
            raise MatmulInputError(f"every dimension must be at least 1, got M={m}, N={n}, K={k}")
    return _chooser.tune(
        device, dtype, shapes, variant, use_shipped=use_shipped, progress=progress, on_entry=on_entry, narrow=narrow
    )
