"""Hopper V6: V5 run by 2-CTA clusters: the B tile both CTAs need is loaded once and multicast
to both, and the pair's tiles are decided once, by the leader CTA.

Idea: two CTAs on neighbouring SMs (a cluster, ``cluster_blocks = 2``) compute vertically
adjacent 128 x 256 tiles, so they need the same 256 x ``block_k`` slab of B for every K block.
Instead of both fetching it from L2, each CTA loads one half of it (128 rows) with a TMA
*multicast* (``multicast_mask=0b11``): the TMA unit writes the half into the same place of both
CTAs' shared memory and completes the bytes on the same-offset barrier of each. Per K block a
CTA now brings in 16 KiB of A and 16 KiB of B instead of 16 + 32 KiB: a third less L2 -> SM
traffic. The price is coupling: a CTA may refill a stage only when the consumers of *both* CTAs
have released it, because its B half lands in both. V5's narrow tiles (128 x 96, 128 x 224, for
B [N, K]) pair the same way, each CTA loading 48 or 112 rows of B: at 256 tokens the pair holds
every token, and the gate-up weight in 128 x 224 pairs is the fastest kernel of the series there.

Which tile the pair computes next is decided in one place. Its first tile is the one the cluster
was launched for (``blockIdx.x / 2``), as with cluster launch control; every later one is picked
by the leader CTA's producer warp and delivered to every role of both CTAs through
``pipeline.broadcast.LeaderTileBroadcast`` (a 2-slot ring in each CTA's shared memory, written
with ``st.async`` across the cluster). The leader sends tile ``i + 1`` before it loads tile ``i``,
so the consumers receive it while tile ``i``'s first wgmma group runs and never wait for it at a
tile boundary. This is the Hopper counterpart of Blackwell's multicast cluster launch control,
with one difference: tilus 0.2.0 has no atomic read-modify-write on global memory (its language
offers only ``lock_semaphore``/``release_semaphore``), so the leader cannot claim tiles from a
global counter. Its rule is the static round robin of V5 over cluster tiles (cluster ``c`` of
``C`` takes 256 x 256 tiles ``c, c + C, ...`` in grouped order). The peer never computes its own
schedule; a dynamic rule would change only the leader's next-tile line.

Option ``pair="n"`` (``PAIR_N_NARROW``, in ``EXTRA_CONFIGS``: correct on the GPU,
``tests/test_gpu_correctness.py::test_hopper_narrow_tiles``, and not tuned, being no faster than
the pair stacked along M, ``plots/h200/pair-n/ of commit b43a7e1``): the
pair computes horizontally adjacent tiles of one M tile instead, so it shares the A tile: each
CTA loads one 64-row slab of it by multicast into both, and its own whole B tile. Which operand to
share is a matter of sizes: a CTA reads ``block_m x block_k`` of A and ``block_n x block_k`` of B a K
block, and the pair should halve the larger. At 256 tokens on a 6144-row weight (a Llama's qkv) in
128 x 96 tiles, A is the larger (128 rows against 96), so the pair along N reads the fewest bytes
from L2 (as cuBLAS's ``96x128`` kernel does, whose ``2x1`` cluster shares the token tile); the
bytes it saves are not what limits that shape (``plots/h100/skinny/``, ``plots/h200/pair-n/ of commit b43a7e1``).
Nothing else changes: a stage still receives both halves of each operand, so the barriers, counts
and releases below are the same, with "own A" and "B half" trading places.

Option ``pingpong`` (``PINGPONG`` and ``PINGPONG_WIDE``, in ``EXTRA_CONFIGS``: built and checked,
not tuned, being slower than V6 without it, ``plots/h100/pingpong/``; a build
without it is V6 as above): CUTLASS's *ping-pong* consumers, meant for big square-ish products.
Without it both warpgroups split every tile by rows and reach its end together, so both write the
tile out together and the tensor core has nothing to do while they convert and stage the
accumulator (the TMA stores drain later, but the staging does not). With it each warpgroup owns
whole tiles, the CTA's tiles alternating between the two, and their main loops take turns
(``pipeline.turns.OrderedTurns``): warpgroup 0 multiplies tile 0 and hands the tensor core over
once its last wgmma is issued, then writes tile 0 out while warpgroup 1 multiplies tile 1, and so
on. The producer is unchanged: it fills the one ring with the tiles' K blocks in the tiles' order,
and each warpgroup takes its own tile's stages and jumps over the other's
(``Pipeline.consumer_skip``).

A warpgroup holds its tile's accumulator in its own registers: 128 x 256 float32 is 256 a thread,
more than a thread can hold (255; the 288-thread CTA gets at most 224 each), so a ping-pong tile is
128 x 128 (``PINGPONG``: two ``m64n128k16`` a K step, the two 64-row slabs of A read as one
``[128, block_k]`` tile, ``mainloop.WHOLE_TILE``; six stages of 32 KiB fit beside the staging
buffers) or 64 x 256 (``PINGPONG_WIDE``: V6's ``m64n256k16``; a stage is 40 KiB, four fit), 128
registers a thread either way, as without the option. Both read 24 KiB per CTA and K block for
half the multiply-adds that V6 without the option gets from 32 KiB: the pair still shares B by
multicast, but a warpgroup's tile is half the CTA's.

The epilogue is V5's ``WgmmaTileStore`` block by block: a tile goes out as four 64 x 64 blocks
(a 128-row tile one 64-row slab after the other), each through the warpgroup's own two staging
buffers. It is free of shared-memory bank conflicts: ``stmatrix`` writes each 8 x 8 matrix as 8
rows of 16 bytes, and a staging buffer is 64 columns (128 bytes) wide with the 128-byte swizzle
(16-byte chunk ``c`` of row ``r`` at chunk ``c ^ (r % 8)``), so the 8 rows fall in 8 different
groups of 4 banks: one wavefront a matrix. A whole 128 x 128 tile staged row-major would have
256-byte rows, each row's chunk ``c`` in the same four banks: 8-way conflicts
(``tests/test_pingpong.py`` checks both against the built layout).

Synchronization (in each CTA of the pair; the ping-pong option's differences in brackets, "owner"
being the warpgroup whose tile the stage holds):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | own producer's ``expect_tx``; own A, own and peer's B half | both consumers [owner] | CTA |
| ``empty[s]`` | 4 [2] | each consumer [owner] of both CTAs, after ``wgmma.wait_group`` | own producer | CTA, remote |
| ``filled[d]`` | 1 + 4 bytes | leader producer: ``expect_tx``, ``st.async`` of the tile | the readers | CTA |
| ``drained[d]`` | 5 | (leader) each consumer of both CTAs, the peer's producer | leader producer | CTA, remote |
| [``turn[w]``] | [1] | [the other warpgroup's elected thread, its last wgmma issued] | [warpgroup ``w``] | [CTA] |
| ``barrier.cluster`` | 2 CTAs | every thread, after barrier setup and before exit | all threads | cluster |

Ping-pong: each consumer warpgroup still receives every tile index (the other's next tile during
its first K block, its own next one after its main loop; nothing after the index that means stop),
so ``drained`` counts the same five readers. The turns keep the ring's parity waits sound: a
warpgroup waits on a stage only after the other has waited for every stage of its tile (the
hand-over comes after its last wgmma is issued), so the fill before the one it waits for has
landed and no old fill passes for its own. Warpgroup 0 takes the first turn without a hand-over
(its first wait on ``turn[0]`` is for the phase before the first); each turn is one arrival and
one wait, strictly alternating, so neither ``turn`` barrier runs a phase ahead of its waiter. The
epilogues need no turn of their own: each warpgroup stages in its own buffers and owns its bulk
async-groups.

``full[s]``'s bytes from the peer may land before the local ``expect_tx``: the phase cannot complete
before that arrival. Every consumer warpgroup releases every stage it read (ping-pong: its own
tiles' stages) in both CTAs (``release_to=0b11``, ``elect_release=True``: thread 0 of the warpgroup
arrives on rank 0's barrier, thread 1 on rank 1's), so a producer loads its A tile or its B half
only into a stage neither CTA still reads.
``filled``/``drained`` are the tile ring of ``LeaderTileBroadcast``: each reader arrives on the
leader's ``drained[d]`` after a barrier of its own threads once all have read the slot.

The rings order at CTA scope (``cluster_fences=False``: acquire.cta waits, release.cta arrivals,
even on the peer's barrier): a stage carries only TMA bytes, counted by the hardware on the
barrier they complete on, and wgmma reads that are complete before the release is issued; the
tile index travels by ``st.async``, counted on the reader's barrier. Cluster-scope ordering would
put an L1 invalidation after every wait and a ``MEMBAR.ALL.GPU`` before every release. A tile
index past the last tile means stop. The first cluster barrier makes sure no remote arrival or
multicast reaches a barrier before it exists; the last, that no CTA leaves while its peer may
still arrive on its barriers. The epilogue is V5's, per CTA.
"""

import tilus
from tilus import GlobalTensor, SharedTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline, TileRasterizer
from pipeline.broadcast import LeaderTileBroadcast
from pipeline.epilogue import WgmmaTileStore, wgmma_fragment
from pipeline.mainloop import WHOLE_TILE, WgmmaMainloop
from pipeline.schedulers import sm_count
from pipeline.turns import OrderedTurns

from ..entry import MatmulKernel
from .v5 import staging_columns, takes  # noqa: F401 (takes: read by versions.space)

IDEA = "2-CTA clusters: B multicast to both CTAs, stages released across the pair, leader-decided tiles"
PTX_MARKERS = (
    "wgmma.mma_async.sync.aligned.m64n256k16",
    ".multicast::cluster",
    "mapa.shared::cluster",
    "mbarrier.arrive.expect_tx.release.cta.shared::cluster",
    "st.async.shared::cluster.mbarrier::complete_tx::bytes",
    "barrier.cluster",
)
REPRESENTATIVE = dict(block_m=128, block_n=256, block_k=64, stages=4, group=8)
# The ping-pong option (module doc): each consumer warpgroup owns whole 128 x 128 tiles (PINGPONG) or
# 64 x 256 ones (PINGPONG_WIDE). Built and checked, not tuned: slower than V6 without it
# (plots/h100/pingpong/). Select it on purpose with versions.kernel(module, dtype, PINGPONG).
PINGPONG = dict(block_m=128, block_n=128, block_k=64, stages=6, group=8, pingpong=True)
PINGPONG_WIDE = dict(block_m=64, block_n=256, block_k=64, stages=4, group=8, pingpong=True)
# The pair side by side along N (module doc, option ``pair``), for 256 tokens on a narrow weight tile
# (qkv): correct, not tuned (no faster than the pair along M, plots/h200/pair-n/ of commit b43a7e1).
PAIR_N_NARROW = dict(block_m=128, block_n=96, block_k=64, stages=7, group=8, pair="n")
EXTRA_CONFIGS = (PINGPONG, PINGPONG_WIDE, PAIR_N_NARROW)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)


def consumers_take_turns(config: dict) -> bool:
    """For the synchronization checker (``matmul.protocol``): whether the consumer warpgroups of
    ``config`` take turns at the ring's stages (ping-pong: each fill is waited for by one of them)."""
    return bool(config.get("pingpong", False))


# per CTA: stages * (block_m + block_n) * block_k * 2 bytes of ring (the whole B tile lands in
# each CTA) + 32 KiB of epilogue staging: V5's budget (ping-pong's 128 x 128 tiles take 32 KiB a
# stage, so six fit; its 64 x 256 ones 40 KiB, four). The group counts cluster tiles (two tiles
# stacked along M): group 8 covers the rows V5's group 16 does. V5's narrow tiles (96 and 224
# columns, each CTA loading 48 or 112 rows of B) for 256 tokens, where the pair holds all of M and
# the multicast takes a fifth to a third off each SM's loads; left out for torch's b [K, N] and
# batches as in V5 (``takes``), C staged in V5's narrower blocks (``staging_columns``).
@tilus.autotune("block_m, block_n, block_k, stages", [(128, 256, 64, 4), (128, 96, 64, 7), (128, 224, 64, 4)])
@tilus.autotune("group", [8, 16])
class Kernel(MatmulKernel):
    def __init__(
        self,
        dtype,
        block_m: int,
        block_n: int,
        block_k: int,
        stages: int,
        group: int,
        pingpong: bool = False,
        pair: str = "m",
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m
        self.require_whole_b_boxes(block_n // 2)  # each CTA loads half of the B tile
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.group = group
        self.pingpong = pingpong
        if pair not in ("m", "n"):
            raise ValueError(f"pair={pair!r}: 'm' (the pair's tiles stacked along M) or 'n' (side by side along N)")
        self.pair = pair
        # rank r of the pair computes M tile m_step * i + (m_step - 1) * r and N tile n_step * j + (n_step - 1) * r
        # of cluster tile (i, j)
        self.m_step, self.n_step = (2, 1) if pair == "m" else (1, 2)
        self.num_sms = sm_count()

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        half_m = self.block_m // 2  # the rows of one consumer warpgroup (pair "n": of A each CTA loads)
        half_n = self.block_n // 2  # the rows of B each CTA of the pair loads (pair "m")
        # a cluster tile: two tiles stacked along M, or side by side along N
        num_pair_rows = cdiv(cdiv(m_size, self.block_m), self.m_step)
        num_pair_columns = cdiv(cdiv(n_size, self.block_n), self.n_step)
        num_cluster_tiles = num_pair_rows * num_pair_columns
        max_clusters = self.num_sms // 2
        self.attrs.blocks = 2 * (num_cluster_tiles if num_cluster_tiles < max_clusters else max_clusters)
        self.attrs.cluster_blocks = 2
        self.attrs.warps = 9  # warps 0-3 and 4-7: consumer warpgroups; warp 8: producer
        rank: int32 = self.cluster.blockRank  # 0: the leader
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_n, self.block_k])  # [.., half]
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)
        # [warpgroup, buffer]: a block of 64 rows (a warpgroup's rows; a ping-pong tile goes out in such blocks)
        s_c = self.shared_tensor(dtype=self.dtype, shape=[2, 2, 64, staging_columns(self.block_n, self.activation)])

        # a stage is read by both consumer warpgroups of both CTAs, or (ping-pong) by one of each CTA
        ring = Pipeline(
            self.stages,
            consumer_arrivals=2 if self.pingpong else 4,
            scope="cluster",
            release_to=0b11,
            elect_release=True,
            cluster_fences=False,
        )
        tiles = LeaderTileBroadcast(depth=2, readers=5)
        raster = TileRasterizer(num_pair_rows, num_pair_columns, self.group)
        self.cluster.sync()  # every barrier of both CTAs exists before anything arrives on it

        # the pair's first tile is the one it was launched for, as with cluster launch control;
        # every later one is decided by the leader and received, one tile ahead of its use
        first: int32 = self.blockIdx.x // 2
        with self.single_warp(8):  # producer
            if rank == 0:  # the leader decides the pair's tiles: a static round robin over clusters
                linear: int32 = first
                while linear < num_cluster_tiles:
                    following: int32 = linear + self.gridDim.x // 2
                    tiles.send(following)  # before this tile's loads, so no reader waits for it
                    self.load_tile(ring, raster, linear, rank, s_a, s_b, g_a, g_b, num_k_blocks)
                    linear = following
            else:
                linear: int32 = first
                while linear < num_cluster_tiles:
                    self.load_tile(ring, raster, linear, rank, s_a, s_b, g_a, g_b, num_k_blocks)
                    linear = tiles.receive()

        if self.pingpong:  # decided when the kernel is built
            turns = OrderedTurns()
            self.pingpong_consumer(
                0, ring, turns, tiles, raster, rank, first, s_a, s_b, s_c, g_c, num_k_blocks, num_cluster_tiles
            )
            self.pingpong_consumer(
                1, ring, turns, tiles, raster, rank, first, s_a, s_b, s_c, g_c, num_k_blocks, num_cluster_tiles
            )
        else:
            self.consumer(0, ring, tiles, raster, rank, first, s_a, s_b, s_c, g_c, num_k_blocks, num_cluster_tiles)
            self.consumer(1, ring, tiles, raster, rank, first, s_a, s_b, s_c, g_c, num_k_blocks, num_cluster_tiles)
        self.cluster.sync()  # neither CTA exits while its peer may still arrive on its barriers

    def load_tile(
        self,
        ring: Pipeline,
        raster: TileRasterizer,
        linear: int32,
        rank: int32,
        s_a: SharedTensor,
        s_b: SharedTensor,
        g_a: GlobalTensor,
        g_b: GlobalTensor,
        num_k_blocks: int32,
    ):
        """Producer: this CTA's A tile and its half of the pair's B tile (pair "n": its half of the
        pair's A tile and its own B tile), every K block. Either way a stage receives both halves of
        each: ``expect_tx`` counts the same bytes."""
        half_m = self.block_m // 2
        half_n = self.block_n // 2
        offset_m, offset_n = self.tile_origin(raster, linear, rank)
        for kb in range(num_k_blocks):
            ring.producer_acquire()  # free in both CTAs
            slot = ring.producer_stage
            with self.single_thread():
                self.mbarrier.arrive_and_expect_tx(
                    ring.producer_barrier(), transaction_bytes=2 * s_a[slot, 0].nbytes + 2 * s_b[slot, 0].nbytes
                )
            offset_k = kb * self.block_k
            if self.pair == "n":  # decided when the kernel is built
                self.tma.global_to_shared(
                    src=g_a,
                    dst=s_a[slot, rank],
                    offsets=[offset_m + rank * half_m, offset_k],
                    mbarrier=ring.producer_barrier(),
                    multicast_mask=0b11,
                )
                self.load_b(g_b, s_b[slot, 0], ring.producer_barrier(), offset_n, offset_k)
                self.load_b(g_b, s_b[slot, 1], ring.producer_barrier(), offset_n + half_n, offset_k)
            else:
                self.tma.global_to_shared(
                    src=g_a, dst=s_a[slot, 0], offsets=[offset_m, offset_k], mbarrier=ring.producer_barrier()
                )
                self.tma.global_to_shared(
                    src=g_a, dst=s_a[slot, 1], offsets=[offset_m + half_m, offset_k], mbarrier=ring.producer_barrier()
                )
                self.load_b(
                    g_b,
                    s_b[slot, rank],
                    ring.producer_barrier(),
                    offset_n + rank * half_n,
                    offset_k,
                    multicast=True,
                    multicast_mask=0b11,
                )
            ring.producer_advance()

    def tile_origin(self, raster: TileRasterizer, linear: int32, rank: int32):
        """(row, column) of C where this CTA's tile of cluster tile ``linear`` starts."""
        pair_row, pair_column = raster.tile(linear)
        offset_m = (self.m_step * pair_row + (self.m_step - 1) * rank) * self.block_m
        offset_n = (self.n_step * pair_column + (self.n_step - 1) * rank) * self.block_n
        return offset_m, offset_n

    def consumer(
        self,
        wg: int,
        ring: Pipeline,
        tiles: LeaderTileBroadcast,
        raster: TileRasterizer,
        rank: int32,
        first: int32,
        s_a: SharedTensor,
        s_b: SharedTensor,
        s_c: SharedTensor,
        g_c: GlobalTensor,
        num_k_blocks: int32,
        num_cluster_tiles: int32,
    ):
        """Consumer warpgroup ``wg``: rows ``wg * block_m / 2 ...`` of every tile of this CTA."""
        half_m = self.block_m // 2
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            mainloop = WgmmaMainloop(ring)
            out = WgmmaTileStore(s_c[wg], half_m, self.block_n)
            linear: int32 = first
            while linear < num_cluster_tiles:
                offset_m, offset_n = self.tile_origin(raster, linear, rank)
                acc = self.register_tensor(dtype=float32, shape=[half_m, self.block_n], init=0.0)
                self.annotate_layout(acc, wgmma_fragment(half_m, self.block_n))
                mainloop.start(s_a, s_b, wg, acc)
                following: int32 = tiles.receive()  # while K block 0 is on the tensor core
                mainloop.finish(s_a, s_b, wg, acc, num_k_blocks)
                out.store(acc, g_c, offset_m + wg * half_m, offset_n, self.epilogue)
                linear = following
            out.finish()

    def pingpong_consumer(
        self,
        wg: int,
        ring: Pipeline,
        turns: OrderedTurns,
        tiles: LeaderTileBroadcast,
        raster: TileRasterizer,
        rank: int32,
        first: int32,
        s_a: SharedTensor,
        s_b: SharedTensor,
        s_c: SharedTensor,
        g_c: GlobalTensor,
        num_k_blocks: int32,
        num_cluster_tiles: int32,
    ):
        """Ping-pong consumer warpgroup ``wg``: the whole ``block_m x block_n`` tile of every other
        tile of this CTA (warpgroup 0 the first), its main loop in its turn (``OrderedTurns``)."""
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            mainloop = WgmmaMainloop(ring)
            out = WgmmaTileStore(s_c[wg], self.block_m, self.block_n)
            linear: int32 = first
            if wg == 1:
                linear = tiles.receive()  # warpgroup 1 starts at the CTA's second tile,
                ring.consumer_skip(num_k_blocks)  # past the first tile's stages
            while linear < num_cluster_tiles:
                offset_m, offset_n = self.tile_origin(raster, linear, rank)
                acc = self.register_tensor(dtype=float32, shape=[self.block_m, self.block_n], init=0.0)
                self.annotate_layout(acc, wgmma_fragment(self.block_m, self.block_n))
                turns.wait(wg)
                mainloop.start(s_a, s_b, WHOLE_TILE, acc)
                # every reader receives every tile index: here the other warpgroup's next tile, sent
                # before this tile's loads; after the main loop this warpgroup's own next one
                other: int32 = tiles.receive()
                mainloop.issue_rest(s_a, s_b, WHOLE_TILE, acc, num_k_blocks)
                turns.hand_over(wg)  # the other warpgroup's wgmma queue behind this tile's last
                mainloop.drain()
                ring.consumer_skip(num_k_blocks)  # the other warpgroup's tile's stages
                following: int32 = other
                if other < num_cluster_tiles:  # past the last tile nothing more is sent
                    following = tiles.receive()
                out.store(acc, g_c, offset_m, offset_n, self.epilogue)
                linear = following
            out.finish()
