"""tilus 0.2.0 fault ``tensormap_prefetch``: a kernel's first TMA copy fetches its tensor map first.

A TMA copy names its tensor map (the 128-byte ``CUtensorMap`` that tilus passes as a
``__grid_constant__`` kernel parameter); the TMA unit reads that descriptor from memory before it
can fetch a byte of the tile. tilus never prefetches it, so a launch's first copy of each operand
waits for two round trips one after the other, the descriptor's and then the tile's, and after a
pass over more data than L2 holds (a model's previous layer) both come from HBM. At decode sizes
a launch's few K blocks are behind that first copy.

The work-around puts ``prefetch.tensormap`` (PTX ISA 8.0, sm_90 on) for every tensor-map
parameter at the top of each kernel that has one, issued by thread 0: the descriptors are on
their way while the CTA initializes its barriers and before the producer asks for the first tile.
A kernel without a tensor map (no TMA) is emitted as before.
"""

from __future__ import annotations

import functools

from .fix import Fix

PREFETCH = 'if (threadIdx.x == 0) asm volatile("prefetch.tensormap [%0];" :: "l"((unsigned long long)&{}) : "memory");'


def is_tensor_map(param) -> bool:
    from tilus.hidet.ir.type import OpaqueType

    return isinstance(param.type, OpaqueType) and param.type.cpp_name == "CUtensorMap"


def _prefetch_tensor_maps_first(original):
    @functools.wraps(original)
    def visit_function(self, func):
        from tilus.hidet.ir.func import Function
        from tilus.hidet.ir.stmt import BlackBoxStmt, SeqStmt

        maps = [param for param in func.params if is_tensor_map(param)] if func.kind == "cuda_kernel" else []
        if maps:
            body = SeqStmt([*(BlackBoxStmt(PREFETCH, param) for param in maps), func.body])
            func = Function(func.name, func.params, body, func.ret_type, func.kind, func.attrs)
        return original(self, func)

    return visit_function


def make() -> Fix:
    from tilus.hidet.backend.codegen import UpdatedCUDACodeGen

    return Fix(
        name="tensormap_prefetch",
        fault="a kernel's first TMA copy of each operand waits for its tensor map to be fetched from memory",
        patches=[(UpdatedCUDACodeGen, "visit_Function", _prefetch_tensor_maps_first)],
    )
