"""Blackwell V6: V5 on a 2-CTA cluster: each CTA pair computes one 256-row tile with cta_group::2.

Idea: a bigger output tile does more MMA work per byte loaded, but one SM's shared memory cannot
hold the operands of a 256 x 256 tile in enough stages. With ``tcgen05.mma.cta_group::2`` two
CTAs of a cluster (ranks 2p and 2p+1) compute one ``block_m x block_n`` tile together: each CTA
loads *half* of the A tile (its 128 rows) and *half* of the B tile (``block_n / 2`` rows of B),
the pair's leader (the even rank) issues the MMAs, and the tensor core reads A and B from both
CTAs' shared memory and writes each CTA's 128 rows of the accumulator into that CTA's TMEM. Per
SM that is half the shared memory of a 1-CTA kernel for the same tile, so the ring gets more
stages and the MMA is twice as tall.

Configuration ``cluster_ctas``: 2 (one pair per cluster), or 4 (two pairs stacked along M that
need the same B tile). tcgen05.mma has no 4-CTA form, so the 4-CTA cluster is a copy-side
arrangement: each pair still runs its own 2-CTA MMA, and the B half that CTA ``h`` of pair 0
loads is multicast by TMA (``multicast_mask``) into CTA ``h`` of both pairs, so every B byte is
fetched from L2 once per cluster; pair 1 loads only its A halves.

Warps (in every CTA): 0-3 epilogue, 4 TMA, 5 MMA (idle in the odd CTA), 6 scheduler (issues CLC
requests in rank 0 only). Synchronization, with ``pairs = cluster_ctas / 2``:

``tma_pipe`` (``stages`` slots, waits at cluster scope). ``full[s]`` of the *leader* counts 1
arrival: the leader's ``arrive.expect_tx`` of the bytes landing in both CTAs of its pair
(``2 * (A half + B half)``); both CTAs' TMA loads (``.cta_group::2``) complete their bytes on the
leader's ``full[s]`` (the odd CTA names it through ``mapa``; a multicast load signals the
barrier at the same offset in the leader of each destination CTA's pair). The odd CTA's
``full[s]`` is unused. ``empty[s]`` of every CTA counts ``pairs`` arrivals: each leader's
``tcgen05.commit.cta_group::2`` after the MMA that read slot ``s`` is multicast to every CTA of
the cluster, so a CTA refills a slot only when every pair that reads it (a multicast B half is
read by both pairs) is done with it.
``acc_pipe`` (``acc_stages`` TMEM buffers, cluster scope). ``full[a]`` of every CTA counts
``pairs`` arrivals: each leader's commit after a tile's last MMA, multicast to every CTA.
``empty[a]`` of each leader counts ``128 * cluster_ctas`` arrivals: every epilogue thread of the
cluster, once its ``tcgen05.ld`` of buffer ``a`` completed, arrives on every leader's ``empty[a]``
(``mbarrier.arrive.expect_tx.shared::cluster``, release at cluster scope); the leader's MMA warp
waits on it before overwriting the buffer. (The pairs run in lockstep anyway: they share the B
stages.)
``clc`` (``pipeline.ClcScheduler``): rank 0's scheduler warp arrives with 16 expected bytes on
``full`` in every CTA (one lane per CTA) and issues a ``try_cancel`` whose response is multicast
to every CTA; every consumer thread of the cluster (``224 * cluster_ctas``) arrives on rank 0's
``empty`` at cluster scope. A cancelled cluster is named by its first CTA: tile = ctaid / ctas.
Start and end: ``barrier.cluster`` after the barriers are initialised (peers arrive on them) and
again before TMEM is freed, since the leader's MMAs write into the odd CTA's TMEM and its commits
arrive on the odd CTA's barriers; the epilogue stores are ``pipeline.tma_store.StagedTmaStore``.
"""

import tilus
from tilus import GlobalTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline, TileRasterizer
from pipeline.clc import ClcScheduler
from pipeline.tma_store import StagedTmaStore

from ..entry import MatmulKernel

IDEA = ("2-CTA cluster: one 256-row tile per CTA pair (tcgen05 cta_group::2), cluster-scope barriers, "
        "multicast commits and CLC")
PTX_MARKERS = ("tcgen05.mma.cta_group::2", "tcgen05.commit.cta_group::2", "multicast::cluster",
               "clusterlaunchcontrol.try_cancel", "mbarrier.arrive.expect_tx", "shared::cluster", "barrier.cluster")
REPRESENTATIVE = dict(block_m=256, block_n=256, block_k=64, stages=6, acc_stages=2, e_block_n=32, group=8,
                      cluster_ctas=2)

TMA_WARP = 4
MMA_WARP = 5
SCHEDULER_WARP = 6
CONSUMER_THREADS = 7 * 32  # per CTA: every warp reads every CLC response
CLC_STAGES = 2


# per CTA: stages * (128 + block_n / 2) * block_k * 2 bytes of ring + 2 epilogue sub-tiles; TMEM
# acc_stages * block_n columns
@tilus.autotune("block_m", [256])
@tilus.autotune("block_n, stages, acc_stages, e_block_n", [(128, 8, 4, 32), (256, 6, 2, 32), (256, 6, 2, 64)])
@tilus.autotune("block_k", [64])
@tilus.autotune("group", [8, 16])
@tilus.autotune("cluster_ctas", [2, 4])
class Kernel(MatmulKernel):
    def __init__(self, dtype, block_m: int, block_n: int, block_k: int, stages: int, acc_stages: int,
                 e_block_n: int, group: int, cluster_ctas: int):
        super().__init__(dtype)
        self.block_m = block_m  # rows of the tile of one CTA pair
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.acc_stages = acc_stages
        self.e_block_n = e_block_n
        self.group = group
        self.cluster_ctas = cluster_ctas

    def matmul(self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32,
               k_size: int32):
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
        s_c = self.shared_tensor(dtype=self.dtype, shape=[2, cta_m, e_block_n])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.acc_stages, cta_m, block_n], cta_group=2)

        tma_pipe = Pipeline(self.stages, consumer_arrivals=pairs, scope="cluster")
        acc_pipe = Pipeline(self.acc_stages, producer_arrivals=pairs, consumer_arrivals=128 * ctas, scope="cluster",
                            release_to=leaders)
        clc = ClcScheduler(CLC_STAGES, consumer_arrivals=CONSUMER_THREADS, cluster_ctas=ctas)
        self.cluster.sync()  # every barrier of the cluster is initialised before a peer arrives on it

        with self.single_warp(TMA_WARP):  # producer of tma_pipe, in every CTA
            tile: int32 = clc.first_tile()
            while True:
                m_tile, n_tile = raster.tile(tile)
                offset_a = m_tile * cluster_m + rank * cta_m
                offset_b = n_tile * block_n + half * half_n
                for k in range(num_k_blocks):
                    tma_pipe.producer_acquire()
                    if half == 0:
                        with self.single_thread():
                            self.mbarrier.arrive_and_expect_tx(tma_pipe.producer_barrier(),
                                                               transaction_bytes=2 * (s_a[0].nbytes + s_b[0].nbytes))
                    full = self.cluster.map_shared_addr(tma_pipe.producer_barrier(), target_rank=leader)
                    self.tma.global_to_shared(src=g_a, dst=s_a[tma_pipe.producer_stage],
                                              offsets=[offset_a, k * block_k], mbarrier=full, cta_group=2)
                    if ctas == 2:
                        self.tma.global_to_shared(src=g_b, dst=s_b[tma_pipe.producer_stage],
                                                  offsets=[offset_b, k * block_k], mbarrier=full, cta_group=2)
                    else:
                        if rank < 2:  # pair 0 fetches B once for both pairs: CTA h -> ranks h and h + 2
                            self.tma.global_to_shared(src=g_b, dst=s_b[tma_pipe.producer_stage],
                                                      offsets=[offset_b, k * block_k], mbarrier=full, cta_group=2,
                                                      multicast_mask=0b0101 << half)
                    tma_pipe.producer_advance()
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break

        with self.single_warp(MMA_WARP):  # the leader's: consumer of tma_pipe, producer of acc_pipe
            while True:
                if half == 0:
                    acc_pipe.producer_acquire()
                    for k in range(num_k_blocks):
                        tma_pipe.consumer_acquire()
                        self.tcgen05.mma(s_a[tma_pipe.consumer_stage], s_b[tma_pipe.consumer_stage].transpose(),
                                         t_acc[acc_pipe.producer_stage], enable_input_d=k != 0, cta_group=2)
                        self.tcgen05.commit(mbarrier=tma_pipe.consumer_barrier(), cta_group=2,
                                            multicast_mask=every_cta)
                        tma_pipe.consumer_advance()
                    self.tcgen05.commit(mbarrier=acc_pipe.producer_barrier(), cta_group=2, multicast_mask=every_cta)
                    acc_pipe.producer_advance()
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

        with self.warp_group(warp_begin=0, num_warps=4):  # consumer of acc_pipe: this CTA's 128 rows
            out = StagedTmaStore(s_c)
            tile: int32 = clc.first_tile()
            while True:
                m_tile, n_tile = raster.tile(tile)
                acc_pipe.consumer_acquire()
                for e in range(block_n // e_block_n):
                    t_sub = self.tcgen05.slice(t_acc[acc_pipe.consumer_stage], offsets=[0, e * e_block_n],
                                               shape=[cta_m, e_block_n], dims=[0, 1])
                    r_sub = self.tcgen05.load(t_sub)
                    self.tcgen05.wait_load()
                    out.put(r_sub, g_c, m_tile * cluster_m + rank * cta_m, n_tile * block_n + e * e_block_n)
                acc_pipe.consumer_release()  # on every leader's empty[a], at cluster scope
                acc_pipe.consumer_advance()
                is_valid, tile = clc.next_tile()
                if not is_valid:
                    break
            out.finish()

        # the peer's MMAs write this CTA's TMEM and its commits arrive on this CTA's barriers
        self.cluster.sync()
        self.tcgen05.dealloc(t_acc)
