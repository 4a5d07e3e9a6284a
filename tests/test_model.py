"""The model benchmark's pieces that need no GPU: the transformer block against a plain reference,
its projection shapes, the report and the figure, and the command's answer without a GPU."""

import math

import pytest
import torch

from matmul import cli
from matmul.harness import model


def small_block(linear):
    return model.Block(linear, hidden=64, mlp=96, heads=4, kv_heads=2, dtype=torch.float32, device="cpu", seed=3)


def reference_block(block, x):
    """The same block written out head by head, without scaled_dot_product_attention's grouping."""
    w, (batch, seq, hidden) = block.weights, x.shape
    d, heads, kv_heads = block.head_dim, block.heads, block.kv_heads
    h = x.reshape(-1, hidden)
    qkv = block.rms_norm(h, w["norm_1"]) @ w["qkv"].T
    q, k, v = qkv[:, :hidden], qkv[:, hidden : hidden + kv_heads * d], qkv[:, hidden + kv_heads * d :]
    outs = []
    for b in range(batch):
        rows = slice(b * seq, (b + 1) * seq)
        heads_out = []
        for i in range(heads):
            j = i // (heads // kv_heads)  # the key/value head this query head shares
            qi, kj, vj = q[rows, i * d : (i + 1) * d], k[rows, j * d : (j + 1) * d], v[rows, j * d : (j + 1) * d]
            scores = (qi @ kj.T) / math.sqrt(d) + torch.full((seq, seq), float("-inf")).triu(1)
            heads_out.append(scores.softmax(-1) @ vj)
        outs.append(torch.cat(heads_out, dim=1))
    h = h + torch.cat(outs) @ w["o"].T
    gate, up = (block.rms_norm(h, w["norm_2"]) @ w["gate_up"].T).chunk(2, dim=-1)
    return (h + (torch.nn.functional.silu(gate) * up) @ w["down"].T).reshape(batch, seq, hidden)


def test_the_block_computes_a_llama_style_layer():
    calls = []
    block = small_block(lambda t, w: calls.append((t.shape[0], *w.shape)) or t @ w.T)
    x = torch.randn(2, 5, 64)
    assert torch.allclose(block(x), reference_block(block, x), atol=1e-4, rtol=1e-4)
    assert calls == model.block_projection_shapes(10, hidden=64, mlp=96, heads=4, kv_heads=2)
    assert model.block_projection_shapes(128) == [
        (128, 6144, 4096),
        (128, 4096, 4096),
        (128, 28672, 4096),
        (128, 4096, 14336),
    ]


def test_the_extended_preset():
    assert model.PROJECTIONS["qkv"] == (6144, 4096) and model.PROJECTIONS["gate-up"] == (28672, 4096)
    assert model.PROJECTIONS["lm_head"] == (128256, 4096) and model.TOKENS == (16, 128, 1024, 8192)


def test_a_layers_window_reads_every_weight_from_memory():
    def count(n, k):
        return model.layer_count(torch.empty(n, k, dtype=torch.float16, device="meta"))

    assert (count(4096, 4096), count(1024, 4096), count(128256, 4096)) == (8, 32, 1)
    assert count(4096, 4096) * 4096 * 4096 * 2 >= 5 * 50e6  # five times the H100's L2


def fake_results():
    rows = [
        {
            "label": label,
            "m": m,
            "n": n,
            "k": k,
            "kernel": "cuBLAS",
            "matmul_ms": 0.02,
            "torch_ms": 0.021,
            "ratio": 1.05,
            "ratios": [1.05],
            "calls": 10,
            "vs_torch_error": 0.0,
            "layers": 8,
            "one_weight": {"matmul_ms": 0.012, "torch_ms": 0.0114, "ratio": 0.95, "ratios": [0.95], "calls": 10},
        }
        for label, (n, k) in list(model.PROJECTIONS.items())[:2]
        for m in (16, 128)
    ]
    return {
        "format": model.FORMAT,
        "dtype": "float16",
        "machine": {"gpu": "stand-in"},
        "back_to_back": rows,
        "back_to_back_summary": {"geomean": 1.05, "min": 1.05, "shapes": len(rows)},
        "one_weight_summary": {"geomean": 0.95, "min": 0.95, "shapes": len(rows)},
        "host_us": {"torch.matmul": 15.0, "matmul()": 14.0, "matmul() runs": "v7", "short path error": 1e-4},
        "block": [
            {
                "batch": 1,
                "seq": 128,
                "tokens": 128,
                "matmul_ms": 0.5,
                "torch_ms": 0.51,
                "ratio": 1.02,
                "vs_torch_error": 0.0,
            }
        ],
    }


def test_the_report_and_the_figure(tmp_path):
    text = model.table(fake_results())
    assert "| q, o | 16 x 4096 x 4096 | cuBLAS | 8 | 20.0 | 21.0 | 1.050 | 12.0 | 11.4 | 0.950 |" in text
    assert "geometric mean 1.050x torch.matmul, worst 1.050x" in text and "one weight: geometric mean 0.950x" in text
    assert "| matmul() | 14.00 |" in text and "short path error" not in text
    assert "| 1 x 128 | 128 | 0.500 | 0.510 | 1.020 |" in text
    written = model.draw(fake_results(), tmp_path)
    assert {p.name for p in written} == {"model-float16.png", "model-float16.svg"}
    assert all(p.stat().st_size > 1000 for p in written)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the answer without a GPU")
def test_the_command_without_a_gpu_says_so(capsys):
    with pytest.raises(SystemExit):
        cli.main(["model"])
    assert "there is none here" in capsys.readouterr().err


def test_settle_plans_waits_until_the_planner_has_derived_what_is_queued(monkeypatch):
    """The windows must time the calls after their plans exist: ``settle_plans`` returns only once
    the planner's queue is empty and its job has finished."""
    import threading
    import time

    from matmul.call import api
    from matmul.call.background import Worker

    derived = threading.Event()

    def derive(key, payloads):
        time.sleep(0.2)  # a derivation that takes a while
        derived.set()

    planner = Worker("stand-in planner", derive)
    monkeypatch.setattr(api._plans, "planner", planner)
    planner.submit("a call's signature", object())
    model.settle_plans(timeout_s=10)
    assert derived.is_set()


def test_the_windows_come_after_the_first_calls_and_their_plans(monkeypatch):
    """``compare`` and ``host_us`` make each function's first call, wait for the planner, and only
    then time: a window that timed calls still on cuBLAS (their plan pending) would measure the
    wrong kernel."""
    events = []
    monkeypatch.setattr(model, "settle_plans", lambda *a, **k: events.append("settle"))
    monkeypatch.setattr(model, "window_ms", lambda fn, calls: events.append("window") or 1.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    def call(name):
        return lambda: events.append(name)

    model.compare(call("ours"), call("theirs"), rounds=2)
    assert events[:3] == ["ours", "theirs", "settle"] and "window" in events
    assert events.index("settle") < events.index("window")
    events.clear()
    model.host_us(call("ours"), calls=3, repeats=2)
    assert events[:2] == ["ours", "settle"] and events.count("ours") == 1 + 3 * 2


def test_a_checked_result_comes_from_the_calls_after_their_plans(monkeypatch):
    """A benchmark checks the kernel it times: ``settled_result`` makes the first call (which runs
    torch's ops while its plan is derived), waits for the planner, and returns a later call's
    result. Checking the first call's result would compare cuBLAS with cuBLAS."""
    settled = []
    monkeypatch.setattr(model, "settle_plans", lambda *a, **k: settled.append(True))

    def call():  # stands for a model whose calls run the chosen kernels once their plans exist
        return "the chosen kernel's" if settled else "torch's"

    assert model.settled_result(call) == "the chosen kernel's"
