"""Persistent tile scheduling with cluster launch control (CLC, Blackwell).

A CLC kernel is launched with one cluster per output tile, as a non-persistent one. A running
cluster asks the hardware to *cancel* a cluster that has not started yet
(``clusterlaunchcontrol.try_cancel``) and, if that works, computes the cancelled cluster's tile
itself: the 16-byte response names the first CTA of the cancelled cluster. When the request fails
no cluster is left to steal and the CTA exits. The prologue (barrier init, TMEM allocation) is paid
once per CTA, not once per tile, and SMs that finish early simply steal more tiles.

``ClcScheduler`` is a ``Pipeline`` whose slots are responses. One warp (of the leader CTA, rank 0,
in a cluster) is the producer: ``request`` waits for a free slot, announces the 16 response bytes
on the slot's ``full`` barrier and issues ``try_cancel``. Every warp that needs to know the next
tile is a consumer: ``next_tile`` waits for the response, decodes it and releases the slot. Every
consumer reads every response, in order, including the last (failed) one, after which it stops.

Barrier invariants:

* ``full[s]``: 1 arrival (the producer's ``arrive.expect_tx`` of 16 bytes) + the 16 response
  bytes. In a cluster of ``cluster_ctas`` CTAs the producer arrives on ``full[s]`` of every CTA
  (one lane per CTA, ``mbarrier.arrive.expect_tx.shared::cluster``) and the response is multicast
  to the same offset in every CTA, so each CTA waits on its own ``full[s]``.
* ``empty[s]``: ``consumer_arrivals`` arrivals, one per consumer thread of every CTA of the
  cluster; in a cluster every consumer arrives on the leader's ``empty[s]``, since only the leader
  issues requests.

Waits and arrivals order at CTA scope, also across the cluster (``Pipeline(cluster_fences=False)``):
the response lands by ``complete_tx`` on the barrier the reader waits on, so no cluster-scope
fence is needed on either side.

The producer must consume each response before it issues the next request: ``try_cancel`` after a
CTA has seen a failed response is undefined, so the producer loop is ``request(); next_tile()``.
"""

import tilus
from tilus import int32

from .pipeline import Pipeline

RESPONSE_BYTES = 16  # an opaque 128-bit response per request


class ClcScheduler(tilus.Class):
    def __init__(self, num_stages: int, consumer_arrivals: int, cluster_ctas: int = 1):
        """``consumer_arrivals``: consumer threads per CTA that call ``next_tile``; ``cluster_ctas``:
        CTAs per cluster (1 for a single-CTA kernel)."""
        self.cluster_ctas: int = cluster_ctas
        self.responses = self.shared_tensor(dtype=int32, shape=[num_stages, 4])
        if cluster_ctas == 1:
            self.pipe = Pipeline(num_stages, consumer_arrivals=consumer_arrivals)
        else:
            # the response lands by complete_tx in every CTA: CTA-scope waits and arrivals suffice
            self.pipe = Pipeline(
                num_stages,
                consumer_arrivals=consumer_arrivals * cluster_ctas,
                scope="cluster",
                release_to=0b1,
                cluster_fences=False,
            )

    def first_tile(self) -> int32:
        """The linear tile (cluster) index this CTA was launched for."""
        return self.blockIdx.x // self.cluster_ctas

    def request(self):
        """Producer (one warp; the leader CTA's in a cluster): ask to cancel a not yet launched cluster."""
        self.pipe.producer_acquire()
        if self.cluster_ctas == 1:
            with self.single_thread():
                self.mbarrier.arrive_and_expect_tx(self.pipe.producer_barrier(), transaction_bytes=RESPONSE_BYTES)
            self.clc.try_cancel(
                self.responses[self.pipe.producer_stage], mbarrier=self.pipe.producer_barrier(), multicast=False
            )
        else:
            # one lane per CTA arrives on that CTA's full barrier; the response goes to every CTA
            self.mbarrier.arrive_and_expect_tx_multicast(
                self.pipe.producer_barrier(),
                transaction_bytes=RESPONSE_BYTES,
                multicast_mask=(1 << self.cluster_ctas) - 1,
                scope="cta",
            )
            self.clc.try_cancel(
                self.responses[self.pipe.producer_stage], mbarrier=self.pipe.producer_barrier(), multicast=True
            )
        self.pipe.producer_advance()

    def next_tile(self):
        """Consumer (every thread of the calling group): (is_valid, linear tile index) of the next
        response; when is_valid is false the tile index is meaningless and the caller stops."""
        self.pipe.consumer_acquire()
        is_valid, first_cta = self.clc.query_response(self.responses[self.pipe.consumer_stage])
        self.pipe.consumer_release()
        self.pipe.consumer_advance()
        tile: int32 = first_cta.x // self.cluster_ctas
        return is_valid, tile
