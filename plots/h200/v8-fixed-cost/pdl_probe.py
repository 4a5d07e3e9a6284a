"""Would programmatic dependent launch hide V8's launch ramp? A prepared probe, not yet run on a GPU.

A launch of V8 at decode sizes spends about half its time with no CTA on an SM (README.md here).
With programmatic dependent launch (PDL: a launch attribute, then ``griddepcontrol.wait`` in the
kernel) the next kernel of a stream may be scheduled while this one still runs, and waits only
where it reads what the previous one wrote. tilus 0.2.0 emits neither half, so this probe patches
its code generator in its own process (nothing in ``matmul/`` changes):

* every kernel begins with ``griddepcontrol.wait`` (all threads: no global memory is touched before
  the previous kernel has finished and its writes are visible) and ``griddepcontrol.launch_dependents``
  (the next kernel may be scheduled from now on);
* every launch goes through ``cudaLaunchKernelEx`` with ``programmaticStreamSerializationAllowed``.

The chain timed: 16 int4 projections 4096 x 4096 at M = 1, each one's output the next one's input (so
a wait that did not hold would read a stale input: the chain's last output is checked against a
float32 chain on the dequantized weights), the 16 weights 138 MB together (more than L2 holds), in
a CUDA graph replayed back to back, without PDL (a cache built as the project builds) and with it
(a cache built here with the patches), each beside cuBLAS's fp16 chain of the same shape in the
same process. One process a cache: tilus names a program by its IR, which the patches leave alone.

    # on the CPU machine
    MATMUL_CACHE_DIR=$PWD/.cache/pf  python plots/h200/v8-fixed-cost/pdl_probe.py --build-only
    MATMUL_CACHE_DIR=$PWD/.cache/pdl python plots/h200/v8-fixed-cost/pdl_probe.py --build-only --pdl
    # on the GPU (carry .gpu, .cache/pf, .cache/pdl)
    MATMUL_CACHE_DIR=$PWD/.cache/pf  python plots/h200/v8-fixed-cost/pdl_probe.py
    MATMUL_CACHE_DIR=$PWD/.cache/pdl python plots/h200/v8-fixed-cost/pdl_probe.py --pdl
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch

CONFIG = {"block_m": 8, "warpgroups": 1, "split": 2, "stages": 4, "chunk": 64, "interleave": 1}
N = K = 4096
LINKS = 16

KERNEL_TOP = (
    'asm volatile("griddepcontrol.wait;" ::: "memory");\n'
    'asm volatile("griddepcontrol.launch_dependents;" ::: "memory");'
)


def patch_code_generator() -> None:
    """PDL in every kernel and launch that tilus emits from now on, in this process and its forks."""
    from tilus.hidet.backend.codegen import UpdatedCUDACodeGen
    from tilus.hidet.ir.func import Function
    from tilus.hidet.ir.stmt import BlackBoxStmt, SeqStmt
    from tilus.hidet.utils.doc import NewLine, Text

    visit_function = UpdatedCUDACodeGen.visit_Function

    @functools.wraps(visit_function)
    def with_wait_first(self, func):
        if func.kind == "cuda_kernel":
            body = SeqStmt([BlackBoxStmt(KERNEL_TOP), func.body])
            func = Function(func.name, func.params, body, func.ret_type, func.kind, func.attrs)
        return visit_function(self, func)

    def launch_with_pdl(self, stmt):
        if stmt.target != "cuda":
            raise ValueError(f"PDL launches are CUDA's, not {stmt.target}'s")
        # tilus's Text.format fills each "{}" in turn (no escapes): the literal braces here hold no "{}"
        config = (
            "cudaLaunchConfig_t config = {0}; config.gridDim = dim3({}); config.blockDim = dim3({}); "
            "config.dynamicSmemBytes = {}; config.stream = (cudaStream_t)get_cuda_stream(); "
            "cudaLaunchAttribute pdl[1]; pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; "
            "pdl[0].val.programmaticStreamSerializationAllowed = 1; config.attrs = pdl; config.numAttrs = 1; "
        )
        return NewLine() + Text("{ " + config + "cudaLaunchKernelEx(&config, {}, {}); }").format(
            self(stmt.grid_dim),
            self(stmt.block_dim),
            self(stmt.shared_mem_bytes),
            self.canonize_funcname(stmt.func_var.name),
            self(stmt.args),
        )

    UpdatedCUDACodeGen.visit_Function = with_wait_first
    UpdatedCUDACodeGen.visit_LaunchKernelStmt = launch_with_pdl


def programs_dir() -> Path:
    import tilus

    return Path(tilus.option.get_option("cache_dir"))


def all_built_with_pdl() -> bool:
    """Whether every program in this process's tilus cache was emitted with the patches (their
    sources are kept: the cache of ``--pdl`` must not be cleaned before the run)."""
    sources = list(programs_dir().glob("**/programs/*/module/source.cu"))
    return bool(sources) and all("griddepcontrol.wait" in s.read_text() for s in sources)


def build(pdl: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "h100" / "v8"))
    import probe_configs

    if pdl:
        patch_code_generator()
    probe_configs.build_all(torch.float16, "int4", [(1, N, K)], [CONFIG])
    if pdl and not all_built_with_pdl():
        raise SystemExit("a program of this cache was built without the patches: build it into an empty cache")


def chain(pdl: bool, rounds: int) -> dict:
    import matmul
    from matmul.measure.correctness import relative_error
    from matmul.quant import linear as quant_linear

    if pdl and not all_built_with_pdl():
        raise SystemExit("this cache holds programs built without the patches: pass it --pdl's own cache")
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(N, K, generator=gen) / K**0.5).half().cuda() for _ in range(LINKS)]
    packed = [matmul.quantize(w) for w in weights]
    dequantized = [qw.dequantize() for qw in packed]
    x = torch.randn(1, K, generator=gen).half().cuda()
    acts = [x] + [torch.empty(1, N, dtype=torch.float16, device="cuda") for _ in range(LINKS)]
    [built] = quant_linear.wait_until_all_built([(torch.float16, "int4", CONFIG)])
    if not built:
        raise SystemExit("V8 did not build")

    def ours():
        for i, qw in enumerate(packed):
            quant_linear.v8(acts[i], qw, acts[i + 1], CONFIG)

    def theirs():
        y = x
        for w in dequantized:
            y = torch.matmul(y, w.T)
        return y

    ours()
    torch.cuda.synchronize()
    exact = x.float()
    for w in dequantized:
        exact = exact @ w.float().T
    error = relative_error(acts[-1], exact)
    graphs = {}
    for name, fn in (("v8", ours), ("cublas", theirs)):
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graphs[name] = graph
    acts[-1].fill_(float("nan"))
    graphs["v8"].replay()
    torch.cuda.synchronize()
    replay_error = relative_error(acts[-1], exact)
    times = {name: [] for name in graphs}
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        for name in graphs if r % 2 == 0 else reversed(list(graphs)):
            for _ in range(3):
                graphs[name].replay()
            start.record()
            for _ in range(20):
                graphs[name].replay()
            stop.record()
            stop.synchronize()
            times[name].append(start.elapsed_time(stop) / 20 / LINKS * 1e3)
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    return {
        "pdl": pdl,
        "gpu": torch.cuda.get_device_name(),
        "links": LINKS,
        "shape": [1, N, K],
        "config": CONFIG,
        "error": error,
        "graph_error": replay_error,
        "us_per_link": median,
        "x_cublas": median["cublas"] / median["v8"],
        "rounds_us": times,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pdl", action="store_true", help="build (or require) kernels launched with PDL")
    parser.add_argument("--build-only", action="store_true", help="build into $MATMUL_CACHE_DIR (no GPU needed)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if "MATMUL_CACHE_DIR" not in os.environ:
        parser.error("set MATMUL_CACHE_DIR: one cache with PDL, another without")
    if args.build_only:
        build(args.pdl)
        return 0
    result = chain(args.pdl, args.rounds)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds_us"}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
