"""tilus 0.2.0 fault ``workspace_in_shared_memory``: the shared workspace can lie past the end of
the dynamic shared memory the kernel asks for.

Some instructions need a few bytes of scratch shared memory that the kernel did not allocate: the
workspace. ``tcgen05.alloc`` writes the tensor-memory address it allocated there, and every
thread reads it back. When the kernel is finalized, tilus places the workspace at the top of the
allocated shared memory rounded up to 128 bytes, but sizes the dynamic shared memory as the
*unrounded* top plus the workspace's bytes. Whenever the tensors allocated before end off a
128-byte boundary, the workspace's tail (or all of it) lies beyond the launch's shared memory:
an illegal address on the GPU (fixed upstream after 0.2.0).

The work-around raises the allocator's high-water mark to the same 128-byte boundary before tilus
sizes the dynamic shared memory, so the size counts the padding in front of the workspace.
Kernels whose allocations end on a boundary build exactly as before.
"""

from __future__ import annotations

import functools

from .fix import Fix

WORKSPACE_ALIGNMENT = 128  # where tilus 0.2.0 places the workspace


def _size_from_the_aligned_workspace(original):
    @functools.wraps(original)
    def finalize(self):
        if self.shared_workspace_var is not None:
            allocator = self.smem_allocator
            top = allocator.maximum_allocated
            allocator.maximum_allocated = -(-top // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT
        return original(self)

    return finalize


def make() -> Fix:
    from tilus.backends.contexts.smem_alloc_ctx import SharedMemoryAllocationContext

    return Fix(
        name="workspace_in_shared_memory",
        fault="the shared workspace is placed 128-byte aligned but the dynamic shared memory is sized from the "
        "unaligned top: the workspace can lie outside it",
        patches=[(SharedMemoryAllocationContext, "finalize", _size_from_the_aligned_workspace)],
    )
