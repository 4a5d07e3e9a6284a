"""tilus 0.2.0 fault ``wgmma_descriptor_offsets``: every wgmma of a tile encodes its two shared-memory
descriptors from scratch.

A ``wgmma.mma`` over a 64-column K block is four ``m64nNk16`` instructions, each reading A and B 32
bytes further along K. tilus's emitter encodes each instruction's descriptors from the full address
(``(addr + offset) >> 4``, masked to 14 bits and or-ed with the leading and stride offsets and the
swizzle mode), and nvcc cannot fold the masks away, so every instruction pays a shift and a mask
per operand and four register-to-uniform moves: on a 128 x 96 V5 tile 79 instructions a K block
for four wgmma, where the tensor core is kept busy only if the warpgroup reaches its next
wgmma in time (ncu's warp-state samples show V5's consumers stalled on issue where cuBLAS's wait on
the tensor core: ``plots/h200/issue-path/ of commit b43a7e1``).

The work-around encodes the descriptor of the tile's base address once and adds each instruction's
offset, shifted, to it: the address field is the 14 bits of ``addr >> 4`` at the bottom of the
descriptor, and a shared-memory address is below 256 KiB, so ``(addr >> 4) + (offset >> 4)`` never
carries out of the field and equals the encoding of ``addr + offset`` whenever the offset is a
multiple of 16 bytes (the others are encoded as before).
"""

from __future__ import annotations

import dataclasses

from .fix import Fix


def _base_plus_offset(original):
    def encoded(self):
        from tilus.hidet.ir import expr as hx
        from tilus.hidet.ir.dtypes import uint64

        addr = self.addr
        offset = int(addr.b.value) if isinstance(addr, hx.Add) and isinstance(addr.b, hx.Constant) else -1
        if offset >= 0 and offset % 16 == 0:  # else (never seen: offsets are whole 16-byte rows) as before
            base = original(dataclasses.replace(self, addr=addr.a))
            return base + uint64(offset >> 4)
        return original(self)

    return encoded


def make() -> Fix:
    from tilus.backends.emitters.cuda.wgmma import SharedMatrixDescriptor

    return Fix(
        name="wgmma_descriptor_offsets",
        fault="every wgmma of a tile encodes its shared-memory descriptors from the full address",
        patches=[(SharedMatrixDescriptor, "encoded", _base_plus_offset)],
    )
