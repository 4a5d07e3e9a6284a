"""Blackwell V8: V7 with int4 weights: the weight is stored in 4 bits with one scale per group of
128 along K, and a warpgroup widens it on chip into tensor memory, where the MMA reads it as its A
operand. The Blackwell twin of Hopper V8 (read that module first).

Not run: no Blackwell GPU is available to this project. This kernel is compiled for sm_100a, its
generated code is checked for the instructions that carry the idea
(``tests/test_blackwell_generated_code.py``), the packed layout is checked against the way its
threads read it (``tests/test_blackwell_series.py``), and its synchronization is executed on the
CPU by the protocol checker (``matmul.protocol``), with planted bugs that it catches
(``tests/protocol_mutants.py``). Nothing here has been timed or checked against a reference on a GPU.

Idea: at small M a projection is bound by reading its weight (V7); int4 reads a quarter of the
bytes. V8 is V7 (swap-AB: the weight's 128 rows are the MMA's M side, the tokens its N side; split-K
over a cluster reduced through DSMEM; a TMA ring) whose ring carries, per K block of 128 columns (one
scale group), the packed int4 tile of the CTA's 128 weight rows (8 KiB, V7: 32 KiB for the same
columns), their 128 scales (256 bytes) and the token tile.

The weight: the same format and the same packed words as Hopper V8 (``matmul.quant.int4``): signed
int4, ``w ~ q * scale[row, k // 128]``, one ``QuantizedWeight`` serves both GPUs. Hopper packs
64-row tiles in the order of the wgmma A fragment; a Blackwell CTA's 128 rows are two of those tiles,
consecutive in memory (one TMA box [32, 64] of int32). That order also suits ``tcgen05.st``: the
16x128b shape writes 16 TMEM lanes x 4 columns from registers laid out as the m16n8 fragment (thread
``4 g + c``: lanes ``g`` and ``g + 8``, 32-bit column ``c``), and two of them per K step of 16 are
exactly the wgmma A fragment of that step. TMEM lets warp ``w`` of a warpgroup reach lanes ``32 w ...
32 w + 31`` only, so widening thread ``32 w + 4 g + c`` takes, for ``r < 2``, the words of Hopper's
thread ``64 (w % 2) + 32 r + 4 g + c`` of tile ``w // 2`` (rows ``32 w + 16 r + g``, ``+ 8``): for
each ``(r, half)`` a warp reads 512 consecutive bytes (one ``ld.shared.v4`` a thread, no bank
conflict). The shared tile is viewed as ``[tile, half, wpar, r, lane, word]`` and permuted so that a
thread's 16 words are one row of a [128, 16] view; they are widened by Hopper's conversion
(``pipeline.widen.int4_pairs``: a ``lop3`` with the magic number and one 16-bit-pair instruction
for each pair of values, which the packed order puts in the register the fragment wants) and
multiplied by the row's scale in the 16-bit dtype (one rounding of ``q * scale``, as
``QuantizedWeight.dequantize()``), then stored with ``tcgen05.st.16x128b``. The scales are Hopper's
[K / 128, N_pad] matrix (N_pad a multiple of 64); the last CTA of an N of 64 rows past a multiple of
128 reads a box half past the matrix, which TMA fills with zeros (zero words, zero scales: rows past
N, never stored).

int4 with one scale per row (``Kernel(weight="int4_channel")``, Hopper V8's ``int4_channel``): the
same packed words with a float32 scale per row (``matmul.quant``), so no scales come through the
ring; the widening threads store the integers -8..7 unscaled (exact in float16 and bfloat16), and
the row's scale multiplies the drained float32 accumulator once, before the split-K exchange.

Why A in tensor memory and not a widened tile in shared memory: ``tcgen05.mma`` reads A from shared
memory (a descriptor) or from tensor memory, never from registers (Hopper V8's path does not exist
here). Through shared memory the widened tile is 32 KiB a K block: written by the widening threads in
the 128-byte-swizzled K-major layout, fenced into the async proxy (``fence.proxy.async``), then read
again by the MMA: 64 KiB of shared-memory traffic per 8 KiB of weight, beside the ring's own TMA
writes and the tokens the MMA reads, and 32 KiB of shared memory per buffer taken from the ring.
Through tensor memory the widened tile leaves the SM's shared memory alone: ``tcgen05.st`` writes it
into 64 TMEM columns a buffer (``wide_stages`` buffers; TMEM is otherwise idle beside a 32- to
128-column accumulator), the MMA reads it where it lies (``tcgen05.mma ... [d], [a], b_desc``, A's
address in brackets), and the hand-off is the accumulator's in reverse: ``tcgen05.wait::st`` and
``tcgen05.fence::before_thread_sync`` before the arrival, ``after_thread_sync`` after the wait. The
constraints it takes: A in TMEM must be the MMA's M side with M = 128 on cta_group::1 (lane ``i`` is
row ``i``) -- the weight rows here, by swap-AB; the widening warps must be a warpgroup whose warp
``w`` holds rows ``32 w ...`` (warps 0-3, which then drain the accumulator as in V7); tilus 0.2.0 had
no emitter for that MMA (``matmul.tilus_fixes.tcgen05_tmem_a`` adds it). TMEM per CTA:
``tmem_columns`` (160 columns for the representative: three CTAs fit an SM's 512).

Roles: warp 4 loads (TMA), warp 5 issues the MMAs, warps 0-3 widen each K block into TMEM and, after
the last one, drain the accumulator into the partial tile (V7).

Synchronization (this CTA's K block ``i`` uses ring slot ``s = i % stages`` at parity ``p = (i //
stages) & 1`` and TMEM buffer ``b = i % wide_stages`` at parity ``q = (i // wide_stages) & 1``):

| barrier | count | who arrives | who waits | scope |
| --- | --- | --- | --- | --- |
| ``ring.full[s]`` | 1 + bytes | TMA lane's ``expect_tx``; 4 TMA loads | warps 0-3; MMA warp: ``p`` | CTA |
| ``ring.empty[s]`` | 129 | 128 widening threads (loaded); MMA warp's commit | TMA warp, ``p ^ 1`` | CTA |
| ``wide.full[b]`` | 128 | each widening thread: st, ``wait::st``, fence | MMA warp, ``q`` | CTA |
| ``wide.empty[b]`` | 1 | MMA warp's commit after the MMAs that read ``b`` | warps 0-3, ``q ^ 1`` | CTA |
| ``acc_ready`` | 1 | MMA warp's commit after its last MMA | warps 0-3, parity 0 | CTA |
| ``arrived`` (exchange) | 1 + bytes | this CTA's ``expect_tx``; the peers' bulk copies | warps 0-3, 0 | CTA |
| ``barrier.cluster`` | the cluster | all: once the barriers exist; before exit (relaxed) | all | cluster |

``ring.empty[s]``: a widening thread arrives once its packed words and scales of ``s`` are in
registers; the MMA warp's ``tcgen05.commit`` once the MMAs that read the tokens of ``s`` completed.
``wide``: the widening thread's arrival follows its ``tcgen05.st`` of ``b``, ``tcgen05.wait::st``
and ``tcgen05.fence::before_thread_sync``; each wait on ``wide`` is followed by ``after_thread_sync``
(``Pipeline(tcgen05_fences=True)``).

Two consumers share ``ring.full[s]``: its next phase cannot complete before both released slot
``s`` (``ring.empty[s]`` counts both), so neither can miss a phase. A widening thread releases its
slot as soon as its loads are issued (an arrival orders the thread's earlier shared-memory reads);
the MMA warp's two commits of a K block track the same MMAs. The rest is V7's: the exchange's
``__syncthreads`` orders the last ``tcgen05.ld`` before TMEM is freed, every barrier exists before
the first cluster barrier (split: arrived at the start, waited for before the exchange), and no CTA
exits before the last one.
"""

import tilus
from tilus import GlobalTensor, RegisterTensor, float32, int32, void_p
from tilus.ir.layout.ops import shared_row_major
from tilus.ir.layout.ops.register_ops import local, spatial
from tilus.ir.layout.ops.register_ops import reduce as reduce_layout
from tilus.utils import cdiv

from pipeline import Pipeline
from pipeline.cluster_reduce import ClusterSplitKReduce, SplitKRange
from pipeline.tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync
from pipeline.widen import int4_pairs, scale_view

from ..entry import PackedWeightKernel

IDEA = "int4 weights (a scale per 128 along K) widened by a warpgroup into tensor memory, the MMA's A operand"
PTX_MARKERS = (
    "tcgen05.mma.cta_group::1.kind::f16 [%r",  # A from tensor memory: an address in brackets, not a descriptor
    "tcgen05.st.sync.aligned.16x128b",
    "tcgen05.wait::st.sync.aligned",
    "lop3.b32",
    "ld.shared.v4",
    "cp.async.bulk.tensor.2d.shared::cta.global",
    "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
    "barrier.cluster",
    "barrier.cluster.arrive.relaxed.aligned",  # the exit barrier orders no memory (ClusterSplitKReduce.exit_barrier)
)
REPRESENTATIVE = {"block_m": 32, "split": 2, "stages": 4, "wide_stages": 2}
# int4 with row scales (``weight="int4_channel"``): built and protocol-checked, not tuned (the format
# is the weight's, not a choice)
EXTRA_CONFIGS = ({**REPRESENTATIVE, "weight": "int4_channel"},)
B_LAYOUTS = ("nk",)  # the packed weight has one layout (matmul.quant)
FUSED_EPILOGUE = False
MAX_ELEMENTS = 2**31 - 1  # C is written by store_global at int32 element offsets (V7)

BLOCK_K = 128  # one scale group
GROUP = 128  # K columns that share a scale; K must be a multiple of it
ROWS = 128  # weight rows of a CTA: the MMA's M, one per TMEM lane
B_UNITS = (4, 2)  # weight rows and K columns per int32 word of the packed weight (matmul.protocol)
WEIGHTS = ("int4", "int4_channel")  # group scales through the ring, or a float32 scale a row after the sum
PACKED_BOX = (32, 64)  # one 128 x 128 packed tile as int32 [rows, columns]: two of Hopper's [16, 64] tiles
# a stage's packed tile as [tile, half, wpar, r, lane, word] (Hopper's thread 32 (2 wpar + r) + lane of
# its tile), permuted to [tile, wpar, lane, r, half, word]: widening thread 64 tile + 32 wpar + lane's
# 16 words, in the order of the K steps of its rows (the module doc)
WORD_SPLIT = [2, 2, 2, 2, 32, 4]
WORD_ORDER = [0, 2, 4, 3, 1, 5]
STAGED_ORDER = [0] + [d + 1 for d in WORD_ORDER]  # the same with the ring's stage first
MAX_M = 256
TMA_WARP = 4
MMA_WARP = 5
PART = 64  # K columns of a token box (128 bytes, swizzled): one MMA call

# The widened tile [128 rows, 128 K columns] in registers: warp w holds rows 32 w ... 32 w + 31 (the
# TMEM lanes it may access); thread (g, c) of the warp holds, for r < 2 and K step s < 8, the 8
# values of the wgmma A fragment of K step s of rows 32 w + 16 r + g (+ 8): those of Hopper V8's
# thread 64 (w % 2) + 32 r + 4 g + c in its tile w // 2, the registers tcgen05.st's 16x128b writes.
WIDE = spatial(4, 1) * local(2, 1) * local(1, 8) * local(1, 2) * local(2, 1) * spatial(8, 4) * local(1, 2)
WORDS = spatial(128, 1) * local(1, 16)  # the same thread's 16 packed words: [r][K step]
SCALES = reduce_layout(WIDE, dims=[1], keepdims=True)  # the scales of its 4 rows


def stage_scale_bytes(weight: str, s_s) -> int:
    """Bytes of scales a stage brings: its 128 rows' group scales; none for row scales."""
    return 0 if weight == "int4_channel" else s_s.nbytes // s_s.shape[0]


def supports(m: int, n: int, k: int) -> bool:
    """The shapes V8 is designed for: at most 256 tokens, K a multiple of the group (128)."""
    return 1 <= m <= MAX_M and n >= 1 and k >= 1 and k % GROUP == 0


def shared_bytes(block_m: int, split: int, stages: int, wide_stages: int = 2) -> int:
    """Shared memory of a configuration: the ring plus the split-K exchange tiles."""
    ring = stages * (ROWS * BLOCK_K // 2 + ROWS * 2 + block_m * BLOCK_K * 2)
    return ring + (2 * split - 1) * (ROWS // split) * block_m * 4


def tmem_columns(block_m: int, wide_stages: int) -> int:
    """Tensor-memory columns of a CTA: the accumulator and the widened tiles, each allocation a power of two."""

    def allocation(columns: int) -> int:
        return max(32, 1 << (columns - 1).bit_length())

    return allocation(block_m) + allocation(wide_stages * BLOCK_K // 2)


@tilus.autotune(
    "block_m, split, stages, wide_stages",
    [(32, 2, 4, 2), (32, 4, 4, 2), (64, 2, 4, 2), (128, 2, 3, 2), (128, 1, 3, 2)],
)
class Kernel(PackedWeightKernel):  # Hopper V8's arguments (entry.PackedWeightKernel)
    def __init__(
        self,
        dtype,
        block_m: int,
        split: int,
        stages: int,
        wide_stages: int = 2,
        b_layout: str = "nk",
        bias: bool = False,
        activation: str = "",
        weight: str = "int4",
    ):
        super().__init__(dtype, b_layout=b_layout, bias=bias, activation=activation)
        self.block_m = block_m
        self.split = split
        self.stages = stages
        self.wide_stages = wide_stages
        if ROWS % split or (ROWS // split) % 8:
            raise ValueError(f"{ROWS} weight rows do not cut into {split} slices of a multiple of 8")
        if b_layout != "nk" or bias or activation:
            raise ValueError("V8 reads its packed weight in one layout, with a plain epilogue")
        if weight not in WEIGHTS:
            raise ValueError(f"weight format {weight!r}: one of {', '.join(WEIGHTS)}")
        self.weight = weight
        self.row_scales = weight == "int4_channel"  # (a Python bool: kernel code reads it at build time)

    def matmul(
        self,
        g_a: GlobalTensor,
        g_w: GlobalTensor,
        g_s: GlobalTensor,
        g_c: GlobalTensor,
        m_size: int32,
        n_size: int32,
        k_size: int32,
    ):
        num_n_tiles = cdiv(n_size, ROWS)
        num_m_tiles = cdiv(m_size, self.block_m)
        self.attrs.blocks = self.split * num_n_tiles * num_m_tiles
        self.attrs.cluster_blocks = self.split
        self.attrs.warps = 6
        stages = self.stages
        rank: int32 = self.cluster.blockRank
        tile: int32 = self.blockIdx.x // self.split
        offset_m: int32 = (tile % num_m_tiles) * self.block_m
        offset_n: int32 = (tile // num_m_tiles) * ROWS

        k_blocks = SplitKRange(cdiv(k_size, BLOCK_K), self.split, rank)

        s_w = self.shared_tensor(dtype=int32, shape=[stages, PACKED_BOX[0], PACKED_BOX[1]])
        self.annotate_layout(s_w, shared_row_major(stages, PACKED_BOX[0], PACKED_BOX[1]))
        s_s = self.shared_tensor(dtype=self.dtype, shape=[stages, 1, ROWS])
        self.annotate_layout(s_s, shared_row_major(stages, 1, ROWS))
        s_x = self.shared_tensor(dtype=self.dtype, shape=[stages, BLOCK_K // PART, self.block_m, PART])
        t_acc = self.tcgen05.alloc(dtype=float32, shape=[ROWS, self.block_m])
        t_wide = self.tcgen05.alloc(dtype=self.dtype, shape=[self.wide_stages, ROWS, BLOCK_K])
        with self.single_warp():  # the allocating warp: the CTA will not allocate again
            self.tcgen05.relinquish_alloc_permit(cta_group=1)
        # a slot is read by the widening threads (words, scales) and by the MMAs (tokens): both release it
        ring = Pipeline(stages, consumer_arrivals=1 + 128)
        # TMEM buffers of widened tiles, handed to the MMA warp and back (tcgen05 fences at each side)
        wide = Pipeline(self.wide_stages, producer_arrivals=128, tcgen05_fences=True)
        acc_ready = self.mbarrier.alloc(counts=[1])
        reduce = ClusterSplitKReduce(self.split, ROWS, self.block_m)
        # every barrier of the cluster exists before a peer's copy lands on it: announced now, waited
        # for before the exchange (nothing before it reaches a peer: the main loop starts at once)
        reduce.arrive_after_init()

        with self.single_warp(TMA_WARP):  # producer: the packed tile, its scales, the tokens
            for i in range(k_blocks.count):
                ring.producer_acquire()
                slot = ring.producer_stage
                with self.single_thread():
                    self.mbarrier.arrive_and_expect_tx(
                        ring.producer_barrier(),
                        transaction_bytes=s_w[slot].nbytes + stage_scale_bytes(self.weight, s_s) + s_x[slot].nbytes,
                    )
                block = k_blocks.first + i
                self.tma.global_to_shared(
                    src=g_w,
                    dst=s_w[slot],
                    offsets=[offset_n // ROWS * PACKED_BOX[0], block * PACKED_BOX[1]],
                    mbarrier=ring.producer_barrier(),
                )
                if not self.row_scales:
                    self.tma.global_to_shared(
                        src=g_s, dst=s_s[slot], offsets=[block, offset_n], mbarrier=ring.producer_barrier()
                    )
                for part in range(BLOCK_K // PART):
                    self.tma.global_to_shared(
                        src=g_a,
                        dst=s_x[slot, part],
                        offsets=[offset_m, block * BLOCK_K + part * PART],
                        mbarrier=ring.producer_barrier(),
                    )
                ring.producer_advance()

        with self.single_warp(MMA_WARP):  # C^T tile += widened weight (TMEM) @ tokens^T (shared memory)
            for i in range(k_blocks.count):
                ring.consumer_acquire()  # the tokens
                wide.consumer_acquire()  # the widened tile, stored and fenced by every widening thread
                slot = ring.consumer_stage
                for part in range(BLOCK_K // PART):
                    a = self.tcgen05.slice(
                        t_wide[wide.consumer_stage], offsets=[0, part * PART], dims=[0, 1], shape=[ROWS, PART]
                    )
                    self.tcgen05.mma(a, s_x[slot, part].transpose(), t_acc, enable_input_d=i + part != 0)
                self.tcgen05.commit(mbarrier=ring.consumer_barrier())  # the tokens' slot, once these MMAs are done
                self.tcgen05.commit(mbarrier=wide.consumer_barrier())  # the TMEM buffer, likewise
                ring.consumer_advance()
                wide.consumer_advance()
            self.tcgen05.commit(mbarrier=acc_ready[0])

        with self.warp_group(warp_begin=0, num_warps=4):  # widen each K block into TMEM, then drain the accumulator
            s_split = self.reshape_shared(s_w, [stages] + WORD_SPLIT)
            s_words = self.reshape_shared(s_split.permute(STAGED_ORDER), [stages, ROWS, 16])
            s_scale = self.reshape_shared(s_s, [stages, ROWS, 1])
            for i in self.range(k_blocks.count, unroll=1):  # noqa: B007
                ring.consumer_acquire()
                slot = ring.consumer_stage
                words = self.load_shared(s_words[slot])
                self.annotate_layout(words, WORDS)
                if self.row_scales:
                    wide_tile = self.integers(words)
                else:
                    scale = self.load_shared(s_scale[slot])
                    self.annotate_layout(scale, SCALES)
                    wide_tile = self.widen(words, scale)
                ring.consumer_release()  # every thread, its packed words and scales in registers
                ring.consumer_advance()
                wide.producer_acquire()  # the MMAs that read this buffer last are complete
                self.tcgen05.store(t_wide[wide.producer_stage], wide_tile)
                self.tcgen05.wait_store()  # the store has landed in TMEM before the MMA warp hears of it
                fence_before_thread_sync()
                wide.producer_release()
                wide.producer_advance()
            self.mbarrier.wait(acc_ready[0], phase=0)
            fence_after_thread_sync()
            partial = self.tcgen05.load(t_acc)
            self.tcgen05.wait_load()
            if self.row_scales:  # each thread's row (its TMEM lane) times the row's float32 scale
                row_scale = self.load_global(g_s, offsets=[offset_n, 0], shape=[ROWS, 1])
                reduce.store(partial * row_scale, 0)
            else:
                reduce.store(partial, 0)

        reduce.wait_for_peers()
        fence_before_thread_sync()
        reduce.exchange(rank)
        fence_after_thread_sync()
        self.tcgen05.dealloc(t_wide)
        self.tcgen05.dealloc(t_acc)
        with self.warp_group(warp_begin=0, num_warps=4):
            reduce.write(rank, g_c, offset_m, offset_n, self.epilogue)
        reduce.exit_barrier()  # no CTA leaves while a peer's copy may still read its partial tile

    def scale_view(self, scales_ptr: void_p, n_pad: int32, k_size: int32) -> GlobalTensor:
        """Group scales as Hopper V8's, [K / 128, N_pad]; row scales: float32 [N_pad, 1] (``matmul.quant``)."""
        return scale_view(self, scales_ptr, n_pad, k_size, self.row_scales, GROUP)

    def integers(self, words: RegisterTensor) -> RegisterTensor:
        """A thread's 16 packed words (128 int4 values) as the 16-bit tile ``WIDE`` of integers -8..7."""
        return self.view(int4_pairs(words, self.dtype), layout=WIDE, dtype=self.dtype)

    def widen(self, words: RegisterTensor, scale: RegisterTensor) -> RegisterTensor:
        """A thread's 16 packed words (128 int4 values) as the 16-bit tile ``WIDE``, times its rows' scales."""
        wide = self.integers(words)
        scaled = wide * scale
        self.annotate_layout(scaled, WIDE)
        return scaled
