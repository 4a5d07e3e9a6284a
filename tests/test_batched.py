"""Batched matmul (torch.bmm's case) without a GPU: the batch index in the tile numbering, the
variant and which versions declare it, the shape and stride rules of ``matmul.call.batched`` and
their errors, and that the batched builds compile (one representative per architecture by
default; the "kn" builds under ``-m full_space``). The GPU checks: tests/test_batched_gpu.py.
"""

import itertools

import pytest
import torch

from matmul import build
from matmul.call import batched, tuner
from matmul.contract import MatmulInputError
from matmul.kernels import variant as variants
from matmul.kernels import versions
from matmul.kernels.variant import Variant, batch_bucket
from pipeline.schedulers import batched_tile, grouped_tile

# --- the tile numbering ---------------------------------------------------------------------------


def covers_every_tile_once(decompose, batches, num_m, num_n, group) -> bool:
    """Whether linear tiles 0 .. batches * num_m * num_n - 1, decomposed by ``decompose``, visit every
    (batch, m_tile, n_tile) exactly once: what a persistent schedule relies on."""
    seen = [decompose(t, num_m, num_n, group) for t in range(batches * num_m * num_n)]
    expected = set(itertools.product(range(batches), range(num_m), range(num_n)))
    return len(seen) == len(set(seen)) and set(seen) == expected


def forgets_the_batch(linear, num_m, num_n, group):
    """A planted bug: a scheduler that wraps the linear index into one product's tiles and never
    advances the batch (what a kernel computing only ``tile(linear % tiles)`` would do): every batch
    but the first is never written, and the first is written ``batches`` times."""
    return (0, *grouped_tile(linear % (num_m * num_n), num_m, num_n, group))


@pytest.mark.parametrize("batches, num_m, num_n, group", [(1, 3, 5, 2), (3, 5, 2, 4), (7, 1, 1, 16), (4, 9, 3, 8)])
def test_batched_tiles_cover_every_tile_once(batches, num_m, num_n, group):
    assert covers_every_tile_once(batched_tile, batches, num_m, num_n, group)
    # within a product the order is the 2-D kernels' grouped order
    tiles = num_m * num_n
    for t in range(batches * tiles):
        assert batched_tile(t, num_m, num_n, group)[1:] == grouped_tile(t % tiles, num_m, num_n, group)


def test_the_coverage_check_catches_a_scheduler_that_forgets_the_batch():
    assert not covers_every_tile_once(forgets_the_batch, 3, 5, 2, 4)
    assert covers_every_tile_once(forgets_the_batch, 1, 5, 2, 4)  # with one product the bug is invisible


# --- the variant and who declares it ----------------------------------------------------------------


def test_variant_batches_key_and_bucket():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 7, 8, 9)] == [1, 2, 4, 4, 8, 8, 8, 16]
    for v in (Variant(batches=8), Variant("kn", batches=1), Variant("kn", True, "relu", 4)):
        assert Variant.parse(v.key()) == v
    assert Variant("kn", batches=8).key() == "kn+batch8"
    assert Variant(batches=8).kernel_options() == Variant().kernel_options()  # same Kernel options
    with pytest.raises(ValueError):
        Variant(batches=3)  # a bucket, not a count
    with pytest.raises(ValueError):
        Variant.parse("batch2+batch4")


@pytest.mark.parametrize("arch", versions.ARCHS)
def test_only_batched_versions_are_candidates(arch):
    batched_variant = Variant(batches=4)
    for version in versions.available(arch):
        module = versions.load(arch, version)
        assert variants.supported(module, batched_variant) == (version == "v5")
    for layout in ("nk", "kn"):
        found = tuner.candidates(arch, 1000, 1000, 1000, Variant(layout, batches=4))
        assert found == ["v5", versions.CUBLAS]


# --- the call's rules --------------------------------------------------------------------------------


def rand(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


def form(a, b, out=None):
    return batched.form(a, b, out, require_cuda=False)


def test_bmm_both_layouts():
    a = rand(3, 40, 64)
    f = form(a, rand(3, 64, 24))  # b [B, K, N] row-major
    assert (f.b_layout, f.batches, f.mnk, f.shape) == ("kn", 3, (40, 24, 64), (3, 40, 24))
    w = rand(3, 24, 64)
    f = form(a, w.transpose(-1, -2))  # b = w.T of a row-major w [B, N, K]
    assert (f.b_layout, f.mnk) == ("nk", (40, 24, 64))
    assert f.operand.data_ptr() == w.data_ptr() and f.operand.stride() == w.stride()
    assert f.variant() == Variant("nk", batches=4)


def test_broadcast_of_one_matrix():
    f = form(rand(40, 64), rand(5, 64, 24))  # a shared by every product
    assert (f.a.shape[0], f.batches, f.shape) == (1, 5, (5, 40, 24))
    f = form(rand(5, 40, 64), rand(1, 64, 24))  # b [1, K, N] shared
    assert (f.operand.shape[0], f.batches) == (1, 5)
    f = form(rand(2, 3, 40, 64), rand(2, 3, 64, 24))  # batch dimensions that flatten as a view
    assert (f.batches, f.shape) == (6, (2, 3, 40, 24))


def test_what_goes_to_torch_matmul_says_why():
    a = rand(3, 40, 64)
    cases = {
        "not row-major": (a.transpose(1, 2).contiguous().transpose(1, 2), rand(3, 64, 24)),
        "row stride": (rand(3, 40, 60)[:, :, :36], rand(3, 36, 24)),  # 60 halves: not 16 bytes
        "flatten": (rand(3, 2, 40, 64).transpose(0, 1), rand(2, 3, 64, 24)),
        "in part": (rand(2, 1, 40, 64), rand(1, 3, 64, 24)),
        "1-D": (rand(64), rand(3, 64, 24)),
        "out=": (a, rand(3, 64, 24), torch.empty(3, 40, 24, dtype=torch.float16)),
        "CUDA": None,
    }
    for words, operands in cases.items():
        if operands is None:
            reason = batched.form(a, rand(3, 64, 24))
        else:
            reason = form(*operands)
        assert isinstance(reason, str) and words in reason, (words, reason)
    # neither row-major [K, N] nor w.T: its rows are not contiguous either way
    odd = rand(3, 64, 48)[:, :, ::2]
    assert isinstance(form(a, odd), str)


def test_errors_name_the_problem():
    with pytest.raises(MatmulInputError, match="inner dimensions"):
        form(rand(3, 40, 64), rand(3, 32, 24))
    with pytest.raises(MatmulInputError, match="do not broadcast"):
        form(rand(3, 40, 64), rand(4, 64, 24))
    with pytest.raises(MatmulInputError, match="float16 or both bfloat16"):
        form(rand(3, 40, 64, dtype=torch.float32), rand(3, 64, 24, dtype=torch.float32))


def test_recorded_gradients_go_to_torch():
    a = rand(3, 40, 64).requires_grad_()
    assert "gradients" in form(a, rand(3, 64, 24))


def test_launch_arguments():
    a = torch.empty(3, 40, 72, dtype=torch.float16)[:, :, :64]
    w = torch.empty(3, 24, 64, dtype=torch.float16)
    f = form(a, w.transpose(-1, -2))
    c = batched.allocate(f)
    assert c.shape == (3, 40, 24) and c.stride() == (40 * 24, 24, 1)
    args = versions.batched_launch_args(f.a, f.operand, c, f.b_layout)
    batches, m, n, k = args[:4]
    assert (batches, m, n, k) == (3, 40, 24, 64)
    assert args[7:10] == (72, 64, 24)  # row strides
    assert args[11:] == (3, 3, 40 * 72, 24 * 64, 40 * 24)  # batch extents and strides
    shared = form(a[0], w.transpose(-1, -2))
    args = versions.batched_launch_args(shared.a, shared.operand, c, shared.b_layout)
    assert args[11] == 1 and args[13] % 8 == 0  # a shared: extent 1, any aligned stride


# --- builds ------------------------------------------------------------------------------------------


def batched_build(arch, layout):
    module = versions.load(arch, "v5")
    return build.build_config(module, arch, module.REPRESENTATIVE, variant=Variant(layout, batches=4))


def check_batched_build(result):
    assert result.ok, result.error
    ptx = result.ptx()
    # every TMA load and store is a box of a 3-D tensor map: (column, row, batch)
    assert "cp.async.bulk.tensor.3d.shared::cta.global" in ptx
    assert "cp.async.bulk.tensor.3d.global.shared::cta" in ptx
    assert "cp.async.bulk.tensor.2d" not in ptx
    assert result.within_shared_limit


@pytest.mark.parametrize("arch", versions.ARCHS)
def test_batched_v5_builds(arch):
    """Hopper's runs on an H100 (tests/test_batched_gpu.py); Blackwell's is compiled only, never run."""
    check_batched_build(batched_build(arch, "nk"))


@pytest.mark.full_space
@pytest.mark.parametrize("arch", versions.ARCHS)
def test_batched_v5_kn_builds(arch):
    check_batched_build(batched_build(arch, "kn"))
