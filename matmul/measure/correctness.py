"""Correctness of a kernel against a float32 reference, as the tests and the harness check it."""

from __future__ import annotations

import math

import torch

from ..contract import DTYPES, aligned_row_length, empty_padded

# fp16/bf16 inputs, float32 accumulation, rounded once to the output dtype: the relative error is
# that rounding (2^-11 for float16, 2^-8 for bfloat16) plus accumulation-order noise.
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def random_operands(m: int, n: int, k: int, dtype: torch.dtype, device="cuda", generator=None):
    """Fresh random A [M, K] and B [N, K], rows padded to 16 bytes as the TMA contract needs."""
    assert dtype in DTYPES

    def matrix(rows, cols):
        padded = torch.empty((rows, aligned_row_length(cols, dtype)), dtype=dtype, device=device)
        padded.uniform_(-1, 1, generator=generator)  # the padding holds noise too: it must not be read
        return padded[:, :cols]

    return matrix(m, k), matrix(n, k)


def poisoned_output(m: int, n: int, dtype: torch.dtype, device="cuda") -> torch.Tensor:
    """An output [M, N] full of NaN, so that any element the kernel fails to write is caught."""
    out = empty_padded(m, n, dtype, device)
    out.fill_(float("nan"))
    return out


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.float() @ b.float().T


def relative_error(out: torch.Tensor, ref: torch.Tensor, chunk_elements: int = 1 << 26) -> float:
    """||out - ref|| / ||ref|| in float64; NaN (an unwritten or broken element) gives inf. Taken over
    row blocks of about ``chunk_elements`` elements, so that checking an output past 2^31 elements
    does not need float64 copies of the whole of it (the tuner checks such shapes too)."""
    rows = max(1, chunk_elements // max(out.shape[-1], 1)) if out.dim() == 2 else out.shape[0]
    diff_sq = ref_sq = 0.0
    for i in range(0, out.shape[0], rows):
        o, r = out[i : i + rows].double(), ref[i : i + rows].double()
        d = o - r
        if not torch.isfinite(d).all():
            return math.inf
        diff_sq += d.square().sum().item()
        ref_sq += r.square().sum().item()
    return math.sqrt(diff_sq) / max(math.sqrt(ref_sq), 1e-30)


CHECK_SHAPES = ((1000, 4095, 17), (17, 1000, 4095), (4095, 17, 1000))  # no multiple of any tile


def check_cases(
    module, shapes=CHECK_SHAPES, dtypes=DTYPES, config=None
) -> list[tuple[int, int, int, torch.dtype, float]]:
    """Run one version (its autotuning, or ``config``) on fresh random operands of each shape and
    dtype, the output poisoned with NaN first: ``(m, n, k, dtype, relative error)`` per case."""
    from ..kernels.versions import run

    cases = []
    for dtype in dtypes:
        for m, n, k in shapes:
            a, b = random_operands(m, n, k, dtype)
            out = run(module, a, b, poisoned_output(m, n, dtype), config=config)
            cases.append((m, n, k, dtype, relative_error(out, reference(a, b))))
    return cases


def check_version(module, shapes=CHECK_SHAPES, dtypes=DTYPES, config=None) -> float | None:
    """The worst relative error of ``check_cases``, or None if any result is off by more than its
    dtype's tolerance."""
    cases = check_cases(module, shapes, dtypes, config)
    if any(not error <= TOLERANCE[dtype] for *_, dtype, error in cases):
        return None
    return max(error for *_, error in cases)
