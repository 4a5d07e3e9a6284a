"""V8 int4 at one token against torch's own int4 kernel (tinygemm, ``torch._weight_int4pack_mm``),
bfloat16, in the call's configuration and in the fastest configurations of a sweep of V8's space
(``plots/h100/v8/probe_configs.py --configs all``, whose ``probe_configs.json`` is read from
``--sweep``), all in one window per shape with cuBLAS on the 16-bit weight, L2 flushed by reading
before each launch. Every V8 output is checked against float32 first. Writes $OUT/vs_tinygemm.json.

    python plots/h200/int4-one-token/vs_tinygemm.py OUT --sweep DIR/probe_configs.json [--top 3]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "h100" / "v8"))
import bench_v8  # noqa: E402 (torch_int4: the same q and scales packed tinygemm's way)

import matmul  # noqa: E402
from matmul.measure.correctness import poisoned_output, relative_error  # noqa: E402
from matmul.measure.timing import interleaved_ms  # noqa: E402
from matmul.quant import linear as quant_linear  # noqa: E402

KEYS = ("block_m", "warpgroups", "split", "stages", "chunk", "interleave")


def name(config: dict) -> str:
    return "/".join(str(config.get(k, 1)) for k in KEYS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--sweep", type=Path, required=True)
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sweep = [r for r in json.loads(args.sweep.read_text()) if isinstance(r["config"], dict)]
    dtype, rows = torch.bfloat16, []
    for m, n, k in sorted({(r["m"], r["n"], r["k"]) for r in sweep}):
        fastest = sorted((r for r in sweep if (r["m"], r["n"], r["k"]) == (m, n, k)), key=lambda r: r["us"])
        configs = {
            name(c): c for c in [quant_linear.config_for(m, n, k, "int4")] + [r["config"] for r in fastest[: args.top]]
        }
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda()
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        qw = matmul.quantize(w)
        reference = x.float() @ qw.dequantize().float().T
        w16 = qw.dequantize()
        fns, names, errors = [lambda x=x, w16=w16: torch.matmul(x, w16.T)], ["cublas"], {}
        tiny = bench_v8.torch_int4(x, qw)
        if tiny:
            fns.append(tiny[0])
            names.append("torch int4")
            errors["torch int4"] = tiny[1]
        assert quant_linear.wait_until_all_built((dtype, "int4", c) for c in configs.values())
        for label, config in configs.items():
            out = poisoned_output(m, n, dtype)
            quant_linear.v8(x, qw, out, config)
            errors[label] = relative_error(out, reference)
            if errors[label] > 1e-2:
                print(f"{m}x{n}x{k} {label}: error {errors[label]:.2e}, skipped", flush=True)
                continue
            fns.append(lambda config=config, out=out, x=x, qw=qw: quant_linear.v8(x, qw, out, config))
            names.append(label)
        times = interleaved_ms(fns, 50, 400)
        row = {
            "m": m,
            "n": n,
            "k": k,
            "call": name(quant_linear.config_for(m, n, k, "int4")),
            "us": {nm: ms * 1e3 for nm, ms in zip(names, times)},
            "errors": errors,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "vs_tinygemm.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{torch.cuda.get_device_name()}, bfloat16, one token, L2 flushed: torch int4's time over each V8's")
    for row in rows:
        us = row["us"]
        cells = ", ".join(
            f"{nm} {us['torch int4'] / t:.2f}" for nm, t in us.items() if nm not in ("cublas", "torch int4")
        )
        print(f"{row['m']} x {row['n']} x {row['k']} (call {row['call']}): {cells}")


if __name__ == "__main__":
    main()
