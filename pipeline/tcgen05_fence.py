"""The tcgen05 thread-synchronization fences, which tilus 0.2.0's language does not offer.

``tcgen05`` operations (MMA, ``tcgen05.ld``/``st``/``cp``, ``alloc``/``dealloc``) run
asynchronously to the thread that issues them, so the ordinary memory model does not order them
across an mbarrier or a ``bar.sync`` between threads. Two fences do:

* ``tcgen05.fence::before_thread_sync`` in the thread that hands TMEM over, after its last tcgen05
  operation on it and before the arrival or barrier (an epilogue thread whose ``tcgen05.ld`` of
  an accumulator buffer has completed, before it releases the buffer to the MMA warp);
* ``tcgen05.fence::after_thread_sync`` in the thread that takes TMEM over, after the wait and
  before its first tcgen05 operation on it (the MMA warp before it overwrites a released buffer;
  the epilogue before it reads an accumulator the MMA warp's commit announced).

``tcgen05.commit`` arrives on its mbarrier with an implicit ``before_thread_sync``, so the MMA side
of a hand-off needs no explicit fence before its commit.

The two functions are called from kernel code (a Script's or a ``tilus.Class``'s methods); they
run when the kernel is transpiled and emit one ``asm volatile`` statement each, with a memory
clobber so that the compiler keeps them between the surrounding waits and arrivals.
"""

from typing import no_type_check

from tilus.hidet.ir.primitives.cuda.funcs import call_cuda
from tilus.hidet.ir.primitives.func import is_primitive_function, register_primitive_function
from tilus.hidet.ir.stmt import asm
from tilus.hidet.lang import attrs, script
from tilus.lang.instructions import base

_BEFORE = "tcgen05_fence_before_thread_sync"
_AFTER = "tcgen05_fence_after_thread_sync"


def _register() -> None:
    if is_primitive_function("cuda_" + _BEFORE):
        return

    @no_type_check
    @script
    def cuda_tcgen05_fence_before_thread_sync():
        attrs.func_name = "cuda_" + _BEFORE
        attrs.func_kind = "cuda_internal"
        asm(template="tcgen05.fence::before_thread_sync;", is_volatile=True, memory_fence=True)

    register_primitive_function(
        name=cuda_tcgen05_fence_before_thread_sync.name, func_or_type=cuda_tcgen05_fence_before_thread_sync
    )

    @no_type_check
    @script
    def cuda_tcgen05_fence_after_thread_sync():
        attrs.func_name = "cuda_" + _AFTER
        attrs.func_kind = "cuda_internal"
        asm(template="tcgen05.fence::after_thread_sync;", is_volatile=True, memory_fence=True)

    register_primitive_function(
        name=cuda_tcgen05_fence_after_thread_sync.name, func_or_type=cuda_tcgen05_fence_after_thread_sync
    )


_register()


def _emit(name: str) -> None:
    builder = base._current_builder
    if builder is None:
        raise RuntimeError("the tcgen05 fences are called from kernel code only")
    builder.evaluate(None, call_cuda(name, []))


def fence_before_thread_sync() -> None:
    """In kernel code: order this thread's earlier tcgen05 operations before its next arrival or
    barrier (the thread hands TMEM over)."""
    _emit(_BEFORE)


def fence_after_thread_sync() -> None:
    """In kernel code: order this thread's later tcgen05 operations after its last wait or barrier
    (the thread takes TMEM over)."""
    _emit(_AFTER)
