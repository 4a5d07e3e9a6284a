"""The switched Llama's training step with its eager autograd through ``torch.autograd.Function``s
(``torch_op._EagerLinear``, ``_EagerMatmul``: the call's path) against the same step through the
custom operators (``torch.ops.tilus_matmul.linear`` and ``mm`` with their registered backward: the
path before), and against the unswitched model, in one process on the same choices: the
operators' dispatch is host time per projection each way, which the GPU may or may not hide.

``MATMUL_TUNE=off`` (set here unless given): each bucket's instant choice (shipped, or its nearest
relative's) is final, so that no tuning child shares the GPU; the chosen kernels are still built
by the build child, waited for before timing.

    python plots/h100/drop-in/train_host_ab.py OUT.json [--rounds 6]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("MATMUL_TUNE", "off")

import torch  # noqa: E402

from matmul.call import torch_op  # noqa: E402
from matmul.harness import drop_in  # noqa: E402
from matmul.harness import model as model_bench  # noqa: E402
from matmul.kernels import swiglu  # noqa: E402


def _operator_linear(x, weight, bias, activation):
    return swiglu.activation(torch.ops.tilus_matmul.linear(x, weight, bias, ""), activation)


def _operator_matmul(a, b, out):
    return torch.ops.tilus_matmul.mm(a, b)


@contextlib.contextmanager
def through_operators():
    """Recorded calls through the custom operators, as before ``_EagerLinear`` and ``_EagerMatmul``."""
    saved = torch_op.linear_with_grad, torch_op.with_grad
    torch_op.linear_with_grad, torch_op.with_grad = _operator_linear, _operator_matmul
    try:
        yield
    finally:
        torch_op.linear_with_grad, torch_op.with_grad = saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    reference, switched, conversion = drop_in.llama_pair(torch.float16)
    ids = torch.randint(0, reference.config.vocab_size, drop_in.TRAIN, device="cuda")
    steps = drop_in.training_steps({"ours": switched, "theirs": reference}, ids)

    def operators_step():
        with through_operators():
            return steps["ours"]()

    for step in (steps["ours"], operators_step, steps["theirs"]):
        step()
    row = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": os.environ["MATMUL_TUNE"]}
    row["settle"] = drop_in.settle()
    row["swiglu_built"] = swiglu.wait_until_built(torch.float16)
    print(row, flush=True)
    # ratio: the operators' step time over the functions' (above 1: the functions' step is faster)
    row["functions_vs_operators"] = model_bench.compare(steps["ours"], operators_step, args.rounds)
    row["functions_vs_torch"] = model_bench.compare(steps["ours"], steps["theirs"], args.rounds)
    row["operators_vs_torch"] = model_bench.compare(operators_step, steps["theirs"], args.rounds)
    for name in ("functions_vs_operators", "functions_vs_torch", "operators_vs_torch"):
        r = row[name]
        print(f"{name}: {r['ratio']:.3f}x ({r['matmul_ms']:.2f} ms against {r['torch_ms']:.2f} ms)", flush=True)
    with open(args.out, "w") as f:
        json.dump(row, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
