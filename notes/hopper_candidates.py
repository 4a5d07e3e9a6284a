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


def sustained(runs, size, m, n, k, rounds, seconds):
    """Each run launched back to back for ``seconds`` (``timing.SustainedTimer``: same operands, no
    L2 flush), in alternating order: its TFLOPS over the second half of its windows, with the SM
    clock and board power nvidia-smi sampled meanwhile. The rate a power-limited card sustains."""
    from matmul.timing import SustainedTimer, alternating_rounds, tflops

    timer = SustainedTimer(seconds)

    def window(run):
        ms = timer([run[1]])[0]
        return ms, timer.last_window

    windows = alternating_rounds(runs, rounds, window)
    base = statistics.median(ms for ms, _ in windows[0])
    for (label, _), ws in zip(runs, windows):
        ms = statistics.median(t for t, _ in ws)
        clock = statistics.mean(info.get("clock_mhz", float("nan")) for _, info in ws)
        power = statistics.mean(info.get("power_w", float("nan")) for _, info in ws)
        print(f"{size} sustained {label}: {tflops(m, n, k, ms):.0f} TFLOPS {base / ms:.3f}x cuBLAS at {clock:.0f} MHz "
              f"{power:.0f} W (rounds {' '.join(f'{t:.3f}' for t, _ in ws)} ms)", flush=True)


def measure(candidates, sizes, rounds, profile=0, seconds=0.0):
    import torch

    from matmul.check import TOLERANCE, poisoned_output, random_operands, reference, relative_error
    from matmul.timing import alternating_rounds, interleaved_ms, tflops

    for m, n, k in sizes:
        size = f"{m}^3" if m == n == k else f"{m}x{n}x{k}"
        a, b = random_operands(m, n, k, torch.float16)
        ref = reference(a, b)
        out = poisoned_output(m, n, torch.float16)
        runs = [("cuBLAS", lambda: torch.matmul(a, b.T))]
        for name, config in candidates:
            module = versions.load("sm_90a", name)
            out.fill_(float("nan"))
            versions.run(module, a, b, out, config=config)
            error = relative_error(out, ref)
            label = f"{name} " + " ".join(f"{k}={v}" for k, v in config.items())
            if error > TOLERANCE[torch.float16]:
                print(f"{size} {label}: WRONG (error {error:.3g})", flush=True)
                continue
            runs.append((label, lambda module=module, config=config: versions.run(module, a, b, out, config=config)))
        if profile:  # `profile` launches of each, in order, inside the range ncu is told to profile
            torch.cuda.synchronize()
            for label, run in runs:
                for _ in range(profile):
                    print(f"profiled {size} {label}", flush=True)
                    torch.cuda.nvtx.range_push("profile")
                    run()
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_pop()
            continue
        if seconds:
            sustained(runs, size, m, n, k, rounds, seconds)
            continue
        # one window per candidate and round, launched in turn with cuBLAS (as the bench does)
        cublas = runs[0][1]
        windows = alternating_rounds(runs[1:], rounds, lambda run: interleaved_ms([run[1], cublas], 25, 100))
        best: dict[str, tuple[float, str]] = {}
        for (label, _), pairs in zip(runs[1:], windows):
            ratio = statistics.median(c_ms / ms for ms, c_ms in pairs)
            ms = statistics.median(ms for ms, _ in pairs)
            print(f"{size} {label}: {tflops(m, n, k, ms):.0f} TFLOPS {ratio:.3f}x cuBLAS "
                  f"(windows {' '.join(f'{c_ms / ms:.3f}' for ms, c_ms in pairs)})", flush=True)
            name = label.split()[0]
            best[name] = max(best.get(name, (ratio, label)), (ratio, label))
        for name, (ratio, label) in best.items():
            print(f"BEST {size} {label}: {ratio:.3f}x cuBLAS", flush=True)


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
