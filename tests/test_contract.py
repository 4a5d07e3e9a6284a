"""Bad operands get a clear error that names the problem and the fix, before any launch."""

import pytest
import torch

from matmul.contract import (
    MatmulInputError,
    check_apart,
    check_bias,
    check_call,
    check_no_internal_overlap,
    check_operands,
    layout,
    overlaps,
    readable,
    row_stride,
)


def mats(m=64, n=32, k=48, dtype=torch.float16):
    return torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (torch.randn(4, 8, 8).half(), torch.randn(8, 8).half()), "must be 2-D"),
        (lambda: mats(dtype=torch.float32), "float16 or both bfloat16"),
        (lambda: (mats()[0], mats(dtype=torch.bfloat16)[1]), "float16 or both bfloat16"),
        (lambda: (torch.randn(64, 48).half(), torch.randn(32, 40).half()), "inner dimensions differ"),
        (lambda: (torch.randn(0, 48).half(), torch.randn(32, 48).half()), "at least 1"),
        (lambda: (torch.randn(48, 64).half().T, torch.randn(32, 48).half()), "unit stride"),
        (lambda: (torch.randn(64, 20).half()[:, :17], torch.randn(32, 17).half()), "not a multiple of 16 bytes"),
        (lambda: (torch.randn(64 * 48 + 1).half()[1:].view(64, 48), torch.randn(32, 48).half()), "16-byte aligned"),
        (lambda: mats(), "CUDA tensors"),
        (lambda: ([[1.0]], mats()[1]), "must be a torch.Tensor"),
    ],
)
def test_bad_operands_are_named(make, message):
    a, b = make()
    with pytest.raises(MatmulInputError, match=message):
        check_operands(a, b)


def test_padded_rows_pass_the_layout_checks():
    # K = 17 is legal when each row is padded to 24 elements (48 bytes): only the device is wrong here
    a = torch.randn(64, 24).half()[:, :17]
    b = torch.randn(32, 24).half()[:, :17]
    with pytest.raises(MatmulInputError, match="CUDA tensors"):
        check_operands(a, b)


def test_row_stride_of_a_single_row_is_aligned():
    assert row_stride(torch.empty(1, 17, dtype=torch.float16)) == 24
    assert row_stride(torch.empty(5, 24, dtype=torch.bfloat16)[:, :17]) == 24


# --- out overlapping an input --------------------------------------------------------------------


def shares_an_element(x, y):
    def addresses(t):
        rows, cols = t.shape
        return {
            t.data_ptr() + (i * t.stride(0) + j * t.stride(1)) * t.element_size()
            for i in range(rows)
            for j in range(cols)
        }

    return bool(addresses(x) & addresses(y))


def test_overlap_is_exact_for_blocks_of_one_buffer():
    buffer = torch.zeros(12, 16).half()
    blocks = [
        buffer[r0:r1, c0:c1]
        for r0, r1 in ((0, 12), (0, 5), (5, 9), (3, 9), (4, 5), (7, 12))
        for c0, c1 in ((0, 16), (0, 8), (4, 12), (8, 16), (15, 16), (12, 16))
    ]
    blocks += [buffer.view(-1)[s : s + 96].view(6, 16) for s in (5, 13, 21, 90)]  # bases off the row grid
    # rows that straddle the buffer's rows
    blocks += [buffer.view(-1)[s : s + 60].as_strided((5, 4), (16, 1)) for s in (14, 78, 109)]
    for x in blocks:
        for y in blocks:
            assert overlaps(x.data_ptr(), layout(x), y.data_ptr(), layout(y)) == shares_an_element(x, y), (
                x.data_ptr(),
                layout(x),
                y.data_ptr(),
                layout(y),
            )
    other = torch.zeros(12, 16).half()
    assert not overlaps(buffer.data_ptr(), layout(buffer), other.data_ptr(), layout(other))


def test_out_overlapping_an_input_is_named():
    a = torch.randn(64, 48).half()[:, :16]  # a [64, 16] in the left third of each 48-wide row
    b = torch.randn(16, 16).half()
    for out in (a, a.as_strided((64, 16), (48, 1), 8)):  # a itself; straddling a's columns
        with pytest.raises(MatmulInputError, match="out overlaps a"):
            check_call(a, b, out, require_cuda=False)
    with pytest.raises(MatmulInputError, match="out overlaps b"):
        check_call(b.clone(), b, b, require_cuda=False)  # out is b
    with pytest.raises(MatmulInputError, match="out overlaps b"):
        check_call(b.clone(), b.T, b, require_cuda=False)  # out is the weight w behind b = w.T
    check_call(a, b, a.as_strided((64, 16), (48, 1), 16), require_cuda=False)  # the middle third: apart from a


def test_out_of_any_dimensions_is_compared_by_its_rows_or_else_its_span():
    """``check_apart``: tensors whose rows one view flattens exactly, as 2-D ones; others (and other
    element sizes) by their spans of bytes, which refuses whatever lies between their rows too."""
    buffer = torch.randn(2, 5, 456).half()
    check_apart(buffer[..., 256:], (("x", buffer[..., :256]),))  # beside each other in every row
    with pytest.raises(MatmulInputError, match="out overlaps x"):
        check_apart(buffer[..., 255:455], (("x", buffer[..., :256]),))
    blocks = torch.randn(4, 6, 8).half()
    out = blocks[:, :3]  # [4, 3, 8] in a [4, 6, 8]: no view makes it a matrix
    with pytest.raises(MatmulInputError, match="out overlaps x"):
        check_apart(out, (("x", blocks[2, 1]),))
    with pytest.raises(MatmulInputError, match="out overlaps x"):
        check_apart(out, (("x", blocks[1, 4]),))  # between its rows, inside its span: refused too
    check_apart(out, (("x", blocks[3, 4:]),))  # past its span
    words = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(MatmulInputError, match="out overlaps w"):
        check_apart(words.view(torch.float16)[100:].view(4, 7), (("w", words[60:]),))
    check_apart(words.view(torch.float16)[:100].view(10, 10), (("w", words[50:]),))
    check_apart(torch.empty(0, 5).half(), (("x", buffer),))  # nothing to share


def test_a_plans_checks_give_cs_strides_without_allocating_it():
    """``allocate=False``: C on the meta device with the strides of the C a call would allocate, for
    B read in place as w [N, K], as b [K, N], and as a b [K, N] whose rows TMA cannot read."""
    a = torch.randn(5, 24, dtype=torch.float16)
    for b in (torch.randn(20, 24, dtype=torch.float16).T, torch.randn(24, 20, dtype=torch.float16)):
        for kn_unreadable in (False, True):
            if kn_unreadable:
                b = torch.randn(24, 21, dtype=torch.float16)[:, :20]  # rows of 42 bytes
            allocated = check_call(a, b, require_cuda=False)[2]
            strides_only = check_call(a, b, require_cuda=False, allocate=False)[2]
            assert strides_only.is_meta and not allocated.is_meta
            assert strides_only.shape == allocated.shape == (5, 20)
            assert strides_only.stride() == allocated.stride() == (24, 1)  # rows padded to 16 bytes


def test_an_out_holding_an_element_twice_is_named():
    """A broadcast out, or rows closer than their length, would keep one of several values written
    to one place: refused, as torch refuses to write it; a column block of wider rows is fine."""
    a, b = torch.randn(8, 16).half(), torch.randn(16, 24).half()
    for out in (torch.empty(1, 24).half().expand(8, 24), torch.empty(300).half().as_strided((8, 24), (16, 1))):
        with pytest.raises(MatmulInputError, match="several places"):
            check_call(a, b, out, require_cuda=False)
    check_call(a, b, torch.empty(8, 40).half()[:, 8:32], require_cuda=False)
    check_no_internal_overlap(torch.empty(3, 0, 5))  # nothing to hold twice
    check_no_internal_overlap(torch.empty(1, 24).expand(1, 24))  # one row: nothing repeated


@pytest.mark.parametrize(
    "bias, message",
    [
        (torch.randn(41).half(), r"\[N\] = \[40\]"),
        (torch.randn(40), "like x"),
        (torch.randn(40).bfloat16(), "like x"),
        ([0.0] * 40, "must be a torch.Tensor"),
    ],
)
def test_a_bias_of_another_shape_dtype_or_kind_is_named(bias, message):
    with pytest.raises(MatmulInputError, match=message):
        check_bias(bias, torch.randn(3, 24).half(), 40)
    check_bias(torch.randn(80).half()[::2], torch.randn(3, 24).half(), 40)  # any stride: fine


def test_readable_copies_only_what_tma_cannot_read():
    dense = torch.randn(9, 24).half()
    assert readable(dense) is dense
    for x in (
        torch.randn(24, 9).half().T,
        torch.randn(9 * 24 + 1).half()[1:].view(9, 24),
        torch.randn(9, 25).half()[:, 1:],
    ):
        copy = readable(x)
        assert torch.equal(copy, x) and copy.stride(1) == 1 and (copy.stride(0) * 2) % 16 == 0
        assert copy.data_ptr() % 16 == 0
    odd = readable(torch.randn(9, 30).half().T.contiguous().T)  # rows of 9 elements: padded to 16
    assert odd.shape == (9, 30)
