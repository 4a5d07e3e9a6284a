"""Time chosen configurations of the Hopper versions against cuBLAS in alternating rounds (fp16,
square shapes), each checked against the float32 reference first: to decide what a space should
hold. Rough numbers for choosing; the bench (``python -m matmul bench``) is the measurement to report.

    python notes/hopper_candidates.py [--sizes 4096,8192] [--rounds 6] v2:block_m=128,block_n=128,... ...
    python notes/hopper_candidates.py --prebuild v2:...   # only build them here (no GPU needed)

A candidate is ``version:name=value,...`` (all of the version's tuning parameters), or a bare
``version`` for every configuration of its autotune space.
"""

import argparse
import statistics

from matmul import build, versions


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


def measure(candidates, sizes, rounds):
    import torch

    from matmul.check import TOLERANCE, poisoned_output, random_operands, reference, relative_error
    from matmul.timing import alternating_rounds, median_ms, tflops

    for size in sizes:
        a, b = random_operands(size, size, size, torch.float16)
        ref = reference(a, b)
        out = poisoned_output(size, size, torch.float16)
        runs = [("cuBLAS", lambda: torch.matmul(a, b.T))]
        for name, config in candidates:
            module = versions.load("sm_90a", name)
            out.fill_(float("nan"))
            versions.run(module, a, b, out, config=config)
            error = relative_error(out, ref)
            label = f"{name} " + " ".join(f"{k}={v}" for k, v in config.items())
            if error > TOLERANCE[torch.float16]:
                print(f"{size}^3 {label}: WRONG (error {error:.3g})", flush=True)
                continue
            runs.append((label, lambda module=module, config=config: versions.run(module, a, b, out, config=config)))
        times = alternating_rounds(runs, rounds, lambda run: median_ms(run[1], warmup_ms=25, repeat_ms=100))
        base = statistics.median(times[0])
        best: dict[str, tuple[float, str]] = {}
        for (label, _), ts in zip(runs, times):
            ms = statistics.median(ts)
            print(f"{size}^3 {label}: {tflops(size, size, size, ms):.0f} TFLOPS {base / ms:.3f}x cuBLAS "
                  f"(rounds {' '.join(f'{t:.3f}' for t in ts)} ms)", flush=True)
            name = label.split()[0]
            best[name] = min(best.get(name, (ms, label)), (ms, label))
        for name, (ms, label) in best.items():
            if name != "cuBLAS":
                print(f"BEST {size}^3 {label}: {base / ms:.3f}x cuBLAS", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("candidates", nargs="+")
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prebuild", action="store_true")
    args = parser.parse_args()
    candidates = [candidate for text in args.candidates for candidate in parse(text)]
    if args.prebuild:
        prebuild(candidates)
    else:
        measure(candidates, [int(s) for s in args.sizes.split(",")], args.rounds)


if __name__ == "__main__":
    main()
