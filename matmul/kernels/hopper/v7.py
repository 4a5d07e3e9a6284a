"""Hopper V7: skinny GEMMs (M up to 256, decode and small batches) at the memory roofline: the
weight streamed once by every SM, split-K across the CTAs of a cluster, the partial sums reduced
through distributed shared memory.

Idea: at small M a projection reads its weight B [N, K] once from HBM and does almost no
arithmetic, so its time is the time to stream N x K elements. V3-V6 cannot do that: their
128 x 256 tiles give 4096 x 4096 only 16-32 CTAs, so most SMs never load anything. V7 cuts the
weight into pieces of ``64 * warpgroups`` rows x ``K / split`` columns, one per CTA, so that a
shape of a few thousand rows still occupies every SM, and makes each CTA's share of the weight
one contiguous stream of K blocks through a deep TMA ring (``stages`` x 8 KiB of weight per
warpgroup in flight: HBM's latency is covered only by many bytes in flight on every SM).

Swap A and B: the weight's rows are the wgmma's M side (64 rows per instruction) and the tokens
its N side (``block_m``, 16 to 256), so at M = 1 or 16 no tensor-core row is padding. The
accumulator is a tile of C^T ([weight rows, tokens]); it is written transposed, clipped to
the matrix (by the TMA store, or ``store_global``'s masks).

Without a split (``split`` = 1) a CTA owns its output tile whole, and each consumer warpgroup
writes its slab of C as soon as its main loop is done: its accumulator transposed into a staging
buffer of C's dtype and written by a TMA store, which clips C's edges
(``pipeline.epilogue.SwappedSlabStore``; a fused variant's bias and activation are applied to the
transposed accumulator on its way, ``pipeline.fused_epilogue``'s ``"wgmma_t"`` fragment). The
buffers take a quarter of the room a float32 tile of the CTA's output would, and that room goes to
the ring: 128 weight rows a CTA (two warpgroups) with six stages fit, where cuBLAS's skinny kernels
keep 112-128 and read each token tile half as often as 64-row CTAs do.

Split-K without a workspace: the ``split`` CTAs of one cluster compute the same output tile over
consecutive ranges of K blocks and reduce their float32 partial tiles through distributed shared
memory (``pipeline.cluster_reduce.ClusterSplitKReduce``): each CTA owns ``1 / split`` of the
tile's rows, receives the other CTAs' partials of those rows by bulk copies into its shared
memory, adds them and writes them. One launch, no global round trip, no atomics. A CTA whose
range is empty (K shorter than ``split`` blocks) loads one block wholly past K, which TMA fills
with zeros: every rank runs the same code.

From 64 tokens on, one weight tile is needed by several token tiles. Without more, each token
tile takes its own cluster and re-reads its share of the weight from HBM or L2 (the grid is
clusters x N tiles x M tiles, neighbours in launch order). With ``multicast`` > 1 the cluster
holds ``multicast`` token tiles of the same weight tile, and the CTAs that sum the same K range
of them receive the weight tile by TMA *multicast*: they take turns, K block ``i``'s weight tile
is loaded by the group's CTA ``i % multicast`` and written by the TMA unit into the same stage
of every CTA of the group, its bytes counted on each one's ``full[s]``; each CTA loads its own
token tile. Each weight byte is then read (from HBM, or from L2 by a neighbouring cluster) once
per cluster instead of once per token tile, and a cluster of 2 with 64 x 64 tiles and no split is
the shape cuBLAS's skinny Hopper kernel takes at 128 tokens. At 64 or 128 tokens, though, so few
token tiles leave fewer CTAs than SMs; the split gives them back, and the two combine: the cluster
is ``split x multicast`` CTAs (at most 8), rank ``m_rank * split + k_rank`` being CTA ``k_rank``
of token tile ``m_rank``. Two kinds of group cross in it. The *split group* of a token tile, its
``split`` CTAs (ranks ``m_rank * split + p``, consecutive), splits K and exchanges its partials
among itself as above (``ClusterSplitKReduce``'s ``rank_base``). The *weight group* of a K range,
its ``multicast`` CTAs (ranks ``k_rank + split * j``, every ``split``-th), shares the weight
tile: its multicast mask is ``0b..0101`` (a bit every ``split`` ranks) shifted by ``k_rank``.
The price is V6's coupling: a stage is refilled only when the consumers of every CTA of the
weight group have released it, since the next weight tile lands in all of them. What the pair costs
in CTAs: each token tile keeps its own ``split`` CTAs, so the cluster launches ``multicast`` times
the CTAs of the split alone, and every one of them still takes a whole weight tile per K block
into its shared memory (the multicast saves L2 reads, not what each SM takes in). The pair is
correct and slower than the split alone at every M it was built for (``plots/h100/skinny/``), so
it is not in the tuned space (``EXTRA_CONFIGS``).
A token tile wholly past M (M not a multiple of the cluster's tokens) is loaded as TMA's zeros
and stored nowhere: its CTA still takes its turns at the weight. The configurations are meant
for M <= 256 (``supports``).

Synchronization (this CTA's K block ``i`` uses stage ``s = i % stages``, parity ``p = (i // stages) & 1``;
the rows marked mc replace the two above them when ``mc = multicast`` > 1, ``wgs = warpgroups``; the
weight group is the ``mc`` CTAs of this CTA's K range, the split group the ``split`` CTAs of its token
tile: the split group is the whole cluster when ``mc`` = 1, the weight group when ``split`` = 1):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``full[s]`` | 1 + bytes | the producer's ``expect_tx`` (weight, tokens); its TMA loads | consumers, ``p`` | CTA |
| ``empty[s]`` | warpgroups | one thread of each consumer warpgroup, after its wgmma wait | producer, ``p ^ 1`` | CTA |
| mc ``full[s]`` | 1 + bytes | ``expect_tx`` (weight, tokens); tokens; weight group's CTA ``i % mc`` | consumers | CTA |
| mc ``empty[s]`` | wgs x mc | a thread of each consumer warpgroup of the weight group | producer | CTA, remote |
| ``__syncthreads`` | all threads | every warp, its partial stored (``exchange``, with a split) | all | CTA |
| ``arrived`` | 1 + bytes | this CTA's ``expect_tx`` (split - 1 slices); its split group's copies | warps 0-3, 0 | CTA |
| ``barrier.cluster`` | the cluster | all: once the mbarriers exist; before exit (relaxed, mc = 1) | all | cluster |

Without a split there is no exchange: each warpgroup writes its staging buffer, orders those
writes before the TMA unit's reads (``fence.proxy.async``, then a barrier of its own 128 threads)
and waits for its store to complete before it leaves (``pipeline.tma_store.StagedTmaStore``); no
buffer is shared between warpgroups.

A peer's copy may land on ``arrived`` as soon as the first cluster barrier is passed, so every
mbarrier is initialized before it. Without multicast nothing reaches a peer before the exchange, so
that barrier is split (``ClusterSplitKReduce.arrive_after_init``): a relaxed arrival at the start,
its wait just before the exchange, and the main loop does not wait for the cluster. A sender's
shared memory is read by its bulk copies until the
receiver's ``arrived`` completes, so no CTA exits before the last cluster barrier. Without
multicast that barrier orders no memory and arrives relaxed (``ClusterSplitKReduce.exit_barrier``;
with no split there is no peer and no barrier): an arrival with release semantics would first wait
until the CTA's own stores of C are performed (``MEMBAR.ALL.GPU``), a fixed cost on every CTA. With
multicast it keeps its release: a peer's consumers arrive on this CTA's ring remotely up to their
last stage, and those arrivals must have landed before this CTA leaves. ``arrived`` is
used once (``ClusterSplitKReduce``); a fresh ``empty[s]`` read with parity ``p ^ 1`` counts as
complete, so the ring starts out free (V3).

With multicast the ring is V6's (``release_to`` every CTA of the weight group, ``elect_release``:
thread ``r`` of a consumer warpgroup arrives on rank ``r``'s ``empty[s]``; ``cluster_fences=False``,
as a stage carries only TMA bytes and wgmma reads complete before the release; with a split the
group's ranks depend on ``k_rank``, ``Pipeline``'s ``release_offset``): a producer's wait on its own
``empty[s]`` sees every consumer of its weight group done with the stage, so its multicast
overwrites no stage that any of them still reads. The CTAs of a weight group sum the same K range,
so they take the same number of turns: no stage waits for a CTA that has stopped loading. The two
kinds of group share no barrier: a split group's copies land on ``arrived`` only, a weight
group's loads and releases on the ring only. A peer's weight bytes may land on ``full[s]`` before
this CTA's own ``expect_tx``: the phase cannot complete without that arrival. A multicast into a peer completes
before the peer's consumers pass ``full[s]``, and so before the peer reaches the last cluster
barrier: no CTA exits with a load or a release still on its way into it.
"""

import tilus
from tilus import GlobalTensor, SharedTensor, float32, int32
from tilus.utils import cdiv

from pipeline import Pipeline
from pipeline.cluster_reduce import ClusterSplitKReduce, SplitKRange
from pipeline.epilogue import SwappedSlabStore, wgmma_fragment
from pipeline.fused_epilogue import output_columns
from pipeline.mainloop import WgmmaMainloop

from ..entry import MatmulKernel

IDEA = "skinny GEMMs: swap-AB, split-K over a cluster reduced through distributed shared memory, deep TMA rings"
PTX_MARKERS = (
    "wgmma.mma_async.sync.aligned.m64n16k16",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
    "mapa.shared::cluster",
    "barrier.cluster",
    "barrier.cluster.arrive.relaxed.aligned",  # the exit barrier orders no memory (ClusterSplitKReduce.exit_barrier)
)
REPRESENTATIVE = {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 8, "multicast": 1}
# the weight multicast to two 64-token tiles (the configuration CI builds for that option)
MULTICAST_REPRESENTATIVE = {"block_m": 64, "warpgroups": 1, "split": 1, "stages": 13, "multicast": 2}
# both: two 64-token tiles, each split over two CTAs, a cluster of four (what CI builds for the pair)
COMBINED_REPRESENTATIVE = {"block_m": 64, "warpgroups": 1, "split": 2, "stages": 12, "multicast": 2}
MAX_CLUSTER = 8  # the portable cluster size: split x multicast CTAs
# Split-K and multicast together: each token tile of a multicast cluster split over two CTAs, so
# that a cluster that shares the weight still gives every SM a CTA at 64 and 128 tokens: 2 x 2 CTAs
# of 64 tokens (the representative, which the protocol checker takes for that cluster) or 32, and
# 2 x 4 of 64 tokens for 256. Built and protocol-checked, not in the space: slower than the split
# alone (twice the CTAs: module doc; plots/h100/skinny/).
EXTRA_CONFIGS = (
    COMBINED_REPRESENTATIVE,
    {"block_m": 32, "warpgroups": 1, "split": 2, "stages": 17, "multicast": 2},
    {"block_m": 64, "warpgroups": 1, "split": 2, "stages": 12, "multicast": 4},
)
B_LAYOUTS = ("nk", "kn")  # B [N, K], or torch's b [K, N] read in place (entry.load_b)
FUSED_EPILOGUE = True  # bias and every activation, in the epilogue (pipeline.fused_epilogue)
# C is written by store_global (ClusterSplitKReduce.write, with a split) at int32
# element offsets: no operand may reach past 2^31 - 1 elements (A and B, read by TMA, could; the
# limit keeps to one rule per version)
MAX_ELEMENTS = 2**31 - 1

BLOCK_K = 64  # one 128-byte swizzled row of fp16/bf16 per TMA box
MAX_M = 256  # the widest wgmma (n = 256): beyond it a CTA would need a second accumulator


def supports(m: int, n: int, k: int) -> bool:
    """The shapes V7 is designed for: at most 256 tokens (every N and K)."""
    return 1 <= m <= MAX_M and n >= 1 and k >= 1


def refit(space: list[dict], config: dict, m: int) -> dict:
    """What a configuration that came close at another M stands for at ``m`` tokens, for the
    tuner's narrowed tuning (``matmul.call.chooser.narrowed``, which times each close version at
    one configuration). The token tile is what depends on M: at 32 tokens two 16-token tiles each
    read the whole weight, where one 32-token tile reads it once. So: the point of ``space`` with
    the same warpgroups, split and multicast whose cluster holds all ``m`` tokens (``block_m x
    multicast``) with the fewest to spare, the first of the space's order; ``config`` itself where
    its cluster is that one already, or where no point of the space holds ``m``."""

    def tokens(c: dict) -> int:
        return c["block_m"] * c.get("multicast", 1)

    kind = ("warpgroups", "split", "multicast")
    holding = [c for c in space if tokens(c) >= m and all(c.get(k, 1) == config.get(k, 1) for k in kind)]
    if not holding:
        return config
    narrowest = min(tokens(c) for c in holding)
    return config if tokens(config) == narrowest else next(c for c in holding if tokens(c) == narrowest)


def shared_bytes(block_m: int, warpgroups: int, split: int, stages: int, multicast: int = 1) -> int:
    """Shared memory of a configuration: the ring plus the write-out's tiles (a multicast weight
    tile lands in the same ring stage in every CTA: the ring is the same size); swiglu's staging
    buffers are half as wide."""
    ring = stages * (warpgroups * 64 + block_m) * BLOCK_K * 2
    if split == 1:
        return ring + warpgroups * block_m * 64 * 2  # a staging buffer of 16-bit C a warpgroup
    exchange = (2 * split - 1) * (64 * warpgroups // split) * block_m * 4  # partial + received
    return ring + exchange


# Token tiles of 16 to 256 columns; per tile, the configurations that are the fastest V7 on some
# shape of the decode preset (plots/h100/skinny/). Without multicast: a split of 2 with 64-row CTAs
# for M <= 64 (more CTAs a cluster read the same rows at once and exchange more), two 128-token
# tiles without a split from M = 128 on (the ring takes the room the exchange leaves), and two
# warpgroups without a split (128 weight rows a CTA: each token tile read half as often). The
# multicast points (2-CTA clusters sharing the weight tile) follow cuBLAS's skinny kernel at 128
# tokens (64 x 64 tiles, no split; first, so the protocol checker takes it for 2-CTA multicast).
# Each ring as deep as shared memory allows beside the exchange or the staging buffers.
@tilus.autotune(
    "block_m, warpgroups, split, stages, multicast",
    [
        (16, 1, 2, 8, 1),
        (16, 1, 2, 20, 1),
        (16, 1, 1, 16, 1),
        (16, 2, 2, 8, 1),
        (16, 2, 4, 5, 1),
        (32, 1, 2, 12, 1),
        (64, 1, 2, 10, 1),
        (64, 1, 2, 12, 1),
        (64, 1, 2, 5, 1),
        (64, 2, 2, 6, 1),
        (128, 1, 2, 6, 1),
        (128, 2, 2, 3, 1),
        (128, 1, 1, 8, 1),
        (64, 2, 1, 8, 1),
        (128, 2, 1, 6, 1),
        (256, 1, 1, 3, 1),
        (256, 1, 2, 3, 1),
        (64, 1, 1, 13, 2),
        (32, 1, 1, 16, 2),
        (64, 1, 1, 13, 4),
        (128, 1, 1, 8, 2),
        (128, 2, 1, 6, 2),
    ],
)
class Kernel(MatmulKernel):
    def __init__(
        self,
        dtype,
        block_m: int,
        warpgroups: int,
        split: int,
        stages: int,
        multicast: int = 1,
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m
        self.warpgroups = warpgroups
        self.split = split
        self.stages = stages
        self.multicast = multicast  # token tiles of a cluster that share each weight tile
        if multicast not in (1, 2, 4):
            raise ValueError(f"the weight tile is multicast to 1, 2 or 4 CTAs, not {multicast}")
        if split < 1 or split * multicast > MAX_CLUSTER:
            raise ValueError(
                f"a cluster of split x multicast = {split} x {multicast} CTAs: at least 1, at most {MAX_CLUSTER}"
            )
        # the weight group of K range 0, ranks split * j (a CTA's own: shifted by its k_rank)
        self.k0_weight_group = sum(1 << (split * j) for j in range(multicast))
        if warpgroups not in (1, 2):
            raise ValueError(f"one or two consumer warpgroups, not {warpgroups}")
        if (64 * warpgroups) % split or (64 * warpgroups // split) % 8:
            raise ValueError(f"{64 * warpgroups} weight rows do not cut into {split} slices of a multiple of 8")
        self.writes_slabs = split == 1  # each warpgroup writes its slab of C (module doc)
        # a split group with no multicast reaches no peer before its exchange: its opening cluster
        # barrier is split (opening_barrier, peers_ready)
        self.splits_opening = split > 1 and multicast == 1

    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        rows = 64 * self.warpgroups  # weight rows of a CTA (the output tile's N side)
        ctas = self.split * self.multicast
        num_n_tiles = cdiv(n_size, rows)
        num_m_groups = cdiv(cdiv(m_size, self.block_m), self.multicast)  # the token tiles of a cluster
        self.attrs.blocks = ctas * num_n_tiles * num_m_groups
        self.attrs.cluster_blocks = ctas
        self.attrs.warps = 4 * self.warpgroups + 1  # consumer warpgroups, then the producer warp
        rank: int32 = self.cluster.blockRank
        # rank = m_rank * split + k_rank: a token tile's split group is consecutive ranks
        k_rank: int32 = rank % self.split  # which K range of the tile this CTA sums
        m_rank: int32 = rank // self.split  # which of the cluster's token tiles it computes
        tile: int32 = self.blockIdx.x // ctas
        # the token tiles of one weight tile are neighbours in launch order: they run at the same
        # time, so the weight comes from HBM once and from L2 for the others, in every wave
        offset_m: int32 = ((tile % num_m_groups) * self.multicast + m_rank) * self.block_m
        offset_n: int32 = (tile // num_m_groups) * rows

        k_blocks = SplitKRange(cdiv(k_size, BLOCK_K), self.split, k_rank)  # this CTA's share of K

        s_w = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.warpgroups, 64, BLOCK_K])
        self.b_tiles_layout(s_w)  # the weight: B's tiles, K-major for "nk", MN-major for "kn"
        s_x = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, BLOCK_K])
        weight_group: int32 = self.k0_weight_group << k_rank  # the CTAs that share this CTA's weight tiles
        if self.multicast > 1:
            # any CTA of the weight group may multicast the next weight tile into a stage, so every
            # consumer warpgroup releases each stage in every CTA of the group (V6's ring)
            ring = Pipeline(
                self.stages,
                consumer_arrivals=self.warpgroups * self.multicast,
                scope="cluster",
                release_to=self.k0_weight_group,
                elect_release=True,
                cluster_fences=False,
                release_offset=k_rank,
                release_offsets=self.split,
            )
        else:
            ring = Pipeline(self.stages, consumer_arrivals=self.warpgroups, elect_release=True)
        if self.writes_slabs:  # each warpgroup writes its own slab of C (module doc)
            columns = output_columns(64, self.activation)  # of C a slab makes (swiglu: half)
            staging = self.shared_tensor(dtype=self.dtype, shape=[self.warpgroups, 1, self.block_m, columns])
            tile_out = SwappedSlabStore(staging, g_c, offset_m, offset_n, self.epilogue)
        else:  # the exchange among this token tile's split group only
            tile_out = ClusterSplitKReduce(self.split, rows, self.block_m, rank_base=m_rank * self.split)
        self.opening_barrier(tile_out)

        with self.single_warp(4 * self.warpgroups):  # producer
            for i in range(k_blocks.count):
                ring.producer_acquire()  # with multicast: free in every CTA of the cluster
                slot = ring.producer_stage
                with self.single_thread():  # the whole weight tile lands here, multicast or not
                    self.mbarrier.arrive_and_expect_tx(
                        ring.producer_barrier(), transaction_bytes=s_w[slot].nbytes + s_x[slot].nbytes
                    )
                offset_k = (k_blocks.first + i) * BLOCK_K
                self.load_weight(g_b, s_w[slot, 0], ring, offset_n, offset_k, i, m_rank, weight_group)
                if self.warpgroups == 2:
                    self.load_weight(g_b, s_w[slot, 1], ring, offset_n + 64, offset_k, i, m_rank, weight_group)
                self.tma.global_to_shared(
                    src=g_a, dst=s_x[slot], offsets=[offset_m, offset_k], mbarrier=ring.producer_barrier()
                )
                ring.producer_advance()

        self.consumer(0, ring, s_w, s_x, tile_out, k_blocks.count)
        if self.warpgroups == 2:
            self.consumer(1, ring, s_w, s_x, tile_out, k_blocks.count)

        if not self.writes_slabs:  # (each warpgroup wrote its slab already)
            self.write_out(tile_out, k_rank, g_c, offset_m, offset_n)
        self.exit_barrier(tile_out)

    def write_out(
        self, reduce: ClusterSplitKReduce, k_rank: int32, g_c: GlobalTensor, offset_m: int32, offset_n: int32
    ):
        """Whole CTA, after the consumers stored their partials: the split group's exchange, then this
        CTA's slice of the tile summed and written into C."""
        self.peers_ready(reduce)
        reduce.exchange(k_rank)
        with self.warp_group(warp_begin=0, num_warps=4):
            reduce.write(k_rank, g_c, offset_m, offset_n, self.epilogue)  # with the variant's bias, activation

    def opening_barrier(self, tile_out: tilus.Class):
        """Whole CTA, once its mbarriers exist: every barrier of the cluster exists before a peer's
        copy or load lands on it. With multicast the first loads reach the peers, so the whole
        cluster waits now; a split group's first write into a peer is its exchange, so it only
        announces now (a relaxed arrival) and waits in ``peers_ready``: the main loop starts at once."""
        if self.splits_opening:
            tile_out.arrive_after_init()
        else:
            self.cluster.sync()

    def peers_ready(self, reduce: tilus.Class):
        """Whole CTA, just before the exchange: the wait of ``opening_barrier``'s split barrier."""
        if self.splits_opening:
            reduce.wait_for_peers()

    def exit_barrier(self, tile_out: tilus.Class):
        """Whole CTA, last: no CTA of the cluster leaves while a peer may still touch its shared
        memory (module doc)."""
        if self.multicast > 1:
            # a peer's consumers may still arrive on this CTA's ring: their remote arrivals are
            # ordered before the peer's arrival here (release), so they have landed
            self.cluster.sync()
        elif not self.writes_slabs:
            tile_out.exit_barrier()  # no CTA leaves while a peer's copy may still read its partial tile

    def load_weight(
        self,
        g_b: GlobalTensor,
        s_tile: SharedTensor,
        ring: Pipeline,
        offset_n: int32,
        offset_k: int32,
        i: int32,
        m_rank: int32,
        weight_group: int32,
    ):
        """Producer: K block ``i``'s weight tile of one warpgroup (64 rows at ``offset_n``) into
        ``s_tile``: loaded by this CTA, or with multicast by the weight group's CTAs in turn."""
        if self.multicast == 1:
            self.load_b(g_b, s_tile, ring.producer_barrier(), offset_n, offset_k)
        elif i % self.multicast == m_rank:  # the weight group's CTAs take turns at the weight tile
            self.load_b(
                g_b,
                s_tile,
                ring.producer_barrier(),
                offset_n,
                offset_k,
                multicast=True,
                multicast_mask=weight_group,
            )

    def consumer(
        self, wg: int, ring: Pipeline, s_w: SharedTensor, s_x: SharedTensor, tile_out: tilus.Class, count: int32
    ):
        """Consumer warpgroup ``wg``: weight rows ``64 * wg ...`` of the tile times every token, over
        this CTA's K blocks, into C (``SwappedSlabStore``) or the partial tile (``ClusterSplitKReduce``)."""
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            acc = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
            self.annotate_layout(acc, wgmma_fragment(64, self.block_m))
            WgmmaMainloop(ring).run(s_w, s_x, wg, acc, count)
            tile_out.store(acc, wg)
