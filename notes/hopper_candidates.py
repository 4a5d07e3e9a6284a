"""Time chosen configurations of the Hopper versions against cuBLAS (fp16), each in one window
with cuBLAS per round (``timing.interleaved_ms``, rounds in alternating order), each checked
against the float32 reference first: to decide what a space should hold. Rough numbers for
choosing; the bench (``python -m matmul bench``) is the measurement to report.

    python notes/hopper_candidates.py [--sizes 4096,8192x14336x4096] [--rounds 6] v2:block_m=128,... ...
    python notes/hopper_candidates.py --prebuild v2:...   # only build them here (no GPU needed)
    ncu --nvtx --nvtx-include "profile/" --clock-control base --metrics gpu__time_duration.sum,... \
        python notes/hopper_candidates.py --profile 3 v2:...   # each checked, then 3 launches in range "profile"
    python notes/hopper_candidates.py --sustained 3 v2:...   # each launched back to back for 3 s a round

A size is ``N`` (N^3) or ``MxNxK``. Under ncu compare elapsed cycles, not durations:
``--clock-control base`` did not pin the H100's clock here (1.29-1.43 GHz).
"""

import argparse
import statistics

from matmul import build
from matmul.kernels import versions


def parse(text: str) -> list[tuple[str, dict]]:
    name, _, params = text.partition(":")
    if not params:
        return [(name, config) for config in versions.space(versions.load("sm_90a", name))]
    return [(name, {key: int(value) for key, value in (item.split("=") for item in params.split(","))})]


def prebuild(candidates):
    for name, config in candidates:
        result = build.build_config(versions.load("sm_90a", name), "sm_90a", config)
        print(name, config, "ok" if result.ok else result.error, result.registers, result.spill_bytes,
              result.shared_bytes, flush=True)


def contenders(candidates, a, b, out):
    """cuBLAS and each candidate (a version at a fixed configuration) as the bench's contenders."""
    import functools

    import torch

    from matmul.harness.bench import CUBLAS, Contender

    cublas_out = torch.empty_like(out)
    found = [Contender(CUBLAS, "baseline", functools.partial(torch.matmul, a, b.T, out=cublas_out), cublas_out)]
    for name, config in candidates:
        label = f"{name} " + " ".join(f"{k}={v}" for k, v in config.items())
        found.append(Contender(label, "version",
                               functools.partial(versions.run, versions.load("sm_90a", name), a, b, out, config=config),
                               out))
    return found


def measure(candidates, sizes, rounds, profile=0, seconds=0.0):
    """Check every candidate against the float32 reference, then time it with the bench's loop
    (``bench.measure``): paired windows with cuBLAS, or with ``seconds`` sustained windows
    (``timing.SustainedTimer``); with ``profile``, only launch each that many times for ncu."""
    import functools

    import torch

    from matmul.harness import bench
    from matmul.measure.correctness import poisoned_output, random_operands, reference
    from matmul.harness.presets import Shape
    from matmul.measure.timing import SustainedTimer, interleaved_ms, tflops

    for m, n, k in sizes:
        size = f"{m}^3" if m == n == k else f"{m}x{n}x{k}"
        shape = Shape(m, n, k, "")
        a, b = random_operands(m, n, k, torch.float16)
        ref = reference(a, b)
        found = contenders(candidates, a, b, poisoned_output(m, n, torch.float16))
        if profile:  # `profile` launches of each checked one, in order, inside the range ncu is told to profile
            rows, timed = bench.check_contenders(shape, found, ref, torch.float16)
            report_wrong(size, rows.values())
            torch.cuda.synchronize()
            for c in timed:
                for _ in range(profile):
                    print(f"profiled {size} {c.name}", flush=True)
                    torch.cuda.nvtx.range_push("profile")
                    c.run()
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_pop()
            continue
        timer = SustainedTimer(seconds) if seconds else functools.partial(interleaved_ms, warmup_ms=25, repeat_ms=100)
        rows = bench.measure(shape, found, ref, torch.float16, timer, rounds, paired=not seconds)
        report_wrong(size, rows)
        best: dict[str, tuple[float, str]] = {}
        for row in rows:
            if not row.get("ok") or (row["kernel"] == bench.CUBLAS and not seconds):
                continue  # wrong (reported above); cuBLAS's own row only says something when sustained
            label, ratio, ms = row["kernel"], row["vs_cublas"], statistics.median(row["ms_rounds"])
            if seconds:
                clock = statistics.mean(row.get("clock_mhz_rounds", [float("nan")]))
                power = statistics.mean(row.get("power_w_rounds", [float("nan")]))
                print(f"{size} sustained {label}: {tflops(m, n, k, ms):.0f} TFLOPS {ratio:.3f}x cuBLAS at {clock:.0f} "
                      f"MHz {power:.0f} W (rounds {' '.join(f'{t:.3f}' for t in row['ms_rounds'])} ms)", flush=True)
                continue
            windows = " ".join(f"{c_ms / ms:.3f}" for ms, c_ms in zip(row["ms_rounds"], row["cublas_ms_rounds"]))
            print(f"{size} {label}: {tflops(m, n, k, ms):.0f} TFLOPS {ratio:.3f}x cuBLAS (windows {windows})", flush=True)
            name = label.split()[0]
            best[name] = max(best.get(name, (ratio, label)), (ratio, label))
        for name, (ratio, label) in best.items():
            print(f"BEST {size} {label}: {ratio:.3f}x cuBLAS", flush=True)


def report_wrong(size, rows):
    from matmul.harness.bench import CUBLAS

    for row in rows:
        if row["kernel"] != CUBLAS and not row["ok"]:
            why = row.get("message") or f"error {row['error']:.3g}"
            print(f"{size} {row['kernel']}: WRONG ({why})", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("candidates", nargs="+")
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prebuild", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="LAUNCHES")
    parser.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS")
    args = parser.parse_args()
    candidates = [candidate for text in args.candidates for candidate in parse(text)]
    if args.prebuild:
        prebuild(candidates)
    else:
        sizes = [tuple(int(d) for d in s.split("x")) if "x" in s else (int(s),) * 3 for s in args.sizes.split(",")]
        measure(candidates, sizes, args.rounds, args.profile, args.sustained)


if __name__ == "__main__":
    main()
