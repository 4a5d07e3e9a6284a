"""Why the tuner and the back-to-back windows rank some kernels differently (the kn and linear rows
of COMMAND.md): each case's version and cuBLAS (as the tuner runs it for the variant) timed three
ways in one process on the H100, the ratio cuBLAS's time over the version's in each:

* ``flushed``: the tuner's way (``timing.interleaved_ms``: launched in turn, L2 flushed by reading
  before every launch, each launch timed by its own events);
* ``one_weight``: ``model.compare``: windows of back-to-back launches on one set of operands;
* ``layers``: the same, each launch on the next of several copies of B (at least
  ``model.LAYERS_BYTES``), so that B comes from HBM as a model's weights do, the activations hot.

    python plots/h100/drop-in/tuner_vs_bench.py OUT.json
"""

import functools
import itertools
import json
import sys

import torch

from matmul.call import tuner
from matmul.harness import model
from matmul.kernels import variant as variants
from matmul.kernels import versions
from matmul.measure.correctness import poisoned_output, relative_error
from matmul.measure.timing import interleaved_ms

V7_16 = {"block_m": 16, "warpgroups": 1, "split": 2, "stages": 8, "multicast": 1}
V6 = {"block_m": 128, "block_n": 256, "block_k": 64, "stages": 4, "group": 8}
CASES = (  # name, M, N, K, variant, version, configuration: rows where the two methods disagreed
    ("q, o", 16, 4096, 4096, "kn", "v7", V7_16),
    ("k, v", 16, 1024, 4096, "kn", "v7", {**V7_16, "stages": 20}),
    ("qkv", 16, 6144, 4096, "kn", "v7", V7_16),
    ("q, o", 1024, 4096, 4096, "kn", "v6", V6),
    ("gate, up", 1024, 14336, 4096, "kn", "v6", V6),
    (
        "down",
        128,
        4096,
        14336,
        "bias+gelu_tanh",
        "v7",
        {**V7_16, "block_m": 64, "split": 1, "stages": 13, "multicast": 2},
    ),
    ("up", 1024, 14336, 4096, "bias+gelu_tanh", "v3", {k: V6[k] for k in ("block_m", "block_n", "block_k", "stages")}),
)


def case(name, m, n, k, key, version, config, dtype=torch.float16, rounds=5) -> dict:
    variant = variants.Variant.parse(key)
    a, _, operand, bias, ref = tuner.variant_operands(m, n, k, dtype, torch.device("cuda"), variant)
    out = poisoned_output(m, variant.out_columns(n), dtype)
    kernel = versions.kernel(versions.load("sm_90a", version), dtype, config, variant)
    copies = [operand] + [operand.clone() for _ in range(model.layer_count(operand) - 1)]  # B as the kernel reads it

    runs = [functools.partial(kernel, *versions.launch_args(a, c, out, bias, variant.b_layout)) for c in copies]
    vendors = [  # the tuner's cuBLAS candidate for the variant
        functools.partial(tuner.variant_vendor, a, c.T if variant.b_layout == "nk" else c, bias, variant.activation)
        for c in copies
    ]
    runs[0]()
    row = dict(name=name, m=m, n=n, k=k, variant=key, version=version, config=config, copies=len(copies))
    row["error"] = relative_error(out, ref)
    ms, vendor_ms = interleaved_ms([runs[0], vendors[0]], warmup_ms=20.0, repeat_ms=100.0)
    row["flushed"] = {"ms": ms, "cublas_ms": vendor_ms, "ratio": vendor_ms / ms}
    row["one_weight"] = model.compare(runs[0], vendors[0], rounds)
    ours, theirs = itertools.cycle(runs), itertools.cycle(vendors)
    row["layers"] = model.compare(lambda: next(ours)(), lambda: next(theirs)(), rounds)
    print(
        f"{name} {m}x{n}x{k} {key} {version}: flushed {row['flushed']['ratio']:.3f}x,"
        f" one weight {row['one_weight']['ratio']:.3f}x, layers {row['layers']['ratio']:.3f}x",
        flush=True,
    )
    return row


def _build(item) -> str:
    from matmul.call import building

    name, m, n, k, key, version, config = item
    try:
        building.build_kernel("sm_90a", torch.float16, version, config, variants.Variant.parse(key))
    except Exception as e:  # the case then builds (and fails) in the timing process, with its message
        return f"{name} {key} {version}: {type(e).__name__}: {e}"
    return ""


def prebuild() -> None:
    """Every case's kernel built at once in forked processes (before this process touches CUDA):
    a fresh machine would otherwise build them one after another inside the timing loop."""
    from matmul.build import parallel

    parallel.in_forked_processes(_build, [(item,) for item in CASES], workers=len(CASES))


def main(path):
    prebuild()
    torch.manual_seed(0)
    rows = []
    for item in CASES:
        rows.append(case(*item))
        with open(path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tuner_vs_bench.json")
