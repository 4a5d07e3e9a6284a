"""Distributed shared memory: the operations a 2-CTA Hopper kernel needs that tilus 0.2.0's
language does not offer: a store of a value computed in registers into a peer CTA's shared
memory, and a load of a value published through an mbarrier that the compiler cannot hoist above
the wait.

tilus 0.2.0 can signal a peer's mbarrier (``mbarrier.arrive_and_expect_tx_remote``) and
multicast TMA loads into several CTAs, but it has no instruction that writes a register into
another CTA's shared memory. ``async_store_to_rank`` adds one as a small primitive emitted into
the kernel being transpiled: ``mapa.shared::cluster`` + ``st.async ... mbarrier::complete_tx``,
which counts its bytes on the receiving CTA's barrier as a TMA load does. A reader that waits on
that barrier (at CTA scope) sees the value; no cluster-scope fence is needed on either side. (A
plain ``st.shared::cluster`` would have to be published by a release at cluster scope, a
``MEMBAR.ALL.GPU`` on sm_90a, and acquired at cluster scope, an L1 invalidation.)

``load_after_wait`` reads such a value. tilus 0.2.0 emits its mbarrier wait as an ``asm volatile``
without a ``"memory"`` clobber, and a tensor's ``.item()`` as a plain C load, so nvcc is free to
move the load above the wait and read the slot before it was written. The load here is itself an
``asm volatile`` with a ``"memory"`` clobber: it stays after the wait.
"""

from typing import no_type_check

from tilus.hidet.ir.dtypes import int32, uint32
from tilus.hidet.ir.primitives.cuda.funcs import call_cuda
from tilus.hidet.ir.primitives.func import is_primitive_function, register_primitive_function
from tilus.hidet.ir.stmt import asm
from tilus.hidet.lang import attrs, script
from tilus.lang.instructions import base

_LOAD = "ld_shared_b32_ordered"
_ASYNC = "st_async_cluster_b32"


def _register() -> None:
    if is_primitive_function("cuda_" + _ASYNC):
        return

    @no_type_check
    @script
    def cuda_ld_shared_b32_ordered(addr: uint32) -> int32:
        attrs.func_name = "cuda_" + _LOAD
        attrs.func_kind = "cuda_internal"
        ret: int32 = 0
        asm(template="ld.shared.b32 %0, [%1];", outputs=[ret], inputs=[addr], is_volatile=True, memory_fence=True)
        return ret

    register_primitive_function(name=cuda_ld_shared_b32_ordered.name, func_or_type=cuda_ld_shared_b32_ordered)

    @no_type_check
    @script
    def cuda_st_async_cluster_b32(local_addr: uint32, local_barrier: uint32, cta_rank: uint32, value: int32):
        attrs.func_name = "cuda_" + _ASYNC
        attrs.func_kind = "cuda_internal"
        asm(
            template="{ .reg.b32 remote, remote_bar; mapa.shared::cluster.u32 remote, %0, %2; "
            "mapa.shared::cluster.u32 remote_bar, %1, %2; "
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [remote], %3, [remote_bar]; }",
            inputs=[local_addr, local_barrier, cta_rank, value],
            is_volatile=True,
            memory_fence=True,
        )

    register_primitive_function(name=cuda_st_async_cluster_b32.name, func_or_type=cuda_st_async_cluster_b32)


_register()


def async_store_to_rank(slot, value, rank: int, barrier) -> None:
    """In kernel code: store the int32 ``value`` into the single-element int32 shared tensor
    ``slot`` of the CTA of rank ``rank`` with ``st.async``, which counts its 4 bytes on that CTA's
    ``barrier`` (the same offset as the single-element barrier register tensor ``barrier`` here)
    as TMA does: a reader that sees the barrier's phase complete sees the value, with no fence on
    either side. Someone must announce the 4 bytes on that barrier (``expect_tx``)."""
    builder = base._current_builder
    if builder is None:
        raise RuntimeError("async_store_to_rank is called from kernel code only")
    local_addr = builder.tensor_item_ptr(slot, space="shared")
    local_barrier = builder.tensor_item_value(barrier)
    builder.evaluate(None, call_cuda(_ASYNC, [uint32(local_addr), uint32(local_barrier), uint32(rank), int32(value)]))


def load_after_wait(slot):
    """In kernel code: the int32 in the single-element int32 shared tensor ``slot`` of this CTA,
    read after (never hoisted above) the mbarrier wait that precedes it."""
    builder = base._current_builder
    if builder is None:
        raise RuntimeError("load_after_wait is called from kernel code only")
    addr = builder.tensor_item_ptr(slot, space="shared")
    return builder.declare(int32, init=call_cuda(_LOAD, [uint32(addr)]))
