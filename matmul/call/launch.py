"""The per-call path of ``matmul()``: everything that can be derived from the operands' signature is
derived once and kept.

A signature is what a call's validity and launch depend on apart from the data: shapes, strides,
dtypes and device of ``a``, ``b`` and ``out``. Its first call runs the full checks
(``contract.check_call``), asks the ``Chooser`` for its bucket's choice and keeps a plan:
``VendorPlan`` (cuBLAS: ``torch.mm`` on the caller's operands) or ``SeriesPlan`` (the tilus
program's launch function itself, sizes and strides precomputed: tilus's ``Script.__call__`` would
derive its dispatch keys on every call; the launch takes torch's current stream, so CUDA graph
capture records it). A later call checks only what the signature does not fix: the 16-byte
alignment of the pointers (TMA's rule) and that ``out`` does not overlap an operand.

Where the native entry is built (``native_entry``), ``keep`` also puts the plan's route in
``Plans.direct``, the C++ table the public ``matmul`` reads, so a seen call without ``out`` runs with
no Python frame (on a host-bound call every Python step shows): ``at::mm`` for cuBLAS, for a version
what ``SeriesPlan.__call__`` does, unless b is copied per call, where the plan itself runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from typing import Callable, Optional

import torch

from .. import contract, knobs
from ..contract import (
    TMA_ALIGN_BYTES,
    TORCH_ONLY,
    aligned_row_length,
    check_no_overlap,
    layout,
    row_stride,
)
from ..kernels import device_context, versions
from ..kernels.variant import PLAIN, SWIGLU_GROUP, Variant
from . import native_entry, tilus_autotune, yielding
from .activation import activation
from .background import EXIT_JOIN_S, Worker
from .chooser import Chooser, bucket_memo
from .tuner import VENDOR, space_config

log = logging.getLogger(__name__)

# The M a plan's native route serves (``add_route``): every M of its bucket, unless the bucket's
# version won only from some M up (the choice's ``from_m``): then each side of it (``Plans.derive``).
ALL_ROWS = (0, 2**63 - 1)
PLAN_GROUP = "plans"  # the planner's jobs queued together are derived in one batch
PLANNER_LINGER_S = 5.0  # the planner's thread waits this long for the next unseen call before it ends
PLANNER_POLL_S = 0.02  # how often a lingering planner looks for calls deferred without waking it


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


def fused_signature(a, b, out, bias, variant: Variant) -> tuple:
    """``signature`` of a call with an epilogue (``linear``): the variant and the bias's layout too."""
    if bias is None:
        return (*signature(a, b, out), variant)
    return (*signature(a, b, out), variant, bias.shape, bias.stride(), bias.dtype, bias.device)


def packed_signature(x, weight) -> tuple:
    """``signature`` of a ``linear`` call on a packed weight (``quantized``): x's shape, strides, dtype
    and device, and what of the weight a launch's sizes depend on (its format, group, N x K and the
    packed rows' stride); raises AttributeError for what is not a tensor or a packed weight."""
    return ("packed", x.shape, x.stride(), x.dtype, x.device, weight.format, weight.group, weight.shape,
            weight.packed.stride(0))  # fmt: skip


def rows_served(entry: dict) -> tuple[int, int]:
    """The M a plan made from the choice ``entry`` serves in its bucket: all of them, or where the
    bucket's version won only from ``from_m`` up, the side of it this call's M is on (``below``: the
    call ran cuBLAS under it; the version's own entry: from it up)."""
    if "below" in entry:
        return ALL_ROWS[0], entry["below"] - 1
    if entry.get("from_m") and entry["version"] != VENDOR:
        return entry["from_m"], ALL_ROWS[1]
    return ALL_ROWS


def describe_call(a, operand, b_layout: str, variant: Variant, out) -> str:
    """A call's signature in a line of the decision log: shape, dtype, b's layout, variant, out."""
    m, k = a.shape
    n = operand.shape[0] if b_layout == "nk" else operand.shape[1]
    extra = "" if variant.key() in ("", b_layout) else f" {variant.key()}"
    return f"{m}x{n}x{k} {str(a.dtype).removeprefix('torch.')} b={b_layout}{extra}{' out=' if out is not None else ''}"


def describe_plan(plan, entry: Optional[dict]) -> str:
    """What a plan runs and why, for the decision log: the kernel, or cuBLAS and the reason."""
    if entry is None:
        return "cuBLAS (TMA cannot read or write these operands in place: rows or base not 16-byte aligned)"
    chosen = entry.get("chosen", entry)
    choice = f"{chosen['version']} {json.dumps(chosen.get('config') or {}, sort_keys=True)} ({entry.get('source')})"
    pending = ", tuning pending" if entry.get("pending") else ""
    if isinstance(plan, SeriesPlan):
        return f"{choice}{pending}"
    for field, why in (("building", "its kernel is building"), ("build_failed", "its kernel did not build"),
                       ("below", "it won only from M={below}")):  # fmt: skip
        if field in entry:
            return f"cuBLAS: the choice is {choice} but {why.format(**entry)}{pending}"
    if chosen["version"] == VENDOR:
        return f"cuBLAS ({entry.get('source')}{pending})"
    return f"cuBLAS: the choice {choice} does not take this call's shape or strides{pending}"


class VendorPlan:
    """cuBLAS chose for this bucket: ``torch.mm`` on the caller's operands (b [K, N] as given), with
    the epilogue in torch's own kernels after it (``torch.addmm`` takes the bias)."""

    rows = ALL_ROWS

    def __init__(
        self, a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor], variant: Variant = PLAIN, chooser=None
    ):
        self.layouts = (layout(a), layout(b), None if out is None else layout(out))
        self.out_contiguous = out is not None and out.is_contiguous()
        self.activation = variant.activation
        self.chooser = chooser  # whose build of swiglu's kernel the activation asks for

    def add_route(self, table, a, b, tag: int = -1) -> None:
        """Calls without ``out`` of the signature of ``a`` and ``b``: at::mm, from the native entry
        (``tag``: the choice's, which ``DirectTable.drop`` names)."""
        table.put_vendor(a, b, self.__call__, tag=tag, min_rows=self.rows[0], max_rows=self.rows[1])

    def product(self, a, b, bias):
        y = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
        return activation(self.chooser, y, self.activation)  # swiglu: one pass, not torch's strided views

    def __call__(self, a, b, out=None, bias=None):
        if out is None:
            return self.product(a, b, bias)
        check_no_overlap(out.data_ptr(), self.layouts[2], "a", a.data_ptr(), self.layouts[0])
        check_no_overlap(out.data_ptr(), self.layouts[2], "b", b.data_ptr(), self.layouts[1])
        if self.out_contiguous and bias is None and self.activation is None:
            torch.mm(a, b, out=out)
        else:  # rows padded to 16 bytes, or an epilogue: computed, then copied into out
            out.copy_(self.product(a, b, bias))
        return out


class SeriesPlan:
    """A version chose for this bucket: its compiled launch function, called with the pointers. The
    kernel reads b in place as the B operand of ``b_layout`` (w [N, K] of b = w.T, or b [K, N])."""

    rows = ALL_ROWS

    def __init__(
        self,
        launch: Callable,
        a: torch.Tensor,
        b: torch.Tensor,
        operand: torch.Tensor,
        b_layout: str,
        c: torch.Tensor,
        out: Optional[torch.Tensor],
        variant: Variant = PLAIN,
        chooser=None,
    ):
        (self.m, self.k), self.n = a.shape, operand.shape[0] if b_layout == "nk" else operand.shape[1]
        self.columns = variant.out_columns(self.n)  # C's width (swiglu: half of B's)
        self.launch = launch
        self.lda, self.ldb, self.ldc = row_stride(a), row_stride(operand), row_stride(c)
        self.dtype, self.device = a.dtype, a.device
        self.device_index = device_context.launch_index(a.device)
        self.out_row = aligned_row_length(self.columns, a.dtype)  # an allocated output's row, padded to 16 bytes
        self.layouts = (layout(a), layout(b), None if out is None else layout(out))
        self.unaligned = VendorPlan(a, b, out, variant, chooser)  # a call whose pointers TMA cannot take

    def add_route(self, table, a, b, tag: int = -1) -> None:
        """Calls without ``out`` of the signature of ``a`` and ``b``: the native entry allocates the
        output and calls the program itself (``tag``: the choice's, which ``DirectTable.drop`` names)."""
        args = (self.launch, self.n, self.k, self.lda, self.ldb, self.ldc, self.out_row, TMA_ALIGN_BYTES)
        table.put_launch(
            a, b, self.__call__, *args, columns=self.columns, tag=tag, min_rows=self.rows[0], max_rows=self.rows[1]
        )

    def __call__(self, a, b, out=None, bias=None):
        # on the path of every call: each step here is paid per launch, so it is kept short
        if (a.data_ptr() | b.data_ptr() | (0 if out is None else out.data_ptr())) % TMA_ALIGN_BYTES:
            return self.unaligned(a, b, out, bias)  # the signature's strides suit TMA, this call's pointers not
        if out is None:
            buffer = torch.empty((self.m, self.out_row), dtype=self.dtype, device=self.device)
            out = buffer if self.out_row == self.columns else buffer[:, : self.columns]
        else:
            buffer = out
            check_no_overlap(out.data_ptr(), self.layouts[2], "a", a.data_ptr(), self.layouts[0])
            check_no_overlap(out.data_ptr(), self.layouts[2], "b", b.data_ptr(), self.layouts[1])
        bias_ptr = 0 if bias is None else bias.data_ptr()
        args = (self.m, self.n, self.k, a.data_ptr(), b.data_ptr(), buffer, self.lda, self.ldb, self.ldc, bias_ptr)
        device_context.launch_on(self.device_index, self.launch, *args)
        return out


class PackedPlan:
    """V8 ran this packed-weight signature (``packed_signature``): its launch function, with the sizes
    and strides the signature fixes. x [..., K] is dense (the signature's strides say so); the
    weight's tensors are read per call, so a plan keeps no weight alive and serves every weight of
    its signature."""

    memo = None  # chosen by ``shipped/rules/v8.json``'s rules, which no tuning changes: ``forget`` keeps it

    def __init__(self, launch: Callable, x: torch.Tensor, weight):
        (self.n, self.k), self.launch = weight.shape, launch
        self.m = x.numel() // self.k
        self.out_shape = (*x.shape[:-1], self.n)
        self.ldw = weight.packed.stride(0)
        self.device_index = device_context.launch_index(x.device)

    def __call__(self, x: torch.Tensor, weight, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Into ``out`` (dense, of ``out_shape``: the caller checks it), or a new output."""
        if out is None:
            out = x.new_empty(self.out_shape)  # dense: rows of n, as x's are rows of k
        args = (self.m, self.n, self.k, x, weight.packed, out, self.k, self.ldw, self.n, 0, weight.scales)
        device_context.launch_on(self.device_index, self.launch, *args)
        return out

    def takes(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> bool:
        """What the signature does not fix: x 16-byte aligned, and ``out`` None or a dense tensor of
        the product's shape and dtype on x's device (V8 may write C by TMA stores); any other
        ``out`` takes the full path, which writes a copy of the product into it."""
        if (x.data_ptr() | (0 if out is None else out.data_ptr())) % TMA_ALIGN_BYTES:
            return False
        return out is None or (
            out.shape == self.out_shape and out.dtype == x.dtype and out.device == x.device and out.is_contiguous()
        )


class Plans:
    """The process's plans by signature. ``check`` and ``program`` are parameters so that the tests
    can run the path on the CPU with stand-in kernels.

    A bucket's choice can change after its plans were derived (a background tuning finished, the
    chosen kernel got built: ``chooser``): the chooser then calls ``forget`` with that bucket, which
    drops the plans derived from its choice and their routes (each route tagged with its bucket's
    number, ``tags``), and the next call of each of those signatures derives its plan again from the
    new choice; other buckets' plans stay. A plan derived while any choice changed, or chosen inside
    a CUDA graph capture (``transient``), runs its call but is not kept."""

    def __init__(self, chooser: Chooser, check=contract.check_call, program=None):
        self.chooser = chooser
        self.check = check
        self.program = program or tilus_autotune.launch_function
        self.plans: dict[tuple, object] = {}
        # the native entry's table of routes for calls without out (None where it is not built)
        self.direct = native_entry.new_table()
        self.lock = threading.Lock()
        self.generation = 0  # counts ``forget``: a plan derived in an earlier generation is not kept
        self.tags: dict[tuple, int] = {}  # a bucket's (``bucket_memo``) number on its native routes
        # unseen calls that the native entry ran with torch's ops, their plans derived on this thread
        self.planner = Worker(
            "matmul-planner",
            self._derive_deferred,
            linger_s=PLANNER_LINGER_S,
            poll_s=PLANNER_POLL_S,
            exit_join_s=EXIT_JOIN_S,
        )
        self.refused: set[tuple] = set()  # signatures whose deferred derivation failed: the Python path names why
        if chooser is not None:
            chooser.on_change(self.forget)

    def wait_for_background(self, timeout_s: float) -> bool:
        """Wait (``timeout_s`` at most, in all) until the plans deferred off callers' paths are
        derived and the tunings and builds they started are done (benchmarks, tests); whether
        they are. The planner first: a deferred derivation asks the chooser, which may queue a
        tuning."""
        deadline = time.monotonic() + timeout_s
        finished = self.planner.wait(timeout_s)
        if finished and self.chooser is not None:
            finished = self.chooser.wait(max(deadline - time.monotonic(), 0.0))
        return finished

    def defer(self, a, b) -> bool:
        """The native entry's miss hook (``entry.cpp``): take the plan of an unseen call ``a @ b``
        (one the checks pass as it is) for the planner's thread, and return True, so that this call
        runs cuBLAS at once; or False, so that it takes the Python path now: with no chooser, in
        ``MATMUL_TUNE=blocking`` (the caller asked to wait for the choice), inside a CUDA graph
        capture (nothing may start there), or where a plan or a failed derivation exists already."""
        if not self._may_defer(a):
            return False
        return self._queue(signature(a, b, None), a, b, None, PLAIN)

    def defer_linear(self, a, b, bias, activation: Optional[str]) -> bool:
        """``linear``'s miss hook (``entry.cpp``): as ``defer``, for an unseen ``linear`` call seen as
        ``a`` [M, K] @ ``b`` = weight.T with ``bias`` and ``activation``: True, and the call runs
        ``F.linear`` and torch's activation at once while the planner derives the variant's plan
        (its route then serves later calls); False, and the Python path runs it (and names what
        is wrong, where something is: an activation it does not know, a swiglu weight that is not
        ``gate_up``'s)."""
        try:
            variant = Variant("nk", bias is not None, activation or None)
        except ValueError:
            return False
        if variant == PLAIN:
            return self.defer(a, b)
        if variant.activation == "swiglu" and b.shape[1] % (2 * SWIGLU_GROUP):
            return False
        if not self._may_defer(a):
            return False
        return self._queue(fused_signature(a, b, None, bias, variant), a, b, bias, variant)

    def _queue(self, key, a, b, bias, variant: Variant) -> bool:
        """Queue the plan of ``key`` for the planner (``defer``'s and ``defer_linear``'s last step), or
        False where a plan or a failed derivation exists already."""
        if key in self.plans or key in self.refused:
            return False
        payload = (a, b, bias, variant, time.monotonic_ns())
        self.planner.submit(key, payload, group=PLAN_GROUP, wake=yielding.plans_at_once())
        return True

    def _may_defer(self, a) -> bool:
        """Whether an unseen call may run torch's ops now: there is a chooser, the caller does not
        wait for choices (``MATMUL_TUNE=blocking``), no CUDA graph is being captured."""
        if self.chooser is None or self.chooser.mode == "blocking":
            return False
        return not (a.is_cuda and torch.cuda.is_current_stream_capturing())

    def _derive_deferred(self, group, payloads) -> None:
        """Derive the deferred calls' plans, each once the caller's calls pause (``planner_gate``).
        A call that has waited longer than the gate's longest hold is dropped unseen, its operands
        released: the next call of its signature queues it again, and a signature never called again
        needs no plan. So while the caller never pauses, the planner derives one plan per longest
        hold and keeps alive no operands older than about two of them."""
        gate = yielding.planner_gate()
        while payloads and not self.planner.closing:
            a, b, bias, variant, queued_ns = payloads.pop(0)  # the list is their only other holder
            fused = variant != PLAIN
            key = fused_signature(a, b, None, bias, variant) if fused else signature(a, b, None)
            if key in self.plans:
                continue
            if gate is not None:
                if time.monotonic_ns() - queued_ns > gate.max_hold_ns:
                    continue
                gate.wait()
                if self.planner.closing:  # the process is exiting: no torch call from this thread now
                    return
            try:
                if fused:  # as ``launch_fused`` keeps it: the route in the variant's table
                    self.remember(key, self.derive(a, b, None, None, variant), a, b, bias, variant)
                else:
                    self.derive(a, b, None, key)
            except Exception as e:  # later calls of the signature take the Python path, which says what failed
                self.refused.add(key)
                log.warning("matmul(): no plan for %s @ %s (%s: %s)", list(a.shape), list(b.shape), type(e).__name__, e)

    def forget(self, memos: set) -> None:
        """Drop the plans derived from the choices of ``memos`` (buckets, as ``bucket_memo`` names
        them), and their routes in the native entry (from any thread: the entry reads its table
        under the GIL, and a route it runs holds its own references)."""
        with self.lock:
            self.generation += 1
            self.plans = {key: plan for key, plan in self.plans.items() if getattr(plan, "memo", None) not in memos}
            tags = [self.tags[memo] for memo in memos if memo in self.tags]
            if self.direct is not None and tags:
                self.direct.drop(tags)

    def _tag(self, plan) -> int:
        """The number of the bucket ``plan`` was chosen for, on its routes (-1: none, a plan no choice
        made, which no change of a choice drops). Under ``lock``."""
        memo = getattr(plan, "memo", None)
        if memo is None:
            return -1
        return self.tags.setdefault(memo, len(self.tags))

    def keep(self, plan, a, b, out=None) -> None:
        """Keep ``plan`` for calls with the signature of these operands, and for calls without ``out``
        its route in the native entry's table."""
        with self.lock:
            if getattr(plan, "generation", self.generation) != self.generation:
                return
            self.plans[signature(a, b, out)] = plan
            if out is None and self.direct is not None:
                plan.add_route(self.direct, a, b, self._tag(plan))

    def remember(self, key, plan, a=None, b=None, bias=None, variant: Variant = PLAIN) -> None:
        """Keep ``plan`` under ``key`` (as ``keep`` decides whether), and given the operands of a call
        without ``out``, its route in the native entry's table of ``linear``'s variant."""
        with self.lock:
            if getattr(plan, "generation", self.generation) == self.generation:
                self.plans[key] = plan
                if a is not None and self.direct is not None:
                    table = self.direct.variant(bias is not None, variant.activation or "")
                    plan.add_route(table, a, b, self._tag(plan))

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

    def launch_fused(self, a, b, bias, variant: Variant, out=None):
        """``variant``'s epilogue of ``a @ b + bias`` into ``out`` (allocated if None): ``linear``'s path.
        Its plans are kept apart from plain calls', and their routes in the native entry's table of
        the variant (``DirectTable.variant``), which its ``linear`` reads."""
        key = fused_signature(a, b, out, bias, variant)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.derive(a, b, out, None, variant)
            if out is None:  # the native entry's linear() runs later calls of this signature
                self.remember(key, plan, a, b, bias, variant)
            else:
                self.remember(key, plan)
        return plan(a, b, out, bias)

    def derive(self, a, b, out, key, variant: Variant = PLAIN):
        """The full checks, the bucket's choice, and the plan for this signature (kept under ``key``)."""
        generation, transient = self.generation, False
        columns = None if variant.activation != "swiglu" else variant.out_columns(b.shape[1])
        # C's strides, not its memory: a plan needs only C's row stride, and on the planner's thread an
        # allocation holds the GIL (and may wait for cudaMalloc) while the caller's calls run
        operand, b_layout, c = self.check(a, b, out, columns=columns, allocate=False)
        m, k = a.shape
        n = operand.shape[0] if b_layout == "nk" else operand.shape[1]
        plan, memo, entry = None, None, None
        if b_layout != TORCH_ONLY:  # else TMA cannot read or write the operands in place: cuBLAS runs it
            variant = dataclasses.replace(variant, b_layout=b_layout)
            memo = bucket_memo(a.device, a.dtype, (m, n, k), variant)
            while True:  # the choice and the generation it belongs to, read together
                generation = self.generation
                arch, entry = self.chooser.get(a.device, a.dtype, m, n, k, variant=variant)
                if generation == self.generation:
                    break
            transient = entry.get("transient", False)
            if entry["version"] != VENDOR:
                module = versions.load(arch, entry["version"])
                # the bucket's choice was tuned on a neighbouring shape: a version with limits may not take this one
                # None: not a point of the space, or not one that builds for the variant
                config = space_config(module, entry["config"], variant)
                if config is not None and versions.fits(
                    module, m, n, k, row_stride(a), row_stride(operand), row_stride(c), variant
                ):
                    program = self._program(arch, a, module, entry, config, variant)
                    if program is not None:
                        plan = SeriesPlan(program, a, b, operand, b_layout, c, out, variant, self.chooser)
        if plan is None:
            plan = VendorPlan(a, b, out, variant, self.chooser)
        if memo is not None:
            plan.rows = rows_served(entry)
        plan.generation = None if transient else generation
        plan.memo = memo  # the bucket whose choice it runs: ``forget`` drops it when that choice changes
        if key is not None:
            self.keep(plan, a, b, out)
        if knobs.decisions.isEnabledFor(logging.INFO):
            call = describe_call(a, operand, b_layout, variant, out)
            knobs.decisions.info("%s: %s", call, describe_plan(plan, entry))
        return plan

    def _program(self, arch, a, module, entry, config, variant: Variant):
        """The launch function of the chosen kernel: the one the chooser loaded (built outside this
        process: ``building``), or, where the caller waits for its choices (``blocking``) or the
        chooser builds nothing (tests' stand-ins), built here; None otherwise (cuBLAS runs). A
        thread of the caller never transpiles or compiles a kernel on its own."""
        loaded = getattr(self.chooser, "program", None)
        if loaded is not None:
            program = loaded(arch, a.dtype, entry, variant)
            if program is not None or self.chooser.mode != "blocking":
                return program
        script = versions.kernel(module, a.dtype, config, variant)
        with device_context.on_device(a.device) if a.device.type == "cuda" else contextlib.nullcontext():
            return self.program(script)

    def packed_plan(self, x, weight, out=None) -> Optional[PackedPlan]:
        """The plan kept for the signature of ``linear(x, weight)`` (``keep_packed``) where this call
        may take it (``PackedPlan.takes``), else None, also for operands that are not tensors, which
        the full path then names."""
        try:
            plan = self.plans.get(packed_signature(x, weight))
            return plan if plan is not None and plan.takes(x, out) else None
        except AttributeError:
            return None

    def keep_packed(self, launch: Callable, x, weight) -> None:
        """Keep V8's ``launch`` (built, just run on ``x``: dense, 16-byte aligned) for later ``linear``
        calls of this signature."""
        self.remember(packed_signature(x, weight), PackedPlan(launch, x, weight))

    def plan_for(self, a, b, out=None):
        """The plan a call with these operands uses (derived if needed): for tests and ``choice``."""
        key = signature(a, b, out)
        return self.plans.get(key) or self.derive(a, b, out, key)
