"""One library alone over the first-calls trace (``trace``), in a fresh process: torch.matmul (the
process never imports ``matmul``) or matmul() (its cache directory empty, as a new machine's:
the shipped table, instant choices, tuning and builds in the background, as a user meets them).
Each call of the trace is made twice in a row on the same operands, each timed on its own
(``timed``). What a fresh process pays on its first use of a kernel (the CUDA runtime loads a
kernel into the context at its first launch, lazily; cuBLAS picks and sets up an algorithm for a
new shape) then shows as the first call's excess over the second. The trace's pairs charge that
cost to whichever of matmul() and torch.matmul runs first; two processes alone, each paying its
own, compare a user of one with a user of the other, call by call.

Run as a script by ``trace.main`` (so that torch's process does not import the package): reads
``{"through": "torch" or "matmul", "seed", "projections": {name: [N, K]}, "trace": [[dtype, name,
M, N, K], ...]}`` on stdin and writes one row per call on stdout (JSON), with matmul()'s choice
(``version``, ``source``) where it ran.
"""

import functools
import gc
import json
import sys
import time

import torch


def timed(fn) -> dict:
    """One call of ``fn`` timed on its own (the device drained first): ``event_ms`` between CUDA
    events recorded on the current stream before and after it; ``host_ms``, the host's time to
    issue it; ``stream_ms``, the host's time until that stream's end event has passed; and
    ``device_ms``, until a device-wide synchronize returns (it waits for every stream of the
    process: GPU work another thread issued meanwhile is charged to the call)."""
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin = time.perf_counter()
    start.record(stream)
    fn()
    end.record(stream)
    issued = time.perf_counter()
    end.synchronize()
    on_stream = time.perf_counter()
    torch.cuda.synchronize()
    on_device = time.perf_counter()
    return {
        "event_ms": start.elapsed_time(end),
        "host_ms": (issued - begin) * 1e3,
        "stream_ms": (on_stream - begin) * 1e3,
        "device_ms": (on_device - begin) * 1e3,
        "begin_s": begin,  # the host's clock (time.perf_counter), to place other events in the call
        "issued_s": issued,
    }


class Collections:
    """Python's garbage collections as they happen (``gc.callbacks``), on any thread: a collection
    runs on the thread whose allocation set it off, the caller's included, and holds the GIL
    throughout; a full one in a process with torch and tilus loaded takes milliseconds."""

    def __init__(self):
        self.spans: list[tuple[int, float, float]] = []  # (generation, start, stop) on perf_counter
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.spans.append((info["generation"], self._started, time.perf_counter()))

    def during(self, call: dict) -> dict:
        """The collections that overlapped the host's part of ``call`` (``timed``'s row): their ms, and
        how many were of the oldest generation."""
        inside = [(g, a, b) for g, a, b in self.spans if a < call["issued_s"] and b > call["begin_s"]]
        return {"gc_ms": sum(b - a for _, a, b in inside) * 1e3, "gc_full": sum(g == 2 for g, _, _ in inside)}


def trace_weights(seed: int, projections: dict) -> dict:
    """The trace's weights by (dtype, projection), both dtypes, seeded; CUDA and cuBLAS started."""
    torch.manual_seed(seed)
    weights = {
        (dtype, name): torch.randn(n, k, device="cuda", dtype=getattr(torch, dtype)) / k**0.5
        for dtype in ("float16", "bfloat16")
        for name, (n, k) in projections.items()
    }
    torch.matmul(torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda"))
    return weights


def main() -> int:
    request = json.load(sys.stdin)
    through = request.get("through", "torch")
    if through == "matmul":
        import matmul
        from matmul.call import api

        product, choice = matmul.matmul, matmul.choice
        loaded = lambda: len(api._chooser.programs)  # noqa: E731 kernels the chooser's thread has opened
    else:
        product, choice, loaded = torch.matmul, None, None
    collections = Collections()
    gc.callbacks.append(collections)
    weights = trace_weights(request["seed"], request["projections"])
    rows = []
    for dtype, name, m, n, k in request["trace"]:
        w = weights[(dtype, name)]
        x = torch.randn(m, k, device="cuda", dtype=w.dtype)
        _ = torch.empty((m, n), device="cuda", dtype=w.dtype)  # the result's size known to the allocator
        del _
        call = functools.partial(product, x, w.T)
        before = loaded and loaded()
        first, second = timed(call), timed(call)
        first.update(collections.during(first))
        second.update(collections.during(second))
        row = {"dtype": dtype, "name": name, "m": m, "n": n, "k": k, "first": first, "second": second}
        if loaded is not None:  # a kernel opened on another thread during the calls
            row["kernels_opened"] = loaded() - before
        if choice is not None:  # asked after both calls: what the second ran
            entry = choice(x, w.T)
            row.update(version=entry.get("version"), source=entry.get("source"))
        rows.append(row)
    print(json.dumps(rows), flush=True)  # one line, the last: anything printed before it is not the result
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
