"""Hopper V5's stream-K option on the CPU: the rule that deals out the tail (``pipeline.stream_k``),
and the option's build for sm_90a.

The rule is checked over grids and shapes far past what a GPU run can try: every K block of every
tail tile is computed by exactly one piece, each tile is finished by exactly one piece (the one
reaching its last K block), each worker has at most one partial and computes it first, and the
workers ``StreamKSchedule.first_contributor`` names for a tile are exactly those whose partials lie
in it (a finisher that missed one would write a wrong tile; one that waited on a worker with no
partial would hang). Whether the kernel follows the rule is what the GPU tests
(``test_stream_k_gpu.py``) and the protocol checker show."""

import math
import re

import pytest
import tilus

from matmul.build import compiler
from matmul.kernels import versions
from matmul.kernels.variant import Variant
from pipeline.stream_k import MOST_CUTS, range_start, stream_k_pieces, tail_workers


def first_contributor(tail_tile: int, tail: int, k_blocks: int, workers: int) -> int:
    """``StreamKSchedule.first_contributor``'s arithmetic, in Python."""
    work = tail * k_blocks
    return ((tail_tile * k_blocks + 1) * tail_workers(tail, workers) + work - 1) // work - 1


CASES = [
    (tiles, k_blocks, workers)
    for workers in (1, 2, 4, 7, 132)
    for tiles in (1, 3, 5, 31, 512, 2048, 1000)
    for k_blocks in (1, 2, 17, 64, 128)
]


def test_every_tail_k_block_is_computed_once_and_every_tail_tile_finished_once():
    for tiles, k_blocks, workers in CASES:
        every_tail_k_block_once(tiles, k_blocks, workers)


def every_tail_k_block_once(tiles: int, k_blocks: int, workers: int):
    tail = tiles % workers
    pieces = stream_k_pieces(tiles, k_blocks, workers)
    done = {}
    finishers = {}
    for worker, mine in enumerate(pieces):
        partials = [p for p in mine if p[2] < k_blocks]
        assert len(partials) <= 1 and (not partials or mine[0] == partials[0]), (worker, mine)
        for tile, begin, end in mine:
            assert tiles - tail <= tile < tiles and 0 <= begin < end <= k_blocks
            for kb in range(begin, end):
                assert (tile, kb) not in done, f"K block {kb} of tile {tile} twice"
                done[tile, kb] = worker
            if end == k_blocks:
                assert tile not in finishers, f"tile {tile} finished twice"
                finishers[tile] = worker
    assert len(done) == tail * k_blocks
    assert sorted(finishers) == list(range(tiles - tail, tiles))


def test_a_finisher_collects_exactly_the_partials_of_its_tile():
    for tiles, k_blocks, workers in CASES:
        partials_collected(tiles, k_blocks, workers)


def partials_collected(tiles: int, k_blocks: int, workers: int):
    tail = tiles % workers
    pieces = stream_k_pieces(tiles, k_blocks, workers)
    partial_of = {w: mine[0][0] for w, mine in enumerate(pieces) if mine and mine[0][2] < k_blocks}
    for worker, mine in enumerate(pieces):
        for tile, begin, end in mine:
            if end < k_blocks or begin == 0:
                continue
            first = first_contributor(tile - (tiles - tail), tail, k_blocks, workers)
            collected = [
                c
                for c in range(worker)
                if c >= first and range_start(c, tail, k_blocks, workers) < range_start(c + 1, tail, k_blocks, workers)
            ]
            expected = [c for c, t in partial_of.items() if t == tile]
            assert collected == expected, (tile, worker, collected, expected)


def test_the_tail_is_shared_evenly():
    # 4096^3 in 128 x 256 tiles on an H100: 512 tiles, 116 in the tail, 64 K blocks each
    lengths = [sum(e - b for _, b, e in mine) for mine in stream_k_pieces(512, 64, 132)]
    assert min(lengths) == 56 and max(lengths) == 57
    assert math.isclose(sum(lengths) / 132 / 64, 116 / 132)
    # no tail, no pieces: 528 tiles are four whole waves
    assert all(not mine for mine in stream_k_pieces(528, 64, 132))


def test_a_short_tail_is_cut_at_most_most_cuts_times_a_tile():
    # a tail of one tile (133 tiles on 132 SMs) goes to two workers, not to all 132
    pieces = stream_k_pieces(133, 64, 132)
    assert [len(mine) for mine in pieces[:3]] == [1, 1, 0] and not any(pieces[2:])
    for tiles, workers in ((133, 132), (135, 132), (200, 132), (7, 4)):
        tail = tiles % workers
        sharing = sum(1 for mine in stream_k_pieces(tiles, 64, workers) if mine)
        assert sharing == min(workers, MOST_CUTS * tail)


@pytest.fixture(scope="module")
def stream_k_build():
    module = versions.load("sm_90a", "v5")
    result = compiler.build_config(module, "sm_90a", dict(module.STREAM_K), tilus.float16)
    assert result.ok, result.error
    return result


def test_stream_k_builds_with_gpu_scope_flags_and_no_batched_entry(stream_k_build):
    ptx = stream_k_build.ptx()
    # each warpgroup publishes (release) and collects (acquire, then the reset) through its flags
    assert len(re.findall(r"st\.release\.gpu", ptx)) >= 2 and len(re.findall(r"ld\.acquire\.gpu", ptx)) >= 2
    assert "wgmma.mma_async.sync.aligned.m64n256k16" in ptx
    module = versions.load("sm_90a", "v5")
    assert not module.takes(module.STREAM_K, Variant(batches=2))
    assert module.STREAM_K in module.EXTRA_CONFIGS and module.STREAM_K not in versions.space(module)


@pytest.mark.parametrize("key", ["bias+gelu_tanh", "swiglu", "kn"])
def test_stream_k_builds_for_every_epilogue_and_b_layout(key):
    module = versions.load("sm_90a", "v5")
    result = compiler.build_config(module, "sm_90a", dict(module.STREAM_K), tilus.float16, variant=Variant.parse(key))
    assert result.ok, result.error
