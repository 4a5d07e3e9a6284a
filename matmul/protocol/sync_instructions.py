"""The instructions that synchronize or work asynchronously: mbarrier allocation, arrivals (with
``expect_tx``, remote, multicast) and parity waits, ``bar.sync`` and ``barrier.cluster``, TMA loads
and stores with their bulk groups, wgmma groups, ``tcgen05`` MMAs, commits, loads and waits,
cluster launch control, and the DSMEM calls (``st.async``, bulk copies to a peer CTA).

A wait yields the condition the scheduler waits for; an asynchronous effect (bytes landing, a
commit's arrival, a CLC response) becomes a ``state.AsyncOp`` that lands when the scheduler fires
it; the asynchronous accesses still in flight (an MMA's operand reads and TMEM writes until a
commit of its thread lands or ``wgmma.wait_group``, a ``tcgen05.ld`` until ``tcgen05.wait::ld``, a
TMA store's reads until its bulk ``wait_group``) are recorded so that an overwrite of what they
touch is a race. The model follows tilus's emitters: a TMA copy or a commit is issued once, by the
warp's leader lane; thread ``i`` of a multicast arrival arrives on rank ``i``.

``SyncInstructions`` is a mixin of ``machine.Machine``: what each instruction does, on top of the
barrier rules (``events``) and the scheduler's clusters (``machine``).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from tilus.hidet.ir import expr as hx

from .state import (
    AccTag,
    AsyncOp,
    Barrier,
    BarrierAddr,
    Cta,
    GlobalRef,
    GroupBarrier,
    LoadTag,
    MemRef,
    Reader,
    RegVal,
    SharedAddr,
)


class SyncInstructions:
    """Handlers of the synchronizing and asynchronous instructions and calls."""

    def evaluate(self, e, env, role, group, active) -> Iterator:
        if not isinstance(e, hx.Call):
            self.eval(e, env, role)
            return
        fname = e.func_var.name
        # the relaxed form (pipeline.cluster_reduce's exit barrier) orders no memory; nothing is read after it
        if fname in ("this_cluster.sync", "cuda_cluster_sync_relaxed"):
            bar = self.cluster_bars[role.cta.cluster]
            if role.cluster_arrival is not None:
                self.fail("overrun", f"{role.name}: a cluster barrier while its earlier arrival was not waited for")
            yield from self.group_sync(role, bar, active[1] - active[0])
            role.cluster_synced = True
        elif fname == "cuda_cluster_arrive_after_init":  # a split cluster barrier's arrival
            if role.cluster_arrival is not None:
                self.fail("overrun", f"{role.name}: arrives at the cluster barrier twice without waiting")
            role.cluster_arrival = self.group_arrive(role, self.cluster_bars[role.cta.cluster], active[1] - active[0])
            yield None
        elif fname == "cuda_cluster_wait_for_peers":  # ... and its wait
            bar = self.cluster_bars[role.cta.cluster]
            generation = role.cluster_arrival
            if generation is None:
                self.fail("unsupported", f"{role.name}: waits at the cluster barrier without arriving first")
            role.cluster_arrival = None
            yield (lambda: bar.generation > generation), None, bar.name
            role.cluster_synced = True
        elif fname == "cuda_st_async_cluster_b32":
            local_addr, local_bar, rank, value = [self.eval(a, env, role) for a in e.args]
            target = self.cta_of(role.cta, rank)
            self.check_peer_ready(role, target, "st.async")
            slot = SharedAddr(target.index, local_addr.alloc, local_addr.start)
            bar = BarrierAddr(target.index, local_bar.alloc, local_bar.index)

            def land(slot=slot, bar=bar, value=value, who=role.name):
                self.ctas[slot.cta].values[slot] = value
                self.complete_tx(bar, 4, f"st.async from {who} (value {value})")

            self.log(f"{role.name}: st.async {value} to cta{target.index}")
            self.async_ops.append(AsyncOp(f"st.async from {role.name}", land, (target.index,), byte_barriers=(bar,)))
            yield None
        elif fname == "cuda_bulk_copy_to_rank":
            local_dst, src, size, local_bar, rank = [self.eval(a, env, role) for a in e.args]
            target = self.cta_of(role.cta, rank)
            self.check_peer_ready(role, target, "a bulk copy")
            bar = BarrierAddr(target.index, local_bar.alloc, local_bar.index)
            # the source's tags travel with the bytes, over the elements the copy covers
            length = int(size / role.cta.allocs[src.alloc].elem_bytes)
            tags = [
                (max(st, src.start) - src.start, min(en, src.start + length) - src.start, tag)
                for st, en, tag in role.cta.tags[src.alloc]
                if st < src.start + length and en > src.start
            ]

            def land(target=target, bar=bar, tags=tags, size=size, who=role.name):
                entries = target.tags[local_dst.alloc]
                lo, hi = local_dst.start, local_dst.start + length
                self.check_write(target, local_dst.alloc, lo, hi, f"a bulk copy from {who}")
                entries[:] = [e for e in entries if e[1] <= lo or e[0] >= hi]
                entries.extend((lo + st, lo + en, tag) for st, en, tag in tags)
                self.complete_tx(bar, size, f"bulk copy from {who} into cta{target.index}")

            self.log(f"{role.name}: bulk copy of {size} bytes to cta{target.index}")
            # it reads the sender's shared memory until it lands, as it writes the receiver's: neither may exit first
            touched = (target.index, role.cta.index)
            self.async_ops.append(AsyncOp(f"a bulk copy from {role.name}", land, touched, byte_barriers=(bar,)))
            yield None
        else:
            self.eval(e, env, role)

    def i_AllocBarrierInst(self, inst, env, role, group, active):
        cta = role.cta
        key = id(inst)

        def make():
            counts = [self.eval(c, env, role) if c is not None else group[1] - group[0] for c in inst.counts]
            alloc = len(cta.allocs)
            for i, c in enumerate(counts):
                addr = BarrierAddr(cta.index, key, i)
                cta.barriers[(key, i)] = Barrier(addr, c, f"cta{cta.index}.mbar{alloc}[{i}]")
            return RegVal([BarrierAddr(cta.index, key, i) for i in range(len(counts))], (len(counts),))

        env[inst.register_output] = self._alloc(inst, role, make)

    def _threads(self, active) -> int:
        return active[1] - active[0]

    def i_ArriveBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        count = self.eval(inst.count, env, role)
        self.arrive(role, addr, self._threads(active) * count, 0, "arrive")
        yield None

    def i_ArriveExpectTxBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        nbytes = self.eval(inst.transaction_bytes, env, role)
        k = self._threads(active)
        self.arrive(role, addr, k, k * nbytes, "arrive.expect_tx")
        yield None

    def i_ArriveExpectTxRemoteBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        nbytes = self.eval(inst.transaction_bytes, env, role)
        rank = self.eval(inst.target_rank, env, role)
        target = self.cta_of(role.cta, rank)
        k = self._threads(active)
        self.arrive(role, dataclasses.replace(addr, cta=target.index), k, k * nbytes, "remote arrive")
        yield None

    def i_ArriveExpectTxMulticastBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        nbytes = self.eval(inst.transaction_bytes, env, role)
        # thread i of the group arrives on the barrier of CTA rank i, for each bit i of the mask
        for lane in range(active[0] - group[0], active[1] - group[0]):
            if (inst.multicast >> lane) & 1:
                target = self.cta_of(role.cta, lane)
                self.arrive(role, dataclasses.replace(addr, cta=target.index), 1, nbytes, "multicast arrive")
        yield None

    def i_WaitBarrierInst(self, inst, env, role, group, active):
        addr = self.eval(inst.barrier, env, role)
        parity = self.eval(inst.phase, env, role)
        if addr.cta != role.cta.index:
            self.fail("unsupported", f"{role.name} waits on a barrier of another CTA")
        b = self.barrier(addr)
        b.observed.setdefault(role, None)

        def ready():
            return (b.completed & 1) != (parity & 1)

        def resume():
            seen = b.completed - 1
            # consumers that take turns at a ring's stages each see every other fill of a stage:
            # together they must see each phase once, in order (Machine.turn_taking)
            team = self.turn_taking and b.loaded
            last = b.team_observed() if team else b.observed.get(role)
            who = f"{role.name}'s team of turn-taking consumers" if team else "it"
            if last is None:
                if seen not in (-1, 0):
                    self.fail(
                        "overrun",
                        f"{role.name}'s first wait on {b.name} (parity {parity}) returns on phase "
                        f"{seen}: earlier phases were never observed",
                    )
            elif seen != last + 1:
                self.fail(
                    "overrun",
                    f"{role.name}'s wait on {b.name} (parity {parity}) returns on phase {seen}; "
                    f"{who} last saw phase {last}",
                )
            b.observed[role] = seen
            self.log(f"{role.name}: wait on {b.name} parity {parity} returns (phase {seen})")

        role.wait_barrier = b
        yield ready, resume, lambda: f"{b.name} parity {parity} ({b.state()})"

    def i_LockSemaphoreInst(self, inst, env, role, group, active):
        # a flag in global memory (a clean workspace: zero until set), waited for until it holds
        # `value` (ld.acquire.gpu in a loop): Hopper V5's stream-K finisher waiting for a partial
        key = self.workspace_key(self.eval(inst.semaphore, env, role), [])
        value = self.eval(inst.value, env, role)

        def ready():
            return self.global_memory.get(key, 0) == value

        def resume():
            self.log(f"{role.name}: {key[0]} at {key[1]} holds {value}")

        yield ready, resume, lambda: f"{key[0]} at {key[1]} to hold {value} (it holds {self.global_memory.get(key, 0)})"

    def i_ReleaseSemaphoreInst(self, inst, env, role, group, active):
        key = self.workspace_key(self.eval(inst.semaphore, env, role), [])
        value = self.eval(inst.value, env, role)
        self.log(f"{role.name}: sets {key[0]} at {key[1]} to {value}")
        self.global_memory[key] = value
        # other roles may run before this one's next instruction (a store the flag was raised too early for)
        yield (lambda: True), None, "nothing"

    def i_SyncThreadsInst(self, inst, env, role, group, active):
        cta = role.cta
        key = group
        if key not in cta.named:
            cta.named[key] = GroupBarrier(group[1] - group[0], f"cta{cta.index}.bar.sync[{group[0]}:{group[1]}]")
        return self.group_sync(role, cta.named[key], self._threads(active))

    # -- TMA --------------------------------------------------------------------------------------
    def whole(self, value) -> int:
        """Rows or K columns of B that a packed weight's box covers: a whole number, or the box
        cuts a word's values."""
        if value != int(value):
            self.fail("unsupported", f"a packed weight's box covers {value} rows or K columns")
        return int(value)

    def i_CopyAsyncTensorGlobalToSharedInst(self, inst, env, role, group, active):
        dst: MemRef = env[inst.inputs[0]]
        src: GlobalRef = env[inst.inputs[1]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        bar: BarrierAddr = self.eval(inst.mbarrier, env, role)
        mask = self.eval(inst.multicast_mask, env, role) if inst.multicast_mask is not None else None
        cta = role.cta
        if src.matrix not in "ABS":
            self.fail("unsupported", f"a TMA load from {src.matrix}")
        rows, cols = dst.shape[-2], dst.shape[-1]
        batch, offsets = _batch_of(offsets)
        if src.matrix == "B":  # a packed weight's box covers more rows and K columns than its elements
            units_r, units_k = self.b_units  # a box of whole tiles: whole rows and K columns (int6: 8/3 a word)
            r0, nr, k0, nk = (
                self.whole(v) for v in (offsets[0] * units_r, rows * units_r, offsets[1] * units_k, cols * units_k)
            )
            tag = LoadTag("B", r0, nr, k0, nk, batch)
        else:
            tag = LoadTag(src.matrix, offsets[0], rows, offsets[1], cols, batch)
        if src.matrix == "A" and self.k_block is None:
            self.k_block = cols
        if mask is None:
            dests = [(cta, bar)]
        else:
            dests = []
            bar_rank = self.ctas[bar.cta].rank
            for rank in range(self.cluster_size):
                if (mask >> rank) & 1:
                    d = self.cta_of(cta, rank)
                    if inst.cta_group == 2:  # the barrier of the same member (leader/peer) of d's pair
                        b_cta = self.cta_of(cta, (rank & ~1) + (bar_rank & 1))
                    else:
                        b_cta = d
                    dests.append((d, dataclasses.replace(bar, cta=b_cta.index)))
        nbytes = dst.nbytes
        for d, b in dests:
            self.barrier(b).loaded = True
            if d.exited:
                self.fail("exit", f"{role.name} TMA-loads into cta{d.index}, which has exited")
            self.check_write(d, dst.alloc, dst.start, dst.end, f"{role.name}'s TMA load")
            d.write_tag(dst.at(d.index), tag)

            def land(b=b, d=d):
                self.complete_tx(
                    b, nbytes, f"TMA load {src.matrix}[{offsets[0]}+{rows}, {offsets[1]}+{cols}] into cta{d.index}"
                )

            self.async_ops.append(
                AsyncOp(
                    f"a TMA load from {role.name}",
                    land,
                    (d.index, b.cta) if b.cta != d.index else (d.index,),
                    byte_barriers=(b,),
                )
            )
        self.log(
            f"{role.name}: TMA load {src.matrix}[{offsets[0]}:+{rows}, {offsets[1]}:+{cols}] "
            f"{nbytes} bytes to {[d.index for d, _ in dests]}"
        )
        yield None

    def i_CopyAsyncTensorSharedToGlobalInst(self, inst, env, role, group, active):
        dst: GlobalRef = env[inst.inputs[0]]
        src: MemRef = env[inst.inputs[1]]
        offsets = [self.eval(o, env, role) for o in inst.offsets]
        if dst.matrix != "C":
            self.fail("unsupported", f"a TMA store into {dst.matrix}")
        self.record_store(role, role.cta.read_tags(src), offsets, src.shape[-2:], "TMA store")
        reader = Reader(f"a TMA store by {role.name}")
        role.cta.add_reader(src, reader)
        role.uncommitted_stores.append(reader)

    def i_CopyAsyncTensorCommitGroupInst(self, inst, env, role, group, active):
        if role.uncommitted_stores:
            role.bulk_groups.append(role.uncommitted_stores)
            role.uncommitted_stores = []

    def i_CopyAsyncTensorWaitGroupInst(self, inst, env, role, group, active):
        _complete_all_but(role.bulk_groups, int(self.eval(inst.n, env, role)))

    # -- MMA --------------------------------------------------------------------------------------
    def _reads(self, cta: Cta, ref: MemRef) -> frozenset:
        return frozenset(t for t in cta.read_tags(ref.at(cta.index)) if isinstance(t, LoadTag))

    def i_WgmmaMmaSSInst(self, inst, env, role, group, active):
        a, b, d = (env[x] for x in inst.inputs)
        d.tag.terms.append((self._reads(role.cta, a), self._reads(role.cta, b)))
        reader = Reader(f"a wgmma of {role.name}")
        role.cta.add_reader(a, reader)
        role.cta.add_reader(b, reader)
        role.wgmma_open.append(reader)

    def i_WgmmaMmaRSInst(self, inst, env, role, group, active):
        # A in registers (Hopper V8's widened weight): a value the warpgroup loaded from shared memory
        # and widened before the wgmma, carrying the tag of the words it came from; only B is read
        # from shared memory while the wgmma runs, until its group is waited for
        a, b, d = (env[x] for x in inst.inputs)
        a_reads = frozenset([a.tag]) if isinstance(a.tag, LoadTag) else frozenset()
        d.tag.terms.append((a_reads, self._reads(role.cta, b)))
        reader = Reader(f"a wgmma of {role.name}")
        role.cta.add_reader(b, reader)
        role.wgmma_open.append(reader)

    def i_WgmmaCommitGroupInst(self, inst, env, role, group, active):
        role.wgmma_groups.append(role.wgmma_open)
        role.wgmma_open = []

    def i_WgmmaWaitGroupInst(self, inst, env, role, group, active):
        _complete_all_but(role.wgmma_groups, int(self.eval(inst.n, env, role)))

    def i_Tcgen05MmaSSInst(self, inst, env, role, group, active):
        a, b, d = (env[x] for x in inst.inputs)
        enable = self.eval(inst.enable_input_d, env, role)
        cta = role.cta
        if inst.cta_group == 2:
            if cta.rank % 2:
                self.fail("unsupported", "a cta_group::2 MMA issued by an odd CTA")
            members = [cta, self.cta_of(cta, cta.rank + 1)]
        else:
            members = [cta]
        b_reads = frozenset().union(*(self._reads(c, b) for c in members))
        reader = Reader(f"an MMA of {role.name}")
        role.mma_reads.append(reader)
        for c in members:
            c.add_reader(a.at(c.index), reader)
            c.add_reader(b.at(c.index), reader)
            if c.exited:
                self.fail("exit", f"{role.name}'s MMA writes the TMEM of cta{c.index}, which has exited")
            tmem = d.at(c.index)
            loading = c.pending_reader(tmem.alloc, tmem.start, tmem.end)
            if loading is not None:
                self.fail(
                    "race",
                    f"{role.name}'s MMA overwrites TMEM of cta{c.index} that {loading.what} may still "
                    f"read (no tcgen05.wait::ld before the buffer was handed back)",
                )
            c.add_tmem_writer(tmem, reader)
            acc = None if not enable else next((t for t in c.read_tags(tmem) if isinstance(t, AccTag)), None)
            if acc is None:
                acc = AccTag()
                c.write_tag(tmem, acc)
            acc.terms.append((self._reads(c, a), b_reads))

    def i_Tcgen05MmaTSInst(self, inst, env, role, group, active):
        # A in tensor memory (Blackwell V8's widened weight): written by tcgen05.st, which must have
        # completed (tcgen05.wait::st) before the hand-off to the MMA's thread
        if inst.cta_group != 1:
            self.fail("unsupported", "a cta_group::2 MMA with A in tensor memory")
        a = env[inst.inputs[0]]
        storing = role.cta.pending_writer(a)
        if storing is not None:
            self.fail("race", f"{role.name}'s MMA reads A in TMEM that {storing.what} may still write")
        return self.i_Tcgen05MmaSSInst(inst, env, role, group, active)

    def i_Tcgen05StoreInst(self, inst, env, role, group, active):
        ref: MemRef = env[inst.inputs[0]]
        value: RegVal = env[inst.inputs[1]]
        cta = role.cta
        for reader in (cta.pending_reader(ref.alloc, ref.start, ref.end), cta.pending_writer(ref)):
            if reader is not None:
                self.fail("race", f"{role.name}'s tcgen05.st overwrites TMEM that {reader.what} may still access")
        store = Reader(f"a tcgen05.st of {role.name}")
        cta.add_tmem_writer(ref, store)
        role.tmem_stores.append(store)
        cta.write_tag(ref, value.tag)

    def i_Tcgen05CommitInst(self, inst, env, role, group, active):
        bar: BarrierAddr = self.eval(inst.mbarrier, env, role)
        if inst.multicast_mask is not None:
            targets = [
                dataclasses.replace(bar, cta=self.cta_of(role.cta, r).index)
                for r in range(self.cluster_size)
                if (inst.multicast_mask >> r) & 1
            ]
        else:
            targets = [bar]

        tracked = [r for r in role.mma_reads if not r.done]  # a commit tracks every MMA issued before it
        role.mma_reads = tracked

        def land(targets=targets, who=role.name, tracked=tracked):
            for reader in tracked:
                reader.done = True
            for t in targets:
                self.arrive_async(t, f"tcgen05.commit from {who}")

        self.log(f"{role.name}: tcgen05.commit to {[self.barrier(t).name for t in targets]}")
        self.async_ops.append(
            AsyncOp(
                f"a tcgen05.commit from {role.name}",
                land,
                tuple(t.cta for t in targets),
                queue=("commit", role) if self.ordered_commits else None,
            )
        )
        yield None

    def i_Tcgen05LoadInst(self, inst, env, role, group, active):
        ref: MemRef = env[inst.inputs[0]]
        writer = role.cta.pending_writer(ref)
        if writer is not None:
            self.fail(
                "race",
                f"{role.name}'s tcgen05.ld reads TMEM that {writer.what} may still write (no commit of it has landed)",
            )
        load = Reader(f"a tcgen05.ld of {role.name}")
        role.cta.add_reader(ref, load)
        role.tmem_loads.append(load)
        accs = [t for t in role.cta.read_tags(ref) if isinstance(t, AccTag)]
        env[inst.register_output] = RegVal(None, tuple(inst.register_output.shape), accs[0] if accs else None)

    def i_Tcgen05WaitInst(self, inst, env, role, group, active):
        if inst.wait_load:
            for load in role.tmem_loads:
                load.done = True
            role.tmem_loads = []
        if inst.wait_store:
            for store in role.tmem_stores:
                store.done = True
            role.tmem_stores = []

    # -- cluster launch control -------------------------------------------------------------------
    def i_ClusterLaunchControlTryCancelInst(self, inst, env, role, group, active):
        slot: MemRef = env[inst.inputs[0]]
        bar: BarrierAddr = self.eval(inst.mbarrier, env, role)
        multicast = self.eval(inst.multicast, env, role)
        cta = role.cta
        members = [self.cta_of(cta, r) for r in range(self.cluster_size)] if multicast else [cta]
        if cta.cluster in self.clc_failed:
            self.fail(
                "clc",
                f"{role.name} issues clusterlaunchcontrol.try_cancel after its cluster was answered "
                f"'no work left' (undefined behaviour)",
            )

        def answer(slot=slot, bar=bar, members=members, who=role.name):
            cancelled = self.cancel_cluster()
            if cancelled is None:
                response = [0, 0, 0, 0]
                self.clc_failed.add(self.ctas[members[0].index].cluster)
            else:
                first = self.ctas[cancelled * self.cluster_size]
                response = [1, *first.block_idx]
            self.log(f"CLC response to {who}: {'cluster %d' % cancelled if cancelled is not None else 'no work left'}")
            for c in members:
                c.values[SharedAddr(c.index, slot.alloc, slot.start)] = response
                self.complete_tx(dataclasses.replace(bar, cta=c.index), 16, f"CLC response into cta{c.index}")

        self.log(f"{role.name}: clusterlaunchcontrol.try_cancel")
        self.async_ops.append(
            AsyncOp(
                f"a CLC response for {role.name}",
                answer,
                tuple(c.index for c in members),
                byte_barriers=tuple(dataclasses.replace(bar, cta=c.index) for c in members),
            )
        )
        yield None

    def i_ClusterLaunchControlQueryResponseInst(self, inst, env, role, group, active):
        slot: MemRef = env[inst.inputs[0]]
        response = role.cta.values.get(SharedAddr(role.cta.index, slot.alloc, slot.start))
        if response is None:
            self.fail("unsupported", f"{role.name} reads a CLC response that never arrived")
        env[inst.register_output] = RegVal(list(response), (4,), None)


def _complete_all_but(groups: list[list[Reader]], newest: int) -> None:
    """A wait_group(n): every group but the ``newest`` n has completed its reads."""
    done = groups[:-newest] if newest else groups[:]
    for group in done:
        for reader in group:
            reader.done = True
    del groups[: len(done)]


def _batch_of(offsets: list) -> tuple[int, list]:
    """A TMA copy's (batch, [row, column]): a batched kernel's 3-D tensor maps put the batch first."""
    if len(offsets) == 3:
        return offsets[0], offsets[1:]
    return 0, offsets
