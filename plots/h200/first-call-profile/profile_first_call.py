"""Where the switched Llama's first call goes: ``python -m matmul drop-in``'s model pair, torch's own
start paid first by the unswitched model (as the drop-in now does), then the switched model's first
prefill of 1 x 128 tokens, then the unswitched model's first call of that shape and each model's
second. The switched model's first call is watched two ways: cProfile (which, from Python 3.12 on,
records every thread: the planner's work is in it) and a sampler of the calling thread's stack
every millisecond (``main-thread-samples.txt``: where that thread was, its innermost frame and its
innermost frame of this project, counted); its second call by the same sampler, on the calling
thread and on the planner's (added after run3: what the planner holds the GIL for meanwhile).

    MATMUL_CACHE_DIR=$(mktemp -d) python plots/h200/first-call-profile/profile_first_call.py OUT_DIR
"""

from __future__ import annotations

import collections
import cProfile
import io
import json
import pstats
import sys
import threading
import time
import traceback
from pathlib import Path

import torch


class Sampler(threading.Thread):
    """Every ``interval_s``, the calling thread's stack: its innermost frame, and the innermost frame
    of this project's code, counted."""

    def __init__(self, thread_id: int, interval_s: float = 1e-3):
        super().__init__(name="first-call-sampler", daemon=True)
        self.thread_id, self.interval_s = thread_id, interval_s
        self.innermost, self.ours = collections.Counter(), collections.Counter()
        self.samples = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            stack = traceback.extract_stack(frame)
            self.samples += 1
            top = stack[-1]
            self.innermost[f"{top.filename}:{top.lineno} {top.name}"] += 1
            mine = [f for f in stack if "/matmul/" in f.filename or "/pipeline/" in f.filename]
            if mine:
                self.ours[f"{mine[-1].filename}:{mine[-1].lineno} {mine[-1].name}"] += 1
            else:
                self.ours["(no frame of this project)"] += 1

    def report(self) -> str:
        lines = [f"{self.samples} samples, one a {self.interval_s * 1e3:g} ms", "", "innermost frame:"]
        lines += [f"{n:6d}  {where}" for where, n in self.innermost.most_common(40)]
        lines += ["", "innermost frame of this project:"]
        lines += [f"{n:6d}  {where}" for where, n in self.ours.most_common(40)]
        return "\n".join(lines) + "\n"


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    from matmul.harness import drop_in
    from matmul.measure.timing import waited_ms

    begin = time.perf_counter()
    reference, switched, _ = drop_in.llama_pair(torch.float16)
    times = {"pair_ms": (time.perf_counter() - begin) * 1e3}
    vocab = reference.config.vocab_size
    threads_before = sorted(t.name for t in threading.enumerate())
    with torch.inference_mode():
        start = torch.randint(0, vocab, (1, 8), device="cuda")
        times["torch_start_ms"] = waited_ms(lambda: reference(input_ids=start, use_cache=False))
        ids = torch.randint(0, vocab, (1, 128), device="cuda")
        sampler = Sampler(threading.get_ident())
        sampler.start()
        profile = cProfile.Profile()
        profile.enable()
        times["ours_first_ms"] = waited_ms(lambda: switched(input_ids=ids, use_cache=False))
        profile.disable()
        sampler.stopping.set()
        sampler.join()
        times["theirs_first_ms"] = waited_ms(lambda: reference(input_ids=ids, use_cache=False))
        # the second call, and the planner's thread meanwhile (what it holds the GIL for)
        planner = next((t for t in threading.enumerate() if t.name == "matmul-planner"), None)
        second = [Sampler(threading.get_ident())] + ([Sampler(planner.ident)] if planner else [])
        for each in second:
            each.start()
        times["ours_second_ms"] = waited_ms(lambda: switched(input_ids=ids, use_cache=False))
        for each in second:
            each.stopping.set()
            each.join()
        times["theirs_second_ms"] = waited_ms(lambda: reference(input_ids=ids, use_cache=False))
    report = {
        "gpu": torch.cuda.get_device_name(),
        **times,
        "threads_before": threads_before,
        "threads_after": sorted(t.name for t in threading.enumerate()),
    }
    print(json.dumps(report), flush=True)
    (out / "times.json").write_text(json.dumps(report, indent=1))
    reports = [("the first call, the calling thread", sampler)]
    reports += list(zip(("the second call, the calling thread", "the second call, the planner's thread"), second))
    (out / "main-thread-samples.txt").write_text("\n".join(f"## {what}\n\n{each.report()}" for what, each in reports))
    text = io.StringIO()
    for order in ("cumulative", "tottime"):
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(60)
    (out / "profile.txt").write_text(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
