"""What the planner's thread spends choosing for an unseen bucket, on the CPU (no GPU needed): the
real ``Chooser`` with the shipped H100 table and an empty choice cache (the trace's first pass on a
fresh machine), tuning and builds stubbed out, over the first-calls trace's 300 (dtype, M, N, K).
Prints the median and 90th percentile of ``Chooser.get`` for a bucket not seen before, and writes
each call's (version, source, nearest) to OUT, so that two commits' choices can be compared.

    python plots/h100/first-calls/choice_cost.py OUT.json
"""

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from matmul.call.choice_cache import ChoiceCache
from matmul.call.chooser import Chooser
from matmul.harness import trace

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def main(out: Path) -> None:
    chooser = Chooser(
        cache=ChoiceCache(Path(tempfile.mkdtemp())),
        tune_jobs=lambda *args, **kwargs: {},
        arch_of=lambda device: "sm_90a",
        gpu_name=lambda device: "NVIDIA H100 80GB HBM3",
        mode="background",
        build_jobs=lambda jobs, on_built: None,
        load=lambda program_dir: None,
    )
    chooser.tuner.submit = lambda *args, **kwargs: True  # nothing tuned or built: only the choice is timed
    chooser.builder.submit = lambda *args, **kwargs: True
    device = torch.device("cpu")
    chooser.get(device, torch.float16, 5, 4096, 4096)  # the modules' first imports, before the timing
    new, choices = [], []
    for dtype, _, m, n, k in trace.the_trace():
        seen = len(chooser.entries)
        begin = time.perf_counter()
        entry = chooser.get(device, DTYPES[dtype], m, n, k)[1]
        elapsed = time.perf_counter() - begin
        if len(chooser.entries) > seen:
            new.append(elapsed)
        choices.append((entry["version"], entry.get("source"), entry.get("nearest")))
    print(
        f"unseen bucket: median {statistics.median(new) * 1e6:.0f} us, "
        f"90th percentile {statistics.quantiles(new, n=10)[-1] * 1e6:.0f} us, {len(new)} buckets"
    )
    out.write_text(json.dumps(choices))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
