"""The registry of the series: which version modules exist for which architecture, and how to run
one of them with its own autotuning or with one fixed configuration.

A version module (``matmul/kernels/<family>/v<N>.py``) defines:

* ``Kernel`` -- a ``matmul.kernels.entry.MatmulKernel`` (a ``tilus.Script``) autotuned with
  ``@tilus.autotune`` over its space: ``__init__(dtype, <its knobs>)`` and a ``matmul`` method that
  receives the global views of A, B and C (the shared entry point makes them);
* ``IDEA`` -- the one idea it adds over the previous version, in a few words;
* ``REPRESENTATIVE`` -- one configuration of its space, the one CI builds by default;
* ``PTX_MARKERS`` -- the PTX instructions that show its step (checked by the tests).
* ``supports(m, n, k)`` (optional) -- whether the version is made for that shape; absent means every
  shape. The tuner, the bench and the GPU tests skip a version on shapes it does not support.
* ``MAX_ELEMENTS`` (optional) -- the largest element offset the version can compute, where it
  indexes an operand in 32 bits (``load_global``/``store_global``; TMA takes 64-bit coordinates).
  ``fits`` checks both; ``run`` refuses what does not fit, and the tuner never tries it.
* ``EXTRA_CONFIGS`` (optional) -- configurations outside the autotune space that are built and
  checked (``build_configs``) but never tuned, so ``matmul()`` cannot pick them; one is run only
  when asked for by name (``kernel(module, dtype, config)``). Blackwell V6's 4-CTA cluster waits
  there until it has run on hardware; Hopper V6's ping-pong consumers stay there, slower than V6
  without them (plots/h100/pingpong/).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
from types import ModuleType
from typing import Any, Optional

import tilus
import torch

from ..contract import MatmulInputError, check_operands, row_stride
from . import device_context
from .entry import batched_class
from .variant import PLAIN, Variant

ARCHS = {"sm_100a": "blackwell", "sm_90a": "hopper"}
ARCH_NAMES = {"sm_100a": "Blackwell", "sm_90a": "Hopper"}
# sm_90a / sm_100a code runs only on exactly these compute capabilities (not on 10.3, 12.0, ...)
ARCH_BY_CAPABILITY = {(9, 0): "sm_90a", (10, 0): "sm_100a"}
VERSIONS = tuple(f"v{i}" for i in range(8))
# The versions past the series that multiply by a quantized weight (``matmul.quant``: packed words and
# scales, not a 16-bit B), V8 of each architecture: launched through ``matmul.quant``, never by the
# tuner, the bench or ``matmul()``, so they are not in VERSIONS.
QUANTIZED_VERSIONS = ("v8", "v8_prefill")  # v8_prefill: Hopper only, correct, not the call's (slower)
# The candidate that is not a version of the series: the vendor library, through torch.matmul. The
# tuner, its stored choices and the harness's results all call it by this one name.
CUBLAS = "cuBLAS"
TILUS_DTYPES = {torch.float16: tilus.float16, torch.bfloat16: tilus.bfloat16}


_ARCH_ALIASES = {
    **{name: "sm_100a" for name in ("sm_100a", "sm100a", "sm_100", "sm100", "blackwell")},
    **{name: "sm_90a" for name in ("sm_90a", "sm90a", "sm_90", "sm90", "hopper")},
}


def normalize_arch(arch: str) -> str:
    """'sm_100a', 'sm100a', 'blackwell' -> 'sm_100a'; likewise for Hopper."""
    try:
        return _ARCH_ALIASES[arch.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}") from None


def local_arch() -> Optional[str]:
    """The series that runs on this machine's current GPU, or None (no GPU, or another kind)."""
    if not torch.cuda.is_available():
        return None
    return ARCH_BY_CAPABILITY.get(torch.cuda.get_device_capability())


def module_name(arch: str, version: str) -> str:
    return f"matmul.kernels.{ARCHS[normalize_arch(arch)]}.{version}"


def available(arch: str) -> list[str]:
    """The versions that exist for ``arch``, in order."""
    found = []
    for version in VERSIONS:
        try:
            importlib.import_module(module_name(arch, version))
        except ModuleNotFoundError as e:
            if e.name != module_name(arch, version):
                raise
            continue
        found.append(version)
    return found


def quantized(arch: str) -> list[str]:
    """The quantized-weight versions (``QUANTIZED_VERSIONS``) that exist for ``arch``."""
    return [v for v in QUANTIZED_VERSIONS if importlib.util.find_spec(module_name(arch, v)) is not None]


def load(arch: str, version: str) -> ModuleType:
    return importlib.import_module(module_name(arch, version))


def space(module: ModuleType, variant: Optional[Variant] = None) -> list[dict[str, Any]]:
    """Every configuration of the version's autotune space, as keyword dicts; given ``variant``, those
    that build for it (a version may leave some out for a variant: its ``takes(config, variant)``)."""
    items = []
    for names, values in getattr(module.Kernel, "_autotune_space", {}).items():
        keys = [n.strip() for n in names.split(",")]
        items.append([dict(zip(keys, v if len(keys) > 1 else [v])) for v in values])
    points = [functools.reduce(lambda x, y: x | y, combo, {}) for combo in itertools.product(*items)]
    takes = getattr(module, "takes", None)
    if variant is not None and takes is not None:
        points = [point for point in points if takes(point, variant)]
    return points


def build_configs(module: ModuleType, variant: Optional[Variant] = None) -> list[dict[str, Any]]:
    """Every configuration to build and check: the autotune space, then ``EXTRA_CONFIGS``; given
    ``variant``, those that build for it (``space``)."""
    configs = [*space(module), *(dict(config) for config in getattr(module, "EXTRA_CONFIGS", ()))]
    takes = getattr(module, "takes", None)
    if variant is not None and takes is not None:
        configs = [config for config in configs if takes(config, variant)]
    return configs


@functools.cache
def _fixed_kernel_class(kernel_cls: type, config_items: tuple) -> type:
    # Same kernel, an autotune space of one point: tilus builds and caches it as usual.
    return type(
        kernel_cls.__name__,
        (kernel_cls,),
        {
            "_autotune_space": {name: [value] for name, value in config_items},
            "__module__": kernel_cls.__module__,
        },
    )


def _variant_space_class(module: ModuleType, variant: Variant) -> type:
    """The version's ``Kernel``, or where it leaves points of its space out for ``variant``
    (``space``), the same kernel autotuned over the others only."""
    points = space(module, variant)
    if len(points) == len(space(module)):
        return module.Kernel
    return _points_kernel_class(module.Kernel, tuple(tuple(point.items()) for point in points))


@functools.cache
def _points_kernel_class(kernel_cls: type, points: tuple) -> type:
    # Same kernel, an autotune space of these points (each a tuple of (name, value), one order)
    names = ", ".join(name for name, _ in points[0])
    return type(
        kernel_cls.__name__,
        (kernel_cls,),
        {
            "_autotune_space": {names: [tuple(value for _, value in point) for point in points]},
            "__module__": kernel_cls.__module__,
        },
    )


def fixed_script(kernel_cls: type, config: dict[str, Any], dtype: torch.dtype, name: Optional[str] = None):
    """The launchable script of ``kernel_cls`` (a version's ``Kernel``, or a subclass with one step
    changed, as the probes under ``plots/`` build them) fixed to ``config``, named ``name`` in
    tilus's cache (default: the class's name)."""
    fixed = _fixed_kernel_class(kernel_cls, tuple(sorted(config.items())))
    if name is not None:
        fixed.__name__ = name
    return fixed(dtype=TILUS_DTYPES[dtype])


def fixed_kernel(module: ModuleType, dtype: torch.dtype, config: dict[str, Any], **options):
    """A version's script for ``dtype`` fixed to ``config``, built with the kernel's further
    ``options`` (Hopper V8's ``weight``: the packed format it reads)."""
    return _fixed_kernel_class(module.Kernel, tuple(sorted(config.items())))(dtype=TILUS_DTYPES[dtype], **options)


def kernel(module: ModuleType, dtype: torch.dtype, config: Optional[dict[str, Any]] = None, variant: Variant = PLAIN):
    """The launchable tilus script of a version for ``dtype``: autotuned, or fixed to ``config``; for
    ``variant`` (B's layout, the epilogue), which the version must support (``variant.supported``)."""
    if config is None:
        cls = _variant_space_class(module, variant)
    else:
        cls = _fixed_kernel_class(module.Kernel, tuple(sorted(config.items())))
    if variant.batched:  # the same kernel behind the batched entry point (launched with batched_launch_args)
        cls = batched_class(cls)
    if variant == PLAIN:
        return cls(dtype=TILUS_DTYPES[dtype])
    return cls(dtype=TILUS_DTYPES[dtype], **variant.kernel_options())


def run(
    module: ModuleType,
    a: torch.Tensor,
    b: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    config: Optional[dict[str, Any]] = None,
) -> torch.Tensor:
    """C = A @ B^T with one version of the series (A [M, K], B [N, K], row-major). A shape the
    version cannot take (``fits``) is refused with ``MatmulInputError`` before anything runs."""
    out = check_operands(a, b, out)
    check_fits(module, a.shape[0], b.shape[0], a.shape[1], row_stride(a), row_stride(b), row_stride(out))
    with device_context.on_device(a.device):
        kernel(module, a.dtype, config)(*launch_args(a, b, out))
    return out


def _reach(m, n, k, lda, ldb, ldc, variant: Variant) -> dict[str, int]:
    """The element count each operand's last element lies at (its largest offset + 1)."""
    b_rows, b_cols = (n, k) if variant.b_layout == "nk" else (k, n)
    columns = variant.out_columns(n)
    lda, ldb, ldc = lda or k + (-k) % 8, ldb or b_cols + (-b_cols) % 8, ldc or columns + (-columns) % 8
    return {"A": (m - 1) * lda + k, "B": (b_rows - 1) * ldb + b_cols, "C": (m - 1) * ldc + columns}


def fits(
    module: ModuleType,
    m: int,
    n: int,
    k: int,
    lda: Optional[int] = None,
    ldb: Optional[int] = None,
    ldc: Optional[int] = None,
    variant: Variant = PLAIN,
) -> bool:
    """Whether a version may run C [M, N] = A [M, K] @ B^T (B [N, K], or [K, N] for ``variant``'s
    "kn") with these row strides (default: rows padded to 16 bytes, as the tuner's operands are):
    its ``supports(m, n, k)`` if it declares one, and its ``MAX_ELEMENTS`` if it declares one (the
    largest element offset it can compute: 32-bit offsets)."""
    return _limit(module, m, n, k, lda, ldb, ldc, variant) is None


def _limit(module, m, n, k, lda, ldb, ldc, variant) -> Optional[str]:
    """What keeps the version from this call, in words, or None."""
    supports = getattr(module, "supports", None)
    if supports is not None and not supports(m, n, k):
        doc = (supports.__doc__ or "").strip().splitlines()
        return f"it supports only some shapes ({doc[0] if doc else 'supports(m, n, k) is False'})"
    limit = getattr(module, "MAX_ELEMENTS", None)
    if limit is None:
        return None
    over = {name: reach for name, reach in _reach(m, n, k, lda, ldb, ldc, variant).items() if reach > limit}
    if not over:
        return None
    named = ", ".join(f"{name} reaches element {reach:,}" for name, reach in over.items())
    return f"it computes element offsets in 32 bits (MAX_ELEMENTS = {limit:,}) and {named}"


def check_fits(
    module: ModuleType,
    m: int,
    n: int,
    k: int,
    lda: Optional[int] = None,
    ldb: Optional[int] = None,
    ldc: Optional[int] = None,
    variant: Variant = PLAIN,
) -> None:
    """``MatmulInputError`` naming the limit and the fix where the version cannot take the call (``fits``):
    launched anyway, it would read or write past what it can index (an illegal address)."""
    problem = _limit(module, m, n, k, lda, ldb, ldc, variant)
    if problem is not None:
        name = module.__name__.rsplit(".", 2)
        raise MatmulInputError(
            f"{'/'.join(name[-2:])} cannot run M={m}, N={n}, K={k}: {problem}. Use matmul.matmul(a, b), which "
            "picks a kernel that takes the shape, or split the call into parts within the limit"
        )


def full_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` [rows, cols] with row stride ``ld`` as the dense [rows, ld] tensor around it (same pointer).

    tilus's autotuner clones the tensor arguments it tunes on, and ``Tensor.clone()`` of a
    row-padded view (``buf[:, :17]``) is a *contiguous* copy: the kernel, still told the padded
    row stride, would read past it. Handed the whole padded rows, tilus clones the same layout.
    Only for matrices whose last row is padded too, as ``correctness.random_operands`` allocates them."""
    ld = row_stride(t)
    return t.as_strided((t.shape[0], ld), (ld, 1))


def launch_args(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor] = None, b_layout: str = "nk"
) -> tuple:
    """The arguments of a version's ``Kernel.__call__`` for C = A @ B^T: B [N, K] (``b_layout``
    "nk") or b [K, N] ("kn"); N is B's, which for swiglu is twice C's width."""
    (m, k), n = a.shape, b.shape[0] if b_layout == "nk" else b.shape[1]
    strides = (row_stride(a), row_stride(b), row_stride(out))
    return (m, n, k, full_rows(a), full_rows(b), full_rows(out), *strides, 0 if bias is None else bias)


def full_batch_rows(t: torch.Tensor) -> torch.Tensor:
    """``full_rows`` of a batch of matrices [batches, rows, cols] (same pointer): whole padded rows,
    so that tilus's autotuner clones the layout the kernel is told of. Only for batches allocated
    with their rows padded (``measure.correctness.random_batched_operands``) or unpadded."""
    ld = t.stride(1)
    return t.as_strided((t.shape[0], t.shape[1], ld), (t.stride(0), ld, 1))


def batched_launch_args(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, b_layout: str = "nk", bias: Optional[torch.Tensor] = None
) -> tuple:
    """The arguments of a batched kernel (``entry.batched_class``) for C[i] = A[i] @ B[i]^T: a
    [batches or 1, M, K], b [batches or 1, N, K] ("nk") or [batches or 1, K, N] ("kn"), out
    [batches, M, N], each matrix row-major (an operand of batch extent 1 is shared by every
    product). Checked by the caller (``contract.check_batched``)."""
    batches, m, _ = out.shape
    k = a.shape[2]
    n = b.shape[1] if b_layout == "nk" else b.shape[2]

    def batch_stride(t):  # any valid stride for a shared operand: its matrix is the only one
        return t.stride(0) if t.shape[0] > 1 else t.shape[1] * t.stride(1)

    return (
        batches,
        m,
        n,
        k,
        full_batch_rows(a),
        full_batch_rows(b),
        full_batch_rows(out),
        a.stride(1),
        b.stride(1),
        out.stride(1),
        0 if bias is None else bias,
        a.shape[0],
        b.shape[0],
        batch_stride(a),
        batch_stride(b),
        batch_stride(out),
    )
