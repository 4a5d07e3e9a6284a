"""What bounds Hopper V8 (int4) at decode sizes: the widening, or the wgmma that takes the widened
weight? V8 (``matmul.kernels.hopper.v8``) against two of its own consumers with one job cut out,
timed in the same window (L2 flushed by reading, as ``bench_v8.py``), with cuBLAS fp16 beside:

* ``no_widen``: the packed words are neither loaded nor widened; each wgmma takes a constant A
  operand (the ring, the TMA traffic, every wgmma and the reduction as in V8);
* ``one_wgmma``: every part of a K block is widened as in V8, but only the block's last part is
  multiplied (a quarter or half of V8's wgmma instructions; the others' widened values are summed
  into it, so none of the conversion is dead code);
* ``ring_only``: neither widening nor wgmma: the consumers take each stage and release it (the
  ring, its TMA traffic, the grid and the reduction of zero partials: what V8's bytes cost alone).

Their outputs are wrong by design: nothing here is checked but V8 itself. Build on the CPU machine
first (``--build-only``; tilus caches the programs under ``$MATMUL_CACHE_DIR``), then time on the GPU:

    MATMUL_CACHE_DIR=.cache/probe python plots/h100/v8/bound_probe.py OUT --build-only
    python plots/h100/v8/bound_probe.py OUT                         # bound_probe.json
    [--variants v8,no_widen,ring_only] [--stages 4,8]               # (default: every variant, 4)
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from tilus import RegisterTensor, SharedTensor, int32

import matmul
from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.kernels import versions
from matmul.measure.correctness import relative_error
from matmul.measure.timing import interleaved_ms
from pipeline.widen import Int4Widen

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


VARIANTS = {"v8": V8.Kernel, "no_widen": NoWiden, "one_wgmma": OneWgmma, "ring_only": RingOnly}


def script(cls, config):
    return versions.fixed_script(cls, config, torch.float16, name=f"{cls.__name__}_probe")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--stages", default="4", help="ring depths to build each configuration with")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    configs = [{**c, "stages": int(stages)} for stages in args.stages.split(",") for c in CONFIGS]
    programs = {}
    for name in args.variants.split(","):
        cls = VARIANTS[name]
        for config in configs:
            with target("sm_90a"):  # built here, or found in tilus's cache
                programs[name, str(config)] = tilus_autotune.load(tilus_autotune.build(script(cls, config)))
            print(f"built {name} {config}", flush=True)
    if args.build_only:  # the libraries are opened, not loaded onto a GPU
        return
    rows = []
    for m, n, k in SHAPES:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).half().cuda()
        x = torch.randn(m, k, generator=gen).half().cuda()
        qw = matmul.quantize(w, format="int4")
        w16 = qw.dequantize()
        out = torch.empty(m, n, dtype=torch.float16, device="cuda")
        fns, names = [lambda x=x, w16=w16: torch.matmul(x, w16.T)], ["cublas"]
        for (name, config), program in programs.items():
            operands = (m, n, k, x, qw.packed, out, x.stride(0), qw.packed.stride(0), out.stride(0), 0, qw.scales)

            def launch(program=program, operands=operands):
                program(*operands)

            if name == "v8":
                launch()
                error = relative_error(out, x.float() @ w16.float().T)
                assert error < 1e-2, f"V8 {config} {m}x{n}x{k}: error {error:.3g}"
            fns.append(launch)
            names.append(f"{name} {config}")
        times = interleaved_ms(fns, 50, 300)
        for name, ms in zip(names, times):
            row = dict(m=m, n=n, k=k, kernel=name, us=ms * 1e3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "bound_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
