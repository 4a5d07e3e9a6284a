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

The chains timed: 16 projections 4096 x 4096 at M = 1, each one's output the next one's input (so
a wait that did not hold would read a stale input: each chain's last output is checked against a
float32 chain), in int4 through V8 (its 16 weights 138 MB together, more than L2 holds) and in
float16 through V7 (what a decode step runs), each in a CUDA graph replayed back to back, without
PDL (a cache built as the project builds) and with it (a cache built here with the patches), beside
cuBLAS's float16 chain in the same process. One process a cache: tilus names a program by its IR,
which the patches leave alone.

    # on the CPU machine
    MATMUL_CACHE_DIR=$PWD/.cache/nopdl python plots/h200/v8-fixed-cost/pdl_probe.py --build-only
    MATMUL_CACHE_DIR=$PWD/.cache/pdl   python plots/h200/v8-fixed-cost/pdl_probe.py --build-only --pdl
    # on the GPU (carry .gpu, .cache/nopdl, .cache/pdl; clean neither: the probe reads the sources)
    MATMUL_CACHE_DIR=$PWD/.cache/nopdl python plots/h200/v8-fixed-cost/pdl_probe.py --out nopdl.json
    MATMUL_CACHE_DIR=$PWD/.cache/pdl   python plots/h200/v8-fixed-cost/pdl_probe.py --pdl --out pdl.json
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
V7_CONFIG = {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 8, "multicast": 1}  # the H200 table's at 1 token
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
        # tilus's Text.format fills each "{}" in turn (no escapes): the literal braces here hold no
        # "{}". The launch's last line keeps tilus's own "dim3(threads, 1, 1), shared bytes,
        # (cudaStream_t)" order, which the build report reads (matmul.build.compiler)
        launch = (
            "{ auto launch = [&](dim3 grid, dim3 block, size_t shared, cudaStream_t stream) { "
            "cudaLaunchConfig_t config = {0}; config.gridDim = grid; config.blockDim = block; "
            "config.dynamicSmemBytes = shared; config.stream = stream; "
            "cudaLaunchAttribute pdl[1]; pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; "
            "pdl[0].val.programmaticStreamSerializationAllowed = 1; config.attrs = pdl; config.numAttrs = 1; "
            "cudaLaunchKernelEx(&config, {}, {}); };\n"
            "  launch(dim3({}), dim3({}), {}, (cudaStream_t)get_cuda_stream()); }"
        )
        return NewLine() + Text(launch).format(
            self.canonize_funcname(stmt.func_var.name),
            self(stmt.args),
            self(stmt.grid_dim),
            self(stmt.block_dim),
            self(stmt.shared_mem_bytes),
        )

    UpdatedCUDACodeGen.visit_Function = with_wait_first
    UpdatedCUDACodeGen.visit_LaunchKernelStmt = launch_with_pdl


def programs_dir() -> Path:
    import tilus

    return Path(tilus.option.get_option("cache_dir"))


def built_as(pdl: bool) -> bool:
    """Whether every program in this process's tilus cache was emitted with the patches (``pdl``) or
    every one without them (their sources are kept: neither cache may be cleaned before the run)."""
    sources = list(programs_dir().glob("**/programs/*/module/source.cu"))
    return bool(sources) and all(("griddepcontrol.wait" in s.read_text()) == pdl for s in sources)


def build(pdl: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "h100" / "v8"))
    import probe_configs

    if pdl:
        patch_code_generator()
    from matmul.harness import roofline
    from matmul.kernels import versions

    probe_configs.build_all(torch.float16, "int4", [(1, N, K)], [CONFIG])
    roofline.prebuild(versions.load("sm_90a", "v7"), [V7_CONFIG], [torch.float16])
    if not built_as(pdl):
        raise SystemExit("this cache holds programs built the other way: build into an empty cache")


def chain(pdl: bool, rounds: int) -> dict:
    import matmul
    from matmul.harness import roofline
    from matmul.kernels import versions
    from matmul.measure.correctness import relative_error
    from matmul.quant import linear as quant_linear

    if not built_as(pdl):
        raise SystemExit("this cache holds programs built the other way: with --pdl, pass the --pdl build's cache")
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(N, K, generator=gen) / K**0.5).half().cuda() for _ in range(LINKS)]
    packed = [matmul.quantize(w) for w in weights]
    dequantized = [qw.dequantize() for qw in packed]
    x = torch.randn(1, K, generator=gen).half().cuda()
    [built] = quant_linear.wait_until_all_built([(torch.float16, "int4", CONFIG)])
    if not built:
        raise SystemExit("V8 did not build")
    v7 = versions.load("sm_90a", "v7")
    chains = {}  # name: (the links, one function a projection; the chain's output; its float32 value)
    for name, ws in (("v8", packed), ("v7", weights), ("cublas", weights)):
        acts = [x] + [torch.empty(1, N, dtype=torch.float16, device="cuda") for _ in range(LINKS)]
        if name == "v8":
            links = [functools.partial(quant_linear.v8, acts[i], qw, acts[i + 1], CONFIG) for i, qw in enumerate(ws)]
        elif name == "v7":
            links = [roofline.launcher(v7, acts[i], w, acts[i + 1], V7_CONFIG) for i, w in enumerate(ws)]
        else:
            links = [functools.partial(torch.matmul, acts[i], w.T, out=acts[i + 1]) for i, w in enumerate(ws)]
        exact = x.float()
        for w in dequantized if name == "v8" else ws:
            exact = exact @ w.float().T
        chains[name] = (links, acts[-1], exact)
    errors, graphs = {}, {}
    for name, (links, last, exact) in chains.items():
        graphs[name] = captured(links, last)
        errors[name] = relative_error(last, exact)
    times = replay_rounds(graphs, rounds, LINKS)
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    return {
        "pdl": pdl,
        "gpu": torch.cuda.get_device_name(),
        "links": LINKS,
        "shape": [1, N, K],
        "configs": {"v8": CONFIG, "v7": V7_CONFIG},
        "graph_errors": errors,
        "us_per_link": median,
        "x_cublas": {name: median["cublas"] / median[name] for name in ("v8", "v7")},
        "rounds_us": times,
    }


def captured(steps: list, last: torch.Tensor) -> "torch.cuda.CUDAGraph":
    """``steps`` run once (each kernel loaded), then captured in a CUDA graph, replayed once into a
    ``last`` poisoned first (the caller checks it)."""
    for step in steps:
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for step in steps:
            step()
    last.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_rounds(graphs: dict, rounds: int, links: int) -> dict:
    """Each graph's microseconds a link in each of ``rounds`` windows (3 replays to warm, then 20
    timed), the graphs taken in turn, in reverse order every other round."""
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
            times[name].append(start.elapsed_time(stop) / 20 / links * 1e3)
    return times


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
