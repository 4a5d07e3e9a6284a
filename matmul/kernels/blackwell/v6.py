"""Blackwell V6: V5 on a 2-CTA cluster: each CTA pair computes one 256-row tile with cta_group::2.

Idea: a bigger output tile does more MMA work per byte loaded, but one SM's shared memory cannot
hold the operands of a 256 x 256 tile in enough stages. With ``tcgen05.mma.cta_group::2`` two
CTAs of a cluster (ranks 2p and 2p+1) compute one ``block_m x block_n`` tile together: each CTA
loads *half* of the A tile (its 128 rows) and *half* of the B tile (``block_n / 2`` rows of B),
the pair's leader (the even rank) issues the MMAs, and the tensor core reads A and B from both
CTAs' shared memory and writes each CTA's 128 rows of the accumulator into that CTA's TMEM. Per
SM that is half the shared memory of a 1-CTA kernel for the same tile, so the ring gets more
stages and the MMA is twice as tall.

Configuration ``cluster_ctas``: 2 (one pair per cluster, the autotune space), or 4 (two pairs
stacked along M that need the same B tile; ``FOUR_CTA``, built and checked but kept out of the
autotune space, so ``matmul()`` never picks it, until it has run on a Blackwell GPU: select it on
purpose with ``versions.kernel(module, dtype, FOUR_CTA)``). tcgen05.mma has no 4-CTA form, so the
4-CTA cluster is a copy-side arrangement: each pair still runs its own 2-CTA MMA, and the B half
that CTA ``h`` of pair 0 loads is multicast by TMA (``multicast_mask``) into CTA ``h`` of both
pairs, so every B byte is fetched from L2 once per cluster; pair 1 loads only its A halves.

Warps (in every CTA): 0-3 epilogue, 4 TMA, 5 MMA (idle in the odd CTA), 6 scheduler (issues CLC
requests in rank 0 only). Synchronization, with ``pairs = cluster_ctas / 2``, ``ctas =
cluster_ctas``, "leader" the even CTA of a pair; "CTA" scope on a peer's barrier means the
arrival reaches the peer (``shared::cluster``) but orders only at CTA scope:

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| leader's ``ring.full[s]`` | 1 + bytes | leader's ``arrive.expect_tx``; both CTAs' loads | leader's MMA | CTA |
| ``ring.empty[s]`` | ``pairs`` | each leader's ``tcgen05.commit``, multicast to every CTA | each CTA's TMA warp | CTA |
| ``acc_ring.full[a]`` | ``pairs`` | each leader's commit after a tile's last MMA, multicast | epilogue | CTA |
| leader's ``acc_ring.empty[a]`` | ``128 * ctas`` | every epilogue thread of the cluster | leader's MMA | CTA |
| ``clc.full[r]`` | 1 + 16 bytes | rank 0's ``arrive.expect_tx`` in every CTA; the response | all 224 | CTA |
| rank 0's ``clc.empty[r]`` | ``224 * ctas`` | every thread of the cluster, ``r`` decoded | rank 0's scheduler | CTA |
| ``barrier.cluster`` | all threads | all, after barrier init / before TMEM is freed | all | cluster |

Why CTA scope suffices: what each hand-off passes on is ordered by the hardware itself: TMA bytes
and CLC responses complete on the barrier they are counted on (``complete_tx``), a
``tcgen05.commit`` arrives once the MMAs before it are complete, and an epilogue thread releases
an accumulator buffer after ``tcgen05.wait::ld`` and ``tcgen05.fence::before_thread_sync``. A
cluster-scope wait would invalidate the SM's L1 at every K block, and a cluster-scope arrival put
a ``MEMBAR.ALL.GPU`` in front of it; only the two ``barrier.cluster`` keep them.

Both CTAs' TMA loads (``.cta_group::2``) complete their bytes on the leader's ``full[s]`` (the odd
CTA names it through ``mapa``; a multicast load signals the barrier at the same offset in the
leader of each destination CTA's pair); the odd CTA's ``full[s]`` is unused. A CTA refills a slot
only when every pair that reads it (a multicast B half is read by both pairs) is done with it. A
cancelled cluster is named by its first CTA: tile = ctaid / ctas.

Exit: the leaders' commits of the last K blocks arrive on every CTA's ``ring.empty``
asynchronously, after the MMA warp's last wait, so each CTA's TMA warp ends with the producer tail
(``ring.producer_tail()``: one wait per stage for its last release) before the CTA may exit. The
cluster barrier before TMEM is freed is there because the leader's MMAs write into the odd CTA's
TMEM and its commits arrive on the odd CTA's barriers; it also orders every thread's remote
arrivals before any CTA exits. The epilogue (early release, staging buffers, TMEM fences) is V5's.
"""

import tilus
from tilus import GlobalTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline, TileRasterizer
from pipeline.clc import ClcScheduler
from pipeline.fused_epilogue import output_columns
from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync
from pipeline.tma_store import StagedTmaStore, staging_buffers

from ..entry import MatmulKernel

IDEA = (
    "2-CTA cluster: one 256-row tile per CTA pair (tcgen05 cta_group::2), barriers reached across the pair, "
    "multicast commits and CLC"
)
PTX_MARKERS = (
    "tcgen05.mma.cta_group::2",
    "tcgen05.commit.cta_group::2",
    "multicast::cluster",
    "clusterlaunchcontrol.try_cancel",
    "mbarrier.arrive.expect_tx",
    "shared::cluster",
    "barrier.cluster",
)
REPRESENTATIVE = dict(
    block_m=256, block_n=256, block_k=64, stages=6, acc_stages=2, e_block_n=32, group=8, cluster_ctas=2
)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)

TMA_WARP = 4
MMA_WARP = 5
SCHEDULER_WARP = 6
CONSUMER_THREADS = 7 * 32  # per CTA: every warp reads every CLC response
CLC_STAGES = 2


# Configurations that are built and checked but left out of the autotune space, so that matmul()
# never picks them on its own: the 4-CTA cluster (two pairs sharing B by TMA multicast) relies on
# multicast commits and barriers that span two MMA pairs, which no Blackwell GPU has run here yet.
# Select it on purpose with versions.kernel(module, dtype, FOUR_CTA).
FOUR_CTA = dict(REPRESENTATIVE, cluster_ctas=4)
# Hopper V5's and V6's narrow tiles for a few hundred tokens (96 and 224 columns: qkv and the
# gate-up weight in 128 tiles at 256 tokens, plots/h100/skinny/), here as the pair's tiles: each CTA
# loads 48 or 112 rows of B and the pair's MMA is one cta_group::2 instruction that wide (tilus sizes
# a cta_group::2 MMA by the whole tile; its cta_group::1 MMA would be split into 32-column
# instructions, gcd(N, 256), so Blackwell V5 has no such tiles). Built and protocol-checked for
# B [N, K] (48 rows are no whole box of torch's b [K, N]); not in the space until a Blackwell GPU has
# timed them.
NARROW = dict(REPRESENTATIVE, block_n=96, stages=8, acc_stages=4)
NARROW_WIDE = dict(REPRESENTATIVE, block_n=224, stages=6, acc_stages=2)
EXTRA_CONFIGS = (FOUR_CTA, NARROW, NARROW_WIDE)


# per CTA: stages * (128 + block_n / 2) * block_k * 2 bytes of ring + up to 4 epilogue sub-tiles;
# TMEM acc_stages * block_n columns
@tilus.autotune("block_m", [256])
@tilus.autotune("block_n, stages, acc_stages, e_block_n", [(128, 8, 4, 32), (256, 6, 2, 32), (256, 6, 2, 64)])
@tilus.autotune("block_k", [64])
@tilus.autotune("group", [8, 16])
@tilus.autotune("cluster_ctas", [2])
class Kernel(MatmulKernel):
    def __init__(
        self,
        dtype,
        block_m: int,
        block_n: int,
        block_k: int,
        stages: int,
        acc_stages: int,
        e_block_n: int,
        group: int,
        cluster_ctas: int,
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m  # rows of the tile of one CTA pair
        self.require_whole_b_boxes(block_n // 2)  # each CTA of the pair loads half of the B tile
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.acc_stages = acc_stages
        self.e_block_n = e_block_n
        self.group = group
        self.cluster_ctas = cluster_ctas
        # as many epilogue staging buffers (up to 4) as fit beside the ring
        cta_m = block_m // 2
        ring_bytes = stages * (cta_m + block_n // 2) * block_k * dtype.nbytes
        self.epilogue_buffers = staging_buffers(cta_m * e_block_n * dtype.nbytes, ring_bytes)

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        block_n, block_k, e_block_n, ctas = self.block_n, self.block_k, self.e_block_n, self.cluster_ctas
        cta_m = self.block_m // 2  # rows of A and C (TMEM lanes) held by one CTA
        half_n = block_n // 2  # rows of B loaded by one CTA
        pairs = ctas // 2
        every_cta = (1 << ctas) - 1
        leaders = 0b0101 if ctas == 4 else 0b0001
        cluster_m = cta_m * ctas  # rows of C computed by one cluster
        num_m_tiles = cdiv(m_size, cluster_m)
        num_n_tiles = cdiv(n_size, block_n)
        self.attrs.blocks = num_m_tiles * num_n_tiles * ctas
        self.attrs.cluster_blocks = ctas
        self.attrs.warps = 7
        raster = TileRasterizer(num_m_tiles, num_n_tiles, self.group)
        num_k_blocks: int32 = cdiv(k_size, block_k)
        rank: int32 = self.cluster.blockRank
        half: int32 = rank % 2  # which half of the pair's A rows and B rows this CTA holds
        leader: int32 = rank - half  # the even rank of this CTA's pair issues its MMAs

        s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, cta_m, block_k])
        s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, half_n, block_k])
        self.b_tiles_layout(s_b)  # K-major for "nk", MN-major for "kn" (entry.load_b)
        c_cols = output_columns(e_block_n, self.activation)  # swiglu: half as many columns of C
        s_c = self.shared_tensor(dtype=self.dtype, shape=[self.epilogue_buffers, cta_m, c_cols])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.acc_stages, cta_m, block_n], cta_group=2)
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=2)

        # every hand-off's data is ordered by the hardware (TMA bytes, tcgen05 commits, tcgen05.ld
        # completion + tcgen05 fences): CTA-scope waits and arrivals, as in V5, reaching the peer
        ring = Pipeline(self.stages, consumer_arrivals=pairs, scope="cluster", cluster_fences=False)
        acc_ring = Pipeline(
            self.acc_stages,
            producer_arrivals=pairs,
            consumer_arrivals=128 * ctas,
            scope="cluster",
            release_to=leaders,
            cluster_fences=False,
            tcgen05_fences=True,
        )
        clc = ClcScheduler(CLC_STAGES, consumer_arrivals=CONSUMER_THREADS, cluster_ctas=ctas)
        self.cluster.sync()  # every barrier of the cluster is initialised before a peer arrives on it

        with self.single_warp(TMA_WARP):  # producer of ring, in every CTA
            tile: int32 = clc.first_tile()
            while True:
                m_tile, n_tile = raster.tile(tile)
                offset_a = m_tile * cluster_m + rank * cta_m
                offset_b = n_tile * block_n + half * half_n
                for k in range(num_k_blocks):
                    ring.producer_acquire()
                    if half == 0:
                        with self.single_thread():
                            self.mbarrier.arrive_and_expect_tx(
                                ring.producer_barrier(), transaction_bytes=2 * (s_a[0].nbytes + s_b[0].nbytes)
                            )
                    full = self.cluster.map_shared_addr(ring.producer_barrier(), target_rank=leader)
                    self.tma.global_to_shared(
                        src=g_a,
                        dst=s_a[ring.producer_stage],
                        offsets=[offset_a, k * block_k],
                        mbarrier=full,
                        cta_group=2,
                    )
                    if ctas == 2:
                        self.load_b(g_b, s_b[ring.producer_stage], full, offset_b, k * block_k, cta_group=2)
                    else:
                        if rank < 2:  # pair 0 fetches B once for both pairs: CTA h -> ranks h and h + 2
                            self.load_b(
                                g_b,
                                s_b[ring.producer_stage],
                                full,
                                offset_b,
                                k * block_k,
                                cta_group=2,
                                multicast=True,
                                multicast_mask=0b0101 << half,
                            )
                    ring.producer_advance()
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break
            ring.producer_tail()  # the leaders' last commits still arrive on this CTA's empty barriers

        with self.single_warp(MMA_WARP):  # the leader's: consumer of ring, producer of acc_ring
            while True:
                if half == 0:
                    acc_ring.producer_acquire()
                    for k in range(num_k_blocks):
                        ring.consumer_acquire()
                        self.tcgen05.mma(
                            s_a[ring.consumer_stage],
                            s_b[ring.consumer_stage].transpose(),
                            t_acc[acc_ring.producer_stage],
                            enable_input_d=k != 0,
                            cta_group=2,
                        )
                        self.tcgen05.commit(mbarrier=ring.consumer_barrier(), cta_group=2, multicast_mask=every_cta)
                        ring.consumer_advance()
                    self.tcgen05.commit(mbarrier=acc_ring.producer_barrier(), cta_group=2, multicast_mask=every_cta)
                    acc_ring.producer_advance()
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break

        with self.single_warp(SCHEDULER_WARP):  # rank 0's: producer of clc; every CTA's: a consumer
            while True:
                if rank == 0:
                    clc.request()
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break

        with self.warp_group(warp_begin=0, num_warps=4):  # consumer of acc_ring: this CTA's 128 rows
            out = StagedTmaStore(s_c)
            tile: int32 = clc.first_tile()
            while True:
                m_tile, n_tile = raster.tile(tile)
                acc_ring.consumer_acquire()
                for e in range(block_n // e_block_n):
                    t_sub = self.tcgen05.slice(
                        t_acc[acc_ring.consumer_stage],
                        offsets=[0, e * e_block_n],
                        shape=[cta_m, e_block_n],
                        dims=[0, 1],
                    )
                    r_sub = self.tcgen05.load(t_sub)
                    self.tcgen05.wait_load()
                    if e == block_n // e_block_n - 1:  # the buffer's last tcgen05.ld has completed:
                        acc_ring.consumer_release()  # on every leader's empty[a]
                        acc_ring.consumer_advance()
                    block, column = self.epilogue.apply(r_sub, n_tile * block_n + e * e_block_n, "tcgen05")
                    out.put(block, g_c, m_tile * cluster_m + rank * cta_m, column)  # with bias and activation
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break
            out.finish()

        # the peer's MMAs write this CTA's TMEM and its commits arrive on this CTA's barriers
        fence_before_thread_sync()
        self.cluster.sync()
        fence_after_thread_sync()
        self.tcgen05.dealloc(t_acc)
