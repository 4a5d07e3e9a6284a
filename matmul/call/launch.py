"""The per-call path of ``matmul()``: everything that can be derived from the operands' signature is
derived once and kept.

A signature is what a call's validity and its launch depend on apart from the data: the shapes,
strides, dtypes and device of ``a``, ``b`` and ``out`` (or that there is none). The first call
with a signature runs the full checks (``contract.check_call``, the clear errors), asks the
``Chooser`` for its bucket's choice and keeps a plan:

* ``VendorPlan`` (cuBLAS won): ``torch.mm`` on the caller's own operands, nothing around it.
* ``SeriesPlan`` (a version won): the compiled tilus program's launch function itself, the sizes
  and row strides already computed, called with the data pointers. tilus's own ``Script.__call__``
  would re-derive its dispatch keys on every call; the launch function takes the stream from torch
  (the current stream of the one tensor argument, ``out``), so CUDA graph capture records it.

A later call with the same signature checks only what the signature does not fix: the 16-byte
alignment of the data pointers (TMA's rule) and, with ``out``, that it does not overlap ``a`` or
``b``; and it launches under the operands' GPU when that is not the current one.

A call without ``out`` whose signature was seen does not come here at all where the native entry is
built (``native_entry``): ``keep`` also puts the plan's route (``add_route``) in ``Plans.direct``,
the C++ table the public ``matmul`` reads. On a host-bound call every step in Python is a visible
share of the time; the table reads the signature from the ``at::Tensor`` and runs the route without
a Python frame: ``at::mm`` on the caller's tensors for cuBLAS; for a version, what
``SeriesPlan.__call__`` does (the alignment checked, the output allocated, the program called with
the pointers), unless b is copied per call, where the plan itself runs.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch

from .. import contract
from ..contract import TMA_ALIGN_BYTES, aligned_row_length, check_aligned, check_no_overlap, layout, row_stride
from ..kernels import versions
from . import native_entry, tilus_autotune
from .tuner import VENDOR, Chooser, fits, space_config


def signature(a, b, out) -> tuple:
    """What a plan depends on apart from the data; raises AttributeError for what is not a tensor."""
    if out is None:
        return a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.device, b.device
    return (
        a.shape,
        b.shape,
        a.stride(),
        b.stride(),
        a.dtype,
        b.dtype,
        a.device,
        b.device,
        out.shape,
        out.stride(),
        out.dtype,
        out.device,
    )


class VendorPlan:
    """cuBLAS chose for this bucket: ``torch.mm`` on the caller's operands (b [K, N] as given)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor]):
        self.layouts = (layout(a), layout(b), None if out is None else layout(out))
        self.out_contiguous = out is not None and out.is_contiguous()

    def add_route(self, table, a, b) -> None:
        """Calls without ``out`` of the signature of ``a`` and ``b``: at::mm, from the native entry."""
        table.put_vendor(a, b, self.__call__)

    def __call__(self, a, b, out=None):
        if out is None:
            return torch.mm(a, b)
        check_no_overlap(out.data_ptr(), self.layouts[2], "a", a.data_ptr(), self.layouts[0])
        check_no_overlap(out.data_ptr(), self.layouts[2], "b", b.data_ptr(), self.layouts[1])
        if self.out_contiguous:
            torch.mm(a, b, out=out)
        else:  # rows padded to 16 bytes: cuBLAS writes a dense result, copied into the padded rows
            out.copy_(torch.mm(a, b))
        return out


class SeriesPlan:
    """A version chose for this bucket: its compiled launch function, called with the pointers."""

    def __init__(
        self,
        launch: Callable,
        a: torch.Tensor,
        b: torch.Tensor,
        bt: torch.Tensor,
        copied: bool,
        c: torch.Tensor,
        out: Optional[torch.Tensor],
    ):
        (self.m, self.k), self.n = a.shape, bt.shape[0]
        self.launch = launch
        self.lda, self.ldb, self.ldc = row_stride(a), row_stride(bt), row_stride(c)
        self.copy_b = copied  # b row-major [K, N]: transposed into [N, K] rows on every call
        self.dtype, self.device = a.dtype, a.device
        self.device_index = a.device.index if a.device.type == "cuda" else None
        self.out_row = aligned_row_length(self.n, a.dtype)  # an allocated output's row, padded to 16 bytes
        self.layouts = (layout(a), layout(b), None if out is None else layout(out))

    def add_route(self, table, a, b) -> None:
        """Calls without ``out`` of the signature of ``a`` and ``b``: the native entry allocates the
        output and calls the program itself, unless b is copied per call (then this plan runs)."""
        if self.copy_b:
            table.put(a, b, self.__call__)
        else:
            n, row = self.n, self.out_row
            args = (self.launch, self.m, n, self.k, self.lda, self.ldb, self.ldc, row, TMA_ALIGN_BYTES)
            table.put_launch(a, b, self.__call__, *args)

    def __call__(self, a, b, out=None):
        # on the path of every call: each step here is paid per launch, so it is kept short
        if a.data_ptr() % TMA_ALIGN_BYTES:
            check_aligned("a", a.data_ptr())
        if self.copy_b:
            bt = torch.empty((self.n, self.ldb), dtype=self.dtype, device=self.device)
            bt[:, : self.k].copy_(b.T)
        else:  # b = w.T: the kernel reads w's rows in place
            bt = b
            if b.data_ptr() % TMA_ALIGN_BYTES:
                check_aligned("b.T", b.data_ptr())
        if out is None:
            buffer = torch.empty((self.m, self.out_row), dtype=self.dtype, device=self.device)
            out = buffer if self.out_row == self.n else buffer[:, : self.n]
        else:
            buffer = out
            check_aligned("out", out.data_ptr())
            check_no_overlap(out.data_ptr(), self.layouts[2], "a", a.data_ptr(), self.layouts[0])
            check_no_overlap(out.data_ptr(), self.layouts[2], "b", b.data_ptr(), self.layouts[1])
        if self.device_index is None or self.device_index == _current_device():
            self.launch(self.m, self.n, self.k, a.data_ptr(), bt.data_ptr(), buffer, self.lda, self.ldb, self.ldc, 0)
        else:
            with torch.cuda.device(self.device_index):
                self.launch(
                    self.m, self.n, self.k, a.data_ptr(), bt.data_ptr(), buffer, self.lda, self.ldb, self.ldc, 0
                )
        return out


def _current_device() -> int:
    # torch.cuda.current_device() without its initialization check: a plan exists, so CUDA is initialized
    return torch._C._cuda_getDevice()


class Plans:
    """The process's plans by signature. ``check`` and ``program`` are parameters so that the tests
    can run the path on the CPU with stand-in kernels."""

    def __init__(self, chooser: Chooser, check=contract.check_call, program=None):
        self.chooser = chooser
        self.check = check
        self.program = program or tilus_autotune.launch_function
        self.plans: dict[tuple, object] = {}
        # the native entry's table of routes for calls without out (None where it is not built)
        self.direct = native_entry.new_table()

    def keep(self, plan, a, b, out=None) -> None:
        """Keep ``plan`` for calls with the signature of these operands, and for calls without ``out``
        its route in the native entry's table."""
        self.plans[signature(a, b, out)] = plan
        if out is None and self.direct is not None:
            plan.add_route(self.direct, a, b)

    def launch(self, a, b, out=None):
        """``a @ b`` into ``out`` (allocated if None); the result."""
        try:
            key = signature(a, b, out)
            plan = self.plans.get(key)
        except (AttributeError, TypeError):  # not tensors: the full checks name the problem
            key = plan = None
        if plan is None:
            plan = self.derive(a, b, out, key)
        return plan(a, b, out)

    def derive(self, a, b, out, key):
        """The full checks, the bucket's choice, and the plan for this signature (kept under ``key``)."""
        bt, copied, c = self.check(a, b, out)
        (m, k), n = a.shape, bt.shape[0]
        arch, entry = self.chooser.get(a.device, a.dtype, m, n, k)
        plan = None
        if entry["version"] != VENDOR:
            module = versions.load(arch, entry["version"])
            # the bucket's choice was tuned on a neighbouring shape: a version with limits may not take this one
            if fits(module, m, n, k, row_stride(a), row_stride(bt), row_stride(c)):
                script = versions.kernel(module, a.dtype, space_config(module, entry["config"]))
                with torch.cuda.device(a.device) if a.device.type == "cuda" else contextlib.nullcontext():
                    plan = SeriesPlan(self.program(script), a, b, bt, copied, c, out)
        if plan is None:
            plan = VendorPlan(a, b, out)
        if key is not None:
            self.keep(plan, a, b, out)
        return plan

    def plan_for(self, a, b, out=None):
        """The plan a call with these operands uses (derived if needed): for tests and ``choice``."""
        key = signature(a, b, out)
        return self.plans.get(key) or self.derive(a, b, out, key)
