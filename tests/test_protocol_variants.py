"""The synchronization-protocol checker (``matmul.protocol``) on the variants' builds
(``matmul.kernels.variant``): a fused epilogue (a bias and an activation, and swiglu) of every
version that fuses one, and the batched build of the versions that have one, on both architectures;
and mutants with bugs on a code path that only a variant's build takes
(``protocol_mutants.VARIANT_MUTANTS``), which the checker must catch on that build and which the
plain build does not show."""

import sys
from pathlib import Path

import pytest

from matmul import protocol
from matmul.kernels import versions
from matmul.kernels.variant import ACTIVATIONS, PLAIN, Variant, supported

sys.path.insert(0, str(Path(__file__).parent))
import protocol_mutants  # noqa: E402

SEEDS = 10
# bias with one activation a version, the activations in turn over the versions: every one of them
# runs in some build
ELEMENTWISE = [a for a in ACTIVATIONS if a != "swiglu"]


def _cases():
    for arch in versions.ARCHS:
        fused = [v for v in protocol.versions_to_check(arch) if supported(versions.load(arch, v), Variant(bias=True))]
        for i, version in enumerate(fused):
            for variant in (
                Variant(bias=True, activation=ELEMENTWISE[i % len(ELEMENTWISE)]),
                Variant(activation="swiglu"),
            ):
                yield pytest.param(arch, version, variant, id=f"{arch}-{version}-{variant.key()}")
        for version in protocol.versions_to_check(arch):
            module = versions.load(arch, version)
            for variant in (Variant(batches=2), Variant(bias=True, activation="gelu_erf", batches=2)):
                if supported(module, variant):
                    yield pytest.param(arch, version, variant, id=f"{arch}-{version}-{variant.key()}")


CASES = list(_cases())


def test_every_architecture_has_fused_and_batched_cases():
    for arch in versions.ARCHS:
        keys = {c.values[2].key() for c in CASES if c.values[0] == arch}
        assert {"swiglu", "batch2"} <= keys and any(k.startswith("bias+") for k in keys), (arch, keys)


@pytest.mark.parametrize("arch, version, variant", CASES)
def test_variant_keeps_the_protocol(arch, version, variant):
    report = protocol.check(arch, version, seeds=SEEDS, variant=variant)
    assert report.interleavings == SEEDS or not report.ok
    assert report.ok, f"{report.label}: {report.verdict}\n{report.trace()}"


@pytest.mark.parametrize(
    "index",
    range(len(protocol_mutants.VARIANT_MUTANTS)),
    ids=[f"{m.arch}-{m.version}-{m.variant}-{i}" for i, m in enumerate(protocol_mutants.VARIANT_MUTANTS)],
)
def test_checker_catches_the_variant_mutant_on_its_build_only(index):
    mutant = protocol_mutants.VARIANT_MUTANTS[index]
    result = protocol_mutants.run_variant(index, SEEDS)
    assert result["kind"] in mutant.kinds, f"{mutant.name}: expected {mutant.kinds}, got {result}"
    with protocol_mutants.mutated(mutant) as module:
        plain = protocol.check(mutant.arch, mutant.version, seeds=3, module=module, variant=PLAIN)
    assert plain.ok, f"{mutant.name}: the plain build should not show it: {plain.verdict}"


def test_a_variant_the_version_does_not_build_is_refused():
    with pytest.raises(ValueError, match="does not build"):
        protocol.check("sm_90a", "v7", seeds=1, variant=Variant(batches=2))


def test_cli_checks_only_the_versions_that_build_the_variant(capsys):
    from matmul import cli

    assert cli.main(["protocol", "--arch", "sm_90a", "--versions", "v2,v5", "--variant", "batch2", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "v5 batch2" in out and "pass" in out and "v2" not in out
