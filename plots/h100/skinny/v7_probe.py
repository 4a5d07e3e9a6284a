"""Hopper V7 against variants of itself with one step changed, timed in one window with cuBLAS
(L2 flushed by reading, ``timing.interleaved_ms``), each output checked against a float32 reference
first (NaN-poisoned). B [N, K] as ``x @ w.T`` gives it.

* ``slices`` (the weight multicast): V7 with ``multicast`` > 1 has the weight group's CTAs load whole
  weight tiles in turn (K block ``i`` by CTA ``i % multicast``); here every CTA of the group loads its
  own slice of every weight tile (``64 / multicast`` rows, whole 128-byte swizzled rows, so each lands
  where the whole tile's box would put it) and multicasts that, as CUTLASS-style kernels do.
* ``release_exit`` (the last cluster barrier): V7 before its exit barrier arrived relaxed, the
  barrier with release semantics (``this_cluster.sync()``), whose arrival waits for the CTA's stores
  of C to be performed (``MEMBAR.ALL.GPU``).
* ``whole_opening`` (the first cluster barrier, without multicast): V7 before that barrier was split
  (``ClusterSplitKReduce.arrive_after_init``, then ``wait_for_peers`` just before the exchange), the
  whole cluster waiting at the start before any CTA begins its main loop.
* ``row_major_partial`` (the split-K exchange tiles): V7 with the partial and received tiles of
  ``ClusterSplitKReduce`` row-major in shared memory, as they were before ``partial_layout`` swizzled
  them: the accumulator's stores and the ``ldmatrix`` loads of the write-out met 8-way bank
  conflicts there (the rows of a 128-column tile lie 512 bytes apart).
* ``direct_store`` (split 1, no multicast: the write-out without shared memory): each consumer
  warpgroup converts its accumulator and stores it into C straight from its registers, where V7
  passes it through the partial tile (a store, a fence, a barrier, an ``ldmatrix`` load) first.
* ``tma_direct`` (split 1, no multicast): ``direct_store`` whose warpgroups write their slabs of C
  through a staging buffer of C's dtype and a TMA store instead (tilus writes the transposed
  accumulator with ``stmatrix.trans``; no masked stores, no serialized wgmma); with the float32
  tile's room given to the ring, 128 weight rows a CTA fit with 6 stages. V7 writes this way since
  (``pipeline.epilogue.SwappedSlabStore``), so ``v7`` rows without a split measured after that
  change are this write-out too.
* ``tma_store`` and ``no_exchange`` (what is left of the write-out with a split): V7 whose
  write-out stages its slice of C in a shared tile of C's dtype and writes it with a TMA store
  (wide, clipped by the copy engine, no masked one-element stores; where that tile fits beside the
  ring), and V7 whose write-out skips the split-K exchange (each CTA stores its own partial: wrong
  by design for a split, not checked).
* ``no_epilogue`` and ``ring_only`` (where V7's time goes; their outputs are wrong by design and not
  checked): V7 without its write-out (no exchange of partials, nothing stored into C), and that
  without the wgmma too (the consumers take each stage and release it: the ring, its TMA traffic
  and the grid alone). Against V7 and cuBLAS, at K = 64 (one K block a CTA: the fixed costs alone)
  and at the decode shapes.

    MATMUL_CACHE_DIR=.cache/probe python plots/h100/skinny/v7_probe.py OUT --build-only   # on the CPU machine
    MATMUL_CACHE_DIR=$PWD/.cache/probe python plots/h100/skinny/v7_probe.py OUT            # v7_probe.json
        [--variants v7,slices,release_exit,row_major_partial] [--configs multicast|split|direct|tma_direct]
        [--shapes 64x4096x4096,...]
"""

import argparse
import contextlib
import json
import sys
from pathlib import Path

import tilus
import torch
from tilus import GlobalTensor, RegisterTensor, SharedTensor, float32, int32
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.harness import presets
from matmul.kernels import versions
from matmul.measure.correctness import relative_error
from matmul.measure.timing import interleaved_ms
from pipeline import Pipeline, cluster_reduce
from pipeline.cluster_reduce import ClusterSplitKReduce
from pipeline.epilogue import wgmma_fragment
from pipeline.mainloop import WgmmaMainloop
from pipeline.tma_store import StagedTmaStore

V7 = versions.load("sm_90a", "v7")
KEYS = ("block_m", "warpgroups", "split", "stages", "multicast")


def configs(*names: str) -> tuple[dict, ...]:
    """Configurations written block_m/warpgroups/split/stages/multicast."""
    return tuple(dict(zip(KEYS, map(int, name.split("/")))) for name in names)


CONFIGS = {
    # cuBLAS's tiling at 64 and 128 tokens (COMMAND.md), four token tiles a cluster, and the space's
    # best without multicast at those sizes
    "multicast": configs(
        "32/1/1/16/2",
        "64/1/1/13/2",
        "64/1/1/13/4",
        "64/1/2/10/1",
        "128/1/2/6/1",
    ),
    # what the tuner picks at decode sizes (plots/h100/skinny/), with and without a split
    "split": configs(
        "16/1/2/8/1",
        "16/1/1/16/1",
        "64/1/2/10/1",
        "128/1/2/6/1",
        "128/1/1/8/1",
    ),
    # the direct write-out: V7's configurations without a split, and rings that fit only without
    # the partial tile (9 stages of 128 tokens; 128 weight rows a CTA, 7 stages)
    "direct": configs(
        "16/1/1/16/1",
        "128/1/1/8/1",
        "128/1/1/9/1",
        "128/2/1/4/1",
        "128/2/1/7/1",
        "64/2/1/9/1",
        # the space's best at 64-256 tokens (plots/h100/skinny/m64-256/), for V7 in the same window
        "64/1/2/10/1",
        "128/1/2/6/1",
        "128/1/1/8/2",
    ),
}
CONFIGS["tma_direct"] = configs(
    # V7's best at 64-256 tokens (plots/h100/skinny/m64-256/), then the same ring written by TMA
    # stores, and 128 weight rows a CTA with the ring the float32 partial tile left no room for
    "64/1/2/10/1",
    "128/1/2/6/1",
    "128/1/1/8/1",
    "128/1/1/8/2",
    "256/1/1/3/1",
    "128/2/1/6/1",
    "64/2/1/8/1",
    "256/1/1/4/1",
    "256/2/1/3/1",
)
SHARED_LIMIT = 227 * 1024  # the H100's shared memory a block, less room for the barriers
SHAPES = {
    "multicast": "64x4096x4096,128x4096x4096,128x28672x4096,256x4096x4096,128x4096x14336",
    "split": "1x4096x4096,16x4096x4096,16x1024x4096,16x28672x4096,16x4096x14336,64x4096x4096,128x4096x4096",
    "tma_direct": ",".join(f"{m}x{n}x{k}" for n, k in presets.DECODE_PROJECTIONS.values() for m in (64, 128, 256)),
    "direct": "16x4096x4096,64x4096x4096,128x4096x4096,256x4096x4096,128x28672x4096,256x28672x4096,"
    "128x4096x14336,256x4096x14336",
}


# (tilus reads the annotations of a kernel's methods)
class Slices(V7.Kernel):
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
        # built with multicast only: every CTA of the weight group loads its slice of the rows, every K block
        rows = 64 // self.multicast
        slices = self.reshape_shared(s_tile, [self.multicast, rows, V7.BLOCK_K])
        self.load_b(
            g_b,
            slices[m_rank],
            ring.producer_barrier(),
            offset_n + m_rank * rows,
            offset_k,
            multicast=True,
            multicast_mask=weight_group,
        )


class ReleaseExit(V7.Kernel):
    def exit_barrier(self, tile_out: tilus.Class):
        self.cluster.sync()


class WholeOpening(V7.Kernel):
    def opening_barrier(self, tile_out: tilus.Class):
        self.cluster.sync()

    def peers_ready(self, reduce: tilus.Class):
        pass  # the whole cluster waited at the start


class RowMajorPartial(V7.Kernel):
    pass  # V7 itself, transpiled with the row-major exchange tiles (row_major_partials)


@contextlib.contextmanager
def row_major_partials():
    """While a script is transpiled: ``ClusterSplitKReduce``'s tiles row-major, not swizzled."""
    swizzled = cluster_reduce.partial_layout
    cluster_reduce.partial_layout = lambda shape: shared_row_major(*shape)
    try:
        yield
    finally:
        cluster_reduce.partial_layout = swizzled


class DirectStore(V7.Kernel):
    def matmul(
        self, g_a: GlobalTensor, g_b: GlobalTensor, g_c: GlobalTensor, m_size: int32, n_size: int32, k_size: int32
    ):
        # V7's matmul with split 1 and no multicast (built for those only): one CTA a tile, no cluster
        rows = 64 * self.warpgroups
        num_m_tiles = cdiv(m_size, self.block_m)
        self.attrs.blocks = cdiv(n_size, rows) * num_m_tiles
        self.attrs.warps = 4 * self.warpgroups + 1
        offset_m: int32 = (self.blockIdx.x % num_m_tiles) * self.block_m
        offset_n: int32 = (self.blockIdx.x // num_m_tiles) * rows
        k_blocks: int32 = cdiv(k_size, V7.BLOCK_K)
        s_w = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.warpgroups, 64, V7.BLOCK_K])
        self.b_tiles_layout(s_w)
        s_x = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, V7.BLOCK_K])
        self.staging_tiles()
        ring = Pipeline(self.stages, consumer_arrivals=self.warpgroups, elect_release=True)
        self.sync()
        with self.single_warp(4 * self.warpgroups):
            for i in range(k_blocks):
                ring.producer_acquire()
                slot = ring.producer_stage
                with self.single_thread():
                    self.mbarrier.arrive_and_expect_tx(
                        ring.producer_barrier(), transaction_bytes=s_w[slot].nbytes + s_x[slot].nbytes
                    )
                self.load_b(g_b, s_w[slot, 0], ring.producer_barrier(), offset_n, i * V7.BLOCK_K)
                if self.warpgroups == 2:
                    self.load_b(g_b, s_w[slot, 1], ring.producer_barrier(), offset_n + 64, i * V7.BLOCK_K)
                self.tma.global_to_shared(
                    src=g_a, dst=s_x[slot], offsets=[offset_m, i * V7.BLOCK_K], mbarrier=ring.producer_barrier()
                )
                ring.producer_advance()
        self.consume_and_store(0, ring, s_w, s_x, k_blocks, g_c, offset_m, offset_n)
        if self.warpgroups == 2:
            self.consume_and_store(1, ring, s_w, s_x, k_blocks, g_c, offset_m, offset_n)

    def staging_tiles(self):
        pass  # C goes out from the registers

    def consume_and_store(
        self,
        wg: int,
        ring: Pipeline,
        s_w: SharedTensor,
        s_x: SharedTensor,
        k_blocks: int32,
        g_c: GlobalTensor,
        offset_m: int32,
        offset_n: int32,
    ):
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            acc = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
            self.annotate_layout(acc, wgmma_fragment(64, self.block_m))
            WgmmaMainloop(ring).run(s_w, s_x, wg, acc, k_blocks)
            self.write_slab(acc, wg, g_c, offset_m, offset_n)

    def write_slab(self, acc: RegisterTensor, wg: int, g_c: GlobalTensor, offset_m: int32, offset_n: int32):
        self.store_global(g_c, self.transpose(acc.to(g_c.dtype)), offsets=[offset_m, offset_n + 64 * wg])


class TmaDirect(DirectStore):
    def staging_tiles(self):
        # one [block_m, 64] tile of C's dtype a consumer warpgroup, in place of V7's float32 partial tile
        self.staging = self.shared_tensor(dtype=self.dtype, shape=[self.warpgroups, 1, self.block_m, 64])

    def write_slab(self, acc: RegisterTensor, wg: int, g_c: GlobalTensor, offset_m: int32, offset_n: int32):
        out = StagedTmaStore(self.staging[wg])
        out.put(self.transpose(acc), g_c, offset_m, offset_n + 64 * wg)
        out.finish()


class TmaStore(V7.Kernel):
    def write_out(
        self, reduce: ClusterSplitKReduce, k_rank: int32, g_c: GlobalTensor, offset_m: int32, offset_n: int32
    ):
        slice_rows = reduce.rows // reduce.parts
        staging = self.shared_tensor(dtype=self.dtype, shape=[1, self.block_m, slice_rows])
        reduce.exchange(k_rank)
        with self.warp_group(warp_begin=0, num_warps=4):
            acc = self.load_shared(reduce.partial[0, k_rank])
            if reduce.parts > 1:
                self.mbarrier.wait(reduce.arrived[0], phase=0)
                for slot in self.range(0, reduce.parts - 1, 1, unroll="all"):
                    self.add(acc, self.load_shared(reduce.received[slot]), out=acc)
            out = StagedTmaStore(staging)
            out.put(self.transpose(acc), g_c, offset_m, offset_n + k_rank * slice_rows)
            out.finish()


class NoExchange(V7.Kernel):
    def write_out(
        self, reduce: ClusterSplitKReduce, k_rank: int32, g_c: GlobalTensor, offset_m: int32, offset_n: int32
    ):
        self.sync()  # the consumers' partials stored
        slice_rows = reduce.rows // reduce.parts
        with self.warp_group(warp_begin=0, num_warps=4):
            acc = self.load_shared(reduce.partial[0, k_rank])
            self.store_global(
                g_c, self.transpose(acc.to(g_c.dtype)), offsets=[offset_m, offset_n + k_rank * slice_rows]
            )


class NoEpilogue(V7.Kernel):
    def __init__(self, dtype, block_m: int, warpgroups: int, split: int, stages: int, multicast: int = 1):
        super().__init__(dtype, block_m, warpgroups, split, stages, multicast)
        # the accumulators stored into the float32 tile and nothing written from it, with a split or
        # without (V7 without a split writes its slabs of C from the consumers: not here)
        self.writes_slabs = False
        self.splits_opening = multicast == 1  # (with split 1: no peer, no opening barrier)

    def write_out(
        self, reduce: ClusterSplitKReduce, k_rank: int32, g_c: GlobalTensor, offset_m: int32, offset_n: int32
    ):
        pass


class RingOnly(NoEpilogue):
    def consumer(
        self, wg: int, ring: Pipeline, s_w: SharedTensor, s_x: SharedTensor, reduce: ClusterSplitKReduce, count: int32
    ):
        with self.warp_group(warp_begin=4 * wg, num_warps=4):
            for _ in range(count):
                ring.consumer_acquire()
                ring.consumer_release()
                ring.consumer_advance()


VARIANTS = {
    "v7": V7.Kernel,
    "slices": Slices,
    "release_exit": ReleaseExit,
    "whole_opening": WholeOpening,
    "row_major_partial": RowMajorPartial,
    "direct_store": DirectStore,
    "tma_direct": TmaDirect,
    "tma_store": TmaStore,
    "no_exchange": NoExchange,
    "no_epilogue": NoEpilogue,
    "ring_only": RingOnly,
}
CUT = ("no_epilogue", "ring_only", "no_exchange")  # wrong by design: not checked


def script(cls, config):
    return versions.fixed_script(cls, config, torch.float16, name=f"{cls.__name__}_probe")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--variants", default="v7,slices")
    parser.add_argument("--configs", default="multicast", choices=sorted(CONFIGS))
    parser.add_argument("--shapes", default=None, help="MxNxK,... (default: the configurations' own)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    programs = {}
    for name in args.variants.split(","):
        for config in CONFIGS[args.configs]:
            if name == "slices" and config["multicast"] == 1:
                continue  # the same kernel as V7's
            if name in ("release_exit", "whole_opening") and config["multicast"] > 1:
                continue  # V7 keeps the release there, and the whole opening barrier (module doc)
            direct = name in ("direct_store", "tma_direct")
            if direct and (config["split"], config["multicast"]) != (1, 1):
                continue  # built for one CTA a tile only
            float32_tile = name in ("no_epilogue", "ring_only") and config["split"] == 1  # (NoEpilogue)
            rows = 64 * config["warpgroups"]
            shared = V7.shared_bytes(**config) + (rows * config["block_m"] * (4 - 2) if float32_tile else 0)
            if not direct and shared > SHARED_LIMIT:
                continue  # fits only without the partial tile
            ring = config["stages"] * (config["warpgroups"] * 64 + config["block_m"]) * V7.BLOCK_K * 2
            if name == "tma_direct" and ring + config["warpgroups"] * config["block_m"] * 64 * 2 > SHARED_LIMIT:
                continue  # no room for C's staging tiles beside the ring
            staging = config["block_m"] * 64 * config["warpgroups"] // config["split"] * 2  # C's slice, 16 bits
            if name == "tma_store" and V7.shared_bytes(**config) + staging > SHARED_LIMIT:
                continue  # no room for C's staging tile beside the ring
            layouts = row_major_partials() if name == "row_major_partial" else contextlib.nullcontext()
            with target("sm_90a"), layouts:  # built here, or found in tilus's cache
                programs[name, str(config)] = tilus_autotune.load(tilus_autotune.build(script(VARIANTS[name], config)))
            print(f"built {name} {config}", flush=True)
    if args.build_only:
        return
    rows = []
    for shape in (args.shapes or SHAPES[args.configs]).split(","):
        m, n, k = map(int, shape.split("x"))
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).half().cuda()
        x = torch.randn(m, k, generator=gen).half().cuda()
        reference = x.float() @ w.float().T
        fns, names = [lambda x=x, w=w: torch.matmul(x, w.T)], ["cublas"]
        for (name, config), program in programs.items():
            out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
            operands = (m, n, k, x, w, out, x.stride(0), w.stride(0), out.stride(0), 0)

            def launch(program=program, operands=operands):
                program(*operands)

            launch()
            if name not in CUT:
                error = relative_error(out, reference)
                assert error < 1e-2, f"{name} {config} {m}x{n}x{k}: error {error:.3g}"
            fns.append(launch)
            names.append(f"{name} {config}")
        times = interleaved_ms(fns, 50, 300)
        for name, ms in zip(names, times):
            row = dict(m=m, n=n, k=k, kernel=name, us=ms * 1e3, x_cublas=times[0] / ms)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "v7_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
