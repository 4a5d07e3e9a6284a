"""Hopper V8's two-warpgroup configurations without a split (int6's ``INT6_ONE_PASS``, and fp8's the
same) under the synchronization checker, its coverage check set aside.

With a split of 1 and no slab of C written by TMA, the two consumer warpgroups write their slabs of
the float32 tile into one shared buffer. The checker keeps a shared region's provenance by byte
range, and the store of the tile carries one warpgroup's accumulator only (the second writer's,
seen by printing the store's tags), so it reports a coverage finding ("an MMA ... read A or B
tiles that do not hold these rows/columns").
On the GPU the configuration computes the right product (``tests/test_v8_gpu.py::
test_int6_past_64_tokens``). This script checks everything else the checker checks (races,
deadlocks, byte counts, phases) over its usual interleavings, with coverage off:

    python plots/h200/int6-pairs/protocol_without_coverage.py    # protocol-without-coverage.txt
"""

from matmul import protocol
from matmul.protocol import coverage
from matmul.quant import linear as quant_linear

CONFIGS = (
    {**quant_linear.config_for(200, 6150, 1024, "int6"), "weight": "int6"},
    {**quant_linear.config_for(200, 6150, 1024, "int6"), "weight": "fp8_e4m3", "chunk": 32},
)


def main() -> None:
    for config in CONFIGS:
        print(config, "with coverage:", protocol.check("sm_90a", "v8", config, seeds=4).verdict, flush=True)
    coverage.CoverageChecks.record_store = lambda self, *args: None
    coverage.CoverageChecks.check_coverage = lambda self: None
    for config in CONFIGS:
        report = protocol.check("sm_90a", "v8", config)
        print(config, "coverage off, 24 interleavings:", report.verdict, flush=True)


if __name__ == "__main__":
    main()
