"""V8 and cuBLAS timed two ways on the same decode shapes: each launch alone after L2 is flushed by
reading (``bench_v8.py``'s way, #25's table: the kernel's code is evicted from L2 with the data),
and launches replayed back to back from a CUDA graph, each on the next of several copies of the
weight (together more than three times L2: each launch reads its weight from HBM while the code,
the tensor maps and the tokens stay warm, as a decode step's projections run in a serving engine).

Per launch in the graph, the time includes no host work and no separate launch's ramp; beside each
shape, a graph of as many launches of a one-thread kernel says what a launch alone costs there, and
the bytes-only floor is the packed weight and scales (or the 16-bit weight) at the copy bandwidth.

    MATMUL_CACHE_DIR=DIR python plots/h200/v8-cold/cold_probe.py OUT --build-only   # on the CPU machine
    MATMUL_CACHE_DIR=DIR python plots/h200/v8-cold/cold_probe.py OUT                # on the GPU: cold_probe.json
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch

import matmul
from matmul.build.compiler import target
from matmul.call import tilus_autotune
from matmul.harness import roofline
from matmul.measure.timing import interleaved_ms
from matmul.quant import linear as quant_linear

SHAPES = ((1, 4096, 4096), (16, 4096, 4096), (1, 6144, 4096), (1, 28672, 4096), (16, 28672, 4096), (1, 4096, 14336))
L2_BYTES = 60 << 20  # the H200's L2 (50 MiB on the H100): copies cover three times this
ROUNDS = 20  # passes over the copies in one graph


def graph_us(step, launches: int) -> float:
    """Microseconds a launch: ``step`` (which issues ``launches`` launches) captured once, the graph
    replayed 5 times after 2 warm-up replays (the median)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # the first call's allocations and plans, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    times = []
    for i in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end) * 1e3 / launches)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    configs = {(m, n, k): quant_linear.config_for(m, n, k, "int4") for m, n, k in SHAPES}
    if args.build_only:
        for config in {str(c): c for c in configs.values()}.values():
            with target("sm_90a"):
                tilus_autotune.build(quant_linear.script(dtype, "int4", config))
            print("built", config, flush=True)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    bandwidth = roofline.copy_tb_per_s(512 << 20, 50, 300) * 1e12  # bytes a second, as the floors count them
    rows = []
    tiny = torch.zeros(1, device="cuda")
    for (m, n, k), config in configs.items():
        assert quant_linear.wait_until_built(dtype, "int4", config), config
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda()
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        qw = matmul.quantize(w, format="int4")
        packed_bytes = qw.packed.numel() * qw.packed.element_size() + qw.scales.numel() * qw.scales.element_size()
        copies = max(2, math.ceil(3 * L2_BYTES / packed_bytes))
        qws = [matmul.quantize(w, format="int4") for _ in range(copies)]
        fp16_copies = max(2, math.ceil(3 * L2_BYTES / (w.numel() * w.element_size())))
        ws = [w.clone() for _ in range(fp16_copies)]
        reference = x.float() @ qw.dequantize().float().T
        error = float((matmul.linear(x, qws[-1]).float() - reference).norm() / reference.norm())
        assert error < 1e-2, f"{m}x{n}x{k}: error {error}"
        flushed_v8, flushed_cublas = interleaved_ms(
            [lambda x=x, qw=qw: matmul.linear(x, qw), lambda x=x, w=w: torch.matmul(x, w.T)], 50, 300
        )

        def v8_step(qws=qws, x=x):
            for _ in range(ROUNDS):
                for q in qws:
                    matmul.linear(x, q)

        def cublas_step(ws=ws, x=x):
            for _ in range(ROUNDS):
                for weight in ws:
                    torch.matmul(x, weight.T)

        def tiny_step(count=ROUNDS * copies):
            for _ in range(count):
                tiny.add_(1.0)

        row = {
            "m": m,
            "n": n,
            "k": k,
            "config": config,
            "error": error,
            "copies": copies,
            "v8_flushed_us": flushed_v8 * 1e3,
            "cublas_flushed_us": flushed_cublas * 1e3,
            "v8_graph_us": graph_us(v8_step, ROUNDS * copies),
            "cublas_graph_us": graph_us(cublas_step, ROUNDS * fp16_copies),
            "tiny_graph_us": graph_us(tiny_step, ROUNDS * copies),
            "int4_bytes_floor_us": packed_bytes / bandwidth * 1e6,
            "fp16_bytes_floor_us": w.numel() * w.element_size() / bandwidth * 1e6,
            "copy_tb_s": bandwidth / 1e12,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / f"cold_probe-{args.dtype}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
