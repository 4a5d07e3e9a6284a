"""Which path (V8, or the weight widened for cuBLAS) the int4 drop-in Llama's projections take at
each prefill, after the first calls of ``python -m matmul drop-in --parts llama-int4`` and the
builds they started; then, for each of the model's packed weights at those token counts, V8's
product against the widened path's (cuBLAS on ``qw.dequantize()``'s weight) and against a float32
product of the same int4 weights, with the configuration the call ran:

    python plots/h200/int4-llama/which_path.py   # which_path.txt
"""

from collections import Counter

import torch

from matmul.harness import drop_in
from matmul.quant import linear as L

reference, switched, dequantized, conversion = drop_in.packed_llama(torch.float16, "int4")
calls = []
run, widened = L.run, L.widened


def counted_run(kernel, x, *rest):
    calls.append(("v8", x.shape[0]))
    return run(kernel, x, *rest)


def counted_widened(x, weight, out=None):
    calls.append(("widened", x.shape[0]))
    return widened(x, weight, out=out)


L.run, L.widened = counted_run, counted_widened
with torch.inference_mode():
    prefills, decodes = drop_in._first_calls(
        reference, switched, torch.float16, drop_in.PACKED_PREFILL, lambda row: None, dequantized
    )
    print("first calls (while V8 builds):", dict(Counter(calls)), flush=True)
    print(drop_in.wait_for_v8(), flush=True)
    for shape, ours, theirs, _, exact in prefills:
        calls.clear()
        logits = ours()
        error, quantized = drop_in._relative(logits, exact()), drop_in._relative(logits, theirs())
        print(
            f"prefill {shape}: {dict(Counter(calls))} of the 11 products; logits against the dequantized model's "
            f"{error:.3g}, against the 16-bit model's {quantized:.3g}",
            flush=True,
        )
    L.run, L.widened = run, widened
    layer = switched.model.layers[0]
    weights = {
        "qkv (fused)": conversion.fused[0][1].packed,
        "o": layer.self_attn.o_proj.weight,
        "gate": layer.mlp.gate_proj.weight,
        "down": layer.mlp.down_proj.weight,
        "lm_head": switched.lm_head.weight,
    }
    for m in (128, 1024):
        for name, qw in weights.items():
            x = torch.randn(m, qw.shape[1], dtype=torch.float16, device="cuda")
            config = L.config_for(m, *qw.shape, qw.format) if L.uses_v8(m, qw) else None
            y = L.linear(x, qw)
            wide = L.widened(x, qw)
            ref = x.float() @ qw.dequantize().float().T
            errors = drop_in._relative(y, ref), drop_in._relative(wide, ref)
            print(
                f"{m} tokens, {name} {tuple(qw.shape)}: "
                + ("widened" if config is None else f"V8 {config['block_m']}/{config['warpgroups']}/{config['split']}")
                + f"; against float32 {errors[0]:.3g}, the widened path's {errors[1]:.3g};"
                f" equal to the widened path's bit for bit: {torch.equal(y, wide)}",
                flush=True,
            )
