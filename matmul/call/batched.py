"""``matmul(a, b)`` with a batch of matrices (torch.bmm's case, and torch.matmul's broadcast of one
matrix across the batch): one launch of a batched kernel whose tile schedule enumerates (batch,
m-tile, n-tile) (``kernels.entry.batched_class``), chosen per (shape bucket, B layout, batch-count
bucket) as 2-D calls are (``Variant.batches``), cuBLAS (torch.matmul) always a candidate.

What the kernels take (``form``), without a copy:

* a [..., M, K] and b [..., K, N] whose batch dimensions are equal, or where one of them is a
  single matrix (2-D, or every batch dimension 1) shared by every product, as torch.matmul
  broadcasts it; the batch dimensions flatten to one as a view;
* each matrix row-major with its rows 16-byte aligned (a), and b [K, N] row-major ("kn") or
  b = w.transpose(-1, -2) of a row-major w [..., N, K] ("nk"); each batch stride a multiple of 16
  bytes that keeps the matrices apart; every base address 16-byte aligned;
* no ``out=``, a CUDA device of the series.

A 2-D b against a batched a is not here: that is the 2-D product of a's rows flattened
(``shapes.general``). What the kernels cannot take goes to torch.matmul, and ``matmul.choice`` names
why (``reason``). Batch dimensions that do not broadcast, mismatched K, dtypes the series does not
take: ``MatmulInputError`` naming the problem and the fix. Never a wrong result.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional, Union

import torch

from ..contract import DTYPES, TMA_ALIGN_BYTES, MatmulInputError, aligned_row_length
from ..kernels import device_context, versions
from ..kernels.variant import Variant, batch_bucket


@dataclasses.dataclass(frozen=True)
class Form:
    """How the kernels read a batched call: every operand [batch, rows, cols] (batch 1 where shared)."""

    a: torch.Tensor  # [Ba, M, K]
    operand: torch.Tensor  # B as the kernel reads it: [Bb, N, K] ("nk") or [Bb, K, N] ("kn")
    b_layout: str
    batches: int
    shape: tuple  # the result's shape, torch.matmul's

    @property
    def mnk(self) -> tuple[int, int, int]:
        m, k = self.a.shape[1:]
        n = self.operand.shape[1] if self.b_layout == "nk" else self.operand.shape[2]
        return m, n, k

    def variant(self) -> Variant:
        return Variant(self.b_layout, batches=batch_bucket(self.batches))


def _flat(t: torch.Tensor, batch_shape: tuple) -> Union[torch.Tensor, str]:
    """``t`` [*batch, rows, cols] as [B, rows, cols] (B = 1 for a matrix shared by every product), a
    view; or why not."""
    rows, cols = t.shape[-2:]
    if t.dim() == 2 or all(d == 1 for d in t.shape[:-2]):
        return t.reshape(1, rows, cols) if t.dim() != 2 else t.unsqueeze(0)
    if tuple(t.shape[:-2]) != tuple(batch_shape):
        return "one operand's batch dimensions broadcast against the other's only in part"
    try:
        return t.view(-1, rows, cols)
    except RuntimeError:
        return "the batch dimensions do not flatten to one as a view"


def _matrix_rule(name: str, t: torch.Tensor) -> Optional[str]:
    """Why TMA cannot read or write the row-major matrices of ``t`` [B, rows, cols] in place, or None."""
    item = t.element_size()
    batches, rows, cols = t.shape
    if t.stride(2) != 1 and cols > 1:
        return f"{name}'s matrices are not row-major"
    row = t.stride(1) if rows > 1 else aligned_row_length(cols, t.dtype)
    if (row * item) % TMA_ALIGN_BYTES or row < cols:
        return f"{name}'s row stride is not a multiple of {TMA_ALIGN_BYTES} bytes"
    if batches > 1 and ((t.stride(0) * item) % TMA_ALIGN_BYTES or t.stride(0) < (rows - 1) * row + cols):
        return f"{name}'s batch stride is not a multiple of {TMA_ALIGN_BYTES} bytes that keeps its matrices apart"
    if t.data_ptr() % TMA_ALIGN_BYTES:
        return f"{name}'s data pointer is not {TMA_ALIGN_BYTES}-byte aligned"
    return None


def form(a, b, out=None, *, require_cuda: bool = True) -> Union[Form, str]:
    """How the batched kernels take ``a @ b`` (b of three or more dimensions), or the reason torch.matmul
    runs it instead (module doc). Raises ``MatmulInputError`` for what torch.matmul would reject too,
    or what the series never takes (dtypes). ``require_cuda=False``: the rules on CPU tensors (tests)."""
    if a.dim() == 0:
        raise MatmulInputError(f"both operands must have at least one dimension, got shapes {tuple(a.shape)}")
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        raise MatmulInputError(
            f"a and b must both be float16 or both bfloat16, got {a.dtype} and {b.dtype}; "
            "convert with .half() or .bfloat16()"
        )
    if a.dim() == 1:
        return "a is 1-D"
    if a.shape[-1] != b.shape[-2]:
        raise MatmulInputError(
            f"inner dimensions differ: a is {list(a.shape)} and b is {list(b.shape)} "
            "(a's last dimension must equal b's second to last)"
        )
    try:
        batch_shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise MatmulInputError(
            f"batch dimensions do not broadcast: a is {list(a.shape)} and b is {list(b.shape)}; their "
            "leading dimensions must be equal, or 1 (or absent) in one of them"
        ) from None
    shape = (*batch_shape, a.shape[-2], b.shape[-1])
    if min(a.shape[-2], a.shape[-1], b.shape[-1]) < 1 or 0 in batch_shape:
        return "an empty dimension"
    if out is not None:
        return "out= is not taken by the batched kernels"
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return "gradients are recorded (torch.matmul's batched product has the backward)"
    if torch.compiler.is_compiling():
        return "traced by torch.compile"
    if require_cuda and (not (a.is_cuda and b.is_cuda) or a.device != b.device):
        return "the operands are not on one CUDA device"
    a3, b3 = _flat(a, batch_shape), _flat(b, batch_shape)
    for t in (a3, b3):
        if isinstance(t, str):
            return t
    batches = max(1, int(torch.Size(batch_shape).numel()))
    if b3.stride(2) == 1 or b3.shape[2] == 1:
        operand, b_layout = b3, "kn"  # b [B, K, N] row-major, read in place
    else:
        operand, b_layout = b3.transpose(1, 2), "nk"  # b = w.transpose(-1, -2): w [B, N, K], read in place
    for name, t in (("a", a3), ("b" if b_layout == "kn" else "b.transpose(-1, -2)", operand)):
        problem = _matrix_rule(name, t)
        if problem is not None:
            return problem
    return Form(a3, operand, b_layout, batches, shape)


def allocate(f: Form) -> torch.Tensor:
    """C [B, M, N], rows padded to 16 bytes (a view of the padded buffer where N needs it)."""
    m, n, _ = f.mnk
    buffer = torch.empty((f.batches, m, aligned_row_length(n, f.a.dtype)), dtype=f.a.dtype, device=f.a.device)
    return buffer[:, :, :n]


class BatchedPlans:
    """The batched calls' programs by (version, configuration, dtype, variant), built once; the
    choice itself is the chooser's, asked per call (it answers from memory after the first)."""

    def __init__(self):
        self.programs: dict[tuple, object] = {}
        self.lock = threading.Lock()

    def program(self, module, dtype, config, variant):
        key = (module.__name__, tuple(sorted(config.items())), dtype, variant)
        with self.lock:
            found = self.programs.get(key)
        if found is None:
            from . import tilus_autotune

            found = tilus_autotune.launch_function(versions.kernel(module, dtype, config, variant))
            with self.lock:
                self.programs[key] = found
        return found


_plans = BatchedPlans()


def choose(chooser, f: Form):
    """(module, config, arch) of the version the chooser picked for ``f``, or (None, entry) for cuBLAS."""
    from .tuner import VENDOR, space_config

    m, n, k = f.mnk
    arch, entry = chooser.get(f.a.device, f.a.dtype, m, n, k, variant=f.variant())
    if entry["version"] == VENDOR:
        return None, entry
    module = versions.load(arch, entry["version"])
    config = space_config(module, entry["config"], f.variant())
    if config is None or not versions.fits(module, m, n, k, variant=f.variant()):
        return None, entry
    return (module, config, arch), entry


def launch(program, f: Form, c: torch.Tensor) -> None:
    """One launch of a batched program: C[i] = A[i % Ba] @ B[i % Bb]."""
    args = versions.batched_launch_args(f.a, f.operand, c, f.b_layout)
    args = (*args[:4], f.a.data_ptr(), f.operand.data_ptr(), c, *args[7:])
    with device_context.on_device(f.a.device):
        program(*args)


def matmul(chooser, a, b, out=None) -> torch.Tensor:
    """``a @ b`` for a batched b (module doc): the chosen batched kernel, else torch.matmul."""
    f = form(a, b, out)
    if isinstance(f, str):
        return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)
    chosen, entry = choose(chooser, f)
    if chosen is None:
        return torch.matmul(a, b)
    module, config, arch = chosen
    # the chooser's program, built outside this process; built here only where the chooser builds nothing
    loaded = getattr(chooser, "program", None)
    program = None if loaded is None else loaded(arch, f.a.dtype, entry, f.variant())
    if program is None:
        if loaded is not None and chooser.mode != "blocking":
            return torch.matmul(a, b)
        program = _plans.program(module, f.a.dtype, config, f.variant())
    c = allocate(f)
    launch(program, f, c)
    return _shaped(c, f)


def _shaped(c: torch.Tensor, f: Form) -> torch.Tensor:
    """C [B, M, N] as the result's shape [*batch, M, N]: a view (C's batches are evenly strided)."""
    return c.unflatten(0, f.shape[:-2]) if len(f.shape) > 3 else (c if len(f.shape) == 3 else c[0])


def choice(chooser, a, b) -> dict:
    """``matmul.choice`` of a batched call: the chooser's entry, or cuBLAS with the ``reason``."""
    f = form(a, b)
    if isinstance(f, str):
        return {"version": versions.CUBLAS, "config": {}, "source": "fallback", "reason": f}
    _, entry = choose(chooser, f)
    return entry


# --- tuning: the candidates of a batched bucket, on fresh operands --------------------------------


def random_operands(batches: int, m: int, n: int, k: int, dtype, device, b_layout: str):
    """Fresh random a [B, M, K] and B [B, N, K] ("nk") or [B, K, N] ("kn"), rows padded to 16 bytes
    (the padding holds noise too: it must not be read), and the float32 reference C [B, M, N]."""

    def matrices(rows, cols):
        padded = torch.empty((batches, rows, aligned_row_length(cols, dtype)), dtype=dtype, device=device)
        padded.uniform_(-1, 1)
        return padded[:, :, :cols]

    a = matrices(m, k)
    operand = matrices(n, k) if b_layout == "nk" else matrices(k, n)
    b_nk = operand if b_layout == "nk" else operand.transpose(1, 2)
    ref = torch.bmm(a.float(), b_nk.float().transpose(1, 2))
    return a, operand, ref


def batched_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The relative error of the whole batch (``measure.correctness.relative_error`` of its rows)."""
    from ..measure.correctness import relative_error

    return relative_error(out.reshape(-1, out.shape[-1]), ref.reshape(-1, ref.shape[-1]))


def gpu_worker(arch: str, dtype, m: int, n: int, k: int, device, variant: Variant):
    """``tuner.gpu_worker`` for a batched variant: ``variant.batches`` products of fresh random
    operands; cuBLAS's candidate is torch.matmul of the batch (its batched GEMM), a version's its
    batched kernel; every output NaN-poisoned before it is checked. No host times: a batched call
    is not issued through the 2-D path's plans."""
    import functools

    from ..measure.timing import median_ms
    from .tuner import VENDOR, Candidate, _gpu_timer, tuned_kernel

    a, operand, ref = random_operands(variant.batches, m, n, k, dtype, device, variant.b_layout)
    torch_b = operand.transpose(1, 2) if variant.b_layout == "nk" else operand  # torch's b [B, K, N]
    out = allocate(Form(a, operand, variant.b_layout, variant.batches, (variant.batches, m, n)))
    args = versions.batched_launch_args(a, operand, out, variant.b_layout)

    def vendor():
        torch.matmul(a, torch_b, out=out)

    vendor_ms = functools.cache(lambda: median_ms(vendor, warmup_ms=20.0, repeat_ms=100.0))

    def prepare(version: str):
        out.fill_(float("nan"))
        if version == VENDOR:
            vendor()
            return Candidate(version, {}, batched_error(out, ref), vendor, vendor, vendor_ms, None)
        config, fixed = tuned_kernel(versions.load(arch, version), dtype, variant, args)
        out.fill_(float("nan"))
        fixed(*args)
        error = batched_error(out, ref)
        return Candidate(version, config, error, functools.partial(fixed, *args), vendor, vendor_ms, None)

    return prepare, _gpu_timer
