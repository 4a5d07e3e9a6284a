"""The synchronization-protocol checker (``matmul.protocol``) on every version, and on mutants with
planted protocol bugs (``tests/protocol_mutants.py``), each of which it must catch."""

import subprocess
import sys
from pathlib import Path

import pytest

from matmul import protocol
from matmul.kernels import versions

sys.path.insert(0, str(Path(__file__).parent))
import protocol_mutants  # noqa: E402

SEEDS = 16

# Findings in the unmutated kernels, kept visible here until the kernel is fixed (strict: the
# test fails once the finding is gone, so the entry is removed with the fix).
KNOWN_FINDINGS: dict[tuple[str, str], str] = {}


def _cases():
    for arch in versions.ARCHS:
        for version in protocol.versions_to_check(arch):
            module = versions.load(arch, version)
            for config in protocol.configs_to_check(module, arch):
                marks = ()
                if (arch, version) in KNOWN_FINDINGS:
                    marks = pytest.mark.xfail(reason=KNOWN_FINDINGS[(arch, version)], strict=True)
                extra = (
                    ""
                    if config == module.REPRESENTATIVE
                    else "-" + "-".join(f"{k}{v}" for k, v in config.items() if module.REPRESENTATIVE.get(k) != v)
                )
                yield pytest.param(arch, version, config, id=f"{arch}-{version}{extra}", marks=marks)


@pytest.mark.parametrize("arch, version, config", list(_cases()))
def test_version_keeps_the_protocol(arch, version, config):
    report = protocol.check(arch, version, config, seeds=SEEDS)
    assert report.interleavings == SEEDS or not report.ok
    assert report.ok, f"{report.label}: {report.verdict}\n{report.trace()}"


def test_every_configuration_the_quantized_call_runs_is_checked_in_its_protocol_shape():
    """``matmul.call.quantized.configs``, every configuration the call builds for each weight format,
    each of a protocol shape (its CTAs, warps, format, consumers a slab) that ``configs_to_check``
    checks for Hopper V8: a rule of ``config_for`` that reaches a new shape (two consumer
    warpgroups for a format that had one) fails here until the shape goes into V8's space or
    ``EXTRA_CONFIGS``, where the checker runs it."""
    from matmul.call import quantized as quant_linear
    from matmul.quant import FORMATS

    v8 = versions.load("sm_90a", "v8")
    checked = {protocol.protocol_shape(v8, "sm_90a", c) for c in protocol.configs_to_check(v8, "sm_90a")}
    for weight_format in FORMATS:
        for config in quant_linear.configs(weight_format):
            built = config if weight_format == "int4" else {**config, "weight": weight_format}
            assert protocol.protocol_shape(v8, "sm_90a", built) in checked, (
                f"V8 {built}, which the call runs, has a protocol shape the checker does not run: add it to "
                "V8's EXTRA_CONFIGS"
            )


def _check_mutant(index: int) -> dict:
    mutant = protocol_mutants.MUTANTS[index]
    if mutant.module == versions.module_name(mutant.arch, mutant.version):
        return protocol_mutants.run(index, SEEDS)
    # a pipeline module's mutant swaps classes that tilus caches by name: check it in a fresh process
    done = subprocess.run(
        [sys.executable, protocol_mutants.__file__, str(index), str(SEEDS)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "index",
    range(len(protocol_mutants.MUTANTS)),
    ids=[m.name.split(":")[0].replace(" ", "-") + f"-{i}" for i, m in enumerate(protocol_mutants.MUTANTS)],
)
def test_checker_catches_the_mutant(index):
    mutant = protocol_mutants.MUTANTS[index]
    result = _check_mutant(index)
    assert result["kind"] in mutant.kinds, f"{mutant.name}: expected {mutant.kinds}, got {result}"


def test_cli_prints_a_row_per_version_and_fails_on_a_finding(capsys, monkeypatch):
    from matmul import cli

    assert cli.main(["protocol", "--arch", "sm_100a", "--versions", "v3", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "Blackwell" in out and "v3" in out and "pass" in out
    mutant = protocol_mutants.MUTANTS[0]  # Blackwell V3 with its producer's parity flipped
    with protocol_mutants.mutated(mutant) as module:
        monkeypatch.setattr(versions, "load", lambda arch, version: module)
        assert cli.main(["protocol", "--arch", "sm_100a", "--versions", "v3", "--seeds", "2"]) == 1
    assert "deadlock" in capsys.readouterr().out


def test_blackwell_v6_keeps_the_protocol_with_commits_landing_in_any_order():
    """V6's producer tail waits for every stage's release: no commit is in flight at exit even if
    one thread's commit arrivals land out of order (its mutant without the tail does not)."""
    module = versions.load("sm_100a", "v6")
    report = protocol.check("sm_100a", "v6", module.REPRESENTATIVE, seeds=SEEDS, ordered_commits=False)
    assert report.ok, f"{report.verdict}\n{report.trace()}"


def test_a_mutant_that_no_longer_matches_fails_loudly():
    stale = protocol_mutants.Mutant(
        "stale", "sm_100a", "v3", "matmul.kernels.blackwell.v3", "no such text", "", ("deadlock",)
    )
    with pytest.raises(AssertionError, match="occurs 0 times"):
        protocol_mutants.mutated_source(stale)


def test_a_barrier_left_partly_arrived_is_reported():
    """The model itself: a phase that receives fewer arrivals than its count before the CTA exits."""
    from matmul.protocol.findings import Finding
    from matmul.protocol.machine import Machine
    from matmul.protocol.state import Barrier, BarrierAddr, Cta

    machine = Machine.__new__(Machine)
    machine.trace, machine.events, machine.async_ops = [], 0, []
    machine.ctas = [Cta(0, (0, 0, 0), 0, 0)]
    machine.cluster_size, machine.resident, machine.finished_clusters = 1, {0}, set()
    machine.pending_clusters, machine.resident_limit = [], 1
    barrier = Barrier(BarrierAddr(0, 1, 0), 2, "b")
    machine.ctas[0].barriers[(1, 0)] = barrier
    barrier.pending = 1
    with pytest.raises(Finding, match="partly arrived"):
        machine.exit_cta(machine.ctas[0])


def test_a_role_that_loops_without_synchronizing_is_reported_not_hung():
    import tilus
    from tilus import int32
    from tilus.lang.instantiated_script import CallParameters, JitInstance

    from matmul.protocol.findings import Finding
    from matmul.protocol.machine import Machine, Problem

    class Spin(tilus.Script):
        def __call__(self, n: int32):
            self.attrs.blocks = 1
            self.attrs.warps = 1
            x: int32 = 0
            for i in range(n):
                x = x + i

    params = CallParameters(Spin)
    program = JitInstance._instantiate_schedule((Spin, params, {}, {}, {params.param_names[0]: 1}))
    assert not isinstance(program, str), program
    (function,) = program.functions.values()
    machine = Machine(function, Problem(m=Machine.LOOP_BUDGET + 1, n=1, k=1))
    with pytest.raises(Finding, match="without synchronizing") as caught:
        machine.run(lambda ready, ops: ready[0])
    assert caught.value.kind == "livelock"


def test_a_read_of_two_accumulators_keeps_their_rows_or_is_refused():
    """A shared buffer two accumulators wrote, each in whole rows, read back whole: the value keeps
    which rows each filled (``state.PiecedTag``), so the store checks each against its own part of C;
    spans that are not whole rows are refused as unsupported, not guessed."""
    from matmul.protocol.data_instructions import DataInstructions
    from matmul.protocol.findings import Finding
    from matmul.protocol.state import AccTag, MemRef, PiecedTag, row_major

    class Reader(DataInstructions):
        def fail(self, kind, message):
            raise Finding(kind, message)

    tile = MemRef(0, 1, 0, (128, 128), row_major((128, 128)), 4)
    first, second = AccTag(), AccTag()
    tag = Reader()._pieces(tile, [(8192, 16384, second), (0, 8192, first)])
    assert tag == PiecedTag(((first, 0, 64), (second, 64, 128)))
    with pytest.raises(Finding, match="unsupported"):
        Reader()._pieces(tile, [(0, 8000, first), (8000, 16384, second)])  # not whole rows
    column_slab = MemRef(0, 1, 0, (128, 64), (128, 1), 4)  # a strided view
    with pytest.raises(Finding, match="unsupported"):
        Reader()._pieces(column_slab, [(0, 8192, first), (8192, 16320, second)])
