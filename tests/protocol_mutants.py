"""Planted protocol bugs for the checker (``matmul.protocol``) to catch.

Each mutant is a text substitution on the source of a real module (a version, or a ``pipeline``
module the version uses) that must match exactly once, so the mutants follow the kernels as they
change: a substitution that no longer matches fails its test loudly instead of testing nothing.
``mutated(mutant)`` loads the changed module as a new module and, for a ``pipeline`` module, puts
its classes in place of the originals in every loaded module while the block runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import linecache
import re
import sys
import types
from typing import Iterator

from matmul.kernels import versions


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    arch: str
    version: str
    module: str  # the module whose source is changed
    old: str
    new: str
    kinds: tuple[str, ...]  # the findings that count as caught
    config: tuple = ()  # configuration overrides (as items) on the representative
    ordered_commits: bool = True  # the checker's assumption (see matmul.protocol)

    @property
    def config_dict(self) -> dict:
        return dict(self.config)


# Hopper V7 with the weight tile multicast to two 64-token tiles (its MULTICAST_REPRESENTATIVE)
V7_MULTICAST = (("block_m", 64), ("warpgroups", 1), ("split", 1), ("stages", 13), ("multicast", 2))
# Hopper V7 without a split, two consumer warpgroups, each writing its own slab of C by TMA store
V7_SLABS = (("block_m", 128), ("warpgroups", 2), ("split", 1), ("stages", 6), ("multicast", 1))
# Hopper V7 with both: two 64-token tiles, each split over two CTAs, a cluster of four (COMBINED_REPRESENTATIVE)
V7_COMBINED = (("block_m", 64), ("warpgroups", 1), ("split", 2), ("stages", 12), ("multicast", 2))
# Hopper V6 with ping-pong consumer warpgroups (its PINGPONG)
V6_PINGPONG = (("block_n", 128), ("stages", 6), ("pingpong", True))
# Hopper V6 with the pair side by side along N, sharing A (its PAIR_N_NARROW)
V6_PAIR_N = (("block_n", 96), ("stages", 7), ("pair", "n"))
# Hopper V5 with its stream-K option (its STREAM_K)
V5_STREAM_K = (("stream_k", True),)
# Hopper V8 with two consumer warpgroups taking a weight slab's K blocks in turn
V8_INTERLEAVED = (("split", 2), ("interleave", 2))
# ... with fp8 weights (8 KiB tiles a stage, chunk 32), as the call runs them on a square weight at decode sizes
V8_FP8_INTERLEAVED = (("weight", "fp8_e4m3"), ("block_m", 8), ("split", 2), ("interleave", 2), ("chunk", 32))
# the cut of a CTA's K range, and the same cut without regard to the interleaved consumers' turns
V8_K_RANGE_CUT_WITHOUT_TURNS = (
    "k_blocks = SplitKRange(cdiv(k_size, BLOCK_K), self.split, rank, self.interleave)",
    "k_blocks = SplitKRange(cdiv(k_size, BLOCK_K), self.split, rank)",
)
# Hopper V8 without a split, two slabs each written by a TMA store (shipped/rules/v8.json's one_pass)
V8_ONE_PASS = (("block_m", 128), ("warpgroups", 2), ("split", 1), ("stages", 4))
# Hopper V8's int6 without a split: two slabs of one partial tile, written whole (rules/v8.json's large_one_pass)
V8_INT6_ONE_PASS = (("weight", "int6"), ("block_m", 128), ("warpgroups", 2), ("split", 1), ("stages", 3), ("chunk", 64))

MUTANTS = (
    Mutant(
        "parity flipped: Blackwell V3's producer waits for the wrong phase of 'empty'",
        "sm_100a",
        "v3",
        "matmul.kernels.blackwell.v3",
        "self.mbarrier.wait(empty[stage], phase=((k // stages) & 1) ^ 1)",
        "self.mbarrier.wait(empty[stage], phase=(k // stages) & 1)",
        ("deadlock",),
    ),
    Mutant(
        "arrival count off by one: Pipeline's 'empty' barriers count one arrival too many (Hopper V5)",
        "sm_90a",
        "v5",
        "pipeline.pipeline",
        "self.empty = self.mbarrier.alloc([consumer_arrivals for _ in range(num_stages)])",
        "self.empty = self.mbarrier.alloc([consumer_arrivals + 1 for _ in range(num_stages)])",
        ("deadlock", "arrivals"),
    ),
    Mutant(
        "arrival count off by one: Blackwell V6's leader 'acc_ring.empty' one arrival short",
        "sm_100a",
        "v6",
        "matmul.kernels.blackwell.v6",
        "consumer_arrivals=128 * ctas,",
        "consumer_arrivals=128 * ctas - 1,",
        ("overrun",),
    ),
    Mutant(
        "wrong byte count: Blackwell V6's leader announces one CTA's bytes instead of the pair's",
        "sm_100a",
        "v6",
        "matmul.kernels.blackwell.v6",
        "transaction_bytes=2 * (s_a[0].nbytes + s_b[0].nbytes)",
        "transaction_bytes=s_a[0].nbytes + s_b[0].nbytes",
        ("bytes",),
    ),
    Mutant(
        "wrong byte count: Hopper V6 announces 16 bytes more than its TMA loads deliver",
        "sm_90a",
        "v6",
        "matmul.kernels.hopper.v6",
        "transaction_bytes=2 * s_a[slot, 0].nbytes + 2 * s_b[slot, 0].nbytes)",
        "transaction_bytes=2 * s_a[slot, 0].nbytes + 2 * s_b[slot, 0].nbytes + 16)",
        ("bytes",),
    ),
    Mutant(
        "phase bit never flips: Pipeline's producer keeps waiting for parity 1 on 'empty' (Blackwell V5)",
        "sm_100a",
        "v5",
        "pipeline.pipeline",
        "self.producer_phase = self.producer_phase ^ (self.producer_stage == 0)",
        "self.producer_phase = self.producer_phase",
        ("overrun",),
    ),
    Mutant(
        "release dropped: the wgmma mainloop never releases a tile's last stage (Hopper V5)",
        "sm_90a",
        "v5",
        "pipeline.mainloop",
        "        ring.consumer_release()  # the last K block's stage\n",
        "",
        ("deadlock",),
    ),
    Mutant(
        "a role leaves early: Blackwell V3's producer skips the last K block",
        "sm_100a",
        "v3",
        "matmul.kernels.blackwell.v3",
        "        with self.single_warp(TMA_WARP):  # producer: global -> shared\n"
        "            for k in range(num_k_blocks):",
        "        with self.single_warp(TMA_WARP):  # producer: global -> shared\n"
        "            for k in range(num_k_blocks - 1):",
        ("deadlock",),
    ),
    Mutant(
        "a CTA leaves early: Blackwell V6 without the cluster barrier before exit",
        "sm_100a",
        "v6",
        "matmul.kernels.blackwell.v6",
        "        self.cluster.sync()\n        fence_after_thread_sync()\n        self.tcgen05.dealloc(t_acc)",
        "        fence_after_thread_sync()\n        self.tcgen05.dealloc(t_acc)",
        ("exit", "arrivals"),
    ),
    Mutant(
        "a producer leaves early: Blackwell V6 without its producer tail, commits landing in any order",
        "sm_100a",
        "v6",
        "matmul.kernels.blackwell.v6",
        "            ring.producer_tail()",
        "            pass",
        ("exit",),
        ordered_commits=False,
    ),
    Mutant(
        "lost phase: Blackwell V1's four warps also wait on mma_done once per K block, with no barrier "
        "between them and the warp that issues the MMAs",
        "sm_100a",
        "v1",
        "matmul.kernels.blackwell.v1",
        "        fence_before_thread_sync()  # warp 0's MMAs, complete, before the barrier...\n",
        "        phase = 0\n"
        "        for offset_k in range(0, k_size, self.block_k):\n"
        "            self.mbarrier.wait(mma_done, phase=phase)\n"
        "            phase ^= 1\n"
        "        fence_before_thread_sync()  # warp 0's MMAs, complete, before the barrier...\n",
        ("overrun",),
    ),
    Mutant(
        "release early: Blackwell V3 commits a stage back before issuing the MMA that reads it",
        "sm_100a",
        "v3",
        "matmul.kernels.blackwell.v3",
        "                self.tcgen05.mma(s_a[stage], s_b[stage].transpose(), t_acc, enable_input_d=k != 0)\n"
        "                self.tcgen05.commit(mbarrier=empty[stage])\n",
        "                self.tcgen05.commit(mbarrier=empty[stage])\n"
        "                self.tcgen05.mma(s_a[stage], s_b[stage].transpose(), t_acc, enable_input_d=k != 0)\n",
        ("race",),
    ),
    Mutant(
        "release early: the wgmma mainloop frees the previous stage without waiting for its group (Hopper V5)",
        "sm_90a",
        "v5",
        "pipeline.mainloop",
        "            self.wgmma.wait_group(1)  # the group of K block kb-1 is complete: its stage is free\n",
        "",
        ("race",),
    ),
    Mutant(
        "staging reused early: StagedTmaStore rewrites a buffer a TMA store may still read (Blackwell V5)",
        "sm_100a",
        "v5",
        "pipeline.tma_store",
        "            self.tma.wait_group(self.buffers - 1, read=True)"
        "  # the store that last read `buf` is done with it\n",
        "            pass\n",
        ("race",),
    ),
    Mutant(
        "accumulator read early: Blackwell V3's epilogue reads TMEM without waiting for acc_ready",
        "sm_100a",
        "v3",
        "matmul.kernels.blackwell.v3",
        "            self.mbarrier.wait(acc_ready[0], phase=0)\n",
        "",
        ("race", "coverage"),
    ),
    Mutant(
        "accumulator freed early: Blackwell V5's epilogue hands a TMEM buffer back before its last "
        "tcgen05.ld completed",
        "sm_100a",
        "v5",
        "matmul.kernels.blackwell.v5",
        "                    self.tcgen05.wait_load()\n"
        "                    if e == self.block_n // self.e_block_n - 1:"
        "  # the buffer's last tcgen05.ld has completed:\n"
        "                        acc_ring.consumer_release()"
        "  # the MMA warp may refill it while this sub-tile is stored\n"
        "                        acc_ring.consumer_advance()\n",
        "                    if e == self.block_n // self.e_block_n - 1:\n"
        "                        acc_ring.consumer_release()\n"
        "                        acc_ring.consumer_advance()\n"
        "                    self.tcgen05.wait_load()\n",
        ("race",),
    ),
    Mutant(
        "tile count broken: the static scheduler rounds a worker's tile count down (Hopper V5)",
        "sm_90a",
        "v5",
        "pipeline.schedulers",
        "mine = (self.num_tiles - self.worker + self.num_workers - 1) // self.num_workers",
        "mine = (self.num_tiles - self.worker) // self.num_workers",
        ("coverage",),
    ),
    Mutant(
        "accumulator reset: Blackwell V3's MMA overwrites the accumulator at K block 1",
        "sm_100a",
        "v3",
        "matmul.kernels.blackwell.v3",
        "enable_input_d=k != 0",
        "enable_input_d=k > 1",
        ("coverage",),
    ),
    Mutant(
        "cluster: Blackwell V6's MMA commits free a stage in the leader only (multicast mask)",
        "sm_100a",
        "v6",
        "matmul.kernels.blackwell.v6",
        "self.tcgen05.commit(mbarrier=ring.consumer_barrier(), cta_group=2,\n"
        "                                            multicast_mask=every_cta)",
        "self.tcgen05.commit(mbarrier=ring.consumer_barrier(), cta_group=2,\n"
        "                                            multicast_mask=leaders)",
        ("deadlock", "bytes"),
    ),
    Mutant(
        "cluster: Hopper V6's tile broadcast sends its drained arrivals to the peer (remote target)",
        "sm_90a",
        "v6",
        "pipeline.broadcast",
        'target_rank=0, scope="cta")',
        'target_rank=1, scope="cta")',
        ("deadlock", "overrun", "arrivals"),
    ),
    Mutant(
        "cluster: the 4-CTA Blackwell V6's B multicast reaches pair 0 only",
        "sm_100a",
        "v6",
        "matmul.kernels.blackwell.v6",
        "multicast_mask=0b0101 << half)",
        "multicast_mask=0b0001 << half)",
        ("deadlock", "bytes", "coverage"),
        config=(("cluster_ctas", 4),),
    ),
    Mutant(
        "cluster: Hopper V7's multicast ring releases each stage in the consumer's own CTA only",
        "sm_90a",
        "v7",
        "matmul.kernels.hopper.v7",
        "release_to=self.k0_weight_group,",
        "release_to=0,",
        ("deadlock", "arrivals"),
        config=V7_MULTICAST,
    ),
    Mutant(
        "store left behind: Hopper V7's warpgroup leaves before the TMA store of its slab has read the staging buffer",
        "sm_90a",
        "v7",
        "pipeline.epilogue",
        "        out.finish()\n",
        "",
        ("exit",),
        config=V7_SLABS,
    ),
    Mutant(
        "wrong slab: Hopper V7's warpgroups all write their slabs at the first warpgroup's columns of C",
        "sm_90a",
        "v7",
        "pipeline.epilogue",
        'self.offset_n + 64 * slab, "wgmma_t")',
        'self.offset_n, "wgmma_t")',
        ("coverage",),
        config=V7_SLABS,
    ),
    Mutant(
        "wrong byte count: Hopper V7's multicast CTA announces only its share of the weight tile",
        "sm_90a",
        "v7",
        "matmul.kernels.hopper.v7",
        "transaction_bytes=s_w[slot].nbytes + s_x[slot].nbytes",
        "transaction_bytes=s_w[slot].nbytes // self.multicast + s_x[slot].nbytes",
        ("bytes",),
        config=V7_MULTICAST,
    ),
    Mutant(
        "cluster: Hopper V7's split-and-multicast weight tile reaches the CTAs of the other K range too",
        "sm_90a",
        "v7",
        "matmul.kernels.hopper.v7",
        "weight_group: int32 = self.k0_weight_group << k_rank",
        "weight_group: int32 = (1 << self.split * self.multicast) - 1",
        ("bytes", "race", "coverage", "overrun"),
        config=V7_COMBINED,
    ),
    Mutant(
        "cluster: Hopper V7's split-and-multicast ring releases every stage to the weight group of K range 0",
        "sm_90a",
        "v7",
        "matmul.kernels.hopper.v7",
        "release_offset=k_rank,",
        "release_offset=0,",
        ("deadlock", "overrun", "arrivals", "race"),
        config=V7_COMBINED,
    ),
    Mutant(
        "cluster: Hopper V7's split-and-multicast exchange sends the partials to token tile 0's split group",
        "sm_90a",
        "v7",
        "matmul.kernels.hopper.v7",
        "rank_base=m_rank * self.split)",
        "rank_base=0)",
        ("bytes", "coverage", "deadlock", "overrun"),
        config=V7_COMBINED,
    ),
    Mutant(
        "tcgen05.st not waited: Blackwell V8's widening threads hand a TMEM buffer to the MMA warp before "
        "their tcgen05.st has landed",
        "sm_100a",
        "v8",
        "matmul.kernels.blackwell.v8",
        "                self.tcgen05.wait_store()  # the store has landed in TMEM before the MMA warp hears of it\n",
        "",
        ("race", "exit"),
    ),
    Mutant(
        "arrival count off by one: Blackwell V8's ring slot is refilled once the widening threads released "
        "it, not the MMAs that read its tokens",
        "sm_100a",
        "v8",
        "matmul.kernels.blackwell.v8",
        "ring = Pipeline(stages, consumer_arrivals=1 + 128)",
        "ring = Pipeline(stages, consumer_arrivals=128)",
        ("race", "overrun", "arrivals"),
    ),
    Mutant(
        "released before its wgmma completed: Hopper V8's consumer hands a stage back while the wgmma that "
        "reads its token tile may still run",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        "                self.wgmma.wait_group(0)  # A's registers are rewritten by the next block\n"
        "                ring.consumer_release()\n",
        "                ring.consumer_release()\n                self.wgmma.wait_group(0)\n",
        ("race",),
    ),
    *(
        Mutant(
            f"wrong byte count: Hopper V8's producer leaves {which} group scales out of a stage's expected bytes",
            "sm_90a",
            "v8",
            "matmul.kernels.hopper.v8",
            "                        + stage_scale_bytes(self.weight, s_s)\n",
            "",
            ("bytes",),
            config=config,
        )
        for which, config in (
            ("int4's", ()),
            # two consumer warpgroups: int6's configuration past 64 tokens (matmul.call.quantized)
            ("int6's", (("weight", "int6"), ("block_m", 128), ("warpgroups", 2), ("split", 2), ("stages", 2))),
        )
    ),
    Mutant(
        "slabs swapped: Hopper V8's two int6 consumer warpgroups store their accumulators into each "
        "other's rows of the partial tile, which one of them writes out whole",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        "            self.store_tile(reduce, acc, wg, turn)\n\n    def int6_half(",
        "            self.store_tile(reduce, acc, (wg + 1) % self.warpgroups, turn)\n\n    def int6_half(",
        ("coverage",),
        config=V8_INT6_ONE_PASS,
    ),
    Mutant(
        "wrong byte count: Blackwell V8's producer expects a stage's group scales for int4 with row "
        "scales, whose ring brings none",
        "sm_100a",
        "v8",
        "matmul.kernels.blackwell.v8",
        'return 0 if weight == "int4_channel" else s_s.nbytes // s_s.shape[0]',
        "return s_s.nbytes // s_s.shape[0]",
        ("bytes", "deadlock"),
        config=(("weight", "int4_channel"),),
    ),
    Mutant(
        "wrong byte count: Hopper V8's producer expects a stage's group scales for int4 with row "
        "scales, whose ring brings none",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        "if weight not in ROW_SCALED else 0",
        'if weight != "fp8_e4m3" else 0',
        ("bytes", "deadlock"),
        config=(("weight", "int4_channel"),),
    ),
    Mutant(
        "wrong byte count: Hopper V8's token boxes announce a group of tokens more than they load "
        "(pipeline.token_boxes)",
        "sm_90a",
        "v8",
        "pipeline.token_boxes",
        "rows = self.full * TOKEN_GROUP + self.tail_rows",
        "rows = (self.full + 1) * TOKEN_GROUP",
        ("bytes", "deadlock"),
        config=(("block_m", 8),),
    ),
    Mutant(
        "wrong K block: Hopper V8's producer loads the packed weight tile of K block 0 for every K block "
        "(the widened A in registers then multiplies the wrong weights)",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        "self.load_weight_tile(g_w, s_w[slot, c], (offset_n + 64 * wg) // TILE_ROWS, block, ring)",
        "self.load_weight_tile(g_w, s_w[slot, c], (offset_n + 64 * wg) // TILE_ROWS, 0, ring)",
        ("coverage",),
    ),
    Mutant(
        "wrong slab: Hopper V8's warpgroups without a split all write their slabs at the first warpgroup's "
        "columns of C",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        "            tile_out.store(acc, wg)\n",
        "            tile_out.store(acc, 0)\n",
        ("coverage",),
        config=V8_ONE_PASS,
    ),
    Mutant(
        "store left behind: Hopper V8's warpgroup without a split leaves before the TMA store of its slab "
        "has read the staging buffer",
        "sm_90a",
        "v8",
        "pipeline.epilogue",
        "        out.finish()\n",
        "",
        ("exit",),
        config=V8_ONE_PASS,
    ),
    Mutant(
        "wrong K range: Hopper V8's interleaved consumers take their K blocks two a stage from ranges cut "
        "without regard to the two (a CTA's last stage reaches into its peer's range)",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        *V8_K_RANGE_CUT_WITHOUT_TURNS,
        ("coverage",),
        config=V8_INTERLEAVED,
    ),
    Mutant(
        "wrong K range in fp8: the same cut as above, with fp8's interleaved consumers (checked apart from "
        "its two warpgroups a CTA since a configuration's protocol shape includes its interleave)",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        *V8_K_RANGE_CUT_WITHOUT_TURNS,
        ("coverage",),
        config=V8_FP8_INTERLEAVED,
    ),
    Mutant(
        "no exit barrier: a Blackwell V8 CTA may exit while its split-K partial is still being copied out of "
        "its shared memory to a peer",
        "sm_100a",
        "v8",
        "matmul.kernels.blackwell.v8",
        "        reduce.exit_barrier()  # no CTA leaves while a peer's copy may still read its partial tile\n",
        "",
        ("exit",),
    ),
    Mutant(
        "no exit barrier: a Blackwell V7 CTA may exit while its split-K partial is still being copied out of "
        "its shared memory to a peer",
        "sm_100a",
        "v7",
        "matmul.kernels.blackwell.v7",
        "        reduce.exit_barrier()  # no CTA leaves while a peer's copy may still read its partial tile\n",
        "",
        ("exit",),
    ),
    Mutant(
        "no exit barrier: a Hopper V7 CTA may exit while its split-K partial is still being copied out of its "
        "shared memory to a peer",
        "sm_90a",
        "v7",
        "matmul.kernels.hopper.v7",
        "            tile_out.exit_barrier()  # no CTA leaves while a peer's copy may still read its partial tile\n",
        "            pass\n",
        ("exit",),
    ),
    Mutant(
        "no exit barrier: a Hopper V8 CTA may exit while its split-K partial is still being copied out of its "
        "shared memory to a peer",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        "        reduce.exit_barrier()  # no CTA leaves while a peer's copy may still read its partial tile\n",
        "",
        ("exit",),
    ),
    Mutant(
        "no wait for the peers: Hopper V8 arrives at the cluster barrier once its mbarriers exist but never "
        "waits there, so its first split-K copy may land on a peer that has not initialized its barriers",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        "            reduce.wait_for_peers()\n",
        "            pass\n",
        ("init", "overrun"),  # or an arrival at the exit barrier before the first one was waited for
    ),
    Mutant(
        "widened over a stage still read: Hopper V8's prefill widening warpgroup stores its B tile into a "
        "main stage without waiting for the consumers to release it",
        "sm_90a",
        "v8_prefill",
        "matmul.kernels.hopper.v8_prefill",
        "        main.producer_acquire()\n        stage = main.producer_stage\n",
        "        stage = main.producer_stage\n",
        ("race", "overrun", "coverage"),
    ),
    Mutant(
        "packed stage released early: Hopper V8's prefill widening warpgroup hands a packed stage back after "
        "its first half, and the producer refills it before the second half is widened",
        "sm_90a",
        "v8_prefill",
        "matmul.kernels.hopper.v8_prefill",
        "                    self.widen_half(widen, main, s_words, s_scale, s_rows, slot, 1)\n"
        "                    packed.consumer_release()",
        "                    packed.consumer_release()\n"
        "                    self.widen_half(widen, main, s_words, s_scale, s_rows, slot, 1)",
        ("coverage", "race"),
    ),
    Mutant(
        "no wait for the peers: Blackwell V8 arrives at the cluster barrier once its mbarriers exist but "
        "never waits there, so its first split-K copy may land on a peer that has not initialized its barriers",
        "sm_100a",
        "v8",
        "matmul.kernels.blackwell.v8",
        "        reduce.wait_for_peers()\n",
        "",
        ("init", "overrun"),
    ),
    Mutant(
        "no wait for the peers: Hopper V7's split group arrives at the cluster barrier once its mbarriers "
        "exist but never waits there, so its first split-K copy may land on a peer that has not initialized "
        "its barriers",
        "sm_90a",
        "v7",
        "matmul.kernels.hopper.v7",
        "            reduce.wait_for_peers()\n",
        "            pass\n",
        ("init", "overrun"),
    ),
    Mutant(
        "one warp, two roles: Hopper V8's producer is the first warp of its second interleaved consumer "
        "warpgroup (the warp index of a CTA without interleaving)",
        "sm_90a",
        "v8",
        "matmul.kernels.hopper.v8",
        "with self.single_warp(4 * consumers):  # producer",
        "with self.single_warp(4 * self.warpgroups):  # producer",
        ("deadlock",),
        config=(("split", 1), ("interleave", 2)),
    ),
    Mutant(
        "multicast to itself: a Hopper V6 CTA paired along N loads its slab of the shared A tile into its own "
        "shared memory only",
        "sm_90a",
        "v6",
        "matmul.kernels.hopper.v6",
        "                    offsets=[offset_m + rank * half_m, offset_k],\n"
        "                    mbarrier=ring.producer_barrier(),\n"
        "                    multicast_mask=0b11,\n",
        "                    offsets=[offset_m + rank * half_m, offset_k],\n"
        "                    mbarrier=ring.producer_barrier(),\n"
        "                    multicast_mask=1 << rank,\n",
        ("bytes", "deadlock"),
        config=V6_PAIR_N,
    ),
    Mutant(
        "wrong tile: both Hopper V6 CTAs paired along N compute the pair's first N tile",
        "sm_90a",
        "v6",
        "matmul.kernels.hopper.v6",
        "offset_n = (self.n_step * pair_column + (self.n_step - 1) * rank) * self.block_n",
        "offset_n = self.n_step * pair_column * self.block_n",
        ("coverage",),
        config=V6_PAIR_N,
    ),
    Mutant(
        "turn handed over early: a Hopper V6 ping-pong warpgroup lets the other start its tile after its own "
        "first K block, before it has waited for the rest of its stages",
        "sm_90a",
        "v6",
        "matmul.kernels.hopper.v6",
        "                mainloop.issue_rest(s_a, s_b, WHOLE_TILE, acc, num_k_blocks)\n"
        "                turns.hand_over(wg)  # the other warpgroup's wgmma queue behind this tile's last\n",
        "                turns.hand_over(wg)\n"
        "                mainloop.issue_rest(s_a, s_b, WHOLE_TILE, acc, num_k_blocks)\n",
        ("overrun", "coverage"),
        config=V6_PINGPONG,
    ),
    Mutant(
        "turn not waited for: a Hopper V6 ping-pong warpgroup starts its tile without its turn",
        "sm_90a",
        "v6",
        "matmul.kernels.hopper.v6",
        "                turns.wait(wg)\n",
        "",
        ("overrun", "coverage"),
        config=V6_PINGPONG,
    ),
    Mutant(
        "parity flipped: both Hopper V6 ping-pong warpgroups wait for a hand-over before their first turn",
        "sm_90a",
        "v6",
        "pipeline.turns",
        "first_free = 1 if wg == 0 else 0",
        "first_free = 0",
        ("deadlock",),
        config=V6_PINGPONG,
    ),
    Mutant(
        "stages not skipped: a Hopper V6 ping-pong warpgroup takes the other's tile's stages for its own",
        "sm_90a",
        "v6",
        "matmul.kernels.hopper.v6",
        "                ring.consumer_skip(num_k_blocks)  # the other warpgroup's tile's stages\n",
        "",
        ("overrun", "coverage", "deadlock"),
        config=V6_PINGPONG,
    ),
    Mutant(
        "flag not waited for: Hopper V5's stream-K finisher reads a partial without waiting",
        "sm_90a",
        "v5",
        "pipeline.stream_k",
        "self.lock_semaphore(flag.item_ptr(), 1)",
        "pass",
        ("race",),
        config=V5_STREAM_K,
    ),
    Mutant(
        "flag raised early: Hopper V5's stream-K publisher sets its flag before storing the partial",
        "sm_90a",
        "v5",
        "pipeline.stream_k",
        """        self.store_global(self.slots, acc, offsets=[slot * self.rows, 0])
        self.sync()  # every thread's stores happen before the flag's release
        with self.single_thread():
            self.release_semaphore(self.flags[slot].item_ptr(), 1)""",
        """        with self.single_thread():
            self.release_semaphore(self.flags[slot].item_ptr(), 1)
        self.store_global(self.slots, acc, offsets=[slot * self.rows, 0])""",
        ("race",),
        config=V5_STREAM_K,
    ),
    Mutant(
        "flag left up: Hopper V5's stream-K finisher does not reset the flags it waited for",
        "sm_90a",
        "v5",
        "pipeline.stream_k",
        "self.release_semaphore(flag.item_ptr(), 0)",
        "pass",
        ("flags",),
        config=V5_STREAM_K,
    ),
    Mutant(
        "contributor missed: Hopper V5's stream-K finisher starts one worker too late",
        "sm_90a",
        "v5",
        "pipeline.stream_k",
        "first: int32 = (x * self.sharing + work - 1) // work - 1",
        "first: int32 = (x * self.sharing + work - 1) // work",
        ("coverage",),
        config=V5_STREAM_K,
    ),
    Mutant(
        "pieces out of order: Hopper V5's stream-K producer loads its pieces in the other order",
        "sm_90a",
        "v5",
        "matmul.kernels.hopper.v5",
        """            for p in range(schedule.piece_count()):
                m_tile, n_tile, k_begin, k_end, tail_tile = schedule.piece(p)
                self.load_k_blocks(""",
        """            for p in range(schedule.piece_count()):
                m_tile, n_tile, k_begin, k_end, tail_tile = schedule.piece(schedule.piece_count() - 1 - p)
                self.load_k_blocks(""",
        ("coverage",),
        config=V5_STREAM_K,
    ),
)


def _load_source(name: str, source: str) -> types.ModuleType:
    """``source`` as a new module beside ``name``. tilus transpiles a method from its source text
    (``inspect``), so the text is registered in ``linecache`` under the new module's file name."""
    original = importlib.import_module(name)
    filename = f"{original.__file__}<mutant>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(name + "_mutant")
    module.__file__ = filename
    module.__package__ = original.__package__
    exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)
    return module


def _layout_free_pattern(text: str) -> re.Pattern:
    """``text`` as a pattern that ignores line breaks and spaces, and the trailing comma a formatter
    adds before a closing bracket (the statement's own indentation is the caller's)."""
    parts = []
    for char in text.strip():
        if char.isspace():
            continue
        if char in ")]}":
            parts.append(r",?\s*")
        parts.append(re.escape(char))
    return re.compile(r"\s*".join(parts))


def mutated_source(mutant: Mutant) -> str:
    """The module's source with ``old`` replaced by ``new``; ``old`` must occur exactly once (laid out
    as written, or as a formatter may have re-wrapped it)."""
    original = importlib.import_module(mutant.module)
    with open(original.__file__) as f:
        source = f.read()
    if source.count(mutant.old) == 1:
        return source.replace(mutant.old, mutant.new)
    matches = list(_layout_free_pattern(mutant.old).finditer(source))
    if len(matches) != 1:
        raise AssertionError(
            f"mutant {mutant.name!r}: the text to replace occurs {len(matches)} times in {mutant.module}"
        )
    match = matches[0]
    indent = mutant.old[: len(mutant.old) - len(mutant.old.lstrip())]
    new = mutant.new[len(indent) :] if mutant.new.startswith(indent) else mutant.new
    if mutant.old.endswith("\n") and new.endswith("\n"):
        new = new[:-1]  # the pattern stops at the last character of ``old``
    return source[: match.start()] + new + source[match.end() :]


@contextlib.contextmanager
def mutated(mutant: Mutant) -> Iterator[types.ModuleType]:
    """The version module to check, with the mutation in place for the duration of the block."""
    source = mutated_source(mutant)
    version_module = versions.module_name(mutant.arch, mutant.version)
    if mutant.module == version_module:
        yield _load_source(mutant.module, source)
        return
    original = importlib.import_module(mutant.module)
    changed = _load_source(mutant.module, source)
    swaps = {
        id(value): changed.__dict__[name]
        for name, value in vars(original).items()
        if isinstance(value, type) and value.__module__ == original.__name__ and name in changed.__dict__
    }
    patched = []  # (namespace dict, key, original value)
    for module in list(sys.modules.values()):
        if module is None or not module.__name__.startswith(("pipeline", "matmul.kernels")):
            continue
        for name, value in list(vars(module).items()):
            if id(value) in swaps:
                patched.append((module.__dict__, name, value))
            # tilus checks a method's arguments against its annotations: point those at the mutant too
            if isinstance(value, type) and value.__module__ == module.__name__:
                for attr in vars(value).values():
                    annotations = getattr(attr, "__annotations__", None)
                    if annotations:
                        patched.extend((annotations, key, v) for key, v in annotations.items() if id(v) in swaps)
    for namespace, key, value in patched:
        namespace[key] = swaps[id(value)]
    try:
        yield importlib.import_module(version_module)
    finally:
        for namespace, key, value in patched:
            namespace[key] = value


def run(index: int, seeds: int) -> dict:
    """Check mutant ``index`` (in this process: run each mutant in a fresh one, since the
    substituted classes of a ``pipeline`` mutant must not leak into the next check)."""
    from matmul import protocol

    mutant = MUTANTS[index]
    with mutated(mutant) as module:
        config = {**module.REPRESENTATIVE, **mutant.config_dict}
        report = protocol.check(
            mutant.arch, mutant.version, config, seeds=seeds, module=module, ordered_commits=mutant.ordered_commits
        )
    finding = report.finding
    return {
        "kind": finding.kind if finding else None,
        "message": finding.message if finding else "",
        "seed": report.seed,
        "strategy": report.strategy,
        "seconds": report.seconds,
    }


# --- mutants of a variant's build (``matmul.kernels.variant``): bugs on a code path that only a fused
# epilogue or a batched build takes, checked on that variant's build (``tests/test_protocol_variants.py``)


@dataclasses.dataclass(frozen=True)
class VariantMutant(Mutant):
    variant: str = ""  # the variant's key (``Variant.key``), e.g. "swiglu" or "batch2"


VARIANT_MUTANTS = (
    VariantMutant(
        "batched tile count: Hopper V5's static scheduler counts one product's tiles, not the batch's",
        "sm_90a",
        "v5",
        "matmul.kernels.hopper.v5",
        "self.blockIdx.x, self.gridDim.x, self.batches)",
        "self.blockIdx.x, self.gridDim.x)",
        ("coverage",),
        variant="batch2",
    ),
    VariantMutant(
        "batched store: Blackwell V5's epilogue stores every product's tile into product 0",
        "sm_100a",
        "v5",
        "matmul.kernels.blackwell.v5",
        "out.put(block, g_c, m_tile * self.block_m, column, batch)",
        "out.put(block, g_c, m_tile * self.block_m, column)",
        ("coverage",),
        variant="bias+relu+batch2",
    ),
    VariantMutant(
        "batched load: Hopper V5's producer loads product 0's A and B tiles for every product",
        "sm_90a",
        "v5",
        "matmul.kernels.hopper.v5",
        "                        kb * self.block_k,\n                        batch,\n",
        "                        kb * self.block_k,\n                        0,\n",
        ("coverage",),
        variant="batch2",
    ),
    VariantMutant(
        "swiglu staging: Blackwell V5 stages swiglu's half-width sub-tiles in full-width buffers",
        "sm_100a",
        "v5",
        "matmul.kernels.blackwell.v5",
        "c_cols = output_columns(self.e_block_n, self.activation)",
        "c_cols = self.e_block_n",
        ("coverage", "race"),
        variant="swiglu",
    ),
)


def run_variant(index: int, seeds: int) -> dict:
    """Check variant mutant ``index`` on its variant's build (in this process: each changes only its
    version module)."""
    from matmul import protocol
    from matmul.kernels.variant import Variant

    mutant = VARIANT_MUTANTS[index]
    assert mutant.module == versions.module_name(mutant.arch, mutant.version), "a version module's mutant"
    with mutated(mutant) as module:
        config = {**module.REPRESENTATIVE, **mutant.config_dict}
        report = protocol.check(
            mutant.arch, mutant.version, config, seeds=seeds, module=module, variant=Variant.parse(mutant.variant)
        )
    finding = report.finding
    return {
        "kind": finding.kind if finding else None,
        "message": finding.message if finding else "",
        "seed": report.seed,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(int(sys.argv[1]), int(sys.argv[2]))))
