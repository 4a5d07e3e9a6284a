"""What bounds Hopper V8 (int4) at decode sizes: the widening, or the wgmma that takes the widened
weight? V8 (``matmul.kernels.hopper.v8``) against two of its own consumers with one job cut out,
timed in the same window (L2 flushed by reading, as ``bench_v8.py``), with cuBLAS fp16 beside:

* ``no_widen``: the packed words are neither loaded nor widened; each wgmma takes a constant A
  operand (the ring, the TMA traffic, every wgmma and the reduction as in V8);
* ``one_wgmma``: every part of a K block is widened as in V8, but only the block's last part is
  multiplied (a quarter or half of V8's wgmma instructions; the others' widened values are summed
  into it, so none of the conversion is dead code);
* ``ring_only``: neither widening nor wgmma: the consumers take each stage and release it (the
  ring, its TMA traffic, the grid and the reduction of zero partials: what V8's bytes cost alone);
* ``mma_sync`` (added on the H200, ``plots/h200/v8-read-control/``): V8 whose widened parts are
  multiplied by ``mma.sync.m16n8k16`` warp by warp (the tokens loaded from the stage into registers)
  instead of a wgmma a warpgroup. Correct at one token; at 16 it is wrong (relative error 0.125 on
  the H200: the 16-token accumulator keeps wgmma's register order, which the dot's two m16n8 tiles
  do not share), so it is checked, and left out of a shape's window where it is wrong;
* ``scale_values`` (H200 too): V8 with int4's scales multiplying every widened value, as V8 did at
  every tile before it scaled the products at up to 16 tokens (``--configs calls``: the call's
  configurations, against V8 in one window);
* ``overlap`` and ``rolling`` (H200, ``plots/h200/v8-rolling/``): V8 whose consumer keeps wgmma
  groups in flight across K blocks, a whole block or one part (``wait_group 1`` after each), each
  block with registers of its own (the loop unrolled by two);
* (``scale_after``, H200, as at 333361c: each K block multiplied unscaled into a float32 tile of
  its own, then scaled into the accumulator; V8 itself does so at tiles of up to 16 tokens since,
  and ``scale_values`` is now the variant that does not)
* (``pairs``, H200, as at c95c3d4: each packed word's nibbles in the order of the magic-number
  conversion's pairs, widened without tilus's ``prmt``s; V8 itself packs and widens so since,
  ``plots/h200/v8-pairs/``)

The cut-down variants' outputs are wrong by design: only V8's, ``mma_sync``'s and ``scale_values``' are
checked. Build on the CPU machine
first (``--build-only``; tilus caches the programs under ``$MATMUL_CACHE_DIR``), then time on the GPU:

    MATMUL_CACHE_DIR=.cache/probe python plots/h100/v8/bound_probe.py OUT --build-only
    python plots/h100/v8/bound_probe.py OUT                         # bound_probe.json
    [--variants v8,no_widen,ring_only] [--stages 4,8]               # (default: every variant, 4)
    [--configs calls --shapes decode --dtype bfloat16]              # the call's configurations
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from bench_v8 import DECODE_SHAPES  # (this script's folder)
from tilus import RegisterTensor, SharedTensor, float32, int32

import matmul
from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.kernels import versions
from matmul.measure.correctness import relative_error
from matmul.measure.timing import interleaved_ms
from matmul.quant import linear as quant_linear
from pipeline import Pipeline
from pipeline.cluster_reduce import ClusterSplitKReduce
from pipeline.epilogue import wgmma_fragment
from pipeline.widen import WORDS, Int4Widen, reduce_layout

V8 = versions.load("sm_90a", "v8")
CONFIGS = (
    {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 32, "interleave": 1},
    {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1},
)
SHAPES = ((1, 4096, 4096), (16, 28672, 4096), (1, 4096, 14336))


# (tilus reads the annotations of a kernel's methods)
class NoWiden(V8.Kernel):
    def half(
        self,
        widen: Int4Widen,
        s_words: SharedTensor,
        scale: RegisterTensor,
        s_x: SharedTensor,
        slot: int32,
        first: int,
        acc: RegisterTensor,
    ):
        self.constant_part(widen, scale, s_x[slot, first], acc)
        if V8.HALF_K // self.chunk == 2:
            self.constant_part(widen, scale, s_x[slot, first + 1], acc)

    def constant_part(self, widen: Int4Widen, scale: RegisterTensor, s_tokens: SharedTensor, acc: RegisterTensor):
        operand = self.register_tensor(dtype=scale.dtype, shape=[64, self.chunk], init=1.0)
        self.annotate_layout(operand, widen.fragment)
        self.wgmma.fence()
        self.wgmma.mma(operand, s_tokens.transpose(), acc)
        self.wgmma.commit_group()


class RingOnly(NoWiden):
    def constant_part(self, widen: Int4Widen, scale: RegisterTensor, s_tokens: SharedTensor, acc: RegisterTensor):
        pass  # no operand, no wgmma: the stage is only taken and released


class OneWgmma(V8.Kernel):
    def half(
        self,
        widen: Int4Widen,
        s_words: SharedTensor,
        scale: RegisterTensor,
        s_x: SharedTensor,
        slot: int32,
        first: int,
        acc: RegisterTensor,
    ):
        words = widen.words(s_words)
        if V8.HALF_K // self.chunk == 2:
            other = widen.operand(words, scale, 0)
            operand = widen.operand(words, scale, 1) + other
            self.annotate_layout(operand, widen.fragment)
            self.wgmma.fence()
            self.wgmma.mma(operand, s_x[slot, first + 1].transpose(), acc)
            self.wgmma.commit_group()
        else:
            self.part(widen, words, scale, 0, s_x[slot, first], acc)


class MmaSync(V8.Kernel):
    def part(
        self,
        widen: Int4Widen,
        words: RegisterTensor,
        scale: RegisterTensor,
        index: int,
        s_tokens: SharedTensor,
        acc: RegisterTensor,
    ):
        # the same widened operand (wgmma's A fragment is four warps' mma.sync m16n8k16 A fragments),
        # multiplied warp by warp: no warpgroup fence, commit or wait between a part and the next
        operand = widen.operand(words, scale, index)
        tokens = self.load_shared(s_tokens)
        self.dot(operand, self.transpose(tokens), acc, out=acc)


class ScaleValues(V8.Kernel):
    """V8 as it was: every tile multiplies each widened value by its scale (V8's ``__init__`` sets
    ``scale_after`` for tiles of up to 16 tokens; here the setting is kept off)."""

    @property
    def scale_after(self) -> bool:
        return False

    @scale_after.setter
    def scale_after(self, value: bool) -> None:
        pass


class Overlap(V8.Kernel):
    """V8 whose int4 consumer keeps a K block's wgmma groups in flight while it widens and issues
    the next block (two sets of products and scales, the loop unrolled by two so that ptxas sees
    each block's registers as its own); a stage is released once the block after it is issued."""

    def consumer(
        self,
        c: int,
        ring: Pipeline,
        s_w: SharedTensor,
        s_s: SharedTensor,
        s_x: SharedTensor,
        reduce: ClusterSplitKReduce,
        count: int32,
    ):
        wg, turn = divmod(c, self.interleave)
        with self.warp_group(warp_begin=4 * c, num_warps=4):
            fragment = wgmma_fragment(64, self.block_m)
            acc = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
            self.annotate_layout(acc, fragment)
            widen = Int4Widen(self.chunk)
            s_words = self.reshape_shared(s_w, [self.stages, self.consumers, 2, 128, WORDS])
            s_scale = self.reshape_shared(s_s, [self.stages, self.consumers, V8.TILE_ROWS, 1])
            first = turn * (V8.BLOCK_K // self.chunk)
            # (not a rebinding of a name first bound to acc: tilus would assign into acc)
            if self.scale_after:
                products_a = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
                self.annotate_layout(products_a, fragment)
                products_b = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
                self.annotate_layout(products_b, fragment)
            else:
                products_a = acc
                products_b = acc
            scale_a = self.register_tensor(dtype=self.dtype, shape=[64, 1])
            self.annotate_layout(scale_a, reduce_layout(fragment))
            scale_b = self.register_tensor(dtype=self.dtype, shape=[64, 1])
            self.annotate_layout(scale_b, reduce_layout(fragment))
            self.issue_block(c, ring, widen, s_words, s_scale, s_x, first, products_a, scale_a)
            ring.consumer_advance()
            for kb in self.range((count - 1) // 2, unroll=1):  # noqa: B007
                self.next_block(
                    c, ring, widen, s_words, s_scale, s_x, first, products_b, scale_b, products_a, scale_a, acc
                )
                self.next_block(
                    c, ring, widen, s_words, s_scale, s_x, first, products_a, scale_a, products_b, scale_b, acc
                )
            if (count - 1) % 2 == 1:
                self.next_block(
                    c, ring, widen, s_words, s_scale, s_x, first, products_b, scale_b, products_a, scale_a, acc
                )
                self.last_block(ring, products_b, scale_b, acc)
            else:
                self.last_block(ring, products_a, scale_a, acc)
            reduce.store(acc, wg, turn)

    def issue_block(
        self,
        c: int,
        ring: Pipeline,
        widen: Int4Widen,
        s_words: SharedTensor,
        s_scale: SharedTensor,
        s_x: SharedTensor,
        first: int,
        products: RegisterTensor,
        scale: RegisterTensor,
    ):
        ring.consumer_acquire()
        slot = ring.consumer_stage
        part_scale = self.block_scale(widen, s_scale[slot, c], scale)
        self.half(widen, s_words[slot, c, 0], part_scale, s_x, slot, first, products)
        self.half(widen, s_words[slot, c, 1], part_scale, s_x, slot, first + V8.HALF_K // self.chunk, products)

    def block_scale(self, widen: Int4Widen, s_scale: SharedTensor, scale: RegisterTensor) -> RegisterTensor:
        """A block's scales as its parts take them: loaded into ``scale``, kept for the fold after the
        block's groups are done, where the products are scaled; else in the layout that scales values."""
        if self.scale_after:
            self.load_shared(s_scale, out=scale)
            part_scale = scale
        else:
            part_scale = widen.scales(s_scale)
        return part_scale

    def next_block(
        self,
        c: int,
        ring: Pipeline,
        widen: Int4Widen,
        s_words: SharedTensor,
        s_scale: SharedTensor,
        s_x: SharedTensor,
        first: int,
        products: RegisterTensor,
        scale: RegisterTensor,
        previous: RegisterTensor,
        previous_scale: RegisterTensor,
        acc: RegisterTensor,
    ):
        self.issue_block(c, ring, widen, s_words, s_scale, s_x, first, products, scale)
        self.wgmma.wait_group(V8.BLOCK_K // self.chunk)  # the previous block's groups done, this one's in flight
        ring.consumer_release_previous()
        ring.consumer_advance()
        self.fold(previous, previous_scale, acc)

    def last_block(self, ring: Pipeline, products: RegisterTensor, scale: RegisterTensor, acc: RegisterTensor):
        self.wgmma.wait_group(0)
        ring.consumer_release_previous()  # (the ring has advanced past the last block's stage)
        self.fold(products, scale, acc)

    def fold(self, products: RegisterTensor, scale: RegisterTensor, acc: RegisterTensor):
        """A completed block's products, scaled, into the accumulator; its tile zeroed for the block
        after next (nothing to do where the values were scaled: the block went into acc)."""
        if self.scale_after:
            scaled = products * self.cast(scale, float32)
            self.annotate_layout(scaled, wgmma_fragment(64, self.block_m))
            self.add(acc, scaled, out=acc)
            zero = self.register_tensor(dtype=float32, shape=[64, self.block_m], init=0.0)
            self.annotate_layout(zero, wgmma_fragment(64, self.block_m))
            self.assign(products, zero)


class Rolling(Overlap):
    """``overlap`` at the grain of a part: each part's wgmma group is followed by ``wait_group 1``,
    so at most two parts are in flight (two parts' operand registers live, not two blocks'), and
    the tensor core runs the previous part, across a block's end too, while the next is widened;
    the previous block's stage is released and its products folded once the block's first part
    is issued."""

    def issue_block(
        self,
        c: int,
        ring: Pipeline,
        widen: Int4Widen,
        s_words: SharedTensor,
        s_scale: SharedTensor,
        s_x: SharedTensor,
        first: int,
        products: RegisterTensor,
        scale: RegisterTensor,
    ):
        self.block_parts(
            c, ring, widen, s_words, s_scale, s_x, first, products, scale, products, scale, products, False
        )

    def next_block(
        self,
        c: int,
        ring: Pipeline,
        widen: Int4Widen,
        s_words: SharedTensor,
        s_scale: SharedTensor,
        s_x: SharedTensor,
        first: int,
        products: RegisterTensor,
        scale: RegisterTensor,
        previous: RegisterTensor,
        previous_scale: RegisterTensor,
        acc: RegisterTensor,
    ):
        self.block_parts(
            c, ring, widen, s_words, s_scale, s_x, first, products, scale, previous, previous_scale, acc, True
        )
        ring.consumer_advance()

    def block_parts(
        self,
        c: int,
        ring: Pipeline,
        widen: Int4Widen,
        s_words: SharedTensor,
        s_scale: SharedTensor,
        s_x: SharedTensor,
        first: int,
        products: RegisterTensor,
        scale: RegisterTensor,
        previous: RegisterTensor,
        previous_scale: RegisterTensor,
        acc: RegisterTensor,
        has_previous: bool,
    ):
        ring.consumer_acquire()
        slot = ring.consumer_stage
        part_scale = self.block_scale(widen, s_scale[slot, c], scale)
        per_half = V8.HALF_K // self.chunk
        words = widen.words(s_words[slot, c, 0])
        self.part(widen, words, part_scale, 0, s_x[slot, first], products)
        self.wgmma.wait_group(1)  # the previous block's last part done
        if has_previous:
            ring.consumer_release_previous()
            self.fold(previous, previous_scale, acc)
        if per_half == 2:
            self.part(widen, words, part_scale, 1, s_x[slot, first + 1], products)
            self.wgmma.wait_group(1)
        words_1 = widen.words(s_words[slot, c, 1])
        self.part(widen, words_1, part_scale, 0, s_x[slot, first + per_half], products)
        self.wgmma.wait_group(1)
        if per_half == 2:
            self.part(widen, words_1, part_scale, 1, s_x[slot, first + per_half + 1], products)
            self.wgmma.wait_group(1)


VARIANTS = {
    "v8": V8.Kernel,
    "no_widen": NoWiden,
    "one_wgmma": OneWgmma,
    "ring_only": RingOnly,
    "mma_sync": MmaSync,
    "scale_values": ScaleValues,
    "overlap": Overlap,
    "rolling": Rolling,
}
CHECKED = (
    "v8",
    "mma_sync",
    "scale_after",
    "scale_values",
    "overlap",
    "rolling",
)  # the variants whose output is V8's: checked before they are timed


def script(cls, config, dtype=torch.float16):
    return versions.fixed_script(cls, config, dtype, name=f"{cls.__name__}_probe")


def calls_configs(shapes) -> list[dict]:
    """The call's int4 configurations for ``shapes``."""
    chosen = [quant_linear.kernel_config("int4", quant_linear.config_for(m, n, k, "int4")) for m, n, k in shapes]
    return list({str(c): c for c in chosen}.values())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--stages", default="4", help="ring depths to build each configuration with")
    parser.add_argument("--configs", default="probe", help="probe: CONFIGS; calls: the call's for each shape")
    parser.add_argument("--shapes", default="probe", help="probe: SHAPES; decode: bench_v8's 1 and 16 tokens")
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    parser_shapes = DECODE_SHAPES if args.shapes == "decode" else SHAPES
    dtype = getattr(torch, args.dtype)
    if args.configs == "calls":  # each shape timed in its own configuration only
        configs = calls_configs(parser_shapes)
    else:
        configs = [{**c, "stages": int(stages)} for stages in args.stages.split(",") for c in CONFIGS]
    programs = {}
    for name in args.variants.split(","):
        cls = VARIANTS[name]
        for config in configs:
            with target("sm_90a"):  # built here, or found in tilus's cache
                programs[name, str(config)] = tilus_autotune.load(tilus_autotune.build(script(cls, config, dtype)))
            print(f"built {name} {config}", flush=True)
    if args.build_only:  # the libraries are opened, not loaded onto a GPU
        return
    rows = []
    for m, n, k in parser_shapes:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda()
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        qw = matmul.quantize(w, format="int4")
        w16 = qw.dequantize()
        out = torch.empty(m, n, dtype=dtype, device="cuda")
        mine = str(quant_linear.kernel_config("int4", quant_linear.config_for(m, n, k, "int4")))
        fns, names = [lambda x=x, w16=w16: torch.matmul(x, w16.T)], ["cublas"]
        for (name, config), program in programs.items():
            if args.configs == "calls" and config != mine:
                continue
            operands = (m, n, k, x, qw.packed, out, x.stride(0), qw.packed.stride(0), out.stride(0), 0, qw.scales)

            def launch(program=program, operands=operands):
                program(*operands)

            if name in CHECKED:
                out.fill_(float("nan"))
                launch()
                error = relative_error(out, x.float() @ w16.float().T)
                if name == "v8":
                    assert error < 1e-2, f"{name} {config} {m}x{n}x{k}: error {error:.3g}"
                elif not error < 1e-2:  # reported and left out of the window
                    print(f"{name} {config} {m}x{n}x{k}: wrong, error {error:.3g}", flush=True)
                    continue
            fns.append(launch)
            names.append(f"{name} {config}")
        times = interleaved_ms(fns, 50, 300)
        for name, ms in zip(names, times):
            row = dict(m=m, n=n, k=k, kernel=name, us=ms * 1e3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (
        args.out / f"bound_probe-{args.dtype}.json" if args.dtype != "float16" else args.out / "bound_probe.json"
    ).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
