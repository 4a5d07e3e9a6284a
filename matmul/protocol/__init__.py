"""A synchronization-protocol checker: each version's barriers, run on the CPU.

``check(arch, version)`` transpiles a version and applies tilus's own passes (the program tilus's
code generator turns into CUDA C; no nvcc, no GPU), then runs that program on a model of the
machine (``machine.Machine``) for a small problem: ragged last tiles and a ragged last K block,
several tiles per CTA where the kernel is persistent (the GPU is taken to have ``SMS`` SMs),
clusters as the kernel declares them, and for CLC kernels a launch that keeps one to
``explore.RESIDENT_CLUSTERS`` clusters on the GPU, so that ``try_cancel`` steals the rest and finally
answers "no work left". Every role (the warps, warpgroups or single warps that a
``thread_group`` sets apart) of every CTA is a thread of execution; the TMA unit, the tensor
core's commits, CLC responses, ``st.async`` and DSMEM bulk copies are asynchronous agents whose
effects land whenever the schedule says. Each seed is one interleaving: seeded random choices,
and strategies that starve the asynchronous agents (they fire only when no role can move), flood
them, run one role as far as it can before another moves, or hold back one kind of role (every
CTA's epilogue, say) until nothing else can move.

A variant's build (``matmul.kernels.variant``; ``check(..., variant=...)``) runs the same way: a
fused epilogue's bias is a side operand (read, never an MMA's operand) and its activation's
arithmetic carries the accumulator's provenance, swiglu's C being half as wide as B has rows; a
batched build (``entry.batched_class``) gets a few products of each problem, its tensor maps'
batch index first, and each product's C must come from that product's A and B.

The modules: this one chooses what to check (configurations, problems) and transpiles it;
``explore`` runs the interleavings; ``machine`` is one run (the grid, the scheduler, the checks on
exit), composed of ``interpreter`` (a role over the IR), ``data_instructions`` and
``sync_instructions`` (what each instruction does), ``events`` (the barrier rules) and ``coverage``
(C stored exactly once); ``state`` holds the records they share and ``findings`` the faults.

What a pass proves, for the problem sizes and interleavings it ran: the *counting* protocol
holds. Every mbarrier phase completes with exactly its arrival count and exactly the bytes
announced by ``expect_tx`` (TMA loads, multicast included, CLC responses, ``st.async``, bulk
copies); no phase completes again before every role that waits on that barrier observed the
previous one, and every parity wait returns on the phase after the last one its role saw (where a
version declares that its consumers take turns at the ring's stages, ``consumers_take_turns``, as
Hopper V6's ping-pong warpgroups do, its consumers are held to that together on the barriers TMA
loads complete on: each phase is seen by one of them, in order, and a wait that returns on a
phase its team already saw is a stale fill taken for a new one); named
barriers and ``barrier.cluster`` see the threads they expect; no role waits forever; no CTA exits
while a TMA load, a commit, a CLC response or an arrival may still reach its shared memory, TMEM
or barriers, or while its own TMA stores may still read its shared memory; no shared memory is
overwritten (TMA load, store, bulk copy) while an MMA or a TMA store issued before may still read
it (an MMA's reads end when a commit of its thread lands or at ``wgmma.wait_group``, a TMA
store's at ``cp.async.bulk.wait_group``); no ``try_cancel``
follows a "no work left" answer; and every element of C is stored exactly once, from an
accumulator that took every K block of its rows and columns exactly once (a tile that several
warpgroups' accumulators fill, each in whole rows of one shared buffer, read back whole, is checked
piece by piece, ``state.PiecedTag``; any other mix of accumulators in one read is reported as
unsupported rather than guessed).

What it does NOT prove: memory ordering (the scope of a wait or an arrival, ``fence.proxy.async``,
the TMEM fences: every wait is taken to acquire everything it needs), data values (the MMAs,
layouts, conversions and swizzles are not executed: only which tiles feed which accumulator),
timing or performance, what ptxas and the hardware do below tilus's IR (the model follows tilus's
emitters: a TMA copy or a commit is issued once, by the warp's leader lane; thread ``i`` of a
multicast arrival arrives on rank ``i``), and anything about problem sizes or schedules it did not
run. It assumes that the arrivals of one thread's ``tcgen05.commit``s land in issue order
(``ordered_commits=False`` drops that: a CTA must then also wait for its last stage releases
before it exits, as Blackwell V6's producer tail does).
"""

from __future__ import annotations

import contextlib
import time
from types import ModuleType
from typing import Any, Iterator, Optional

import tilus
from tilus.lang.instantiated_script import CallParameters, JitInstance

from ..kernels import versions
from ..kernels.variant import PLAIN, SWIGLU_GROUP, Variant, supported
from .data_instructions import SIDE_OPERANDS
from .explore import Report, check_function
from .findings import KINDS, Finding
from .machine import Problem

SMS = 4  # the GPU a persistent kernel is built for here: a few SMs, so CTAs get several tiles each
# quantized-weight versions (versions.quantized) the model runs
QUANTIZED_CHECKED = {"sm_100a": ("v8",), "sm_90a": ("v8", "v8_prefill")}

__all__ = [
    "KINDS",
    "Finding",
    "Report",
    "check",
    "check_function",
    "configs_to_check",
    "problems_for",
    "transpile",
    "versions_to_check",
]


def versions_to_check(arch: str) -> list[str]:
    """The versions of ``arch`` the checker runs: the series, then its checked quantized-weight versions."""
    extra = QUANTIZED_CHECKED.get(versions.normalize_arch(arch), ())
    return versions.available(arch) + [v for v in versions.quantized(arch) if v in extra]


@contextlib.contextmanager
def _built_for_sms(module: ModuleType, sms: int) -> Iterator[None]:
    """Kernels that size their persistent grid with ``sm_count()`` see a GPU of ``sms`` SMs."""
    import pipeline.schedulers as schedulers

    saved = {}
    for owner in (module, schedulers):
        if hasattr(owner, "sm_count"):
            saved[owner] = owner.sm_count
            owner.sm_count = lambda: sms
    try:
        yield
    finally:
        for owner, fn in saved.items():
            owner.sm_count = fn


def transpile(
    module: ModuleType,
    arch: str,
    config: dict[str, Any],
    sms: int = SMS,
    dtype=tilus.float16,
    lowered: bool = True,
    variant: Variant = PLAIN,
):
    """The tilus IR function of one configuration of a version, built for ``variant`` (its B layout,
    bias and activation; a batched variant behind ``entry.batched_class``'s launch): as transpiled,
    or (``lowered``) after tilus's own passes, the program its code generator turns into CUDA C."""
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from tilus.drivers import BuildOptions, optimize_program

    from ..build.compiler import target
    from ..kernels.entry import batched_class

    cls = batched_class(module.Kernel) if variant.batched else module.Kernel
    options = variant.kernel_options() if variant != PLAIN else {}
    params = CallParameters(cls)
    divisibility = {params.param_names[i]: 1 for i in params.tuning_params}
    with target(arch), _built_for_sms(module, sms):
        program = JitInstance._instantiate_schedule(
            (cls, params, {"dtype": dtype, **options, **config}, {}, divisibility)
        )
        if isinstance(program, str):
            raise RuntimeError(f"{module.__name__} {config} does not transpile:\n{program}")
        if lowered:
            with TemporaryDirectory() as scratch:
                program = optimize_program(program, BuildOptions.create(), Path(scratch))
    (function,) = program.functions.values()
    return function


def problems_for(
    config: dict[str, Any], block_k: int = 64, k_multiple: int = 1, variant: Variant = PLAIN
) -> list[Problem]:
    """Small problems for a configuration (``block_m`` rows of a cluster tile, ``block_n`` columns,
    ``block_k`` K columns a stage unless the configuration says; K rounded up to ``k_multiple``, for a
    version that takes only such K, as V8 takes whole scale groups; N rounded up to whole gate-up
    pairs of groups for swiglu; ``variant.batches`` products of each shape for a batched variant):

    * four tile rows and three tile columns, the last of each ragged, and a K that wraps the ring
      twice and ends in a ragged block (persistent kernels get several tiles per CTA);
    * less than one tile and less than one K block (one K block in all: loops that run from the
      second block run zero times);
    * whole tiles and whole K blocks, the ring filled exactly once;
    * with stream-K (Hopper V5's ``stream_k``, on ``SMS`` = 4 CTAs), before those: three whole waves
      and a tail of three ragged tiles of three K blocks, where one CTA's range ends one tile and
      starts the next; a tail of one tile of two K blocks, cut between two CTAs while the other
      two have nothing to do (``pipeline.stream_k.MOST_CUTS``); one tile of nine K blocks, of which
      the finisher computes five after the other CTA's four.
    """
    bm = config.get("block_m", 128) * max(1, config.get("cluster_ctas", 2) // 2)
    bn = config.get("block_n", 128)
    bk = config.get("block_k", block_k)
    stages = config.get("stages", 1)

    def whole(k: int, multiple: int = k_multiple) -> int:
        return -(-k // multiple) * multiple

    n_multiple = 2 * SWIGLU_GROUP if variant.activation == "swiglu" else 1
    b = variant.batches
    problems = [
        Problem(7 * bm // 2 + 8, whole(5 * bn // 2 + 8, n_multiple), whole(2 * stages * bk + bk // 2 + 8), b),
        Problem(bm // 2 + 8, whole(bn // 2 + 8, n_multiple), whole(bk // 2 + 8), b),
        Problem(2 * bm, bn, whole(stages * bk), b),
    ]
    if config.get("stream_k"):  # first: the checker's runs take the first problems most often
        problems = [
            Problem(2 * bm + 8, whole(5 * bn - 100, n_multiple), 3 * bk - 8, b),
            Problem(bm - 28, whole(5 * bn - 8, n_multiple), 2 * bk - 8, b),
            Problem(8, whole(8, n_multiple), 9 * bk, b),
            *problems,
        ]
    return problems


def cluster_shape(function) -> tuple:
    """What a configuration's cluster is, for choosing configurations to check: its CTAs, which
    operands its TMA loads multicast (a cluster of 2 that splits K and one that shares B by
    multicast keep different protocols, and so do a pair that shares B and one that shares A: each
    CTA's loads land in other places of both), and the rank masks of its multicast arrivals (a
    cluster of 4 that shares B among all four CTAs releases to ranks 0b1111; one of two groups that
    split K, each sharing B between two CTAs, to 0b0101 or 0b1010)."""
    from tilus.ir.tools.instruction_collector import collect_instructions

    instructions = collect_instructions(function)
    operands = {}  # global view -> A, B or C, in the order the checker names them (DataInstructions)
    for inst in instructions:
        if type(inst).__name__ == "GlobalViewInst" and getattr(inst.ptr, "hint", None) not in SIDE_OPERANDS:
            operands.setdefault(inst.global_output, "ABC"[len(operands)] if len(operands) < 3 else "?")
    multicast = tuple(
        sorted(
            {
                operands.get(inst.inputs[1], "?")
                for inst in instructions
                if type(inst).__name__ == "CopyAsyncTensorGlobalToSharedInst" and inst.multicast_mask is not None
            }
        )
    )
    arrivals = tuple(
        sorted({inst.multicast for inst in instructions if type(inst).__name__ == "ArriveExpectTxMulticastBarrierInst"})
    )
    return tuple(function.metadata.cluster_blocks), multicast, arrivals


def uses_global_flags(function) -> bool:
    """Whether CTAs wait for one another through flags in global memory (Hopper V5's stream-K)."""
    from tilus.ir.tools.instruction_collector import collect_instructions

    return any(type(inst).__name__ == "LockSemaphoreInst" for inst in collect_instructions(function))


def consumers_take_turns(module: ModuleType, config: dict[str, Any]) -> bool:
    """Whether the consumers of ``config`` take turns at the ring's stages, tile by tile (Hopper V6's
    ping-pong warpgroups), as the version declares (``consumers_take_turns(config)``; none do
    otherwise): the checker then holds them together to seeing each phase once (``Machine``)."""
    return getattr(module, "consumers_take_turns", lambda config: False)(config)


def b_units(module: ModuleType, config: dict[str, Any]) -> tuple:
    """Rows and K columns of B per element of B as the kernel loads it: a packed weight's words
    (V8), per weight format where the version packs several (Hopper V8's ``B_UNITS``, keyed by its
    ``weight``), else (1, 1)."""
    units = getattr(module, "B_UNITS", (1, 1))
    if isinstance(units, dict):
        return units[config.get("weight", "int4")]
    return units


def configs_to_check(
    module: ModuleType, arch: Optional[str] = None, all_configs: bool = False, variant: Variant = PLAIN
) -> list[dict[str, Any]]:
    """The representative configuration, plus the first configuration of every other protocol
    shape (``cluster_shape``: its CTAs, which operands it multicasts, and the ranks its multicast
    releases reach; whether its consumers take
    turns; and its warps, the roles that arrive on its barriers (a second consumer warpgroup on
    the same stages, Hopper V8's interleaved ones); whether its CTAs wait for one another through
    global flags (``uses_global_flags``); a packed weight's format; in the autotune space, or in the version's
    ``EXTRA_CONFIGS``: built and checked, not tuned), read from what each configuration transpiles
    to; or (``all_configs``) every configuration. Only configurations that build for ``variant``
    (a version's ``takes``: Hopper V5's stream-K computes one product, not a batch)."""
    candidates = versions.build_configs(module, variant)
    if all_configs:
        return candidates
    arch = arch or next(a for a, family in versions.ARCHS.items() if f".{family}." in module.__name__ + ".")
    configs = [dict(module.REPRESENTATIVE)]
    shapes = {protocol_shape(module, arch, module.REPRESENTATIVE)}
    for config in candidates:
        shape = protocol_shape(module, arch, config)
        if shape not in shapes:
            shapes.add(shape)
            configs.append(config)
    return configs


def protocol_shape(module: ModuleType, arch: str, config: dict[str, Any]) -> tuple:
    """What ``configs_to_check`` tells configurations apart by: two of the same shape arrive on the
    same barriers in the same counts (``configs_to_check``'s doc)."""
    function = transpile(module, arch, config, lowered=False)
    shape = cluster_shape(function), consumers_take_turns(module, config), function.metadata.num_warps
    # a packed weight's format: what a stage brings (V8's row scales come through no ring); and
    # V8's consumers a slab, which take a stage's K blocks in turn where two warpgroups of as many
    # warps would each take a slab of rows (the same barrier counts, another data flow)
    return (*shape, uses_global_flags(function), config.get("weight"), config.get("interleave", 1))


def check(
    arch: str,
    version: str,
    config: Optional[dict[str, Any]] = None,
    seeds: int = 24,
    module: Optional[ModuleType] = None,
    ordered_commits: bool = True,
    variant: Variant = PLAIN,
) -> Report:
    """Check one configuration (default: the representative) of a version, built for ``variant``
    (one the version builds: ``matmul.kernels.variant.supported``). ``ordered_commits=False`` lets
    the arrivals of one thread's ``tcgen05.commit``s land in any order (PTX orders the MMAs a commit
    tracks, not one commit's arrival against the next one's)."""
    arch = versions.normalize_arch(arch)
    module = module or versions.load(arch, version)
    config = dict(module.REPRESENTATIVE if config is None else config)
    if not supported(module, variant):
        raise ValueError(f"{arch} {version} does not build the variant {variant.key()!r}")
    start = time.time()
    function = transpile(module, arch, config, variant=variant)
    # a version with a packed weight (V8) declares its K block, its K granule and B's units
    problems = problems_for(config, getattr(module, "BLOCK_K", 64), getattr(module, "GROUP", 1), variant)
    report = check_function(
        function,
        problems,
        seeds,
        label=f"{arch} {version} {config}" + (f" {variant.key()}" if variant != PLAIN else ""),
        ordered_commits=ordered_commits,
        b_units=b_units(module, config),
        swiglu=variant.activation == "swiglu",
        turn_taking=consumers_take_turns(module, config),
    )
    report.seconds = time.time() - start  # transpiling included
    return report
