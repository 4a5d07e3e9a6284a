"""CPU tests of the drop-in harness's pieces that do not need a GPU (``matmul.harness.drop_in``)."""

import pytest
import torch

from matmul.harness import drop_in


def test_training_steps_run_forward_backward_and_the_optimizer():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=64, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    models = {"a": transformers.LlamaForCausalLM(config), "b": transformers.LlamaForCausalLM(config)}
    before = {name: model.lm_head.weight.detach().clone() for name, model in models.items()}
    ids = torch.randint(0, 64, (2, 7))
    steps = drop_in.training_steps(models, ids)
    assert steps.keys() == models.keys()
    for name, step in steps.items():
        loss = step()
        assert loss.ndim == 0 and torch.isfinite(loss)
        assert models[name].training
        assert not torch.equal(models[name].lm_head.weight, before[name])  # the optimizer stepped
        assert models[name].lm_head.weight.grad is not None


def test_settle_records_which_kernel_each_bucket_runs(monkeypatch):
    from matmul.call import api

    monkeypatch.setattr(api._plans, "wait_for_background", lambda timeout_s: True)
    entries = {
        1: ("sm_90a", {"key": "b16", "version": "v7", "source": "measured"}),
        2: ("sm_90a", {"key": "b1024", "version": "cuBLAS", "source": "shipped"}),
    }
    monkeypatch.setattr(api._chooser, "entries", entries)
    row = drop_in.settle(1.0)
    assert row["finished"] and row["pending"] == 0
    assert row["choices_by_source"] == {"measured": 1, "shipped": 1}
    assert row["choices"] == [("b1024", "cuBLAS", "shipped"), ("b16", "v7", "measured")]


@pytest.mark.parametrize("format", drop_in.PACKED_FORMATS)
def test_the_packed_llama_equals_its_dequantized_copy_not_the_16_bit_model(format, monkeypatch):
    """``packed_llama``'s third model stands for the switched one: on the CPU (the call widens the
    packed weight for torch there) their logits agree to rounding, and both differ from the 16-bit
    model's by the format's own error."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, attn_implementation="eager",
    )  # fmt: skip
    import matmul.nn as mnn

    monkeypatch.setattr(mnn, "eligible", lambda layer: None)  # the CPU stands in for the GPU here
    reference, switched, dequantized, conversion = drop_in.packed_llama(torch.bfloat16, format, config, device="cpu")
    assert len(conversion.swapped) == 8 and not conversion.skipped  # q, k, v, o, gate, up, down, lm_head
    ids = torch.randint(0, 64, (2, 5))
    with torch.inference_mode():
        ours, exact, theirs = (m(input_ids=ids, use_cache=False).logits for m in (switched, dequantized, reference))
    assert drop_in.relative(ours, exact) < 2e-2
    assert drop_in.relative(ours, theirs) > 5 * drop_in.relative(ours, exact)
