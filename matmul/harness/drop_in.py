"""The call as a model meets it outside ``matmul(x, w.T)``: ``python -m matmul drop-in``.

Three parts, each timed as a model issues its work (back to back on one stream, host time included,
``model.compare``: windows of calls in alternating order, the ratio torch's time over ours, above 1
when the project is faster):

* ``kn``: ``matmul(x, W)`` with ``W`` a contiguous [K, N] matrix (torch's own layout for a plain
  ``a @ b``) against ``torch.matmul(x, W)`` on the same operands, over the extended LLM preset
  (``model.PROJECTIONS`` at ``model.TOKENS`` tokens), both of ``python -m matmul model``'s ways:
  cycling through copies of the weight (``layers``: each call reads its weight from HBM, as a
  model's layers do; the row's ratio) and on one weight (``one_weight``: L2 holds a weight under
  50 MB).
* ``linear``: ``matmul.linear(x, w, bias, "gelu_tanh")`` against ``F.linear`` followed by
  ``F.gelu``, and ``matmul.linear(x, gate_up, activation="swiglu")`` against ``F.linear`` on the
  concatenated gate and up weights followed by the split and ``silu(gate) * up``, on the preset's
  MLP shapes at ``LINEAR_TOKENS`` tokens.
* ``llama``: a ``transformers`` Llama (random weights, ``LAYERS`` layers, Llama-3-8B's widths or
  another model's: ``WIDTHS``, ``--widths``) switched the way the README tells users,
  ``matmul.nn.convert(model, fuse_gate_up=True, fuse_qkv=True)``, against a copy of the same model
  unswitched: ``convert``'s wall time, prefill, a decode step (eager, and replayed from a CUDA graph
  over a static KV cache), and training steps (forward, backward, SGD) at ``TRAIN``'s sizes; the
  switched model's first call timed on its own; its logits and gradients compared with the
  unswitched's.
* ``llama-<format>``: the same with packed weights (``convert(model, weights=format,
  fuse_qkv=True)``), which returns once its kernels are built: ``convert``'s wall time, then decode
  steps captured in a CUDA graph at once (what a graph captured right after ``convert`` holds for
  good), then the rows above but training.

The ``kn`` and ``linear`` parts call every case once first (its bucket's instant choice: a
relative's narrowed tuning starts in the background), wait for that tuning (``settle``), then time
each case, with where its choice came from; ``linear`` also times torch's product alone, which
bounds what any fused epilogue can gain over torch's product + activation (``ceiling``).

The ``llama`` part runs every workload once first (the prefills' first calls timed: what a user of a
fresh machine waits for, beside the unswitched model's first call of the same shape; torch's own
start and its start for each shape, which a user pays either way, are paid by a third model first), then
waits for the tuning those calls started in the background (``settle``), then times each row; with
``MATMUL_TUNE=blocking`` the first calls tune in the caller instead. What each call ran is in
``matmul.choice``.
"""

from __future__ import annotations

import copy
import functools
import json
import statistics
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..kernels.variant import Variant
from ..measure.timing import waited_ms
from . import model as model_bench
from .model import relative_difference as relative

LINEAR_TOKENS = (16, 128, 1024, 8192)
LINEAR_SHAPES = {"up": (14336, 4096), "down": (4096, 14336)}  # bias + gelu
SWIGLU_SHAPE = (14336, 4096)  # gate and up, each [I, K]
LAYERS = 2
PREFILL = ((1, 128), (1, 2048), (4, 2048))  # batch x tokens
# packed weights add 1024 tokens: V8 runs int4 up to 1536 (``call/shipped/rules/v8.json``), past it (and
# int6 and fp8 past 256) the call widens the weight for cuBLAS
PACKED_PREFILL = ((1, 128), (1, 1024), (1, 2048), (4, 2048))
# the packed Llama's formats: ``matmul.quantize``'s, each a part ``llama-<format>``
PACKED_FORMATS = ("int4", "int6", "fp8_e4m3")
DECODE_BATCHES = (1, 8, 32)
DECODE_CONTEXT = 1024  # tokens in the KV cache before the timed step
TRAIN = ((2, 512), (2, 2048))  # host-bound (two layers, 1024 tokens) and GPU-bound
# the models' widths (random weights, ``LAYERS`` layers): Llama-3-8B's, and Qwen2-7B's (its q, k, v
# biases too) for a model no shipped table was tuned on
WIDTHS = {
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       vocab_size=128256),
    "qwen2-7b": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                     vocab_size=152064, attention_bias=True),
}  # fmt: skip
DEFAULT_WIDTHS = "llama-3-8b"
SETTLE_S = 300.0  # at most this long for the background tuning the first calls started
FORMAT = "tilus-matmul-drop-in/1"


def kn_layout(dtype, rounds: int, record: Callable[[dict], None]) -> None:
    """Every shape is called once first (its bucket's instant choice, tuning started in the
    background), the tuning is waited for (``settle``), then each shape is timed and checked."""
    import matmul

    cases = []
    for (name, (n, k)), m in [(item, m) for item in model_bench.PROJECTIONS.items() for m in model_bench.TOKENS]:
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(k, n, device="cuda", dtype=dtype) / k**0.5
        first = matmul.choice(x, w)
        matmul.matmul(x, w)
        cases.append((name, x, w, first))
    record(settle_and_say("kn"))
    for name, x, w, first in cases:
        (m, k), n = x.shape, w.shape[1]
        error = relative(model_bench.settled_result(lambda x=x, w=w: matmul.matmul(x, w)), x.float() @ w.float())
        result = model_bench._projection(x, w, rounds, operand=_as_is)  # "layers" (the ratio) and one weight
        entry = matmul.choice(x, w)
        print(
            f"kn {name} {m}x{n}x{k}: {result['ratio']:.3f}x, one weight {result['one_weight']['ratio']:.3f}x"
            f" ({entry.get('version')})",
            flush=True,
        )
        row = dict(name=name, m=m, n=n, k=k, error=error, version=entry.get("version"), **result)
        record({**row, **_provenance(entry), "first": _provenance(first)})


def _as_is(w: torch.Tensor) -> torch.Tensor:
    return w


def _provenance(entry: dict) -> dict:
    """What a choice ran and where it came from, as a results row keeps it."""
    keep = ("version", "config", "source", "nearest", "narrowed_from", "building", "below")
    return {k: entry[k] for k in keep if k in entry}


def linear_epilogues(dtype, rounds: int, record: Callable[[dict], None]) -> None:
    """As ``kn_layout``: every case called once, the background tuning waited for, then each
    timed; beside each row, torch's ``F.linear`` alone against torch's product + activation
    (``ceiling``): what a fused epilogue running at cuBLAS's speed would reach."""
    import matmul

    cases = []
    for m in LINEAR_TOKENS:
        for name, (n, k) in LINEAR_SHAPES.items():
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
            bias = torch.randn(n, device="cuda", dtype=dtype)
            ours = functools.partial(matmul.linear, x, w, bias, "gelu_tanh")
            theirs = functools.partial(_linear_then_gelu, x, w, bias)
            alone = functools.partial(F.linear, x, w, bias)
            expected = F.gelu(F.linear(x.float(), w.float(), bias.float()), approximate="tanh")
            variant = Variant("nk", True, "gelu_tanh")
            cases.append((f"{name}+bias+gelu_tanh", m, n, k, ours, theirs, alone, expected, variant))
        i, k = SWIGLU_SHAPE
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        gate, up = (torch.randn(i, k, device="cuda", dtype=dtype) / k**0.5 for _ in range(2))
        fused, concatenated = matmul.gate_up(gate, up), torch.cat([gate, up])

        def theirs(x=x, concatenated=concatenated):
            g, u = F.linear(x, concatenated).chunk(2, dim=-1)
            return F.silu(g) * u

        def ours(x=x, fused=fused):
            return matmul.linear(x, fused, None, "swiglu")

        alone = functools.partial(F.linear, x, concatenated)
        expected = F.silu(x.float() @ gate.float().T) * (x.float() @ up.float().T)
        cases.append(("gate_up+swiglu", m, 2 * i, k, ours, theirs, alone, expected, Variant("nk", False, "swiglu")))
    for case in cases:
        case[4]()  # each bucket's instant choice; its tuning starts
    record(settle_and_say("linear"))
    for name, m, n, k, ours, theirs, alone, expected, variant in cases:
        record(_linear_row(name, m, n, k, ours, theirs, alone, expected, rounds, variant))


def _linear_then_gelu(x, w, bias):
    return F.gelu(F.linear(x, w, bias), approximate="tanh")


def _linear_row(name, m, n, k, ours, theirs, alone, expected, rounds, variant) -> dict:
    from ..call import api

    first = model_bench.settled_result(ours)  # the timed kernel's result, not its first call's cuBLAS
    error = relative(first, expected)
    result = model_bench.compare(ours, theirs, rounds)
    bound = model_bench.compare(alone, theirs, rounds)  # torch's product alone against product + activation
    dtype = first.dtype
    _, entry = api._chooser.get(torch.device("cuda", torch.cuda.current_device()), dtype, m, n, k, variant)
    ceiling = bound["ratio"]
    print(
        f"linear {name} {m}x{n}x{k}: {result['ratio']:.3f}x (ceiling at cuBLAS's product {ceiling:.3f}x,"
        f" error {error:.2e}, {entry['version']})",
        flush=True,
    )
    return dict(name=name, m=m, n=n, k=k, error=error, **result, ceiling=ceiling, **_provenance(entry))


# --- a transformers Llama ------------------------------------------------------------------------


def llama_config(layers: int = LAYERS, widths: str = DEFAULT_WIDTHS):
    from transformers import LlamaConfig

    return LlamaConfig(
        **WIDTHS[widths], num_hidden_layers=layers, max_position_embeddings=8192, attn_implementation="sdpa"
    )


def llama_pair(dtype, layers: int = LAYERS, widths: str = DEFAULT_WIDTHS):
    """A random Llama and a copy of it switched to the project's kernels (README's one line)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        reference = LlamaForCausalLM(llama_config(layers, widths)).to(dtype)
    switched = copy.deepcopy(reference)
    return reference, switched, _timed_convert(switched, fuse_gate_up=True, fuse_qkv=True)


def _decode_inputs(vocab: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt (``DECODE_CONTEXT`` tokens) and the next token of ``batch`` sequences."""
    prompt = torch.randint(0, vocab, (batch, DECODE_CONTEXT), device="cuda")
    return prompt, torch.randint(0, vocab, (batch, 1), device="cuda")


def _decode_steps(switched, reference, prompt: torch.Tensor, token: torch.Tensor, dtype, expected=None):
    """Functions running one decode step of ``token`` after ``prompt`` on each model (and on
    ``expected``, where given), each with a static KV cache of its own. The prompt is cached once,
    by the reference, and the others start from a copy of that cache: the timed step is what is
    compared, and the prompt's prefill (up to 32 x 1024 tokens) tunes no buckets of its own."""
    from transformers import StaticCache

    models = {"ours": switched, "theirs": reference, **({"expected": expected} if expected is not None else {})}
    caches = {
        name: StaticCache(
            reference.config, batch_size=prompt.shape[0], max_cache_len=DECODE_CONTEXT + 8, device="cuda", dtype=dtype
        )
        for name in models
    }
    reference(
        input_ids=prompt, past_key_values=caches["theirs"], cache_position=torch.arange(DECODE_CONTEXT, device="cuda")
    )
    cached = caches["theirs"].key_cache + caches["theirs"].value_cache
    for name in set(models) - {"theirs"}:
        for mine, theirs in zip(caches[name].key_cache + caches[name].value_cache, cached):
            mine.copy_(theirs)
    position = torch.full((1,), DECODE_CONTEXT, device="cuda")

    def step(model, cache):  # writes the same cache slot every time: a steady-state step
        return lambda: model(input_ids=token, past_key_values=cache, cache_position=position).logits

    return tuple(step(model, caches[name]) for name, model in models.items())


def _graphed(step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    def replay():
        graph.replay()
        return out

    return replay


def settle(timeout_s: float = SETTLE_S) -> dict:
    """Wait (at most ``timeout_s``) until the plans and the tuning that the first calls started in
    the background are done, so that the timed rows measure the choices a model runs from then on;
    nothing to wait for in blocking mode."""
    from ..call import api

    begin = time.perf_counter()
    finished = api._plans.wait_for_background(timeout_s)
    entries = [entry for _, entry in api._chooser.entries.values()]
    return {
        "kind": "settle",
        "seconds": time.perf_counter() - begin,
        "finished": finished,
        "choices_by_source": dict(Counter(entry.get("source") for entry in entries)),
        "pending": sum(bool(api._chooser.tuner.pending(entry.get("key"))) for entry in entries),
        # which kernel each bucket met so far runs from here on (a model's rows do not say per projection)
        "choices": sorted({(str(e.get("key")), str(e.get("version")), str(e.get("source"))) for e in entries}),
    }


def settle_and_say(part: str, timeout_s: float = SETTLE_S) -> dict:
    """``settle``, and say how it ended: where the tuning did not finish, its children still time
    kernels on the same GPU while the part's rows are timed, and those rows measure that contention
    (on a GPU with no shipped table of its own, enough to double a training step's time)."""
    settled = settle(timeout_s)
    print(
        f"{part}: background tuning {'done' if settled['finished'] else 'NOT done'} after {settled['seconds']:.0f} s,"
        f" choices {settled['choices_by_source']}, {settled['pending']} pending"
        + ("" if settled["finished"] else ": the rows below share the GPU with the tuning, not a measurement"),
        flush=True,
    )
    return settled


def _row(record, rounds, label, kind, shape, ours, theirs, first=None, expected=None, graphed=False) -> None:
    """One timed row of a model pair: ``ours`` against ``theirs`` (``model.compare``; ``graphed``: each
    replayed from a CUDA graph), with the relative error of ours's logits against ``expected``'s
    (``theirs`` without one; with one, also against theirs); a row that fails is recorded with its
    error and the others still run."""
    entry = {"kind": kind, "shape": shape}
    try:
        if graphed:
            ours, theirs = _graphed(ours), _graphed(theirs)
        if first is not None:
            entry["first_call_ms"], entry["torch_first_call_ms"], entry["torch_shape_start_ms"] = first
        # the kernels the windows time (a first call after the tuning settled runs torch's ops)
        logits = model_bench.settled_result(ours)
        entry["logits_error"] = relative(logits, (expected or theirs)())
        if expected is not None:
            entry["logits_error_against_theirs"] = relative(logits, theirs())
        del logits
        entry.update(model_bench.compare(ours, theirs, rounds))
        print(
            f"{label} {kind} {shape}: {entry['ratio']:.3f}x (logits error {entry['logits_error']:.2e}"
            + (f", first call {first[0]:.0f} ms, torch's {first[1]:.0f} ms" if first is not None else "")
            + (f", torch's start for the shape {first[2]:.0f} ms" if first is not None else "")
            + ")",
            flush=True,
        )
    except Exception as e:  # one part's failure is reported, the others still run
        entry["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    record(entry)


def _first_calls(reference, switched, dtype, prefill, record, third, expected=None):
    """Each workload of the pair once, the prefills' first calls timed (``llama``'s docstring);
    the prefills and decode steps as (shape, ours, theirs, first, expected) for ``_timed_rows``,
    ``expected`` a model whose logits ours should equal (``theirs`` without one). ``third``: an
    unswitched model of the same widths (``expected`` may be it) that meets each shape first."""
    vocab = reference.config.vocab_size
    # torch's own start (the CUDA context, cuBLAS's handle, the model's first kernels loaded) and
    # its start for each new shape (its attention's kernels for the length, cuBLAS's heuristics)
    # are paid by a user with or without the switch (a prefill row's torch_shape_start_ms): the
    # third model pays them first, so that each model's first call of a shape is what meeting it
    # costs that model. The pair still leans against the switched model: the third model's
    # products loaded the reference's cuBLAS kernels, not ours.
    start = torch.randint(0, vocab, (1, 8), device="cuda")
    record({"kind": "torch start", "first_call_ms": waited_ms(lambda: third(input_ids=start, use_cache=False))})
    prefills = []
    for batch, tokens in prefill:
        ids = torch.randint(0, vocab, (batch, tokens), device="cuda")
        ours, theirs, exact, before = (
            None if model is None else (lambda model=model, ids=ids: model(input_ids=ids, use_cache=False).logits)
            for model in (switched, reference, expected, third)
        )
        shape_start = waited_ms(before)
        prefills.append(([batch, tokens], ours, theirs, (waited_ms(ours), waited_ms(theirs), shape_start), exact))
    decodes = []
    for batch in DECODE_BATCHES:
        prompt, token = _decode_inputs(vocab, batch)
        ours, theirs, *exact = _decode_steps(switched, reference, prompt, token, dtype, expected)
        ours()
        decodes.append((batch, ours, theirs, exact[0] if exact else None))
    return prefills, decodes


def _timed_rows(prefills, decodes, record, rounds, label) -> None:
    """The rows of ``_first_calls``'s workloads: each prefill, each decode step eager and replayed
    from a CUDA graph."""
    for shape, ours, theirs, first, expected in prefills:
        _row(record, rounds, label, "prefill", shape, ours, theirs, first, expected)
    for batch, ours, theirs, expected in decodes:
        _row(record, rounds, label, "decode eager", [batch, 1], ours, theirs, expected=expected)
        _row(record, rounds, label, "decode graph", [batch, 1], ours, theirs, expected=expected, graphed=True)


def llama(dtype, rounds: int, record: Callable[[dict], None], widths: str = DEFAULT_WIDTHS) -> None:
    """Every workload runs once first (the prefills' first calls timed: what a user waits for),
    then the background tuning they started is waited for, then each row is timed."""
    reference, switched, conversion = llama_pair(dtype, widths=widths)
    record(_conversion_row(conversion))
    with torch.inference_mode():
        prefills, decodes = _first_calls(reference, switched, dtype, PREFILL, record, copy.deepcopy(reference))
    for shape in TRAIN:
        ids = torch.randint(0, reference.config.vocab_size, shape, device="cuda")
        switched(input_ids=ids, labels=ids).loss.backward()  # the training steps' shapes, first seen here
        switched.zero_grad(set_to_none=True)
    record(settle_and_say("llama"))
    with torch.inference_mode():
        _timed_rows(prefills, decodes, record, rounds, "llama")
    for shape in TRAIN:
        record(training(reference, switched, conversion, rounds, shape))


def _timed_convert(model, **options):
    """``matmul.nn.convert(model, **options)``, its wall time kept as the conversion's ``seconds``."""
    import matmul

    begin = time.perf_counter()
    conversion = matmul.nn.convert(model, **options)
    conversion.seconds = time.perf_counter() - begin
    return conversion


def _conversion_row(conversion) -> dict:
    """What ``convert`` did, and its wall time (for packed weights: every V8 kernel built)."""
    return {
        "kind": "conversion",
        "seconds": conversion.seconds,
        "skipped_layers": conversion.skipped,
        "fused": len(conversion.fused),
    }


def packed_llama(dtype, format: str = "int4", config=None, device="cuda", widths: str = DEFAULT_WIDTHS) -> tuple:
    """The drop-in Llama, a copy switched with packed weights (``convert(model, weights=format,
    fuse_qkv=True)``: the README's line for packed weights), and a copy whose switched layers
    hold the weights the packed ones stand for (``qw.dequantize()``), run by torch: what the switched
    model's logits should equal up to the kernels' rounding (against the 16-bit model they differ by
    the quantization's own error)."""
    import matmul

    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    with torch.device(device):
        reference = LlamaForCausalLM(config or llama_config(widths=widths)).to(dtype)
    switched, dequantized = copy.deepcopy(reference), copy.deepcopy(reference)
    conversion = _timed_convert(switched, fuse_qkv=True, weights=format)
    with torch.no_grad():
        for name, layer in dequantized.named_modules():
            if type(layer) is torch.nn.Linear and name not in conversion.skipped:
                layer.weight.copy_(matmul.quantize(layer.weight, format=format).dequantize())
    return reference, switched, dequantized, conversion


def wait_for_v8(timeout_s: float = SETTLE_S) -> dict:
    """Wait (at most ``timeout_s``) until the kernels whose builds the first calls started are built
    (``nn.convert(weights=...)`` builds V8's before it returns; a call asks for the rest)."""
    from ..call import api

    chooser = api._chooser
    begin = time.perf_counter()
    while (chooser.building or chooser.builder.busy()) and time.perf_counter() - begin < timeout_s:
        time.sleep(0.1)
    return {
        "kind": "builds",
        "seconds": time.perf_counter() - begin,
        "finished": not (chooser.building or chooser.builder.busy()),
        "built": len(chooser.programs),
        "failed": sorted(map(str, chooser.failed)),
    }


def llama_packed(format: str, dtype, rounds: int, record: Callable[[dict], None], widths: str = DEFAULT_WIDTHS) -> None:
    """``PACKED_PREFILL``'s prefills and ``llama``'s decode steps with the switched model's weights
    packed in ``format`` (``packed_llama``), against the unswitched 16-bit model; the logits error is
    against the model of the dequantized weights. No training step: packed weights are frozen."""
    part = f"llama-{format}"
    reference, switched, dequantized, conversion = packed_llama(dtype, format, widths=widths)
    record(_conversion_row(conversion))
    print(f"{part}: convert took {conversion.seconds:.1f} s", flush=True)
    with torch.inference_mode():  # a CUDA graph captured as soon as convert returns: what it holds for good
        for batch in DECODE_BATCHES[:2]:
            prompt, token = _decode_inputs(reference.config.vocab_size, batch)
            ours, theirs, exact = _decode_steps(switched, reference, prompt, token, dtype, dequantized)
            _row(record, rounds, part, "decode graph at once", [batch, 1], ours, theirs, expected=exact, graphed=True)
        prefills, decodes = _first_calls(reference, switched, dtype, PACKED_PREFILL, record, dequantized, dequantized)
    built = wait_for_v8()
    print(f"{part}: V8 builds {'done' if built['finished'] else 'NOT done'} after {built['seconds']:.0f} s", flush=True)
    record(built)
    record(settle_and_say(part))
    with torch.inference_mode():
        _timed_rows(prefills, decodes, record, rounds, part)


def training_steps(models: dict, ids: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """By name, a function running one training step of each model (forward with ``ids`` as their
    own labels, backward, SGD) and returning the loss."""
    steps = {}
    for name, model in models.items():
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)

        def step(model=model, optimizer=optimizer):
            optimizer.zero_grad(set_to_none=False)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            return loss

        steps[name] = step
    return steps


def training(reference, switched, conversion, rounds: int, shape=TRAIN[0]) -> dict:
    """A training step of ``shape`` (batch, tokens) on both models; the gradients of one step of each
    against those of a float32 copy of the reference (``gradient_errors``)."""
    entry: dict = {"kind": "train", "shape": list(shape)}
    try:
        ids = torch.randint(0, reference.config.vocab_size, shape, device="cuda")
        steps = training_steps({"ours": switched, "theirs": reference}, ids)
        # gradients of one step from identical weights (before any optimizer step)
        exact = copy.deepcopy(reference).float()
        for model in (switched, reference, exact):
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
        grads = _gradients(exact), _gradients(switched, conversion), _gradients(reference)
        entry["gradient_errors"] = gradient_errors(*grads)
        del grads
        del exact
        torch.cuda.empty_cache()
        entry.update(model_bench.compare(steps["ours"], steps["theirs"], max(3, rounds // 2)))
        errors = entry["gradient_errors"]
        print(
            f"llama train {tuple(shape)}: {entry['ratio']:.3f}x (gradients against float32: ours max "
            f"{errors['ours']['max']:.2e}, torch's max {errors['torch']['max']:.2e})",
            flush=True,
        )
    except Exception as e:
        entry["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    return entry


def _gradients(model, conversion=None) -> dict[str, torch.Tensor]:
    """Each parameter's gradient by its name in the unswitched model (a fused weight's split back
    into the weights it stands for: gate and up, q, k and v)."""
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None and p.numel()}
    for module, fusion in conversion.fused if conversion is not None else ():
        prefix = next(n for n, m in model.named_modules() if m is module)
        fused = {
            n: grads.pop(f"{prefix}.{n}") for n, _ in module.named_parameters(recurse=False) if f"{prefix}.{n}" in grads
        }
        grads.update({f"{prefix}.{n}": g for n, g in fusion.unfused(fused).items()})
    return grads


def gradient_errors(exact: dict, ours: dict, theirs: dict) -> dict:
    """Relative error of each gradient of the switched model (``ours``) and of the unswitched one
    (``theirs``, both in the 16-bit dtype) against the float32 model's: the switched model's error is
    judged against torch's own in the same dtype (``worst_ratio``: the largest ours / torch's over
    the parameters), not against an absolute tolerance that rounding alone can exceed."""
    names = [n for n in exact if n in ours and n in theirs]
    mine = {n: relative(ours[n], exact[n]) for n in names}
    torch_own = {n: relative(theirs[n], exact[n]) for n in names}

    def summary(errors):
        return {"max": max(errors.values()), "median": statistics.median(errors.values()), "by_parameter": errors}

    return {
        "ours": summary(mine),
        "torch": summary(torch_own),
        "worst_ratio": max(mine[n] / max(torch_own[n], 1e-30) for n in names),
    }


PARTS = {
    "kn": kn_layout,
    "linear": linear_epilogues,
    "llama": llama,
    **{f"llama-{format}": functools.partial(llama_packed, format) for format in PACKED_FORMATS},
}
DEFAULT_PARTS = ("kn", "linear", "llama")


def main(out_dir: Path, parts=DEFAULT_PARTS, dtype=torch.float16, rounds: int = 10, widths=DEFAULT_WIDTHS) -> int:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for part in parts:
        results = {
            "format": FORMAT,
            "part": part,
            "gpu": torch.cuda.get_device_name(),
            "dtype": str(dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "widths": widths,
            "rounds": rounds,
            "results": [],
        }
        name = part if widths == DEFAULT_WIDTHS else f"{part}-{widths}"
        path = out_dir / f"drop-in-{name}-{results['dtype']}.json"

        def record(row, results=results, path=path):  # written after every row: a cut run keeps what it measured
            results["results"].append(row)
            path.write_text(json.dumps(results, indent=1, default=str))

        run = PARTS[part]
        if part.startswith("llama"):  # the parts with a model of some widths
            run = functools.partial(run, widths=widths)
        run(dtype, rounds, record)
        print(f"wrote {path}", flush=True)
    return 0
