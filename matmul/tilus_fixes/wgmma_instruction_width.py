"""tilus 0.2.0 fault ``wgmma_instruction_width``: a wgmma tile is issued in instructions only as wide
as the greatest power of two that divides it.

``WgmmaMmaSSInst.get_inst_mnk`` takes the instruction's N as ``gcd(n, 256)``, so a tile 96 columns
wide is issued as three ``m64n32k16`` per K step, one 112 wide as seven ``m64n16k16``, where one
``m64n96k16`` or ``m64n112k16`` would do (wgmma takes any N that is a multiple of 8 up to 256 for
16-bit and 8-bit floating-point operands: PTX ISA, "Matrix shape"; tilus's own ``WgmmaConfig``
lists them). Each narrower instruction reads its A tile from shared memory again and costs an issue
slot: a 128 x 96 V5 tile issues five times the instructions of a 128 x 128 one, and runs far
slower (plots/h100/skinny/). The instruction is made as wide as the tile wherever that width is an
instruction tilus knows; the layout inference and the emitter both ask ``get_inst_mnk``, so they
agree. Widths that are powers of two are unchanged.
"""

from __future__ import annotations

from .fix import Fix


def _as_wide_as_the_tile(original):
    def get_inst_mnk(m, n, k, a_dtype, b_dtype, d_dtype):
        from tilus.hidet.ir.primitives.cuda.wgmma import WgmmaConfig

        inst_m, inst_n, inst_k = original(m, n, k, a_dtype, b_dtype, d_dtype)
        if n <= 256 and n % 8 == 0 and n != inst_n:
            names = (a_dtype.short_name, b_dtype.short_name, d_dtype.short_name)
            try:
                WgmmaConfig.get(inst_m, n, inst_k, *names)
            except (KeyError, ValueError):  # an N this operand type has no instruction for: as before
                return inst_m, inst_n, inst_k
            return inst_m, n, inst_k
        return inst_m, inst_n, inst_k

    return staticmethod(get_inst_mnk)


def make() -> Fix:
    from tilus.ir.instructions.cuda.wgmma import WgmmaMmaSSInst

    return Fix(
        name="wgmma_instruction_width",
        fault="a wgmma tile is issued in instructions as wide as the greatest power of two dividing its N",
        patches=[(WgmmaMmaSSInst, "get_inst_mnk", _as_wide_as_the_tile)],
    )
