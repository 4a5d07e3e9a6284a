"""Blackwell V7: skinny GEMMs (M up to 256, decode and small batches) at the memory roofline: the
weight streamed once by every SM, split-K across the CTAs of a cluster, the partial sums reduced
through distributed shared memory. The Blackwell twin of Hopper V7 (read that module first).

Idea: at small M a projection's time is the time to read its weight B [N, K] once. The CTA tiles
of V3-V6 (128 x 256 and larger) leave most SMs without work at these sizes; V7 gives every CTA 128
weight rows x ``K / split`` columns, and the ``split`` CTAs of a cluster that share those rows
reduce their float32 partial tiles through distributed shared memory
(``pipeline.cluster_reduce.ClusterSplitKReduce``, as on Hopper): no workspace, no atomics, one launch.

Swap A and B: the weight's 128 rows are the MMA's M side (``tcgen05.mma`` with M = 128, its
accumulator on the 128 TMEM lanes), the tokens its N side (``block_m``, 32 to 128 columns of TMEM),
so no tensor-core row is padding at M = 1. The accumulator is a tile of C^T, written transposed.
A CTA whose K range is empty (K shorter than ``split`` blocks) loads one block wholly past K, which
TMA fills with zeros. Tokens beyond ``block_m`` take further clusters, each re-reading the weight.

Roles are V3's: warp 4 loads (TMA), warp 5 issues the MMAs, warps 0-3 (the TMEM lanes) drain the
accumulator into the partial tile.

Synchronization (this CTA's K block ``i`` uses slot ``s = i % stages``, parity ``p = (i // stages) & 1``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | a TMA-warp lane's ``expect_tx`` (both tiles); 2 TMA loads | MMA warp, parity ``p`` | CTA |
| ``empty[s]`` | 1 | MMA warp's ``tcgen05.commit`` after the MMA that read ``s`` | TMA warp, parity ``p ^ 1`` | CTA |
| ``acc_ready`` | 1 | MMA warp's ``tcgen05.commit`` after its last MMA | warps 0-3, parity 0 | CTA |
| ``arrived`` (exchange) | 1 + bytes | this CTA's ``expect_tx``; the peers' bulk copies | warps 0-3, parity 0 | CTA |
| ``barrier.cluster`` | all threads | once the barriers exist; before exit (relaxed) | all | cluster |

The first cluster barrier is split as Hopper V8's (``ClusterSplitKReduce.arrive_after_init``): each
CTA arrives, relaxed, once its barriers exist, and waits only before the exchange, its first write
into a peer, so the main loop does not wait for the cluster's slowest CTA to begin.
The exchange's ``__syncthreads`` also orders the last ``tcgen05.ld`` before TMEM is freed (with the
tcgen05 fences on either side, as in V3). The last cluster barrier orders no memory and arrives
relaxed, as Hopper V7's (``ClusterSplitKReduce.exit_barrier``; none with no split): no CTA first
waits for its own stores of C to be performed.
"""

import tilus
from tilus import GlobalTensor, float32, int32
from tilus.utils import cdiv

from pipeline.cluster_reduce import ClusterSplitKReduce, SplitKRange
from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync

from ..entry import MatmulKernel

IDEA = "skinny GEMMs: swap-AB tcgen05, split-K over a cluster reduced through distributed shared memory"
PTX_MARKERS = (
    "tcgen05.mma.cta_group::1",
    "tcgen05.commit",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
    "mapa.shared::cluster",
    "barrier.cluster",
    "barrier.cluster.arrive.relaxed.aligned",  # the exit barrier orders no memory (ClusterSplitKReduce.exit_barrier)
)
REPRESENTATIVE = {"block_m": 32, "split": 2, "stages": 8}
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)
# C is written by store_global (ClusterSplitKReduce.write) at int32 element offsets: no operand may
# reach past 2^31 - 1 elements (A and B, read by TMA, could; the limit keeps to one rule per version)
MAX_ELEMENTS = 2**31 - 1

BLOCK_K = 64  # one 128-byte swizzled row of fp16/bf16 per TMA box
ROWS = 128  # weight rows of a CTA: the MMA's M, one per TMEM lane
MAX_M = 256
TMA_WARP = 4
MMA_WARP = 5


def supports(m: int, n: int, k: int) -> bool:
    """The shapes V7 is designed for: at most 256 tokens (every N and K)."""
    return 1 <= m <= MAX_M and n >= 1 and k >= 1


def shared_bytes(block_m: int, split: int, stages: int) -> int:
    """Shared memory of a configuration: the ring plus the split-K exchange tiles."""
    return stages * (ROWS + block_m) * BLOCK_K * 2 + (2 * split - 1) * (ROWS // split) * block_m * 4


# Not timed (no Blackwell GPU here): Hopper V7's choices carried over (split 2, the ring as deep
# as shared memory allows next to the exchange), token tiles of 32 (the narrowest TMEM
# allocation), 64 and 128 columns.
@tilus.autotune("block_m, split, stages", [(32, 2, 8), (32, 1, 10), (64, 2, 6), (128, 2, 4), (128, 1, 4)])
class Kernel(MatmulKernel):
    def __init__(
        self,
        dtype,
        block_m: int,
        split: int,
        stages: int,
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m
        self.split = split
        self.stages = stages
        if ROWS % split or (ROWS // split) % 8:
            raise ValueError(f"{ROWS} weight rows do not cut into {split} slices of a multiple of 8")

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        num_n_tiles = cdiv(n_size, ROWS)
        num_m_tiles = cdiv(m_size, self.block_m)
        self.attrs.blocks = self.split * num_n_tiles * num_m_tiles
        self.attrs.cluster_blocks = self.split
        self.attrs.warps = 6
        stages = self.stages
        rank: int32 = self.cluster.blockRank  # which K range of the tile this CTA sums
        tile: int32 = self.blockIdx.x // self.split
        # the token tiles of one weight tile are neighbours in launch order (Hopper V7)
        offset_m: int32 = (tile % num_m_tiles) * self.block_m
        offset_n: int32 = (tile // num_m_tiles) * ROWS

        k_blocks = SplitKRange(cdiv(k_size, BLOCK_K), self.split, rank)  # this CTA's share of K

        s_w = self.shared_tensor(dtype=self.dtype, shape=[stages, ROWS, BLOCK_K])
        self.b_tiles_layout(s_w)  # the weight: B's tiles, K-major for "nk", MN-major for "kn"
        s_x = self.shared_tensor(dtype=self.dtype, shape=[stages, self.block_m, BLOCK_K])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[ROWS, self.block_m])
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=1)
        full = self.mbarrier.alloc(counts=[1 for _ in range(stages)])
        empty = self.mbarrier.alloc(counts=[1 for _ in range(stages)])
        acc_ready = self.mbarrier.alloc(counts=[1])
        reduce = ClusterSplitKReduce(self.split, ROWS, self.block_m)
        # every barrier of the cluster exists before a peer's copy lands on it: announced now, waited
        # for before the exchange (nothing before it reaches a peer: the main loop starts at once)
        reduce.arrive_after_init()

        with self.single_warp(TMA_WARP):  # producer: this CTA's share of the weight, and the tokens
            for i in range(k_blocks.count):
                stage = i % stages
                self.mbarrier.wait(empty[stage], phase=((i // stages) & 1) ^ 1)
                if self.b_layout == "kn":  # the weight (B, the MMA's A side) from b [K, N]: entry.load_b's boxes
                    offset_k = (k_blocks.first + i) * BLOCK_K
                    with self.single_thread():
                        self.mbarrier.arrive_and_expect_tx(
                            full[stage], transaction_bytes=s_w[stage].nbytes + s_x[stage].nbytes
                        )
                    self.load_b(g_b, s_w[stage], full[stage], offset_n, offset_k)
                    self.tma.global_to_shared(
                        src=g_a, dst=s_x[stage], offsets=[offset_m, offset_k], mbarrier=full[stage]
                    )
                else:  # B [N, K]: the weight's tile is one TMA box, loaded as V1's A tile
                    self.load_k_block(
                        g_b,
                        g_a,
                        s_w[stage],
                        s_x[stage],
                        full[stage],
                        offset_n,
                        offset_m,
                        (k_blocks.first + i) * BLOCK_K,
                    )

        with self.single_warp(MMA_WARP):  # C^T tile += weight rows @ tokens^T
            for i in range(k_blocks.count):
                stage = i % stages
                self.mbarrier.wait(full[stage], phase=(i // stages) & 1)
                self.tcgen05.mma(s_w[stage], s_x[stage].transpose(), t_acc, enable_input_d=i != 0)
                self.tcgen05.commit(mbarrier=empty[stage])
            self.tcgen05.commit(mbarrier=acc_ready[0])

        with self.warp_group(warp_begin=0, num_warps=4):  # TMEM -> this CTA's partial tile
            self.mbarrier.wait(acc_ready[0], phase=0)
            fence_after_thread_sync()  # the MMAs that acc_ready announced, before tcgen05.ld reads TMEM
            partial = self.tcgen05.load(t_acc)
            self.tcgen05.wait_load()
            reduce.store(partial, 0)

        reduce.wait_for_peers()
        fence_before_thread_sync()  # every tcgen05.ld, before the barrier after which TMEM is freed
        reduce.exchange(rank)
        fence_after_thread_sync()
        self.tcgen05.dealloc(t_acc)
        with self.warp_group(warp_begin=0, num_warps=4):
            reduce.write(rank, g_c, offset_m, offset_n, self.epilogue)  # with the variant's bias, activation
        reduce.exit_barrier()  # no CTA leaves while a peer's copy may still read its partial tile
