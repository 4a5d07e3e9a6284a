"""Bad operands get a clear error that names the problem and the fix, before any launch."""

import pytest
import torch

from matmul.contract import MatmulInputError, check_operands, row_stride


def mats(m=64, n=32, k=48, dtype=torch.float16):
    return torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)


@pytest.mark.parametrize("make, message", [
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
])
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
