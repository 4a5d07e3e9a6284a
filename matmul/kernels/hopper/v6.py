"""Hopper V6: V5 run by 2-CTA clusters: the B tile both CTAs need is loaded once and multicast
to both, and the pair's tiles are decided once, by the leader CTA.

Idea: two CTAs on neighbouring SMs (a cluster, ``cluster_blocks = 2``) compute vertically
adjacent 128 x 256 tiles, so they need the same 256 x ``block_k`` slab of B for every K block.
Instead of both fetching it from L2, each CTA loads one half of it (128 rows) with a TMA
*multicast* (``multicast_mask=0b11``): the TMA unit writes the half into the same place of both
CTAs' shared memory and completes the bytes on the same-offset barrier of each. Per K block a
CTA now brings in 16 KiB of A and 16 KiB of B instead of 16 + 32 KiB: a third less L2 -> SM
traffic. The price is coupling: a CTA may refill a stage only when the consumers of *both* CTAs
have released it, because its B half lands in both.

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

Synchronization (in each CTA of the pair):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | own producer's ``expect_tx``; own A, own and peer's B half | both consumers | CTA |
| ``empty[s]`` | 4 | each consumer of both CTAs, after ``wgmma.wait_group`` | own producer | CTA, remote |
| ``filled[d]`` | 1 + 4 bytes | leader producer: ``expect_tx``, ``st.async`` of the tile | the readers | CTA |
| ``drained[d]`` | 5 | (leader) each consumer of both CTAs, the peer's producer | leader producer | CTA, remote |
| ``barrier.cluster`` | 2 CTAs | every thread, after barrier setup and before exit | all threads | cluster |

``full[s]``'s bytes from the peer may land before the local ``expect_tx``: the phase cannot complete
before that arrival. Every consumer warpgroup releases every stage in both CTAs (``release_to=0b11``,
``elect_release=True``: thread 0 of the warpgroup arrives on rank 0's barrier, thread 1 on rank 1's),
so a producer loads its A tile or its B half only into a stage neither CTA still reads.
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
from pipeline.epilogue import SUB_COLS, WgmmaTileStore, wgmma_fragment
from pipeline.mainloop import WgmmaMainloop
from pipeline.schedulers import sm_count

from ..entry import MatmulKernel

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
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)


# per CTA: stages * (block_m + block_n) * block_k * 2 bytes of ring (the whole B tile lands in
# each CTA) + 32 KiB of epilogue staging: V5's budget. The group counts cluster tiles (256 rows):
# group 8 covers the rows V5's group 16 does.
@tilus.autotune("block_m, block_n, block_k, stages", [(128, 256, 64, 4)])
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
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.group = group
        self.num_sms = sm_count()

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        half_m = self.block_m // 2  # the rows of one consumer warpgroup
        half_n = self.block_n // 2  # the rows of B each CTA of the pair loads
        num_pairs = cdiv(cdiv(m_size, self.block_m), 2)  # a cluster tile: two tiles stacked along M
        num_n_tiles = cdiv(n_size, self.block_n)
        num_cluster_tiles = num_pairs * num_n_tiles
        max_clusters = self.num_sms // 2
        self.attrs.blocks = 2 * (num_cluster_tiles if num_cluster_tiles < max_clusters else max_clusters)
        self.attrs.cluster_blocks = 2
        self.attrs.warps = 9  # warps 0-3 and 4-7: consumer warpgroups; warp 8: producer
        rank: int32 = self.cluster.blockRank  # 0: the leader
        num_k_blocks: int32 = cdiv(k_size, self.block_k)

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_m, self.block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, half_n, self.block_k])  # [.., half]
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)
        s_c = self.shared_tensor(dtype=self.dtype, shape=[2, 2, half_m, SUB_COLS])  # [warpgroup, buffer]

        ring = Pipeline(
            self.stages, consumer_arrivals=4, scope="cluster", release_to=0b11, elect_release=True, cluster_fences=False
        )
        tiles = LeaderTileBroadcast(depth=2, readers=5)
        raster = TileRasterizer(num_pairs, num_n_tiles, self.group)
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
        """Producer: this CTA's A tile and its half of the pair's B tile, every K block."""
        half_m = self.block_m // 2
        half_n = self.block_n // 2
        pair_m, n_tile = raster.tile(linear)
        offset_m = (2 * pair_m + rank) * self.block_m
        offset_b = n_tile * self.block_n + rank * half_n
        for kb in range(num_k_blocks):
            ring.producer_acquire()  # free in both CTAs
            slot = ring.producer_stage
            with self.single_thread():
                self.mbarrier.arrive_and_expect_tx(
                    ring.producer_barrier(), transaction_bytes=2 * s_a[slot, 0].nbytes + 2 * s_b[slot, 0].nbytes
                )
            offset_k = kb * self.block_k
            self.tma.global_to_shared(
                src=g_a, dst=s_a[slot, 0], offsets=[offset_m, offset_k], mbarrier=ring.producer_barrier()
            )
            self.tma.global_to_shared(
                src=g_a, dst=s_a[slot, 1], offsets=[offset_m + half_m, offset_k], mbarrier=ring.producer_barrier()
            )
            self.load_b(
                g_b, s_b[slot, rank], ring.producer_barrier(), offset_b, offset_k, multicast=True, multicast_mask=0b11
            )
            ring.producer_advance()

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
                pair_m, n_tile = raster.tile(linear)
                acc = self.register_tensor(dtype=float32, shape=[half_m, self.block_n], init=0.0)
                self.annotate_layout(acc, wgmma_fragment(half_m, self.block_n))
                mainloop.start(s_a, s_b, wg, acc)
                following: int32 = tiles.receive()  # while K block 0 is on the tensor core
                mainloop.finish(s_a, s_b, wg, acc, num_k_blocks)
                out.store(
                    acc, g_c, (2 * pair_m + rank) * self.block_m + wg * half_m, n_tile * self.block_n, self.epilogue
                )
                linear = following
            out.finish()
