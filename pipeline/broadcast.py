"""Transports between the CTAs of a cluster: values one CTA decides and every CTA of the cluster
needs, carried through distributed shared memory (``pipeline.dsmem``) and counted on mbarriers.

``LeaderTileBroadcast`` delivers the tile sequence the leader CTA of a 2-CTA cluster picks to
every reader role of both CTAs (Hopper V6).
"""

import tilus
from tilus import int32, uint32

from .dsmem import async_store_to_rank, load_after_wait


class LeaderTileBroadcast(tilus.Class):
    """A 2-CTA cluster's tile sequence, decided by the leader CTA (rank 0) and delivered to both.

    The leader's deciding warp ``send``s each linear tile index (and finally an index past the
    last tile, meaning "stop"); every reader group of both CTAs ``receive``s the same sequence. The
    values travel through a ring of ``depth`` int32 slots present in each CTA:

    ``filled[d]`` (each CTA, arrival count 1, plus 4 bytes): the sender announces the 4 bytes on
    both CTAs' ``filled[d]`` (``arrive.expect_tx``) and writes slot ``d`` of both with ``st.async``,
    which counts its bytes on that barrier as a TMA load does. Readers wait on it at CTA scope.
    ``drained[d]`` (leader only, arrival count ``readers``, the reader groups of both CTAs
    together): each reader group, once all its threads have read the slot (a barrier of the
    group), arrives on the leader's ``drained[d]`` from one elected thread; the sender waits on it
    before writing slot ``d`` again.

    Nothing here needs a cluster-scope fence: the value is ordered by its own byte count on the
    barrier the reader waits on (as TMA bytes are), and the slot is rewritten only by ``st.async``
    after the readers' arrivals, as a ring stage is refilled by TMA after the consumers' release.
    A plain ``st.shared::cluster`` would have to be published by release/acquire at cluster scope:
    on sm_90a a ``MEMBAR.ALL.GPU`` and an L1 invalidation on every reader at every tile start, on
    the tensor core's critical path.

    Both barriers start the usual way (``drained`` free, ``filled`` empty), and each side keeps a
    slot index and a phase bit that flips when it wraps around, like ``Pipeline``. The peer's
    ``drained`` barriers exist (every CTA runs the same allocation) but are never used.
    """

    def __init__(self, depth: int, readers: int):
        self.depth: int = depth
        self.slots = self.shared_tensor(dtype=int32, shape=[depth, 1])
        self.filled = self.mbarrier.alloc([1 for _ in range(depth)])
        self.drained = self.mbarrier.alloc([readers for _ in range(depth)])
        self.send_slot: int32 = 0
        self.send_phase: uint32 = self.mbarrier.producer_initial_phase
        self.recv_slot: int32 = 0
        self.recv_phase: uint32 = self.mbarrier.consumer_initial_phase

    def send(self, linear: int32):
        """Deliver ``linear`` to both CTAs. Called by one warp of the leader CTA (one elected
        thread of it announces and writes; every lane keeps the ring position)."""
        self.mbarrier.wait(self.drained[self.send_slot], phase=self.send_phase, scope="cta")
        with self.single_thread():
            for rank in range(2):
                self.mbarrier.arrive_and_expect_tx_remote(
                    self.filled[self.send_slot], transaction_bytes=4, target_rank=rank, scope="cta"
                )
                async_store_to_rank(self.slots[self.send_slot], linear, rank, self.filled[self.send_slot])
        self.send_slot = (self.send_slot + 1) % self.depth
        self.send_phase = self.send_phase ^ (self.send_slot == 0)

    def receive(self) -> int32:
        """The next linear tile index (past the last tile: stop). Called by every thread of a
        reader group (a warp or a warpgroup) of either CTA."""
        self.mbarrier.wait(self.filled[self.recv_slot], phase=self.recv_phase, scope="cta")
        linear: int32 = load_after_wait(self.slots[self.recv_slot])
        self.sync()  # every thread of the group has its copy before the slot is handed back
        with self.single_thread():
            self.mbarrier.arrive_and_expect_tx_remote(
                self.drained[self.recv_slot], transaction_bytes=0, target_rank=0, scope="cta"
            )
        self.recv_slot = (self.recv_slot + 1) % self.depth
        self.recv_phase = self.recv_phase ^ (self.recv_slot == 0)
        return linear
