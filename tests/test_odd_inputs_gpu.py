"""What users pass outside the forms the other GPU tests take, on the GPU: broadcast and
column-major operands, misaligned bases, sliced rows, empty and one-wide dimensions, 1-D and
permuted inputs, odd ``out`` tensors, biases of another dtype, device or stride, inference tensors,
gradients, NaN, packed weights with the same oddities, converted models copied, saved and converted
twice.

Each case is run as torch would run it (in float32, the reference) and through the project, a
version of the series fixed as every bucket's choice (``conftest.fixed``: the kernels themselves,
no tuning). The only outcomes allowed are torch's result (within the dtype's tolerance, NaN where
torch has NaN, the same shape and dtype) or ``MatmulInputError`` with a message; any other
exception, a wrong result or a fault fails the test. Where torch refuses a case, the project must
refuse it too. ``MATMUL_ODD_INPUTS_LOG=FILE`` appends each case's outcome to FILE (a JSON line).
"""

from __future__ import annotations

import copy
import io
import json
import os
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import matmul
from matmul import MatmulInputError
from matmul.call import quantized as quant_linear
from matmul.kernels import variant as variants
from matmul.measure.correctness import TOLERANCE, poisoned_output, relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

F16, BF16 = torch.float16, torch.bfloat16
M, N, K = 37, 300, 264  # tokens, weight rows, columns: no multiple of a tile; K's rows 16-byte aligned


def randn(*shape, dtype=F16, device="cuda"):
    return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)


def weight(n=N, k=K, dtype=F16):
    return randn(n, k, dtype=dtype) / k**0.5


def f32(t):
    return None if t is None else t.float()


class Refused(Exception):
    """The reference's way of saying torch refuses the case too."""


@dataclass
class Case:
    name: str
    make: Callable[[], tuple[Callable[[], object], Callable[[], object]]]  # () -> (ours, torch's in float32)
    dtype: torch.dtype = F16


CASES: list[Case] = []


def case(name, dtype=F16):
    def register(make):
        CASES.append(Case(name, make, dtype))
        return make

    return register


# --- matmul(a, b) ---------------------------------------------------------------------------------


def product(a, b, **kwargs):
    return (lambda: matmul.matmul(a, b, **kwargs)), (lambda: f32(a) @ f32(b))


@case("a's rows broadcast (stride 0)")
def _():
    return product(randn(1, K).expand(M, K), weight().T)


@case("a column-major")
def _():
    return product(randn(K, M).T, weight().T)


@case("a's base 2 bytes past a 16-byte boundary")
def _():
    return product(randn(M * K + 8)[1 : 1 + M * K].view(M, K), weight().T)


@case("a's rows 2 bytes longer than K (unaligned row stride)")
def _():
    return product(randn(M, K + 1)[:, 1:], weight().T)


@case("a's columns a slice of wider rows")
def _():
    return product(randn(M, K + 24)[:, 8 : 8 + K], weight().T)


@case("b = w.T with w's rows broadcast")
def _():
    return product(randn(M, K), randn(1, K).expand(N, K).T)


@case("b [K, N] with its columns broadcast")
def _():
    return product(randn(M, K), randn(K, 1).expand(K, N))


@case("b [K, N] a column slice of wider rows")
def _():
    return product(randn(M, K), randn(K, N + 12)[:, 4 : 4 + N])


@case("b [K, N] with N odd (rows not 16-byte aligned)")
def _():
    return product(randn(M, K), randn(K, 37))


@case("a 1-D")
def _():
    return product(randn(K), weight().T)


@case("b 1-D")
def _():
    return product(randn(M, K), randn(K))


@case("a 3-D, permuted")
def _():
    return product(randn(M, 2, K).transpose(0, 1), weight().T)


@case("a 4-D")
def _():
    return product(randn(2, 3, 5, K), weight().T)


@case("a 2-D times a batch of b")
def _():
    return product(randn(M, K), randn(2, K, N))


@case("a batch of b broadcast along the batch (stride 0)")
def _():
    return product(randn(3, M, K), randn(1, K, 304).expand(3, K, 304))


@case("batch dimensions broadcast against each other (a [3, 1, M, K] @ b [1, 2, K, N])")
def _():
    return product(randn(3, 1, M, K), randn(1, 2, K, 304))


@case("no rows (M = 0)")
def _():
    return product(randn(0, K), weight().T)


@case("a batch of no rows (a [2, 0, K])")
def _():
    return product(randn(2, 0, K), weight().T)


@case("K = 0")
def _():
    return product(randn(M, 0), randn(0, N))


@case("N = 1")
def _():
    return product(randn(M, K), weight(1).T)


@case("K = 1")
def _():
    return product(randn(M, 1), randn(1, N))


@case("a long K (65536) at one token")
def _():
    return product(randn(1, 65536), weight(16, 65536).T)


@case("bfloat16, every tile ragged", dtype=BF16)
def _():
    return product(randn(M, K, dtype=BF16), weight(dtype=BF16).T)


@case("a row of NaN")
def _():
    a = randn(M, K)
    a[3] = float("nan")
    return product(a, weight().T)


@case("an infinity in b")
def _():
    w = weight()
    w[7, 5] = float("inf")
    return product(randn(M, K), w.T)


def with_out(out, a=None, b=None):
    a = randn(M, K) if a is None else a
    b = weight().T if b is None else b

    def ours():
        result = matmul.matmul(a, b, out=out)
        assert result.data_ptr() == out.data_ptr(), "the result is not out"
        return out

    return ours, (lambda: f32(a) @ f32(b))


@case("out column-major")
def _():
    return with_out(torch.empty(N, M, device="cuda", dtype=F16).T)


@case("out a column slice of wider rows")
def _():
    return with_out(torch.empty(M, N + 20, device="cuda", dtype=F16)[:, 8 : 8 + N])


def refused_by_torch(ours):
    def reference():
        raise Refused

    return ours, reference


@case("out of another dtype")
def _():
    return refused_by_torch(with_out(torch.empty(M, N, device="cuda"))[0])


@case("out of another shape")
def _():
    return refused_by_torch(with_out(torch.empty(M, N + 1, device="cuda", dtype=F16))[0])


@case("out broadcast (stride 0)")
def _():
    return refused_by_torch(with_out(torch.empty(1, N, device="cuda", dtype=F16).expand(M, N))[0])


@case("out overlapping a")
def _():
    buffer = randn(M, 576)  # rows of 1152 bytes: a and out TMA-readable, so only the overlap is wrong
    return refused_by_torch(with_out(buffer[:, 256 : 256 + N], a=buffer[:, :K])[0])


@case("out on the CPU")
def _():
    return refused_by_torch(with_out(torch.empty(M, N, dtype=F16))[0])


@case("a float32")
def _():
    return refused_by_torch(product(randn(M, K, dtype=torch.float32), weight(dtype=torch.float32).T)[0])


@case("a float16, b bfloat16")
def _():
    return refused_by_torch(product(randn(M, K), weight(dtype=BF16).T)[0])


@case("a on the CPU")
def _():
    return refused_by_torch(product(randn(M, K, device="cpu"), weight().T)[0])


@case("inner dimensions differ")
def _():
    return refused_by_torch(product(randn(M, K), weight(k=K + 8).T)[0])


@case("inference tensors")
def _():
    with torch.inference_mode():
        a, b = randn(M, K), weight().T

    def ours():
        with torch.inference_mode():
            return matmul.matmul(a, b)

    return ours, (lambda: f32(a) @ f32(b))


def gradients(forward, reference_forward, *leaves):
    """(ours, reference) of the output and every leaf's gradient after ``backward(g)``."""
    g = {}

    def run(fn, tensors):
        y = fn(*tensors)
        if "g" not in g:
            g["g"] = torch.randn_like(y, dtype=torch.float32)
        y.backward(g["g"].to(y.dtype))
        return (y, *(t.grad for t in tensors))

    def ours():
        return run(forward, [t.detach().clone().requires_grad_() for t in leaves])

    def reference():
        return run(reference_forward, [t.detach().float().requires_grad_() for t in leaves])

    return ours, reference


@case("gradients of a 3-D a @ w.T")
def _():
    return gradients(lambda a, w: matmul.matmul(a, w.T), lambda a, w: a @ w.T, randn(2, 19, K), weight())


@case("gradients of a @ b with b [K, N]")
def _():
    return gradients(matmul.matmul, torch.matmul, randn(M, K), randn(K, N) / K**0.5)


# --- linear(x, w, bias, activation) ---------------------------------------------------------------


def linear_case(x, w, bias=None, activation=None):
    def reference():
        if x.dtype != w.dtype or (bias is not None and (bias.dtype != w.dtype or bias.device != w.device)):
            raise Refused
        return variants.torch_epilogue(f32(x) @ f32(w).T, f32(bias), activation)

    return (lambda: matmul.linear(x, w, bias, activation)), reference


@case("linear: x 3-D permuted, bias, silu")
def _():
    return linear_case(randn(M, 2, K).transpose(0, 1), weight(), randn(N), "silu")


@case("linear: x 1-D")
def _():
    return linear_case(randn(K), weight(), randn(N))


@case("linear: no rows (x [2, 0, K])")
def _():
    return linear_case(randn(2, 0, K), weight(), randn(N), "relu")


@case("linear: bias float32")
def _():
    return linear_case(randn(M, K), weight(), randn(N, dtype=torch.float32))


@case("linear: bias on the CPU")
def _():
    return linear_case(randn(M, K), weight(), randn(N, device="cpu"))


@case("linear: bias one too long")
def _():
    return refused_by_torch(linear_case(randn(M, K), weight(), randn(N + 1))[0])


@case("linear: bias every other element of a tensor")
def _():
    return linear_case(randn(M, K), weight(), randn(2 * N)[::2])


@case("linear: bias broadcast (stride 0)")
def _():
    return linear_case(randn(M, K), weight(), randn(1).expand(N))


@case("linear: an activation it does not know")
def _():
    return refused_by_torch(linear_case(randn(M, K), weight(), None, "tanh")[0])


@case("linear: weight column-major")
def _():
    return linear_case(randn(M, K), (randn(K, N) / K**0.5).T)


@case("linear: swiglu on an odd number of rows")
def _():
    return refused_by_torch(linear_case(randn(M, K), weight(N + 1), None, "swiglu")[0])


@case("linear: gradients of x 3-D, bias, gelu")
def _():
    return gradients(
        lambda x, w, b: matmul.linear(x, w, b, "gelu"),
        lambda x, w, b: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)),
        randn(2, 19, K),
        weight(),
        randn(N),
    )


# --- packed weights (matmul.quantize): V8 where it is built, else the widened weight ---------------

QK = 256  # a packed weight's K: a multiple of its group


def packed(n=N, k=QK, dtype=F16):
    w = weight(n, k, dtype)
    return matmul.quantize(w, format="int4")


def quantized_case(x, qw, bias=None, out=None):
    def reference():
        if x.dtype != qw.dtype or x.shape[-1] != qw.shape[1] or (bias is not None and bias.dtype != x.dtype):
            raise Refused
        return torch.nn.functional.linear(f32(x), f32(qw.dequantize()), f32(bias))

    def ours():
        tokens = x.numel() // max(x.shape[-1], 1)
        if x.dtype == qw.dtype and x.shape[-1] == qw.shape[1] and tokens:  # V8's kernel, not the widened path
            quant_linear.wait_until_built(x.dtype, "int4", quant_linear.config_for(tokens, *qw.shape, "int4"))
        if out is not None:
            return matmul.matmul(x, qw.T, out=out)
        return matmul.linear(x, qw, bias)

    return ours, reference


@case("int4: x 3-D permuted")
def _():
    return quantized_case(randn(5, 2, QK).transpose(0, 1), packed())


@case("int4: x 1-D")
def _():
    return quantized_case(randn(QK), packed())


@case("int4: no rows")
def _():
    return quantized_case(randn(0, QK), packed())


@case("int4: x's rows broadcast")
def _():
    return quantized_case(randn(1, QK).expand(5, QK), packed())


@case("int4: x column-major")
def _():
    return quantized_case(randn(QK, 5).T, packed())


@case("int4: x bfloat16, the weight packed from float16")
def _():
    return quantized_case(randn(5, QK, dtype=BF16), packed())


@case("int4: x float32")
def _():
    return quantized_case(randn(5, QK, dtype=torch.float32), packed())


@case("int4: bias float32")
def _():
    return quantized_case(randn(5, QK), packed(), randn(N, dtype=torch.float32))


@case("int4: K differs")
def _():
    return quantized_case(randn(5, QK + 128), packed())


@case("int4: out column-major")
def _():
    return quantized_case(randn(5, QK), packed(), out=torch.empty(N, 5, device="cuda", dtype=F16).T)


def packed_out_over_x(keep_first: bool):
    """x [5, QK] and an out [5, N] over x's last 8 elements, both dense and aligned; with
    ``keep_first``, a call without out first keeps V8's launch for x, which then takes the out."""
    qw, buffer = packed(), randn(4000)
    x, out = buffer[: 5 * QK].view(5, QK), buffer[5 * QK - 8 : 5 * QK - 8 + 5 * N].view(5, N)

    def ours():
        quant_linear.wait_until_built(F16, "int4", quant_linear.config_for(5, *qw.shape, "int4"))
        if keep_first:
            matmul.linear(x, qw)
        return matmul.matmul(x, qw.T, out=out)

    return refused_by_torch(ours)


@case("int4: out overlapping x")
def _():
    return packed_out_over_x(keep_first=False)


@case("int4: out overlapping x, after its launch was kept")
def _():
    return packed_out_over_x(keep_first=True)


@case("int4: x requires grad")
def _():
    qw = packed()
    x = randn(5, QK)
    g = torch.randn(5, N, device="cuda")

    def ours():
        leaf = x.clone().requires_grad_()
        y = matmul.linear(leaf, qw)
        y.backward(g.to(y.dtype))
        return y, leaf.grad

    def reference():
        leaf = x.float().requires_grad_()
        y = leaf @ qw.dequantize().float().T
        y.backward(g)
        return y, leaf.grad

    return ours, reference


# --- a converted model ------------------------------------------------------------------------------


def small_model():
    return torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.GELU(), torch.nn.Linear(N, 7)).cuda().half()


def model_case(transform):
    """(ours, reference): ``transform(converted model)``'s output against the float32 model's."""
    model = small_model()
    x = randn(3, M, K)
    expected = copy.deepcopy(model).float()

    def ours():
        with torch.no_grad():
            return transform(model)(x)

    def reference():
        with torch.no_grad():
            return expected(x.float())

    return ours, reference


@case("nn: a model whose second layer's weight rows are 600 bytes (not 16-byte aligned), converted")
def _():
    def transform(model):
        switch = matmul.nn.convert(model)
        assert switch.swapped, "nothing converted"
        return model

    return model_case(transform)


@case("nn: converted twice, undone once")
def _():
    def transform(model):
        matmul.nn.convert(model)
        matmul.nn.convert(model).undo()
        return model

    return model_case(transform)


@case("nn: a converted model deep-copied")
def _():
    return model_case(lambda model: (matmul.nn.convert(model), copy.deepcopy(model))[1])


@case("nn: a converted model saved and loaded whole")
def _():
    def transform(model):
        matmul.nn.convert(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    return model_case(transform)


@case("nn: a state dict loaded into a converted model")
def _():
    def transform(model):
        state = copy.deepcopy(model.state_dict())
        converted = small_model()
        matmul.nn.convert(converted)
        converted.load_state_dict(state)
        return converted

    return model_case(transform)


# --- the check ----------------------------------------------------------------------------------


def outputs(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def assert_matches(got, expected, dtype):
    assert isinstance(got, torch.Tensor), f"returned {type(got).__name__}, not a tensor"
    assert got.shape == expected.shape, f"shape {tuple(got.shape)}, torch's {tuple(expected.shape)}"
    assert got.dtype == dtype, f"dtype {got.dtype}, expected {dtype}"
    assert got.device == expected.device, f"on {got.device}, torch's on {expected.device}"
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(got), nan), "NaN where torch has none, or none where it has"
    if expected.numel() == 0:
        return
    inf = torch.isinf(expected)
    assert torch.equal(got[inf].float(), expected[inf]), "infinities differ from torch's"
    finite = ~(nan | inf)
    if finite.any():
        error = relative_error(got.float()[finite].reshape(1, -1), expected[finite].reshape(1, -1))
        assert error <= 2 * TOLERANCE[dtype], f"relative error {error:.3g}"


def log(record: dict) -> None:
    path = os.environ.get("MATMUL_ODD_INPUTS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


@pytest.mark.parametrize("fixed", ["v7", "v5"], indirect=True)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_odd_input_gets_torchs_result_or_a_clear_error(fixed, case):
    torch.manual_seed(0)
    ours, reference = case.make()
    try:
        expected = reference()
    except Refused:
        expected = None
    record = {"case": case.name, "version": fixed.chooser.version}
    try:
        got = ours()
        torch.cuda.synchronize()
    except MatmulInputError as error:
        log({**record, "outcome": "refused", "message": str(error)})
        assert len(str(error)) > 20, f"a refusal that names nothing: {error!r}"
        return
    except Exception as error:
        log({**record, "outcome": "raised", "message": f"{type(error).__name__}: {error}"})
        raise
    ran = [(v.key() or "plain", runs) for *_, v, runs in fixed.chooser.asked]
    log({**record, "outcome": "computed", "asked": ran})
    assert expected is not None, "torch refuses this case; the call returned a result"
    got, expected = outputs(got), outputs(expected)
    assert len(got) == len(expected)
    for ours_part, theirs in zip(got, expected):
        if theirs is None:
            assert ours_part is None, "a gradient where torch has none"
            continue
        assert ours_part is not None, "no gradient where torch has one"
        assert_matches(ours_part, theirs, case.dtype)


# --- threads and streams ------------------------------------------------------------------------


@pytest.mark.parametrize("fixed", ["v7"], indirect=True)
def test_calls_from_several_threads_each_on_its_own_stream_are_each_right(fixed):
    """A serving loop's threads, each issuing on a stream of its own: every call must run on the
    caller's current stream, after the work queued there before it. Each input is written on the
    thread's stream only after a sleep queued there (``torch.cuda._sleep``, longer than the host
    takes to reach the launch), over NaN: a launch on another stream reads NaN. (The legacy default
    stream waits for the others, so a launch there would hide; seen failing with the product
    launched on a second stream of the thread.) The threads meet unseen signatures at the
    same time (their plans derived, their kernels instantiated concurrently: ``tilus_fixes.
    serial_instantiation``), dense and packed weights, with and without out."""
    torch.manual_seed(0)
    w, bias, qw = weight(), randn(N), packed()
    for tokens in (1, 5, 16, 37):  # V8's kernels for these token counts, built before the threads start
        quant_linear.wait_until_built(F16, "int4", quant_linear.config_for(tokens, *qw.shape, "int4"))
    calls = ("matmul", "linear", "matmul out", "packed")

    def worker(index: int):
        stream, done = torch.cuda.Stream(), []
        with torch.cuda.stream(stream):
            for step in range(24):
                m = (1, 5, 16, 37)[(index + step) % 4]
                kind = calls[(index + step // 4) % 4]
                k = QK if kind == "packed" else K
                values = randn(m, k)
                x = torch.full_like(values, float("nan"))
                torch.cuda._sleep(1_000_000)  # the input is written late on this stream (~0.5 ms)
                x.copy_(values)
                if kind == "matmul":
                    y = matmul.matmul(x, w.T)
                elif kind == "linear":
                    y = matmul.linear(x, w, bias, "silu")
                elif kind == "matmul out":
                    y = poisoned_output(m, N, F16)  # rows padded to 16 bytes, as TMA stores them
                    matmul.matmul(x, w.T, out=y)
                else:
                    y = matmul.linear(x, qw)
                done.append((kind, values, y))
        stream.synchronize()
        return done

    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = [item for done in pool.map(worker, range(4)) for item in done]
    torch.cuda.synchronize()  # whatever stream a launch went to, it has finished: its result is final
    dequantized = qw.dequantize().float()
    for kind, values, y in results:
        if kind == "linear":
            expected = torch.nn.functional.silu(values.float() @ w.float().T + bias.float())
        elif kind == "packed":
            expected = values.float() @ dequantized.T
        else:
            expected = values.float() @ w.float().T
        assert_matches(y, expected, F16)
