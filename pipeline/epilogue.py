"""The Hopper epilogues. ``SlotTileStore`` (V2-V4) stages the output tile in the idle ring's A slots
and stores it synchronously. ``WgmmaTileStore`` (the persistent V5-V6) writes a warpgroup's wgmma
accumulator out in column blocks through ``pipeline.tma_store.StagedTmaStore`` (two swizzled staging buffers, TMA stores
that run on while the warpgroup goes back to its main loop). ``SwappedSlabStore`` (the swap-AB V7
without a split of K) writes each warpgroup's slab of C^T into C, transposed on its way into the
staging buffer.

A block is ``SUB_COLS`` = 64 fp16 columns (128 bytes: the widest tile a 128-byte-swizzled TMA box
holds), written with ``stmatrix`` into the swizzled buffer without bank conflicts (a row-major
tile 512 bytes wide would put 8 rows of a ``stmatrix`` in the same banks).

The blocks are taken from the accumulator without copying. For a tile of 64 rows (one row of
wgmma instructions) each group of 8 columns sits in 4 consecutive registers of every thread, so
the fragment of a ``64 x cols`` tile is, register for register, the fragment of a ``64 x 64``
tile repeated ``cols / 64`` times over a leading dimension that lives in registers only:
``wgmma_fragment_blocks`` is that view, ``[cols / 64, 64, 64]``, and block ``j`` is a slice of
it. The loop over blocks is unrolled, so every register index is a constant.

Both stores pass each block through the variant's ``pipeline.fused_epilogue.FusedEpilogue`` (bias,
activation; for swiglu a block of C comes from twice as many accumulator columns) before converting
it: block by block, so that one block's bias and temporaries are live at a time, not the tile's.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, SharedTensor, int32
from tilus.ir.layout.inference.inference_rules.wgmma import generate_wgmma_register_layout
from tilus.ir.layout.ops.register_ops import compose, local, unsqueeze

from .fused_epilogue import FusedEpilogue, output_columns, product_columns
from .tma_store import StagedTmaStore

SUB_COLS = 64


def wgmma_fragment(rows: int, cols: int):
    """The register layout tilus gives a ``rows x cols`` float32 wgmma accumulator (fp16/bf16
    operands: instruction K = 16, one instruction as wide as the tile)."""
    return generate_wgmma_register_layout(rows, cols, 64, cols, 16)


def wgmma_fragment_blocks(rows: int, cols: int, sub_cols: int = SUB_COLS):
    """``wgmma_fragment(rows, cols)``'s registers seen as ``[cols / sub_cols, rows, sub_cols]``.
    Holds for one row of wgmma instructions (``rows == 64``); taller tiles interleave the rows'
    registers differently (``wgmma_fragment_grid``)."""
    if rows != 64 or cols % sub_cols:
        raise ValueError(
            f"column blocks of a {rows} x {cols} fragment: need 64 rows and a multiple of {sub_cols} columns"
        )
    block = unsqueeze(generate_wgmma_register_layout(rows, sub_cols, 64, sub_cols, 16), [0])
    return compose(local(cols // sub_cols, 1, 1), block)


def wgmma_fragment_grid(rows: int, cols: int, sub_cols: int):
    """``wgmma_fragment(rows, cols)``'s registers seen as ``[rows / 64, cols / sub_cols, 64, sub_cols]``:
    the fragment of a taller tile is that of its 64-row slabs (one row of instructions each) one
    after the other in every thread's registers, and each slab's is ``cols / sub_cols`` column
    blocks one after the other (``sub_cols`` a multiple of 8)."""
    if rows % 64 or cols % sub_cols or sub_cols % 8:
        raise ValueError(
            f"a {rows} x {cols} fragment in {sub_cols}-column blocks: need a multiple of 64 rows "
            f"and of {sub_cols} (itself a multiple of 8) columns"
        )
    block = unsqueeze(generate_wgmma_register_layout(64, sub_cols, 64, sub_cols, 16), [0, 1])
    return compose(local(rows // 64, cols // sub_cols, 1, 1), block)


class WgmmaTileStore(tilus.Class):
    """Writes a warpgroup's ``rows x cols`` accumulator to global memory, as many columns of C at a
    time as a staging buffer holds (module doc). ``staging``: ``[2, 64, SUB_COLS]`` in the output
    dtype, private to the warpgroup, or narrower where ``cols`` is no multiple of the product columns
    ``SUB_COLS`` take (Hopper V5's 96- and 224-column tiles: ``v5.staging_columns``); a tile taller
    than 64 rows (a ping-pong warpgroup's 128 rows) goes out one 64-row block at a time, each staged
    and stored exactly as a one-row tile's. Call ``store`` and ``finish`` from the warpgroup (128
    threads)."""

    def __init__(self, staging: SharedTensor, rows: int, cols: int):
        self.out = StagedTmaStore(staging)
        self.rows: int = rows
        self.cols: int = cols

    def store(
        self,
        acc: RegisterTensor,
        g_c: GlobalTensor,
        offset_m: int32,
        offset_n: int32,
        epilogue: FusedEpilogue,
        batch: int32 = 0,
    ):
        """The accumulator whose first column is the product's ``offset_n``, through ``epilogue`` (the
        variant's bias and activation, block by block) into C (into its matrix ``batch`` where C is
        a batched kernel's [batches, M, N])."""
        # a staging buffer's columns of C (SUB_COLS, or narrower for a tile that is no multiple of it)
        sub_cols = product_columns(self.out.staging.shape[-1], epilogue.activation)
        if self.rows == 64:  # one row of wgmma instructions (decided when the kernel is built)
            blocks = self.view(acc, layout=wgmma_fragment_blocks(self.rows, self.cols, sub_cols))
            for j in self.range(self.cols // sub_cols, unroll="all"):
                block, column = epilogue.apply(blocks[j], offset_n + j * sub_cols, "wgmma")
                self.out.put(block, g_c, offset_m, column, batch)
        else:  # a taller tile: its 64-row slabs one after the other, each in column blocks
            grid = self.view(acc, layout=wgmma_fragment_grid(self.rows, self.cols, sub_cols))
            for i in self.range(self.rows // 64, unroll="all"):
                for j in self.range(self.cols // sub_cols, unroll="all"):
                    block, column = epilogue.apply(grid[i, j], offset_n + j * sub_cols, "wgmma")
                    self.out.put(block, g_c, offset_m + i * 64, column, batch)

    def finish(self):
        self.out.finish()


class SlotTileStore(tilus.Class):
    """The TMA-store epilogue for a wgmma accumulator staged in the slots of an idle ring of A tiles
    (Hopper V2-V4: shared memory goes to stages, and the output tile needs none of its own).

    ``slots`` is ``[stages, rows, block_k]``, or ``[stages, slabs, rows, block_k]`` of which one slab
    is used (one slab of A per consumer warpgroup); ``stages * block_k >= cols``. Column block ``j``
    (``block_k`` wide) of the ``rows x cols`` float32 accumulator goes into slot ``j``, swizzled as
    the TMA loads wrote it, and its own TMA store reads it back the same way. Call ``store`` from the
    accumulator's warpgroup once every load into these slots has landed and every wgmma of the group
    is complete: it syncs the group, and returns once the stores have read the slots."""

    def __init__(self, slots: SharedTensor):
        self.slots: SharedTensor = slots

    def store(
        self,
        acc: RegisterTensor,
        g_c: GlobalTensor,
        offset_m: int32,
        offset_n: int32,
        slab: int,
        epilogue: FusedEpilogue,
    ):
        rows, cols = acc.shape
        sub_cols = self.slots.shape[-1]  # columns of C a slot holds
        acc_cols = product_columns(sub_cols, epilogue.activation)  # the accumulator's columns that make them
        if self.slots.shape[0] * sub_cols < cols:
            raise ValueError(
                f"a {rows} x {cols} tile does not fit in {self.slots.shape[0]} slots of {sub_cols} "
                f"columns: use stages * block_k >= block_n"
            )
        grid = self.view(acc, layout=wgmma_fragment_grid(rows, cols, acc_cols))  # no copy
        self.sync()  # every warp of the group is past its wgmma wait: no wgmma reads the slots now
        for i in self.range(rows // 64, unroll="all"):
            for j in self.range(cols // acc_cols, unroll="all"):
                slot = self.slots[j, slab] if len(self.slots.shape) == 4 else self.slots[j]
                block, _ = epilogue.apply(grid[i, j], offset_n + j * acc_cols, "wgmma")  # bias, activation
                self.store_shared(slot, block.to(self.slots.dtype), offsets=[i * 64, 0])
        self.fence.proxy_async(space="shared")  # generic-proxy stores -> the TMA unit's (async-proxy) reads
        self.sync()
        with self.single_warp():
            for j in self.range(cols // acc_cols, unroll="all"):
                slot = self.slots[j, slab] if len(self.slots.shape) == 4 else self.slots[j]
                column = output_columns(offset_n, epilogue.activation)  # swiglu: half the product's
                self.tma.shared_to_global(slot, g_c, offsets=[offset_m, column + j * sub_cols])
            self.tma.commit_group()
            self.tma.wait_group(0)


class SwappedSlabStore(tilus.Class):
    """The write-out of a swap-AB kernel whose CTA owns its output tile whole (Hopper V7 with no
    split of K): each consumer warpgroup's accumulator is a slab of C^T, 64 weight rows (C's
    columns) by ``cols`` tokens (C's rows); seen transposed (``cols x 64``, the ``"wgmma_t"``
    fragment) it goes through ``epilogue`` (bias, activation; swiglu makes 32 columns of C of it)
    and into C at (``offset_m``, the slab's first column) by a TMA store, straight after the
    warpgroup's main loop, in parallel with the other warpgroups' and with no float32 tile in
    between. ``staging`` is ``[slabs, 1, cols, 64]`` (``[..., 32]`` for swiglu) in C's dtype, one
    buffer a warpgroup: 64 columns of 16 bits are 128 bytes, tilus gives the buffer the 128-byte
    swizzle, and it writes the transposed accumulator into it with ``stmatrix.trans``
    (``STSM.MT88``), bank-conflict free. The TMA store clips C's edges, so the accumulator is
    never read under a branch: a store masked element by element would make ptxas serialize
    every wgmma of the kernel (its note C7514)."""

    def __init__(
        self, staging: SharedTensor, g_c: GlobalTensor, offset_m: int32, offset_n: int32, epilogue: FusedEpilogue
    ):
        self.staging: SharedTensor = staging
        self.g_c: GlobalTensor = g_c
        self.offset_m: int32 = offset_m
        self.offset_n: int32 = offset_n
        self.epilogue: FusedEpilogue = epilogue

    def store(self, acc: RegisterTensor, slab: int):
        """Warpgroup ``slab``'s accumulator (``64 x cols`` float32, a wgmma fragment) into C, through
        the epilogue and converted to C's dtype; returns once the TMA store has completed. Called by
        that warpgroup."""
        block, column = self.epilogue.apply(self.transpose(acc), self.offset_n + 64 * slab, "wgmma_t")
        out = StagedTmaStore(self.staging[slab])
        out.put(block, self.g_c, self.offset_m, column)
        out.finish()
