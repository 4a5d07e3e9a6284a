"""Split-K partial sums reduced across the CTAs of a cluster, through distributed shared memory.

The CTAs of a cluster of ``parts`` CTAs computed the same output tile over different K ranges;
each holds a float32 partial tile of ``rows x cols`` in registers (or ``layers`` of them, from
thread groups of the CTA that split its own K range further: each layer is stored, sent and
added as a partial of its own). The tile's rows are cut into
``parts`` slices and CTA ``r`` (its rank in the cluster) owns slice ``r``: it will add the
``parts`` partials of that slice and write the result. No global workspace, no atomics, no second
launch.

A larger cluster may hold several such groups side by side (a cluster that also shares a tile
between output tiles, Hopper V7 with multicast): the ``parts`` CTAs of one group are then the
cluster ranks ``rank_base + rank_stride * r``, ``r`` their place in the group, which is the rank
the methods below take. Each group exchanges with its own CTAs only; by default the group is the
whole cluster (``rank_base = 0``, ``rank_stride = 1``).

1. ``store``: each consumer warpgroup writes its accumulator into this CTA's ``partial`` tile
   (float32, one slice after another, each swizzled against bank conflicts: ``partial_layout``).
2. ``exchange`` (whole CTA): a fence orders those generic-proxy stores before the copy engine's
   reads, then one thread announces on this CTA's ``arrived`` barrier the bytes it will receive
   (``parts - 1`` slices) and sends slice ``p`` of its partial to every peer ``p`` with one bulk
   copy each (``cp.async.bulk.shared::cluster.shared::cta``): the copy lands in the peer's
   ``received`` slot for this sender and counts its bytes on the peer's ``arrived`` barrier, as a
   TMA load does.
3. ``total`` (the owning threads): wait on ``arrived`` (phase 0: the barrier is used once), then
   add this CTA's own slice and the ``parts - 1`` received ones in registers.

Synchronization: ``arrived`` (each CTA, 1 arrival: its own ``expect_tx``, plus the bytes of every
peer's copy, which may land before that arrival; the phase cannot complete without it). The
cluster must be synchronized after the barriers are initialized and before the first copy into a
peer (``self.cluster.sync()`` at the start, or, where nothing before the exchange reaches a peer,
a relaxed arrival at the start, ``arrive_after_init``, and its wait just before the exchange,
``wait_for_peers``, so that the main loop does not wait for the cluster's slowest CTA), and
before any CTA exits (``exit_barrier``): a CTA's outgoing copies read its shared memory until the
*receiver's* barrier completes, so a sender may leave only once every receiver has seen its bytes.
That last barrier orders no memory: each receiver arrives on it after its own wait on ``arrived``
has seen every copy into it complete, so its arrival is relaxed (``barrier.cluster.arrive.relaxed``),
and the CTA need not wait for its output's global stores to be performed first (``MEMBAR.ALL.GPU``,
which an arrival with release semantics costs).
Every slot is written once per launch, so no barrier guards reuse.
"""

from typing import no_type_check

import tilus
from tilus import GlobalTensor, RegisterTensor, float32, int32
from tilus.hidet.ir.dtypes import uint32
from tilus.hidet.ir.primitives.cuda.funcs import call_cuda
from tilus.hidet.ir.primitives.func import (
    is_primitive_function,
    register_primitive_function,
)
from tilus.hidet.ir.stmt import asm
from tilus.hidet.lang import attrs, script
from tilus.ir.layout.ops.shared_ops import shared_row_major_swizzle
from tilus.lang.instructions import base

from .fused_epilogue import FusedEpilogue, split_k_layout

_COPY = "bulk_copy_to_rank"
_EXIT = "cluster_sync_relaxed"
_ARRIVE = "cluster_arrive_after_init"  # (tilus has a cluster_arrive_relaxed and a cluster_wait of its own: other names)
_WAIT = "cluster_wait_for_peers"


def _register() -> None:
    if is_primitive_function("cuda_" + _COPY):
        return

    @no_type_check
    @script
    def cuda_cluster_sync_relaxed():
        attrs.func_name = "cuda_" + _EXIT
        attrs.func_kind = "cuda_internal"
        asm(template="barrier.cluster.arrive.relaxed.aligned;", outputs=[], inputs=[], is_volatile=True)
        asm(template="barrier.cluster.wait.aligned;", outputs=[], inputs=[], is_volatile=True)

    register_primitive_function(name=cuda_cluster_sync_relaxed.name, func_or_type=cuda_cluster_sync_relaxed)

    @no_type_check
    @script
    def cuda_cluster_arrive_after_init():
        attrs.func_name = "cuda_" + _ARRIVE
        attrs.func_kind = "cuda_internal"
        asm(template="barrier.cluster.arrive.relaxed.aligned;", outputs=[], inputs=[], is_volatile=True)

    register_primitive_function(name=cuda_cluster_arrive_after_init.name, func_or_type=cuda_cluster_arrive_after_init)

    @no_type_check
    @script
    def cuda_cluster_wait_for_peers():
        attrs.func_name = "cuda_" + _WAIT
        attrs.func_kind = "cuda_internal"
        asm(template="barrier.cluster.wait.aligned;", outputs=[], inputs=[], is_volatile=True, memory_fence=True)

    register_primitive_function(name=cuda_cluster_wait_for_peers.name, func_or_type=cuda_cluster_wait_for_peers)

    @no_type_check
    @script
    def cuda_bulk_copy_to_rank(local_dst: uint32, src: uint32, size: uint32, local_barrier: uint32, cta_rank: uint32):
        attrs.func_name = "cuda_" + _COPY
        attrs.func_kind = "cuda_internal"
        asm(
            template="{ .reg.b32 remote, remote_bar; mapa.shared::cluster.u32 remote, %0, %4; "
            "mapa.shared::cluster.u32 remote_bar, %3, %4; "
            "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
            "[remote], [%1], %2, [remote_bar]; }",
            inputs=[local_dst, src, size, local_barrier, cta_rank],
            is_volatile=True,
            memory_fence=True,
        )

    register_primitive_function(name=cuda_bulk_copy_to_rank.name, func_or_type=cuda_bulk_copy_to_rank)


_register()


def partial_layout(shape):
    """The shared layout of the partial and received tiles, ``[..., rows, cols]`` float32: each
    ``rows x cols`` slice contiguous (one bulk copy sends it, and the receiver reads it in the
    sender's layout), cut into blocks of 32 columns (128 bytes), whose 16-byte groups are permuted
    row by row (``shared_row_major_swizzle``). Row-major, the rows of a 128-column slice lie 512
    bytes apart, in the same banks: a warp storing its accumulator (8 rows at a time from a wgmma
    fragment, 32 from a tcgen05 one) or loading 8 rows with ``ldmatrix`` met 8-way conflicts
    or worse. Swizzled, the 8 rows of a block use different banks."""
    return shared_row_major_swizzle(shape, 4)


def bulk_copy_to_rank(dst, src, barrier, rank) -> None:
    """In kernel code (one thread): copy the shared tensor ``src`` of this CTA into the shared
    tensor at ``dst``'s offset in the CTA of rank ``rank``, its bytes counted on that CTA's barrier
    at the offset of the single-element barrier register tensor ``barrier``. ``src`` and ``dst``
    are the same size, a multiple of 16 bytes, both contiguous."""
    builder = base._current_builder
    if builder is None:
        raise RuntimeError("bulk_copy_to_rank is called from kernel code only")
    dst_addr = builder.tensor_ptr(dst, space="shared")
    src_addr = builder.tensor_ptr(src, space="shared")
    barrier_addr = builder.tensor_item_value(barrier)
    builder.evaluate(
        None,
        call_cuda(_COPY, [uint32(dst_addr), uint32(src_addr), uint32(src.nbytes), uint32(barrier_addr), uint32(rank)]),
    )


def _cluster_call(name: str) -> None:
    """In kernel code: call the registered cluster-barrier primitive ``name`` (no arguments)."""
    builder = base._current_builder
    if builder is None:
        raise RuntimeError(f"{name} is called from kernel code only")
    builder.evaluate(None, call_cuda(name, []))


def cluster_arrive_relaxed() -> None:
    """In kernel code (every thread of the CTA): arrive on the cluster barrier without waiting,
    relaxed (``ClusterSplitKReduce.arrive_after_init``)."""
    _cluster_call(_ARRIVE)


def cluster_wait() -> None:
    """In kernel code (every thread of the CTA, after ``cluster_arrive_relaxed``): wait until every
    thread of the cluster has arrived (acquire: what the peers did before arriving is visible)."""
    _cluster_call(_WAIT)


def cluster_sync_relaxed() -> None:
    """In kernel code (every thread of the CTA): ``barrier.cluster`` with a relaxed arrival, an
    execution barrier of the cluster that orders no memory (``ClusterSplitKReduce.exit_barrier``)."""
    _cluster_call(_EXIT)


class SplitKRange(tilus.Class):
    """The K blocks a CTA of rank ``rank`` sums when ``parts`` CTAs split ``num_k_blocks``: the
    contiguous range ``first, first + 1, ..., first + count - 1``. ``count`` is at least 1: a CTA
    whose range is empty (fewer K blocks than CTAs) loads one block wholly past K, which TMA fills
    with zeros, so every CTA runs the same code and adds a zero partial. With ``multiple`` > 1 every
    range but the last starts at a multiple of ``multiple`` blocks and is that long, so a CTA that
    takes its blocks ``multiple`` at a time never reaches into a peer's range: what lies past its
    own ``count`` lies past K."""

    def __init__(self, num_k_blocks: int32, parts: int, rank: int32, multiple: int = 1):
        per_rank: int32 = (num_k_blocks + parts * multiple - 1) // (parts * multiple) * multiple
        self.first: int32 = rank * per_rank
        self.count: int32 = max(min(num_k_blocks - self.first, per_rank), 1)


class ClusterSplitKReduce(tilus.Class):
    """The sum over a cluster of ``parts`` CTAs of their ``rows x cols`` float32 partial tiles
    (module doc), written out transposed: the tiles are tiles of C^T (a kernel that swapped its
    operands), the result goes to C. ``rows`` is a multiple of 64 (one slab per consumer
    warpgroup) and of ``8 * parts``. With ``parts == 1`` there is nothing to exchange: the tile
    only passes through shared memory on its way out. ``rank_base`` (known at run time) and
    ``rank_stride`` place the group in a larger cluster (module doc)."""

    def __init__(self, parts: int, rows: int, cols: int, layers: int = 1, rank_base: int32 = 0, rank_stride: int = 1):
        self.parts: int = parts
        # the group's CTA r is cluster rank rank_base + rank_stride * r (module doc)
        self.rank_base = rank_base
        self.rank_stride: int = rank_stride
        self.rows: int = rows
        self.cols: int = cols
        self.layers: int = layers
        self.partial = self.shared_tensor(dtype=float32, shape=[layers, parts, rows // parts, cols])
        self.annotate_layout(self.partial, partial_layout([layers, parts, rows // parts, cols]))
        if parts > 1:
            slots = layers * (parts - 1)  # layer l of peer p's slice in slot l * (parts - 1) + ...
            self.received = self.shared_tensor(dtype=float32, shape=[slots, rows // parts, cols])
            self.annotate_layout(self.received, partial_layout([slots, rows // parts, cols]))
            self.arrived = self.mbarrier.alloc([1])

    def store(self, acc: RegisterTensor, slab: int, layer: int = 0):
        """A thread group's partial rows into this CTA's partial tile (layer ``layer``): ``acc`` is
        slab ``slab`` of the tile, cut into slabs of ``acc``'s height (64 rows for a wgmma
        warpgroup, all 128 TMEM lanes for a tcgen05 accumulator)."""
        height = acc.shape[0]
        slabs = self.reshape_shared(self.partial, [self.layers, self.rows // height, height, self.cols])
        self.store_shared(slabs[layer, slab], acc)

    def exchange(self, rank: int32):
        """Whole CTA, after every ``store``: send slice ``p`` of the partial tile to peer ``p``
        (``rank`` and ``p``: places in the group, module doc)."""
        self.fence.proxy_async(space="shared")  # generic-proxy stores -> the copy engine's reads
        self.sync()
        if self.parts > 1:
            with self.single_thread():
                self.mbarrier.arrive_and_expect_tx(
                    self.arrived[0], transaction_bytes=self.layers * (self.parts - 1) * self.partial[0, 0].nbytes
                )
                for layer in self.range(0, self.layers, 1, unroll="all"):
                    first: int32 = layer * (self.parts - 1)
                    for step in self.range(1, self.parts, 1, unroll="all"):
                        peer: int32 = (rank + step) % self.parts
                        # the peer keeps what it receives from this CTA in slot (rank - peer - 1) mod parts
                        bulk_copy_to_rank(
                            self.received[first + self.parts - 1 - step],
                            self.partial[layer, peer],
                            self.arrived[0],
                            self.rank_base + self.rank_stride * peer,
                        )

    def arrive_after_init(self):
        """Whole CTA, first, in place of a full cluster barrier: announce to the peers that this
        CTA's mbarriers exist (tilus fences their initialization for the cluster,
        ``fence.mbarrier_init.release.cluster``, at the kernel's start) with a relaxed arrival, and
        go on at once: nothing of the main loop reaches a peer, so its TMA loads start without
        waiting for the slowest CTA of the cluster to begin. ``wait_for_peers`` completes the
        barrier before the first copy into a peer (with ``parts == 1``: no peer, no barrier)."""
        if self.parts > 1:
            cluster_arrive_relaxed()

    def wait_for_peers(self):
        """Whole CTA, before ``exchange``, after ``arrive_after_init``: wait until every CTA of the
        cluster has arrived, so every peer's ``arrived`` barrier exists before a copy lands on it."""
        if self.parts > 1:
            cluster_wait()

    def exit_barrier(self):
        """Whole CTA, last: no CTA of the cluster exits while a peer's copy may still read its
        partial tile (module doc; with ``parts == 1`` there is no peer, and no barrier)."""
        if self.parts > 1:
            cluster_sync_relaxed()

    def write(self, rank: int32, g_c: GlobalTensor, offset_m: int32, offset_n: int32, epilogue: FusedEpilogue):
        """This CTA's slice (``rows / parts`` rows of C^T from row ``rank * rows / parts``) summed
        over the cluster, through ``epilogue`` (the variant's bias and activation: C^T's rows are
        C's columns, so the slice is transposed first; swiglu pairs its rows r and r + 8),
        converted to C's dtype and stored into C at (offset_m, offset_n + the slice's first row);
        ``store_global`` clips what lies past C's edges. Called by the thread group that writes it
        out, after ``exchange``."""
        slice_rows = self.rows // self.parts
        acc = self.load_shared(self.partial[0, rank])
        if epilogue.fused:  # a layout whose transpose is column groups (pipeline.fused_epilogue)
            self.annotate_layout(acc, split_k_layout(slice_rows, self.cols))
        if self.layers > 1:
            for layer in self.range(1, self.layers, 1, unroll="all"):
                self.add(acc, self.load_shared(self.partial[layer, rank]), out=acc)
        if self.parts > 1:
            self.mbarrier.wait(self.arrived[0], phase=0)
            for slot in self.range(0, self.layers * (self.parts - 1), 1, unroll="all"):
                self.add(acc, self.load_shared(self.received[slot]), out=acc)
        if epilogue.fused:
            tile, column = epilogue.apply(self.transpose(acc), offset_n + rank * slice_rows, "split_k")
            self.store_global(g_c, tile.to(g_c.dtype), offsets=[offset_m, column])
        else:
            out = self.transpose(acc.to(g_c.dtype))
            self.store_global(g_c, out, offsets=[offset_m, offset_n + rank * (self.rows // self.parts)])
