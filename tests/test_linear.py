"""CPU tests of what a model meets outside ``matmul(x, w.T)``: torch.matmul's shape rules, b [K, N]
read in place, ``linear`` with its fused epilogue, ``matmul.nn`` and the backward, all through the
launch path with stand-in kernels (tests/stand_ins.py) in place of the GPU."""

import copy
import functools
import threading
from pathlib import Path

import pytest
import torch
from conftest import FixedChooser, QKVAttention

import matmul
from matmul import contract
from matmul.call import api, shapes, torch_op
from matmul.call.launch import Plans, SeriesPlan, VendorPlan
from matmul.contract import check_call, kernel_b
from matmul.harness import drop_in
from matmul.kernels import swiglu, versions
from matmul.kernels import variant as variants
from matmul.kernels.variant import Variant
from tests import stand_ins

ARCH = "sm_90a"


@pytest.fixture(params=["v3", versions.CUBLAS])
def path(request, monkeypatch):
    """matmul()'s plans over a stand-in v3 (or cuBLAS, i.e. torch on the CPU), installed as the process's."""
    stand_ins.install(monkeypatch, wrong=(), arch=ARCH, available=("v3",))
    chooser = FixedChooser(request.param, arch=ARCH, check_fits=False)
    plans = Plans(chooser, check=functools.partial(check_call, require_cuda=False))
    previous = api.use_plans(plans)
    monkeypatch.setattr(api, "matmul", api.python_matmul)  # the native entry would route by its own table
    yield plans
    api.use_plans(previous)


def close(result, expected, dtype=torch.float16):
    assert result.shape == expected.shape
    error = (result.float() - expected.float()).norm() / expected.float().norm()
    assert error <= (2e-3 if dtype == torch.float16 else 1.6e-2), f"relative error {error:.3g}"


# --- shapes --------------------------------------------------------------------------------------


def test_leading_dimensions_are_flattened_into_m_as_a_view():
    x = torch.randn(2, 3, 5, 16)
    flat = shapes.flatten_rows(x)
    assert flat.shape == (30, 16) and flat.data_ptr() == x.data_ptr() and flat._base is x
    sliced = x[:, :, :, :8]  # rows still nest: a view
    assert shapes.flatten_rows(sliced).data_ptr() == x.data_ptr()
    assert shapes.flatten_rows(torch.randn(16)).shape == (1, 16)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((2, 7, 24), (24, 40)), ((3, 2, 5, 24), (24, 16)), ((24,), (24, 40)), ((9, 24), (24,)), ((2, 9, 24), (24,))],
)
def test_matmul_follows_torchs_shape_rules(path, a_shape, b_shape):
    a, b = torch.randn(a_shape).half(), torch.randn(b_shape).half()
    close(matmul.matmul(a, b), torch.matmul(a.float(), b.float()))


def test_a_batch_of_matrices_is_computed_by_torch_and_correct(path):
    a, b = torch.randn(3, 8, 24).half(), torch.randn(3, 24, 16).half()
    close(matmul.matmul(a, b), torch.matmul(a.float(), b.float()))
    assert path.chooser.asked == []  # no kernel of the series was asked: torch.matmul's batched GEMM ran


@pytest.mark.parametrize(
    "a_shape, b_shape", [((0, 24), (24, 40)), ((2, 0, 24), (24, 40)), ((9, 0), (0, 40)), ((9, 24), (24, 0))]
)
def test_an_empty_product_is_torchs_result_not_an_error(path, monkeypatch, a_shape, b_shape):
    """M, N or K = 0: torch's empty (or, for K = 0, zero) result, no kernel asked, as torch.matmul
    gives it to a model whose batch is empty; dtypes and ``out`` still checked."""
    monkeypatch.setattr(contract, "_check_device", lambda a, b: None)  # CPU operands stand in for CUDA ones
    a, b = torch.randn(a_shape).half(), torch.randn(b_shape).half()
    result = matmul.matmul(a, b)
    expected = torch.matmul(a.float(), b.float())
    assert result.shape == expected.shape and result.dtype == torch.float16 and torch.equal(result.float(), expected)
    assert path.chooser.asked == []
    with pytest.raises(matmul.MatmulInputError, match="float16 or both bfloat16"):
        matmul.matmul(a.float(), b.float())


def test_an_empty_product_traces_into_one_graph(path, monkeypatch):
    """Under torch.compile (fullgraph) the empty product is torch's, ``out`` included: the checks
    that read data pointers are left to the eager call."""
    monkeypatch.setattr(contract, "_check_device", lambda a, b: None)
    a, b, out = torch.randn(0, 24).half(), torch.randn(24, 40).half(), torch.empty(0, 40).half()
    compiled = torch.compile(lambda a, b, out: matmul.matmul(a, b, out=out), backend="eager", fullgraph=True)
    assert compiled(a, b, out).shape == (0, 40)


def test_an_empty_linear_is_torchs_result_with_bias_and_activation(path, monkeypatch):
    monkeypatch.setattr(contract, "_check_device", lambda a, b: None)
    w, bias = torch.randn(40, 24).half(), torch.randn(40).half()
    y = matmul.linear(torch.randn(2, 0, 24).half(), w, bias, "silu")
    assert y.shape == (2, 0, 40) and y.dtype == torch.float16
    zero_k = matmul.linear(torch.randn(3, 0).half(), torch.randn(40, 0).half(), bias, "relu")
    assert torch.equal(zero_k, torch.relu(bias).expand(3, 40))  # K = 0: the bias alone
    assert path.chooser.asked == []


def test_linear_copies_an_input_tma_cannot_read(path):
    """``linear`` takes x in any strides, as torch does: a column-major x, or one whose base is not
    16-byte aligned, is copied once into rows TMA can read, and the kernel runs on the copy."""
    w = torch.randn(40, 24).half()
    for x in (torch.randn(24, 9).half().T, torch.randn(9 * 24 + 1).half()[1:].view(9, 24)):
        close(matmul.linear(x, w), x.float() @ w.float().T)
    assert path.chooser.asked  # the kernel's plan ran them (the copies share one signature), not a refusal


@pytest.mark.parametrize(
    "a, b, message",
    [
        (torch.randn(2, 7, 24).half(), torch.randn(25, 8).half(), "inner dimensions differ"),
        (torch.tensor(1.0).half(), torch.randn(4, 4).half(), "at least one dimension"),
    ],
)
def test_shapes_that_do_not_match_are_refused_with_the_fix(path, a, b, message):
    with pytest.raises(matmul.MatmulInputError, match=message):
        matmul.matmul(a, b)


def test_out_of_leading_dimensions(path):
    a, b = torch.randn(2, 7, 24).half(), torch.randn(24, 40).half()
    out = torch.full((2, 7, 40), float("nan")).half()
    assert matmul.matmul(a, b, out=out) is out
    close(out, torch.matmul(a.float(), b.float()))
    with pytest.raises(matmul.MatmulInputError, match=r"out must have shape \[2, 7, 40\]"):
        matmul.matmul(a, b, out=torch.empty(14, 40).half())


# --- b [K, N] in place ---------------------------------------------------------------------------


def test_both_layouts_of_b_are_read_in_place():
    w = torch.randn(32, 48).half()  # [N, K]
    operand, layout = kernel_b(w.T)
    assert layout == "nk" and operand.data_ptr() == w.data_ptr()
    b = torch.randn(48, 32).half()  # torch's [K, N]
    operand, layout = kernel_b(b)
    assert layout == "kn" and operand is b  # no copy: the kernels read it as it is


def test_a_row_major_b_takes_the_kn_variant_and_no_copy(path):
    a, b = torch.randn(100, 48).half(), torch.randn(48, 40).half()
    close(path.launch(a, b), a.float() @ b.float())
    m, n, k, variant, _ = path.chooser.asked[-1]
    assert (m, n, k) == (100, 40, 48) and variant.b_layout == "kn"
    plan = next(iter(path.plans.values()))
    if isinstance(plan, SeriesPlan):  # the kernel got b's own pointer: nothing copied it
        assert plan.launch.pointers[1] == b.data_ptr() and plan.launch.variant.b_layout == "kn"


def test_a_kn_b_whose_rows_tma_cannot_read_goes_to_cublas(path):
    a, b = torch.randn(10, 24).half(), torch.randn(24, 30).half()  # rows of 60 bytes
    close(path.launch(a, b), a.float() @ b.float())
    assert path.chooser.asked == [] and isinstance(next(iter(path.plans.values())), VendorPlan)


# --- linear --------------------------------------------------------------------------------------

ACTIVATIONS = [None, "relu", "gelu_tanh", "gelu_erf", "silu"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_is_f_linear_then_the_activation(path, activation, with_bias):
    x, w = torch.randn(3, 33, 48).half(), torch.randn(40, 48).half()
    bias = torch.randn(40).half() if with_bias else None
    expected = variants.activate(
        torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float()), activation
    )
    close(matmul.linear(x, w, bias, activation), expected)
    if with_bias or activation:
        assert path.chooser.asked[-1][3] == Variant("nk", with_bias, activation)


def test_gelu_means_the_exact_gelu_as_in_torch(path):
    x, w = torch.randn(8, 48).half(), torch.randn(40, 48).half()
    close(matmul.linear(x, w, None, "gelu"), torch.nn.functional.gelu(x.float() @ w.float().T))


def test_swiglu_of_a_fused_gate_up_weight(path):
    gate, up = torch.randn(40, 48).half(), torch.randn(40, 48).half()
    x = torch.randn(2, 9, 48).half()
    fused = matmul.gate_up(gate, up)
    assert fused.shape == (80, 48)
    y = matmul.linear(x, fused, activation="swiglu")
    expected = torch.nn.functional.silu(x.float() @ gate.float().T) * (x.float() @ up.float().T)
    close(y, expected)


def test_gate_up_round_trip_and_padding():
    gate, up = torch.randn(20, 16), torch.randn(20, 16)  # 20 rows: padded to 24
    fused = variants.gate_up(gate, up)
    assert fused.shape == (48, 16) and torch.equal(fused[8:16], up[:8]) and torch.equal(fused[:8], gate[:8])
    back_gate, back_up = variants.split_gate_up(fused, 20)
    assert torch.equal(back_gate, gate) and torch.equal(back_up, up)
    y = torch.arange(48.0).expand(2, 48)
    g, u = variants.split_gate_up_columns(y)
    assert g[0, 8].item() == 16 and u[0, 0].item() == 8


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x, w: matmul.linear(x, w, activation="tanh"), "activation must be None or one of"),
        (lambda x, w: matmul.linear(x, w, torch.randn(7).half()), r"bias must be \[N\] = \[40\]"),
        (lambda x, w: matmul.linear(x, w, torch.randn(40)), "bias must be torch.float16"),
        (lambda x, w: matmul.linear(x, w.T), "x's last dimension"),
        (lambda x, w: matmul.linear(x, w[:36], activation="swiglu"), "matmul.gate_up"),
        (lambda x, w: matmul.linear(x, w.float()), "float16"),
    ],
)
def test_bad_linear_calls_name_the_problem_and_the_fix(path, call, message):
    with pytest.raises(matmul.MatmulInputError, match=message):
        call(torch.randn(5, 48).half(), torch.randn(40, 48).half())


def test_linear_plans_are_kept_per_variant(path):
    x, w, bias = torch.randn(8, 48).half(), torch.randn(40, 48).half(), torch.randn(40).half()
    matmul.linear(x, w, bias, "relu")
    matmul.linear(x, w, bias, "relu")
    matmul.linear(x, w, bias, "silu")
    assert [v for *_, v, _ in path.chooser.asked] == [Variant("nk", True, "relu"), Variant("nk", True, "silu")]


# --- autograd ------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", [None, "gelu_tanh", "silu"])
def test_linear_gradients_match_torch(path, activation):
    x = torch.randn(2, 7, 48).half().requires_grad_()
    w = torch.randn(40, 48).half().requires_grad_()
    bias = torch.randn(40).half().requires_grad_()
    y = matmul.linear(x, w, bias, activation)
    grad = torch.randn_like(y)
    y.backward(grad)
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, bias))
    variants.activate(torch.nn.functional.linear(xr, wr, br), activation).backward(grad.float())
    for ours, theirs in ((x.grad, xr.grad), (w.grad, wr.grad), (bias.grad, br.grad)):
        close(ours, theirs)


def test_swiglu_gradients_of_a_fused_gate_up_weight(path):
    """Through the operator and ``swiglu.InterleavedSwiglu``, against autograd of the unfused
    gate and up projections."""
    x = torch.randn(2, 5, 48).half().requires_grad_()
    gate, up = torch.randn(24, 48).half(), torch.randn(24, 48).half()
    fused = matmul.gate_up(gate, up).requires_grad_()
    y = matmul.linear(x, fused, activation="swiglu")
    grad = torch.randn_like(y)
    y.backward(grad)
    xr, gr, ur = (t.detach().float().requires_grad_() for t in (x, gate, up))
    (torch.nn.functional.silu(xr @ gr.T) * (xr @ ur.T)).backward(grad.float())
    close(x.grad, xr.grad)
    d_gate, d_up = variants.split_gate_up(fused.grad, 24)
    close(d_gate, gr.grad)
    close(d_up, ur.grad)


def test_interleaved_swiglu_backward_is_autograds():
    """The hand-written backward against autograd through the column views, in float64."""
    y = torch.randn(3, 4, 64, dtype=torch.float64, requires_grad=True)
    from matmul.call.activation import InterleavedSwiglu

    assert torch.autograd.gradcheck(lambda y: InterleavedSwiglu.apply(y, None), (y,))
    grad = torch.randn(3, 4, 32, dtype=torch.float64)
    reference = y.detach().clone().requires_grad_()
    variants.activate(reference, "swiglu").backward(grad)
    InterleavedSwiglu.apply(y, None).backward(grad)
    torch.testing.assert_close(y.grad, reference.grad)
    torch.testing.assert_close(InterleavedSwiglu.apply(y, None), variants.activate(y, "swiglu"))


def test_matmul_gradients_read_the_weight_in_place(path):
    x = torch.randn(9, 48).half().requires_grad_()
    w = torch.randn(40, 48).half().requires_grad_()
    (matmul.matmul(x, w.T) * 1.0).sum().backward()
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    (xr @ wr.T).sum().backward()
    close(x.grad, xr.grad)
    close(w.grad, wr.grad)
    # dA = dC @ w: w [N, K] read as b [K, N] in place
    assert any(variant.b_layout == "kn" for *_, variant, _ in path.chooser.asked)


def test_eager_autograd_takes_the_functions_not_the_operators(path):
    """Eager calls that need a gradient skip the custom operators' dispatch (tens of microseconds of
    host time each way, per projection of a training step); a double backward still works through
    the series' launches, against torch's."""
    x = (torch.randn(6, 48) / 4).half().requires_grad_()  # small: the second derivative stays in fp16's range
    w = (torch.randn(40, 48) / 4).half().requires_grad_()
    bias = torch.randn(40).half().requires_grad_()

    def recorded_by(y):
        node = y.grad_fn
        while type(node).__name__ in ("ViewBackward0", "AliasBackward0"):  # the call's reshape
            node = node.next_functions[0][0]
        return type(node).__name__

    assert recorded_by(matmul.linear(x, w, bias)) == "_EagerLinearBackward"
    assert recorded_by(matmul.matmul(x, w.T)) == "_EagerMatmulBackward"
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    grads = []
    for product, inputs in ((lambda: matmul.linear(x, w, bias, "silu"), (x, w)), (lambda: None, (xr, wr))):
        y = product()
        if y is None:  # torch's, in float32
            y = torch.nn.functional.silu(torch.nn.functional.linear(xr, wr, bias.detach().float()))
        (dx,) = torch.autograd.grad(y.float().square().sum(), inputs[0], create_graph=True)
        grads.append(torch.autograd.grad(dx.float().square().sum(), inputs[1])[0])  # a gradient penalty's
    close(grads[0], grads[1])


def test_torch_func_transforms_differentiate_through_the_call(path):
    """``torch.func.grad`` takes the eager Functions (their ``setup_context`` form), against torch's."""
    x = torch.randn(6, 48).half()
    w = torch.randn(40, 48).half()
    bias = torch.randn(40).half()
    ours = torch.func.grad(lambda x, w: matmul.linear(x, w, bias, "silu").float().sum(), argnums=(0, 1))(x, w)
    theirs = torch.func.grad(
        lambda x, w: torch.nn.functional.silu(torch.nn.functional.linear(x, w, bias.float())).sum(), argnums=(0, 1)
    )(x.float(), w.float())
    for a, b in zip(ours, theirs):
        close(a, b)
    close(torch.func.grad(lambda x: matmul.matmul(x, w.T).float().square().sum())(x),
          torch.func.grad(lambda x: (x @ w.float().T).square().sum())(x.float()))  # fmt: skip


def test_the_fake_linear_operator_gives_the_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(10, 48, dtype=torch.float16), torch.empty(80, 48, dtype=torch.float16)
        assert torch.ops.tilus_matmul.linear(x, w, None, "swiglu").shape == (10, 40)
        assert torch.ops.tilus_matmul.linear(x, w, None, "").shape == (10, 80)
    assert torch_op.linear is not None


# --- matmul.nn -----------------------------------------------------------------------------------


class GatedMLP(torch.nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.down_proj = torch.nn.Linear(inner, hidden, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(48, 48)
        self.mlp = GatedMLP(48, 40)
        self.head = torch.nn.Linear(48, 16).float()  # float32: stays torch's

    def forward(self, x):
        return self.mlp(self.proj(x))


@pytest.fixture
def model(monkeypatch):
    import matmul.nn as mnn

    block = Block().half()
    block.head.float()
    monkeypatch.setattr(
        mnn, "eligible", lambda layer: None if layer.weight.dtype in (torch.float16, torch.bfloat16) else "float32"
    )
    return block


@pytest.mark.parametrize("fuse", [False, True])
def test_convert_and_undo_round_trip(path, model, fuse):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layers = dict(model.named_modules())
    x = torch.randn(2, 5, 48).half()
    expected = model(x).float()
    conversion = matmul.nn.convert(model, fuse_gate_up=fuse)
    assert isinstance(model.proj, matmul.nn.Linear) and isinstance(model.proj, torch.nn.Linear)
    assert model.proj.weight is layers["proj"].weight  # shared, not copied
    assert conversion.skipped == {"head": "float32"}
    close(model(x), expected)  # parameters that require grad: the product through the operator
    with torch.no_grad():  # inference: the fused epilogue
        close(model(x), expected)
    if fuse:
        assert hasattr(model.mlp, "gate_up_weight") and model.mlp.gate_proj.weight.numel() == 0
        assert path.chooser.asked and any(v.activation == "swiglu" for *_, v, _ in path.chooser.asked)
    else:
        assert model.state_dict().keys() == before.keys()
    conversion.undo()
    assert dict(model.named_modules()).keys() == layers.keys()
    assert all(model.get_submodule(name) is layer for name, layer in layers.items() if name)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    close(model(x), expected)


def test_convert_to_int4_weights_and_undo(monkeypatch):
    """``convert(weights="int4")``: each layer whose K is a multiple of the group packed once and run
    through ``matmul.linear(x, qw, bias)`` (on the CPU: the widened weight and torch), the others
    listed with the reason, the 16-bit layers back after ``undo``."""
    import matmul.nn as mnn

    monkeypatch.setattr(mnn, "eligible", lambda layer: None)  # the CPU stands in for the GPU here
    model = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).half()
    layers = list(model)
    x = torch.randn(3, 7, 256).half()
    conversion = matmul.nn.convert(model, weights="int4")
    assert isinstance(model[0], matmul.nn.QuantizedLinear) and model[0].weight.format == "int4"
    assert model[0].bias is layers[0].bias
    assert model[2] is layers[2] and "group of 128" in conversion.skipped["2"]
    qw = model[0].weight
    expected = layers[2](
        torch.relu(torch.nn.functional.linear(x.float(), qw.dequantize().float(), layers[0].bias.float())).half()
    )
    close(model(x), expected)
    conversion.undo()
    assert list(model) == layers
    with pytest.raises(matmul.MatmulInputError, match="weights=.int5."):
        matmul.nn.convert(model, weights="int5")
    with pytest.raises(matmul.MatmulInputError, match="not both"):
        matmul.nn.convert(model, weights="int4", fuse_gate_up=True)


def test_convert_to_int4_skips_a_layer_whose_weight_cannot_be_packed(monkeypatch):
    """A weight with an infinity cannot be packed (``matmul.quantize`` refuses it): ``convert`` keeps
    torch's layer, says why, and converts the rest; fused q, k and v with such a weight are left
    unfused and the two sound projections packed alone."""
    import matmul.nn as mnn

    monkeypatch.setattr(mnn, "eligible", lambda layer: None)  # the CPU stands in for the GPU here
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), QKVAttention(128, 128)).half()
    with torch.no_grad():
        model[0].weight[1, 2] = float("inf")
        model[2].k_proj.weight[0, 0] = float("nan")
    conversion = matmul.nn.convert(model, weights="int4", fuse_qkv=True)
    assert type(model[0]) is torch.nn.Linear and "infinite or NaN" in conversion.skipped["0"]
    assert conversion.fused == [] and "infinite or NaN" in conversion.skipped["2.k_proj"]
    assert isinstance(model[2].q_proj, matmul.nn.QuantizedLinear) and isinstance(
        model[2].v_proj, matmul.nn.QuantizedLinear
    )
    conversion.undo()
    assert all(type(layer) is torch.nn.Linear for layer in (model[0], model[2].q_proj, model[2].k_proj))


@pytest.fixture
def attention(monkeypatch):
    import matmul.nn as mnn

    monkeypatch.setattr(mnn, "eligible", lambda layer: None)  # the CPU stands in for the GPU here
    torch.manual_seed(0)
    return QKVAttention(48, 16).half()


@pytest.fixture
def products(monkeypatch):
    """The N of each ``matmul.linear`` product ``matmul.nn`` runs, in order (one per launch)."""
    import matmul.nn as mnn

    ran, linear = [], mnn.linear

    def counted(x, weight, *rest):
        ran.append(weight.shape[0])
        return linear(x, weight, *rest)

    monkeypatch.setattr(mnn, "linear", counted)
    return ran


def test_fused_qkv_is_one_product_and_undo_restores_the_layers(path, attention, products):
    before = {k: v.clone() for k, v in attention.state_dict().items()}
    layers = dict(attention.named_children())
    reference = copy.deepcopy(attention)
    conversion = matmul.nn.convert(attention, fuse_qkv=True)
    assert isinstance(attention.k_proj, matmul.nn.ProjectionSlice)
    assert attention.state_dict().keys() == {"qkv_weight", "qkv_bias"}  # one copy of the weights
    assert attention.qkv_weight.shape == (80, 48) and layers["k_proj"].weight.numel() == 0
    for _ in range(2):  # a second input: a new product, not the first one's columns
        x = torch.randn(2, 5, 48).half()
        ran = len(products)
        with torch.no_grad():
            for result, expected in zip(attention(x), reference(x)):
                close(result, expected.float())
        assert products[ran:] == [80]  # q, k and v in one launch
    with torch.no_grad():
        assert attention.q_proj(x).data_ptr() != attention.q_proj(x).data_ptr()  # q twice: computed twice
    conversion.undo()
    assert dict(attention.named_children()) == layers
    after = attention.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_fused_qkv_on_another_input_runs_each_projections_own_rows(path, attention, products):
    """A cross-attention's k and v read another tensor than q: each gets its own product of its own
    rows of the fused weight (no column of a product of the wrong input)."""
    x, memory = torch.randn(3, 48).half(), torch.randn(7, 48).half()
    with torch.no_grad():
        expected = [t.float() for t in attention(x, memory)]
        matmul.nn.convert(attention, fuse_qkv=True)
        for _ in range(2):
            for result, reference in zip(attention(x, memory), expected):
                close(result, reference)
    assert products == [80, 16, 16] + [48, 16, 16]  # fused once, then each its own


def test_fused_qkv_recomputes_after_an_in_place_change_of_the_input(path, attention):
    x = torch.randn(4, 48).half()
    with torch.no_grad():
        matmul.nn.convert(attention, fuse_qkv=True)
        attention.q_proj(x)
        x.mul_(-2)  # k and v must see the changed input, not the product made before the change
        weight, bias = attention.qkv_weight, attention.qkv_bias
        close(attention.k_proj(x), torch.nn.functional.linear(x.float(), weight[48:64].float(), bias[48:64].float()))


def test_fused_qkv_under_torch_compile_fullgraph(path, attention, products):
    """The sharing is plain Python around the operator: dynamo traces it into one graph, with one
    product in it."""
    reference = copy.deepcopy(attention)
    matmul.nn.convert(attention, fuse_qkv=True)
    compiled = torch.compile(attention, backend="eager", fullgraph=True)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 48).half()
            for result, expected in zip(compiled(x), reference(x)):
                close(result, expected.float())
    assert products and set(products) == {80}


def test_fused_qkv_gradients_match_the_separate_layers(path, attention):
    x = torch.randn(2, 5, 48).half()
    reference = QKVAttention(48, 16).half()
    reference.load_state_dict(attention.state_dict())
    sum(t.float().square().sum() for t in reference(x)).backward()
    matmul.nn.convert(attention, fuse_qkv=True)
    sum(t.float().square().sum() for t in attention(x)).backward()
    expected = torch.cat([reference.get_submodule(name).weight.grad for name in matmul.nn.QKV])
    close(attention.qkv_weight.grad, expected)
    close(attention.qkv_bias.grad, torch.cat([reference.get_submodule(name).bias.grad for name in matmul.nn.QKV]))


def test_fused_qkv_with_packed_weights(monkeypatch, products):
    """``convert(weights="int4", fuse_qkv=True)``: the stacked weight packed once, each row as the
    separate weights pack it, one product a forward (on the CPU: the widened weight and torch); a
    cross-attention's k and v are the columns of the whole product of their own input; ``undo``
    puts the 16-bit layers back; a K that is no multiple of the group fuses nothing and says why."""
    import matmul.nn as mnn

    monkeypatch.setattr(mnn, "eligible", lambda layer: None)  # the CPU stands in for the GPU here
    torch.manual_seed(0)
    model = QKVAttention(256, 64).half()
    layers = dict(model.named_children())
    conversion = matmul.nn.convert(model, weights="int4", fuse_qkv=True)
    packed = conversion.fused[0][1].packed
    assert packed.format == "int4" and packed.shape == (384, 256) and model.state_dict() == {}
    rows = [matmul.quantize(layer.weight.detach(), format="int4").dequantize() for layer in layers.values()]
    assert torch.equal(packed.dequantize(), torch.cat(rows))  # the same values as three packed weights
    x, memory = torch.randn(2, 5, 256).half(), torch.randn(7, 256).half()
    with torch.no_grad():
        for source, ran in ((None, [384]), (memory, [384, 384, 384])):  # cross-attention: each its own product
            products.clear()
            sources = (x, x, x) if source is None else (x, memory, memory)
            for result, read, weight, layer in zip(model(x, source), sources, rows, layers.values()):
                close(result, torch.nn.functional.linear(read.float(), weight.float(), layer.bias.float()))
            assert products == ran
    assert conversion.fused[0][1].kept is None  # the 16-bit layers: the Conversion's alone, freed with it
    conversion.undo()
    assert dict(model.named_children()) == layers
    ragged = QKVAttention(200, 64).half()
    conversion = matmul.nn.convert(ragged, weights="int4", fuse_qkv=True)
    assert conversion.fused == [] and "group of 128" in conversion.skipped["k_proj"]


def test_a_converted_model_cast_to_float32_runs_torchs_forward(path, monkeypatch):
    """``model.float()`` after ``convert`` (an evaluation in full precision): the layers, the fused
    gate-up and q, k, v included, run torch's own forward on float32 weights, not an error."""
    import matmul.nn as mnn

    monkeypatch.setattr(mnn, "eligible", lambda layer: None)  # the CPU stands in for the GPU here
    torch.manual_seed(0)
    model = torch.nn.Sequential(GatedMLP(48, 40), QKVAttention(48, 16)).half()
    conversion = matmul.nn.convert(model, fuse_gate_up=True, fuse_qkv=True)
    assert len(conversion.fused) == 2
    model.float()
    x = torch.randn(3, 48)
    asked = len(path.chooser.asked)
    hidden = model[0](x)
    q, k, v = model[1](hidden)
    reference = conversion.undo()
    expected_hidden = reference[0](x)
    for ours, theirs in zip((hidden, q, k, v), (expected_hidden, *reference[1](expected_hidden))):
        assert ours.dtype == torch.float32 and torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4)
    assert len(path.chooser.asked) == asked  # no kernel was asked for float32


def test_a_linear_loads_a_torch_state_dict(path):
    layer = torch.nn.Linear(48, 40).half()
    ours = matmul.nn.Linear(48, 40, dtype=torch.float16)
    ours.load_state_dict(layer.state_dict())
    x = torch.randn(3, 48).half()
    close(ours(x), layer(x).float())


def test_a_transformers_llama_switched_in_one_line_gives_its_logits_and_gradients(path, monkeypatch):
    """The README's one line on a real (tiny, random) transformers Llama: every projection through
    the launch path (stand-in kernels), the gated MLPs fused, the logits and gradients as before."""
    transformers = pytest.importorskip("transformers")
    import matmul.nn as mnn

    monkeypatch.setattr(mnn, "eligible", lambda layer: None)  # the CPU stands in for the GPU here
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).half()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits.float()
    conversion = matmul.nn.convert(model, fuse_gate_up=True, fuse_qkv=True)
    assert len(conversion.fused) == 4 and conversion.skipped == {}
    assert isinstance(model.lm_head, matmul.nn.Linear)
    with torch.no_grad():
        close(model(input_ids=ids).logits, expected)
    assert any(v.activation == "swiglu" for *_, v, _ in path.chooser.asked)
    model(input_ids=ids, labels=ids).loss.backward()  # through the operators' backward
    for fused_grad in (model.model.layers[0].mlp.gate_up_weight.grad, model.model.layers[0].self_attn.qkv_weight.grad):
        assert fused_grad is not None and fused_grad.abs().sum() > 0
    # the benchmark's gradient check: the fused gradients split back, each as the unswitched model's
    reference(input_ids=ids, labels=ids).loss.backward()
    grads = drop_in._gradients(model, conversion)
    theirs = {n: p.grad for n, p in reference.named_parameters()}
    assert grads.keys() == theirs.keys()
    for name, grad in grads.items():
        close(grad, theirs[name].float())
    asked = len(path.chooser.asked)
    conversion.undo()
    model.zero_grad()
    with torch.no_grad():
        close(model(input_ids=ids).logits, expected)
    assert len(path.chooser.asked) == asked  # undone: torch's own forward again


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_swiglu_kernels_build(backward):
    """The interleaved swiglu kernels build for Hopper: 16-byte loads of each group of 8 gate and up
    values, 16-byte stores, the exponential of silu (tests/test_swiglu_gpu.py runs them)."""
    import tilus

    from matmul.build import compiler

    result = compiler.build_script(
        swiglu.InterleavedSwigluKernel, "sm_90a", {"dtype": tilus.float16, "backward": backward}, version="swiglu"
    )
    assert result.ok, result.error
    ptx = result.ptx()
    assert ptx.count("ld.global.nc.v4.u32") == (3 if backward else 2)
    assert ptx.count("st.global.v4") == (2 if backward else 1)
    assert "ex2.approx" in ptx
    assert result.spill_bytes == 0


def test_swiglu_kernels_are_built_by_the_chooser_and_torch_runs_meanwhile(monkeypatch, tmp_path):
    """swiglu's kernels are built as every kernel of the call: by the chooser's build children
    (``Chooser.kernel``), both of a dtype at once with ``build_now``; until then, and for good where
    the build fails, torch's operators give the same activation."""
    import stand_ins

    from matmul.call import activation

    monkeypatch.setattr(activation.versions, "local_arch", lambda: swiglu.ARCH)
    monkeypatch.setattr(swiglu, "takes", lambda y: True)
    release = threading.Event()
    chooser = stand_ins.chooser_building_in_children(monkeypatch, tmp_path, "stand_ins:cpu_build_raising", release)
    y = torch.randn(8, 2 * 64, dtype=torch.float16)
    expected = swiglu.forward(y)  # torch's
    assert torch.equal(activation.activation(chooser, y, "swiglu"), expected)  # asks for the forward's kernel
    release.set()
    assert chooser.build_now(activation.swiglu_kernels(torch.float16), progress=False, timeout_s=120) == [False] * 2
    jobs = [job for request in chooser.requests for job in request]
    assert sorted(job["config"]["backward"] for job in jobs) == [False, True]  # each asked once
    assert all(job["version"] == "swiglu" for job in jobs) and len(chooser.failed) == 2
    assert torch.equal(activation.activation(chooser, y, "swiglu"), expected)  # torch's, for good
    assert sum(map(len, chooser.requests)) == 2  # neither asked again


def test_the_build_child_builds_the_swiglu_kernel():
    """The real child (no GPU) builds the forward kernel for Hopper and reports its program."""
    from matmul.call import building
    from matmul.kernels.variant import Variant

    reports = []
    job = {"id": "swiglu", "arch": "sm_90a", "dtype": "float16", "version": "swiglu",
           "config": {"backward": False}, "variant": Variant().key()}  # fmt: skip
    building.build_in_child([job], lambda *report: reports.append(report))
    assert len(reports) == 1 and reports[0][2] is None, reports
    assert (Path(reports[0][1]) / "module").is_dir()
