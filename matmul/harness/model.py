"""What a model sees: ``matmul()`` against ``torch.matmul`` with the host's time included.

The paired windows of ``bench`` flush L2 and time each launch alone: they compare kernels and hide
what a model pays per call on the host (checks, dispatch, allocation). Here the calls run as a
model issues them, back to back on one stream, no flush or sync between them, one pair of CUDA
events around a window; where the host is slower than the GPU, its time is what is measured.

* ``back_to_back``: per call, over Llama-3-8B's projections with the fused q/k/v and gate/up
  weights and a 128256-word lm_head (``PROJECTIONS``) at ``TOKENS`` tokens, ``matmul(x, w.T)``
  against ``torch.matmul(x, w.T)``, the view ``w.T`` made in the call. ``layers`` (the main figure):
  each call takes the next of copies of the weight (``LAYERS_BYTES`` together), so every call reads
  its weight from HBM as a model's layers do; ``one weight``: a weight smaller than L2 stays there,
  the kernels get shorter than the host's issue time: the host's cost at its most exposed.
* ``host_us``: the host's time per call at 16 x 256 x 256, GPU idle, for ``torch.matmul``,
  ``matmul()``, and the version ``matmul()`` would launch there through tilus's ``Script.__call__``
  and through ``SeriesPlan.__call__`` (what calls with ``out=`` run).
* ``block``: the forward pass of one transformer block (``Block``: RMSNorm, grouped-query attention
  through ``scaled_dot_product_attention``, a SwiGLU MLP) with its projections through ``matmul()``
  against ``torch.matmul``.

Each comparison runs ``rounds`` rounds (the block three times as many) in alternating order; a
ratio is torch's time over ``matmul()``'s (above 1: ``matmul()`` is faster), the median of the
rounds'. Every shape is tuned first (``matmul.tune``, one child process).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from . import presets

PROJECTIONS = {
    **presets.LLAMA3_8B_PROJECTIONS,
    "qkv": (6144, 4096),
    "gate-up": (28672, 4096),
    "lm_head": (128256, 4096),
}
TOKENS = (16, 128, 1024, 8192)
LAYERS_BYTES = 256 * 2**20  # the copies of a weight a "layers" window cycles through: five times an NVIDIA H100's L2
HOST_SHAPE = (16, 256, 256)
BLOCK_SIZES = ((1, 128), (1, 1024), (4, 1024), (2, 4096))  # batch x sequence
FORMAT = "tilus-matmul-model/2"


def settle_plans(timeout_s: float = 60.0) -> None:
    """Wait until matmul()'s planner has derived the plans of the calls made so far. An unseen call
    runs cuBLAS and leaves its plan to the planner, which derives it once the calls pause
    (``matmul.call.yielding.planner_gate``); the windows here time the calls after that, and the
    first calls are timed elsewhere (``harness.trace``)."""
    from ..call import api

    api._plans.planner.wait(timeout_s)


def settled_result(fn: Callable[[], object]):
    """What ``fn`` returns once matmul()'s planner has derived the plans of its calls: a call unseen
    (or whose bucket's choice changed since its plan) runs torch's ops while its plan is derived, so
    the result of a first call checks cuBLAS, not the kernel that the timed windows run."""
    fn()
    settle_plans()
    return fn()


def window_ms(fn: Callable[[], object], calls: int) -> float:
    """Milliseconds per call of ``calls`` calls launched back to back, one event pair around them."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def compare(
    ours: Callable[[], object], theirs: Callable[[], object], rounds: int = 10, window_ms_target: float = 50.0
) -> dict:
    """Both functions timed in back-to-back windows of about ``window_ms_target``, ``rounds`` rounds
    in alternating order; per call milliseconds (medians) and the median of the rounds' ratios."""
    for fn in (ours, theirs):
        fn()
    torch.cuda.synchronize()
    settle_plans()
    estimate = max(window_ms(theirs, 3), 1e-3)
    calls = max(10, int(window_ms_target / estimate))
    window_ms(ours, calls)  # warm-up: the GPU's clock settles under this load
    window_ms(theirs, calls)
    ours_ms, theirs_ms = [], []
    for r in range(rounds):
        order = [(ours, ours_ms), (theirs, theirs_ms)]
        for fn, times in order if r % 2 == 0 else order[::-1]:
            times.append(window_ms(fn, calls))
    ratios = [t / o for o, t in zip(ours_ms, theirs_ms)]
    return {
        "matmul_ms": statistics.median(ours_ms),
        "torch_ms": statistics.median(theirs_ms),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "calls": calls,
    }


def host_us(fn: Callable[[], object], calls: int = 2000, repeats: int = 5) -> float:
    """The host's time per call in microseconds (best of ``repeats`` loops, after a first call and
    its plan), the GPU drained between loops."""
    best = math.inf
    fn()
    settle_plans()
    for _ in range(repeats):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - begin) / calls * 1e6)
    torch.cuda.synchronize()
    return best


# --- the transformer block -----------------------------------------------------------------------


class Block:
    """One Llama-style decoder block (no rotary embedding: it does not touch the projections), its
    projections through ``linear(x, w)`` (``x @ w.T``)."""

    def __init__(
        self,
        linear: Callable,
        hidden: int = 4096,
        mlp: int = 14336,
        heads: int = 32,
        kv_heads: int = 8,
        dtype=torch.float16,
        device="cuda",
        seed: int = 0,
        weights: Optional[dict] = None,
    ):
        self.linear, self.hidden, self.mlp, self.heads, self.kv_heads = linear, hidden, mlp, heads, kv_heads
        self.head_dim = hidden // heads
        if weights is None:
            g = torch.Generator(device=device).manual_seed(seed)

            def weight(n, k):
                return (torch.randn(n, k, device=device, dtype=torch.float32, generator=g) / math.sqrt(k)).to(dtype)

            kv = kv_heads * self.head_dim
            weights = {
                "qkv": weight(hidden + 2 * kv, hidden),
                "o": weight(hidden, hidden),
                "gate_up": weight(2 * mlp, hidden),
                "down": weight(hidden, mlp),
                "norm_1": torch.ones(hidden, device=device, dtype=dtype),
                "norm_2": torch.ones(hidden, device=device, dtype=dtype),
            }
        self.weights = weights

    @staticmethod
    def rms_norm(x, weight, eps: float = 1e-5):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        w, kv = self.weights, self.kv_heads * self.head_dim
        h = x.reshape(batch * seq, hidden)
        qkv = self.linear(self.rms_norm(h, w["norm_1"]), w["qkv"])
        q, k, v = qkv.split([hidden, kv, kv], dim=-1)
        q = q.reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = k.reshape(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + self.linear(attn.transpose(1, 2).reshape(batch * seq, hidden), w["o"])
        gate, up = self.linear(self.rms_norm(h, w["norm_2"]), w["gate_up"]).chunk(2, dim=-1)
        h = h + self.linear(torch.nn.functional.silu(gate) * up, w["down"])
        return h.reshape(batch, seq, hidden)


def block_projection_shapes(
    tokens: int, hidden: int = 4096, mlp: int = 14336, heads: int = 32, kv_heads: int = 8
) -> list[tuple[int, int, int]]:
    """(M, N, K) of ``Block``'s four projections (q/k/v fused, o, gate/up fused, down) at ``tokens``."""
    kv = kv_heads * hidden // heads
    return [
        (tokens, hidden + 2 * kv, hidden),
        (tokens, hidden, hidden),
        (tokens, 2 * mlp, hidden),
        (tokens, hidden, mlp),
    ]


# --- the run -------------------------------------------------------------------------------------


def run(
    dtype=torch.float16, tokens=TOKENS, projections=PROJECTIONS, block_sizes=BLOCK_SIZES, rounds: int = 10, log=print
) -> dict:
    import matmul
    from matmul.call import api

    from .results import machine, software  # the GPU, its clocks and the software, as the bench records them

    device = torch.device("cuda", torch.cuda.current_device())
    shapes = [(m, n, k) for m in tokens for n, k in projections.values()]
    block_shapes = sorted({s for b, q in block_sizes for s in block_projection_shapes(b * q)})
    log(f"tuning {len(set(shapes) | set(block_shapes) | {HOST_SHAPE})} shapes (those not stored yet) ...")
    began = time.time()
    matmul.tune([*shapes, *block_shapes, HOST_SHAPE], dtype=dtype, device=device)
    results = {
        "format": FORMAT,
        "dtype": str(dtype).removeprefix("torch."),
        "machine": machine(),
        "software": software(),
        "tuning_s": time.time() - began,
        "rounds": rounds,
        "back_to_back": [],
        "block": [],
    }

    g = torch.Generator(device=device).manual_seed(1)
    for label, (n, k) in projections.items():
        w = (torch.rand(n, k, device=device, generator=g) * 2 - 1).to(dtype)
        for m in tokens:
            x = (torch.rand(m, k, device=device, generator=g) * 2 - 1).to(dtype)
            row = {
                "label": label,
                "m": m,
                "n": n,
                "k": k,
                "kernel": api.choice(x, w.T)["version"],
                **_projection(x, w, rounds),
            }
            results["back_to_back"].append(row)
            log(
                f"{label:>9} {m:>5}x{n}x{k}: matmul() {row['matmul_ms'] * 1e3:9.1f} us ({row['kernel']}), "
                f"torch {row['torch_ms'] * 1e3:9.1f} us: {row['ratio']:.3f}x; "
                f"one weight {row['one_weight']['ratio']:.3f}x"
            )
        torch.cuda.empty_cache()
    results["back_to_back_summary"] = summary([r["ratio"] for r in results["back_to_back"]])
    results["one_weight_summary"] = summary([r["one_weight"]["ratio"] for r in results["back_to_back"]])

    results["host_us"] = host_times(dtype, device)
    log(
        f"host time per call at {'x'.join(map(str, HOST_SHAPE))}: "
        + ", ".join(f"{name} {us:.1f} us" for name, us in results["host_us"].items() if isinstance(us, float))
    )

    for batch, seq in block_sizes:
        x = torch.randn(batch, seq, 4096, device=device, generator=g).to(dtype)
        row = {"batch": batch, "seq": seq, "tokens": batch * seq, **_block(x, dtype, rounds)}
        results["block"].append(row)
        log(
            f"block {batch} x {seq}: matmul() {row['matmul_ms']:.3f} ms, torch {row['torch_ms']:.3f} ms: "
            f"{row['ratio']:.3f}x (outputs differ by {row['vs_torch_error']:.1e})"
        )
    return results


def relative_difference(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||y|| in float32."""
    x, y = x.float(), y.float()
    return float((x - y).norm() / y.norm().clamp_min(1e-30))


def summary(ratios: list[float]) -> dict:
    return {"geomean": statistics.geometric_mean(ratios), "min": min(ratios), "shapes": len(ratios)}


def layer_count(w: torch.Tensor) -> int:
    """How many copies of ``w`` a "layers" window cycles through: ``LAYERS_BYTES`` of them, at least one."""
    return max(1, math.ceil(LAYERS_BYTES / (w.numel() * w.element_size())))


def _projection(x: torch.Tensor, w: torch.Tensor, rounds: int, operand=torch.t) -> dict:
    """``matmul(x, operand(w))`` against ``torch.matmul`` on the same operands, both ways (the
    module's docstring); ``operand``: what a call makes of the stored weight (``w.T`` for a linear
    layer's [N, K] weight; the identity for a weight stored as [K, N])."""
    import matmul

    error = relative_difference(settled_result(lambda: matmul.matmul(x, operand(w))), torch.matmul(x, operand(w)))
    layers = [w] + [w.clone() for _ in range(layer_count(w) - 1)]
    ours, theirs = itertools.cycle(layers), itertools.cycle(layers)
    return {
        "vs_torch_error": error,
        "layers": len(layers),
        **compare(
            lambda: matmul.matmul(x, operand(next(ours))), lambda: torch.matmul(x, operand(next(theirs))), rounds
        ),
        "one_weight": compare(lambda: matmul.matmul(x, operand(w)), lambda: torch.matmul(x, operand(w)), rounds),
    }


def _block(x: torch.Tensor, dtype, rounds: int) -> dict:
    import matmul

    ours = Block(lambda t, w: matmul.matmul(t, w.T), dtype=dtype, device=x.device)
    theirs = Block(lambda t, w: torch.matmul(t, w.T), dtype=dtype, device=x.device, weights=ours.weights)
    error = relative_difference(settled_result(lambda: ours(x)), theirs(x))
    return {
        "vs_torch_error": error,
        # three times the rounds in shorter windows: where the block is host-bound, the host's hiccups move a
        # window's time by tens of percent, and the median of more rounds settles
        **compare(lambda: ours(x), lambda: theirs(x), rounds=3 * rounds, window_ms_target=50.0),
    }


def host_times(dtype, device) -> dict:
    """Host time per call at ``HOST_SHAPE``: torch, ``matmul()``, and a version of the series through
    tilus's ``Script.__call__`` and through ``matmul()``'s short path (forced, whatever the choice)."""
    import matmul
    from matmul.call import api, tilus_autotune, tuner
    from matmul.call.launch import SeriesPlan
    from matmul.contract import check_call
    from matmul.kernels import versions

    m, n, k = HOST_SHAPE
    x = torch.rand(m, k, device=device).to(dtype)
    w = torch.rand(n, k, device=device).to(dtype)
    out = {
        "torch.matmul": host_us(lambda: torch.matmul(x, w.T)),
        "matmul()": host_us(lambda: matmul.matmul(x, w.T)),
        "matmul() runs": api.choice(x, w.T)["version"],
    }
    arch = api.device_arch(device)
    version = next(v for v in tuner.candidates(arch, m, n, k) if v != tuner.VENDOR)
    module = versions.load(arch, version)
    script = versions.kernel(module, dtype, module.REPRESENTATIVE)
    bt, copied, c = check_call(x, w.T)
    args = versions.launch_args(x, bt, c)
    script(*args)
    out[f"{version} through Script.__call__"] = host_us(lambda: script(*args))
    plan = SeriesPlan(tilus_autotune.launch_function(script), x, w.T, bt, copied, c, None)
    result = plan(x, w.T, None)
    torch.cuda.synchronize()
    out[f"{version} through matmul()'s short path"] = host_us(lambda: plan(x, w.T, None))
    out["short path error"] = relative_difference(result, x.float() @ w.float().T)
    return out


# --- the report ----------------------------------------------------------------------------------


def table(results: dict) -> str:
    lines = [
        "| projection | M x N x K | matmul() runs | layers | matmul() us/call | torch us/call | x torch "
        "| one weight: matmul() us/call | torch us/call | x torch |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["back_to_back"]:
        one = r["one_weight"]
        lines.append(
            f"| {r['label']} | {r['m']} x {r['n']} x {r['k']} | {r['kernel']} | {r['layers']} | "
            f"{r['matmul_ms'] * 1e3:.1f} | {r['torch_ms'] * 1e3:.1f} | {r['ratio']:.3f} | "
            f"{one['matmul_ms'] * 1e3:.1f} | {one['torch_ms'] * 1e3:.1f} | {one['ratio']:.3f} |"
        )
    s, one = results["back_to_back_summary"], results["one_weight_summary"]
    lines += [
        "",
        f"Back to back over {s['shapes']} shapes, each call on the next layer's weight: geometric mean "
        f"{s['geomean']:.3f}x torch.matmul, worst {s['min']:.3f}x. Every call on one weight: geometric "
        f"mean {one['geomean']:.3f}x, worst {one['min']:.3f}x.",
        "",
        "| host time per call, 16 x 256 x 256 | us |",
        "| --- | ---: |",
    ]
    for name, value in results["host_us"].items():
        if isinstance(value, float) and "error" not in name:
            lines.append(f"| {name} | {value:.2f} |")
    lines += [
        "",
        f"(matmul() runs {results['host_us']['matmul() runs']} there.)",
        "",
        "| block (batch x seq) | tokens | matmul() ms | torch ms | x torch | outputs differ by |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["block"]:
        lines.append(
            f"| {r['batch']} x {r['seq']} | {r['tokens']} | {r['matmul_ms']:.3f} | {r['torch_ms']:.3f} | "
            f"{r['ratio']:.3f} | {r['vs_torch_error']:.1e} |"
        )
    return "\n".join(lines)


def middle_half(rows: list) -> list[list[float]]:
    """Whiskers from each row's median ratio to the quartiles of its rounds' ratios (``yerr`` of a
    bar chart): how far the windows' noise moves a ratio. None of a row's: no whisker."""
    below, above = [], []
    for r in rows:
        ratios = r.get("ratios", []) if r else []
        if len(ratios) < 2:
            below.append(0.0), above.append(0.0)
            continue
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        below.append(max(r["ratio"] - q1, 0.0)), above.append(max(q3 - r["ratio"], 0.0))
    return [below, above]


def draw(results: dict, out_dir: Path) -> list[Path]:
    """The back-to-back ratios per shape and the block's per size, as PNG and SVG; whiskers span
    the middle half of each comparison's rounds."""
    from matplotlib.figure import Figure

    rows = results["back_to_back"]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    tokens = sorted({r["m"] for r in rows})
    fig = Figure(figsize=(13, 5.2), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[3, 1])
    ax = left.subplots()
    width = 0.8 / len(tokens)
    colors = ["tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple"]
    for i, m in enumerate(tokens):
        found = [next((r for r in rows if r["m"] == m and r["label"] == label), None) for label in labels]
        values = [r["ratio"] if r else math.nan for r in found]
        xs = [j + (i - (len(tokens) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, values, width, label=f"M = {m}", color=colors[i % len(colors)])
        ax.errorbar(xs, values, yerr=middle_half(found), fmt="none", ecolor="0.25", elinewidth=0.8, capsize=1.5)
        one = [
            next((r["one_weight"]["ratio"] for r in rows if r["m"] == m and r["label"] == label), math.nan)
            for label in labels
        ]
        ax.plot(xs, one, "k_", ms=7, mew=1.5, label="one weight" if i == 0 else None)
    ax.axhline(1.0, color="0.3", lw=1)
    ax.axhline(0.97, color="0.3", lw=1, ls=":")
    weights = {r["label"]: (r["n"], r["k"]) for r in rows}
    ax.set_xticks(
        range(len(labels)), [f"{label}\n{weights[label][0]} x {weights[label][1]}" for label in labels], fontsize=8
    )
    ax.set_ylabel("torch.matmul time / matmul() time")
    s = results["back_to_back_summary"]
    one = results["one_weight_summary"]
    ax.set_title(
        f"Back to back, host time included; bars: each call on the next layer's weight (geomean "
        f"{s['geomean']:.3f}x, worst {s['min']:.3f}x); marks: every call on one weight (geomean "
        f"{one['geomean']:.3f}x, worst {one['min']:.3f}x); whiskers: the middle half of the rounds",
        fontsize=9,
        wrap=True,
    )
    ax.legend(fontsize=8, ncols=len(tokens) + 1)
    below, above = middle_half(rows)
    every = [r["ratio"] for r in rows] + [r["one_weight"]["ratio"] for r in rows]
    every += [r["ratio"] - d for r, d in zip(rows, below)] + [r["ratio"] + d for r, d in zip(rows, above)]
    ax.set_ylim(min(0.9, min(every) - 0.02), max(1.1, max(every) + 0.02))
    ax2 = right.subplots()
    blocks = results["block"]
    ax2.bar(range(len(blocks)), [r["ratio"] for r in blocks], color="tab:red")
    ax2.errorbar(
        range(len(blocks)), [r["ratio"] for r in blocks], yerr=middle_half(blocks), fmt="none", ecolor="0.25", capsize=3
    )
    ax2.axhline(1.0, color="0.3", lw=1)
    ax2.set_xticks(range(len(blocks)), [f"{r['batch']} x {r['seq']}" for r in blocks], fontsize=8)
    ax2.set_title("Transformer block forward", fontsize=10)
    ax2.set_ylim(min(0.9, min(r["ratio"] for r in blocks) - 0.02), max(1.1, max(r["ratio"] for r in blocks) + 0.02))
    fig.suptitle(
        f"matmul() against torch.matmul as a model calls it: {results['machine'].get('gpu', '')}, {results['dtype']}",
        fontsize=11,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for ext in ("png", "svg"):
        path = out_dir / f"model-{results['dtype']}.{ext}"
        fig.savefig(path, dpi=120, metadata={"Date": None} if ext == "svg" else None)
        written.append(path)
    return written


def main(out_dir: Path, dtype=torch.float16, rounds: int = 10) -> int:
    results = run(dtype=dtype, rounds=rounds)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"results-model-{results['dtype']}.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    (out_dir / f"model-{results['dtype']}.md").write_text(text + "\n")
    print(text)
    for path in draw(results, out_dir):
        print(f"figure: {path}")
    return 0
