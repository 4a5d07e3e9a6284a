"""Hopper V8 for many tokens (``matmul/kernels/hopper/v8_prefill.py``) on the CPU: its build for
sm_90a (no spill, the shared memory its docstring counts, the instructions of its idea) and that
the protocol checker runs it (``tests/test_protocol.py`` checks its synchronization, and two planted
bugs in ``tests/protocol_mutants.py``). Its results are checked on
the H100 by ``tests/test_v8_prefill_gpu.py``."""

import importlib

import pytest
import torch

from matmul import build, protocol
from matmul.kernels import versions

PREFILL = importlib.import_module("matmul.kernels.hopper.v8_prefill")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_the_representative_builds_with_its_markers(dtype):
    result = build.build_config(PREFILL, "sm_90a", dict(PREFILL.REPRESENTATIVE), versions.TILUS_DTYPES[dtype])
    assert result.ok, result.error[-3000:]
    assert result.spill_bytes == 0
    assert 0 <= result.shared_bytes - PREFILL.shared_bytes(**PREFILL.REPRESENTATIVE) < 1024
    found = build.markers_found(result, PREFILL.PTX_MARKERS)
    assert all(found.values()), found
    assert "stmatrix" in result.ptx()  # the widened halves go into the B tile by stmatrix


def test_the_shapes_it_takes():
    assert PREFILL.supports(1000, 4095, 4096) and PREFILL.supports(1, 1, 128)
    assert not PREFILL.supports(1000, 4096, 4000)  # K: whole scale groups


def test_the_protocol_checker_runs_it():
    assert "v8_prefill" in protocol.versions_to_check("sm_90a")
    assert "v8_prefill" not in protocol.versions_to_check("sm_100a")  # Hopper only
