"""The interpreter: runs one role of one CTA over the kernel's tilus IR as a Python generator that
yields at every synchronization event, so that the scheduler (``machine``) interleaves the roles.

A *role* is a set of threads of one CTA that follow the same path through the kernel: the thread
ranges of the ``thread_group`` statements whose bodies block (wait on an mbarrier, a named or a
cluster barrier) cut the CTA's threads into roles before the kernel runs (``role_ranges``), so every
role runs the whole kernel body and skips the groups it is not in. Statements that do not block (an
elected lane's ``arrive.expect_tx``, a warp's TMA store) run inline with the threads of the role
that execute them: an arrival made by ``k`` threads counts ``k``.

The interpreter evaluates expressions with C's integer semantics (and the launch dimensions before
any role runs), executes statements (loops, branches, thread groups that narrow the active threads,
``item()``), and hands each instruction to the ``i_<Instruction>`` handler of the machine and each
call statement to its ``evaluate``; the instructions that order memory or hand over TMEM have no
counting effect (``NO_OPS``, ``NO_OP_CALLS``). ``Interpreter`` is a mixin of ``machine.Machine``:
it knows the IR, not what an instruction means (``data_instructions``, ``sync_instructions``), so
an instruction the model learns is a new handler, not a change here.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
from tilus.hidet.ir import expr as hx
from tilus.hidet.ir.primitives.cuda import vars as cuda_vars
from tilus.ir import stmt as ts
from tilus.ir.func import Function

from .findings import Finding
from .state import GlobalRef, Role, SharedAddr

# calls that order memory or hand over TMEM: no counting effect (see the package doc)
NO_OP_CALLS = ("cuda_tcgen05_fence", "cuda_fence")

NO_OPS = {
    "AnnotateLayoutInst",
    "FenceProxyAsync",
    "FenceProxyAsyncInst",
    "WgmmaFenceInst",
    "Tcgen05DeallocInst",
    "Tcgen05RelinquishAllocPermitInst",
    "FenceProxyAsyncReleaseInst",
}


class _Break(Exception):
    pass


class _Return(Exception):
    pass


BLOCKING_CALLS = ("this_cluster.sync", "cuda_cluster_sync_relaxed", "cuda_cluster_wait_for_peers")


def _blocks(stmt) -> bool:
    """Whether a statement (tree) contains a blocking synchronization."""
    found = False

    def visit(s):
        nonlocal found
        if found or s is None:
            return
        if isinstance(s, ts.InstStmt):
            if type(s.inst).__name__ in ("WaitBarrierInst", "SyncThreadsInst"):
                found = True
        elif isinstance(s, ts.EvaluateStmt):
            if isinstance(s.expr, hx.Call) and s.expr.func_var.name in BLOCKING_CALLS:
                found = True
        elif isinstance(s, ts.SeqStmt):
            for x in s.seq:
                visit(x)
        elif isinstance(s, ts.IfStmt):
            visit(s.then_body)
            visit(s.else_body)
        elif isinstance(s, (ts.ForStmt, ts.WhileStmt, ts.ThreadGroupStmt, ts.LetStmt)):
            visit(s.body)

    visit(stmt)
    return found


def role_ranges(function: Function) -> list[tuple[int, int]]:
    """Cut a CTA's threads at the bounds of every thread group whose body blocks."""
    num_threads = function.metadata.num_warps * 32
    cuts = {0, num_threads}

    def visit(s, lo, hi):
        if s is None:
            return
        if isinstance(s, ts.ThreadGroupStmt):
            if s.thread_begin < 0:
                if _blocks(s.body):
                    raise Finding("unsupported", "a blocking wait inside an elected thread group")
                return
            g_lo = lo + s.thread_begin
            g_hi = g_lo + s.num_threads
            if _blocks(s.body):
                cuts.update((g_lo, g_hi))
            visit(s.body, g_lo, g_hi)
        elif isinstance(s, ts.SeqStmt):
            for x in s.seq:
                visit(x, lo, hi)
        elif isinstance(s, ts.IfStmt):
            visit(s.then_body, lo, hi)
            visit(s.else_body, lo, hi)
        elif isinstance(s, (ts.ForStmt, ts.WhileStmt, ts.LetStmt)):
            visit(s.body, lo, hi)

    visit(function.body, 0, num_threads)
    points = sorted(cuts)
    return list(zip(points[:-1], points[1:]))


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - _c_div(a, b) * b


class Interpreter:
    """Runs a role over the IR: ``run_role`` is the generator the scheduler steps."""

    # -- the interpreter --------------------------------------------------------------------------
    def run_role(self, role: Role) -> Iterator:
        env: dict = dict(self.params)
        try:
            yield from self.exec(self.function.body, env, role, (0, self.num_threads), (role.lo, role.hi))
        except _Return:
            pass

    def exec(self, s, env, role, group, active) -> Iterator:
        t = type(s)
        if t is ts.SeqStmt:
            for x in s.seq:
                yield from self.exec(x, env, role, group, active)
        elif t is ts.InstStmt:
            result = self.inst(s.inst, env, role, group, active)
            if result is not None:
                yield from result
        elif t is ts.DeclareStmt:
            env[s.var] = self.eval(s.init, env, role) if s.init is not None else 0
        elif t is ts.AssignStmt:
            env[s.var] = self.eval(s.value, env, role)
        elif t is ts.ForStmt:
            extent = self.eval(s.extent, env, role)
            try:
                for i in range(extent):
                    self.count_iteration(role)
                    env[s.iter_var] = i
                    yield from self.exec(s.body, env, role, group, active)
            except _Break:
                pass
        elif t is ts.WhileStmt:
            try:
                while self.eval(s.cond, env, role):
                    self.count_iteration(role)
                    yield from self.exec(s.body, env, role, group, active)
            except _Break:
                pass
        elif t is ts.IfStmt:
            if self.eval(s.cond, env, role):
                yield from self.exec(s.then_body, env, role, group, active)
            elif s.else_body is not None:
                yield from self.exec(s.else_body, env, role, group, active)
        elif t is ts.BreakStmt:
            raise _Break()
        elif t is ts.ReturnStmt:
            raise _Return()
        elif t is ts.LetStmt:
            for var, value in zip(s.bind_vars, s.bind_values):
                env[var] = self.eval(value, env, role)
            yield from self.exec(s.body, env, role, group, active)
        elif t is ts.ThreadGroupStmt:
            if s.thread_begin < 0:  # elect-any: the lowest threads of the parent group
                sub = (group[0], group[0] + s.num_threads)
            else:
                sub = (group[0] + s.thread_begin, group[0] + s.thread_begin + s.num_threads)
            inner = (max(sub[0], active[0]), min(sub[1], active[1]))
            if inner[0] < inner[1]:
                yield from self.exec(s.body, env, role, sub, inner)
        elif t is ts.EvaluateStmt:
            if s.pred is not None and not self.eval(s.pred, env, role):
                return
            yield from self.evaluate(s.expr, env, role, group, active)
        elif t is ts.TensorItemValueStmt:
            value = env[s.tensor]
            if value.data is None or len(value.data) != 1:
                self.fail("unsupported", f"item() of a tensor the checker holds no value for ({s.tensor})")
            env[s.var] = value.data[0]
        elif t is ts.TensorItemPtrStmt:
            ref = env[s.tensor]
            env[s.ptr_var] = ref if isinstance(ref, GlobalRef) else SharedAddr(ref.cta, ref.alloc, ref.start)
        else:
            self.fail("unsupported", f"statement {t.__name__}")

    # -- dispatch to the instruction handlers -----------------------------------------------------
    def inst(self, inst, env, role: Role, group, active):
        name = type(inst).__name__
        handler = getattr(self, "i_" + name, None)
        if handler is None:
            if name in NO_OPS:
                return None
            self.fail("unsupported", f"instruction {name}")
        return handler(inst, env, role, group, active)

    # -- expressions ------------------------------------------------------------------------------
    def eval(self, e, env, role: Optional[Role], lookup=None):
        t = type(e)
        if t is int or t is bool:
            return int(e)
        if t is hx.Var:
            if e in env:
                return env[e]
            if lookup is not None:
                return lookup(e)
            return self._special(e, role)
        if t is hx.Constant:
            v = e.value
            return int(v) if isinstance(v, (bool, np.bool_)) else v
        ev = self.eval
        if isinstance(e, hx.BinaryExpr):
            a = ev(e.a, env, role, lookup)
            b = ev(e.b, env, role, lookup)
            name = t.__name__
            if name == "Add":
                return a + b
            if name == "Sub":
                return a - b
            if name == "Multiply":
                return a * b
            if name == "Div":
                return _c_div(a, b)
            if name == "Mod":
                return _c_mod(a, b)
            if name == "BitwiseAnd":
                return int(a) & int(b)
            if name == "BitwiseOr":
                return int(a) | int(b)
            if name == "BitwiseXor":
                return int(a) ^ int(b)
            if name == "LeftShift":
                return int(a) << int(b)
            if name == "RightShift":
                return int(a) >> int(b)
            if name == "LessThan":
                return int(a < b)
            if name == "LessEqual":
                return int(a <= b)
            if name == "Equal":
                return int(a == b)
            if name == "NotEqual":
                return int(a != b)
            if name == "LogicalAnd":
                return int(bool(a) and bool(b))
            if name == "LogicalOr":
                return int(bool(a) or bool(b))
            self.fail("unsupported", f"expression {name}")
        name = t.__name__
        if name == "LogicalNot":
            return int(not ev(e.a, env, role, lookup))
        if name == "Neg":
            return -ev(e.a, env, role, lookup)
        if name == "BitwiseNot":
            return ~int(ev(e.a, env, role, lookup))
        if name == "Cast":
            v = ev(e.expr, env, role, lookup)
            return v
        if name == "IfThenElse":
            c = ev(e.cond, env, role, lookup)
            return ev(e.then_expr if c else e.else_expr, env, role, lookup)
        if name == "Call":
            return self.call(e, env, role)
        self.fail("unsupported", f"expression {name}: {e}")

    def _special(self, var, role: Optional[Role]):
        name = var.name or var.hint
        if name and name.startswith("gridDim."):
            return self.grid["xyz".index(name[-1])]
        if role is None:
            self.fail("unsupported", f"variable {var} outside a CTA")
        cta = role.cta
        if name and name.startswith("blockIdx."):
            return cta.block_idx["xyz".index(name[-1])]
        if var is cuda_vars.clusterBlockRank:
            return cta.rank
        if var is cuda_vars.clusterBlockIdx.x:
            return cta.rank
        if var in (cuda_vars.clusterBlockIdx.y, cuda_vars.clusterBlockIdx.z):
            return 0
        if var is cuda_vars.clusterSize or var is cuda_vars.clusterDim.x:
            return self.cluster_size
        if name and name.startswith("threadIdx"):
            self.fail("unsupported", "control flow that depends on threadIdx")
        self.fail("unsupported", f"unbound variable {var}")

    def call(self, e, env, role):
        fname = e.func_var.name
        args = [self.eval(a, env, role) for a in e.args]
        if fname in ("generic_min", "generic_max"):
            return min(args) if fname == "generic_min" else max(args)
        if fname.startswith(NO_OP_CALLS):
            return None
        if fname == "cuda_ld_shared_b32_ordered":
            addr = args[0]
            return role.cta.values.get(addr, 0)
        self.fail("unsupported", f"call {fname}")

    def _eval_static(self, e):
        """Evaluate a launch expression over the parameters (following the body's declarations)."""
        decls = {}

        def collect(s):
            if isinstance(s, ts.SeqStmt):
                for x in s.seq:
                    collect(x)
            elif isinstance(s, ts.DeclareStmt) and s.init is not None:
                decls[s.var] = s.init

        collect(self.function.body)
        env = dict(self.params)

        def lookup(var):
            if var not in env:
                if var not in decls:
                    raise Finding("unsupported", f"launch expression uses {var}")
                env[var] = self.eval(decls[var], env, None, lookup)
            return env[var]

        return self.eval(e, env, None, lookup)
