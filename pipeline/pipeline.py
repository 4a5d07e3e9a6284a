"""A ring of shared-memory stages handed from a producer to a consumer through mbarriers.

What V4 needs (one CTA)
-----------------------
A ring of ``num_stages`` stages. Each stage ``s`` has two barriers:

* ``full[s]``  -- the producer says "stage s holds data". It completes when ``producer_arrivals``
  arrivals have been made *and* every byte announced with ``expect_tx`` (TMA) has landed.
* ``empty[s]`` -- the consumer says "stage s may be overwritten". It completes after
  ``consumer_arrivals`` arrivals (threads calling ``consumer_release``, or a ``tcgen05.commit``).

Phases: both sides walk the ring in the same order and keep a phase bit that flips each time they
wrap around, so a wait on a barrier always names the phase it expects to see completed. The
producer starts with phase 1 on ``empty`` (every stage is free at the start: waiting for "the phase
before the first" returns at once); the consumer starts with phase 0 on ``full``.

Arrival counts: by default every thread of the group that calls ``consumer_release`` arrives, so
``consumer_arrivals`` counts threads (for example 128 for one warpgroup). With
``elect_release=True`` one elected thread of the calling group arrives, so ``consumer_arrivals``
counts consumer groups. Use it only where the group's work on the stage is complete for all of its
threads once one of them has seen it complete: a warpgroup after ``wgmma.wait_group`` (a wgmma
group is issued and waited by the four warps together). This is how CUTLASS's Hopper pipelines
release. A consumer that keeps one MMA group in flight releases the stage *before* the current
one, once ``wgmma.wait_group 1`` shows it done: ``consumer_release_previous``.

Tensor-memory stages: with ``tcgen05_fences=True`` the stages are TMEM buffers (Blackwell's
accumulator ring): every wait is followed by ``tcgen05.fence::after_thread_sync`` and every
``consumer_release`` is preceded by ``tcgen05.fence::before_thread_sync``
(``pipeline.tcgen05_fence``), so the tcgen05 operations of the thread that takes a buffer over are
ordered after those of the thread that handed it over. A ``tcgen05.commit`` that completes a
barrier carries the "before" fence itself.

Cluster pipelines (the cluster versions, V6)
--------------------------------------------
The same class serves rings whose producer and consumers sit in different CTAs of a cluster:

* ``scope="cluster"``: the waits acquire at cluster scope, so that arrivals and data coming from
  a peer CTA are visible.
* ``release_to`` is a bit mask of the CTAs (by rank in the cluster, up to 4) whose ``empty``
  barrier a consumer arrives on; 0 (the default) means this CTA's own barrier. ``0b01`` sends every
  release to the leader CTA (Blackwell 2-CTA MMA: the leader issues the MMA that reads both CTAs'
  stages); ``0b11`` releases the stage in both CTAs (Hopper multicast: both CTAs' TMA refill a
  stage, so both must know it is free). The arrival count of ``empty`` must then count the
  consumers of every CTA that releases to it; with ``elect_release`` one elected thread arrives
  per CTA of ``release_to``.
* ``release_offset``: a cluster that holds several groups of CTAs side by side, each with a ring
  of its own shape (Hopper V7 with split-K and multicast: the CTAs that share a K range share the
  weight's stages), releases to ranks that depend on the CTA's group, known at run time only. The
  ranks are then ``release_to``'s shifted by ``release_offset`` (an int32, one of
  ``release_offsets`` values ``0, 1, ...``, at most 4). An arrival's mask is built into the kernel,
  so the release takes one branch per offset. With ``elect_release`` the ranks reach up to 7 (an
  8-CTA cluster); without it, up to 3 (``arrive_on_ranks``).
* ``cluster_fences``: what a cluster-scope barrier costs. On sm_90a and sm_100a a wait that
  acquires at cluster scope is followed by an invalidation of the SM's L1 (``CCTL.IVALL``), and an
  arrival that releases at cluster scope is preceded by ``MEMBAR.ALL.GPU``. Once per K block that
  is expensive. A ring whose stages carry only what the hardware itself orders needs neither: TMA
  bytes are counted on the barrier they complete on (``complete_tx``), and a ``tcgen05.commit`` or
  a ``wgmma.wait_group`` shows the MMAs that read a stage complete before the release is issued.
  ``cluster_fences=False`` then keeps the arrivals' reach (peer CTAs' barriers, ``release_to``)
  but orders them at CTA scope (acquire.cta waits, release.cta arrivals), as CUTLASS's TMA
  pipelines do. Keep the default (True) where a stage hands over data written by plain stores
  from another CTA.
* ``producer_tail()``: a peer's multicast ``tcgen05.commit`` may still be on its way into this
  CTA's ``empty`` barriers after the last wait of the peer's MMA warp; before the producer's CTA
  exits, the producer waits once more on every stage, for the releases of the last fills.
"""

import tilus
from tilus import RegisterTensor, int32, uint32

from .tcgen05_fence import fence_after_thread_sync, fence_before_thread_sync


class Pipeline(tilus.Class):
    def __init__(
        self,
        num_stages: int,
        producer_arrivals: int = 1,
        consumer_arrivals: int = 1,
        scope: str = "cta",
        release_to: int = 0,
        elect_release: bool = False,
        cluster_fences: bool = True,
        tcgen05_fences: bool = False,
        release_offset: int32 = 0,
        release_offsets: int = 1,
    ):
        self.num_stages: int = num_stages
        self.scope: str = scope
        self.release_to: int = release_to
        # release_to's ranks shifted by release_offset (a run-time value, below release_offsets)
        if not 1 <= release_offsets <= 4:  # release_barrier has a branch for offsets 0-3 only
            raise ValueError(f"release_offsets is 1 to 4, not {release_offsets}")
        self.release_offset = release_offset
        self.release_offsets: int = release_offsets
        self.elect_release: bool = elect_release
        self.tcgen05_fences: bool = tcgen05_fences
        # the scope the waits acquire at and cross-CTA arrivals release at (see the module doc)
        self.order_scope: str = scope if cluster_fences else "cta"
        self.remote_scope: str = "cluster" if cluster_fences else "cta"
        self.full = self.mbarrier.alloc([producer_arrivals for _ in range(num_stages)])
        self.empty = self.mbarrier.alloc([consumer_arrivals for _ in range(num_stages)])
        self.producer_stage: int32 = 0
        self.consumer_stage: int32 = 0
        self.producer_phase: uint32 = self.mbarrier.producer_initial_phase
        self.consumer_phase: uint32 = self.mbarrier.consumer_initial_phase

    # -- producer side --------------------------------------------------------------------------
    def producer_acquire(self):
        """Wait until the current stage is free to be filled."""
        self.mbarrier.wait(self.empty[self.producer_stage], phase=self.producer_phase, scope=self.order_scope)
        if self.tcgen05_fences:
            fence_after_thread_sync()

    def producer_barrier(self) -> RegisterTensor:
        """The barrier the producer's writes complete on (give it to TMA or tcgen05.commit)."""
        return self.full[self.producer_stage]

    def producer_release(self):
        """Arrive on the current stage's ``full`` barrier (producers that write with plain stores)."""
        self.mbarrier.arrive(self.full[self.producer_stage], scope=self.order_scope)

    def after(self, stage: int32) -> int32:
        """The stage after ``stage`` around the ring: a compare and a select, not ``% num_stages``:
        with a ring depth that is no power of two (7, 13) the remainder is a multiply-high chain on
        the consumer's path from one MMA group's completion to the next group's issue."""
        return 0 if stage + 1 == self.num_stages else stage + 1

    def producer_advance(self):
        self.producer_stage = self.after(self.producer_stage)
        self.producer_phase = self.producer_phase ^ (self.producer_stage == 0)

    def producer_tail(self):
        """Before the producer's CTA exits: wait until the consumers have released every stage, so
        that no arrival is still on its way into this CTA's shared memory (a peer's multicast
        ``tcgen05.commit`` completes asynchronously, after the peer's last wait)."""
        for _ in range(self.num_stages):
            self.producer_acquire()
            self.producer_advance()

    # -- consumer side --------------------------------------------------------------------------
    def consumer_acquire(self):
        """Wait until the current stage holds data."""
        self.mbarrier.wait(self.full[self.consumer_stage], phase=self.consumer_phase, scope=self.order_scope)
        if self.tcgen05_fences:
            fence_after_thread_sync()

    def consumer_barrier(self) -> RegisterTensor:
        """The barrier that frees the current stage (give it to tcgen05.commit)."""
        return self.empty[self.consumer_stage]

    def consumer_release(self):
        """Arrive on the current stage's ``empty`` barrier: this CTA's, or those of ``release_to``."""
        if self.tcgen05_fences:
            fence_before_thread_sync()
        self.release_barrier(self.empty[self.consumer_stage])

    def consumer_release_previous(self):
        """Release the stage before the current one (a consumer that keeps one MMA group in
        flight releases the previous K block's stage once the current block's MMA is issued)."""
        previous = self.num_stages - 1 if self.consumer_stage == 0 else self.consumer_stage - 1
        self.release_barrier(self.empty[previous])

    def release_barrier(self, barrier: RegisterTensor):
        """Arrive on an ``empty`` barrier as ``release_to``, ``release_offset`` and ``elect_release`` say."""
        if self.release_to == 0:
            if self.elect_release:
                with self.single_thread():
                    self.mbarrier.arrive(barrier, scope=self.order_scope)
            else:
                self.mbarrier.arrive(barrier, scope=self.order_scope)
        elif self.release_offsets == 1:
            self.release_to_ranks(barrier, self.release_to)
        else:
            # the offset is known at run time only, each branch's ranks when the kernel is built
            if self.release_offset == 0:
                self.release_to_ranks(barrier, self.release_to)
            if self.release_offset == 1:
                self.release_to_ranks(barrier, self.release_to << 1)
            if self.release_offsets > 2:
                if self.release_offset == 2:
                    self.release_to_ranks(barrier, self.release_to << 2)
                if self.release_offset == 3:
                    self.release_to_ranks(barrier, self.release_to << 3)

    def release_to_ranks(self, barrier: RegisterTensor, ranks: int):
        """Arrive on ``barrier`` in each CTA of the bit mask ``ranks`` (known when the kernel is built)."""
        if self.elect_release:
            # thread i of the calling group arrives on the barrier of CTA rank i, for each bit i
            self.mbarrier.arrive_and_expect_tx_multicast(
                barrier, transaction_bytes=0, multicast_mask=ranks, scope=self.remote_scope
            )
        else:
            self.arrive_on_ranks(barrier, ranks)

    def arrive_on_ranks(self, barrier: RegisterTensor, ranks: int):
        """Arrive on ``barrier`` in each CTA of the bit mask ``ranks``. The mask is known when the
        kernel is built, so the branches fold away."""
        if ranks & 0b0001:
            self.mbarrier.arrive_and_expect_tx_remote(
                barrier, transaction_bytes=0, target_rank=0, scope=self.remote_scope
            )
        if ranks & 0b0010:
            self.mbarrier.arrive_and_expect_tx_remote(
                barrier, transaction_bytes=0, target_rank=1, scope=self.remote_scope
            )
        if ranks & 0b0100:
            self.mbarrier.arrive_and_expect_tx_remote(
                barrier, transaction_bytes=0, target_rank=2, scope=self.remote_scope
            )
        if ranks & 0b1000:
            self.mbarrier.arrive_and_expect_tx_remote(
                barrier, transaction_bytes=0, target_rank=3, scope=self.remote_scope
            )

    def consumer_advance(self):
        self.consumer_stage = self.after(self.consumer_stage)
        self.consumer_phase = self.consumer_phase ^ (self.consumer_stage == 0)

    def consumer_skip(self, count: int32):
        """Move the consumer position ``count`` stages on without waiting or releasing: the stages
        another consumer takes in between (ping-pong warpgroups share one ring, tile by tile). The
        phase flips once for each time the position wraps around."""
        passed: int32 = self.consumer_stage + count
        self.consumer_stage = passed % self.num_stages
        self.consumer_phase = self.consumer_phase ^ ((passed // self.num_stages) % 2 == 1)
