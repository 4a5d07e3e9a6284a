"""``torch.nn`` on the project's kernels: a drop-in ``Linear`` and a one-call switch of a whole model.

::

    import matmul
    switch = matmul.nn.convert(model)        # every nn.Linear now runs matmul.linear
    switch = matmul.nn.convert(model, fuse_gate_up=True)  # and each gated MLP one swiglu kernel
    switch = matmul.nn.convert(model, fuse_qkv=True)      # and each attention's q, k, v one product
    switch.undo()                            # the model as it was
    switch = matmul.nn.convert(model, weights="int4")  # every weight packed in 4 bits (inference)

``Linear`` is a ``torch.nn.Linear`` (same parameters, same state dict, ``isinstance`` still true)
whose forward is ``matmul.linear(x, weight, bias, activation)``. ``convert`` swaps each eligible
``nn.Linear`` of a model for one that shares its parameters (no copy: an optimizer built before
keeps working), and leaves the others as they are, saying why in ``Conversion.skipped``: the
kernels take float16/bfloat16 weights on a Hopper or Blackwell GPU, and a layer whose weight is
float32 or on the CPU keeps torch's own forward.

``weights="int4"`` (or ``"int4_channel"``, ``"int6"``, ``"fp8_e4m3"``) stores each eligible layer's weight packed
instead (``matmul.quantize``, once) and runs it through ``matmul.linear(x, qw, bias)``: Hopper V8 at
decode sizes (int4: also prefill sizes up to 1536 tokens where its tiles fill the GPU), else the
weight widened on the GPU (``matmul.quant``). ``QuantizedLinear`` is frozen: its packed weight is
not a parameter (no gradient, not in the state dict, not moved by ``.to()``), while its input and
bias get their gradients (dX = dY W, the weight widened once), so
the layers before it (low-rank adapters on a frozen quantized model) still train through it. The
16-bit layers are kept by the ``Conversion`` for ``undo``: drop it (or do not keep it) and their
memory is freed. A layer whose K is not a multiple of the format's group (128) stays torch's,
listed in ``skipped``, as does any layer whose rows TMA cannot read (``in_features`` times the
item size not a multiple of 16 bytes).

``fuse_gate_up=True`` also finds gated MLPs, modules with ``gate_proj``, ``up_proj`` and
``down_proj`` linear layers and a SiLU ``act_fn`` (Llama, Mistral, Qwen), and runs ``down_proj(
silu(gate_proj(x)) * up_proj(x))`` as ``down_proj(linear(x, gate_up, activation="swiglu"))``: one
kernel writes the intermediate once, at half the width of the two projections. The fused weight is
made once (``matmul.gate_up``); the two projections' weights are released meanwhile and rebuilt
from it by ``undo``, so the model holds one copy of them, and its state dict has the fused weight
(``gate_up_weight``) in their place until then. Only where the user asks: fusing changes the
state dict and trains one parameter where there were two.

``fuse_qkv=True`` also finds attention modules with ``q_proj``, ``k_proj`` and ``v_proj`` linear
layers of one input width (Llama, Mistral, Qwen2, whose q, k and v biases are fused too) and runs
the three as one product with their weights stacked (``qkv_weight``, ``qkv_bias``): one launch
instead of three, and a product wide enough to fill the GPU where a grouped-query attention's k and
v, a quarter of q's width each, are not. Each projection becomes a ``ProjectionSlice``: the first of
the three called on an input computes all three; its siblings, called on the same tensor (the same
object, unchanged since), take their columns of that product, views with no copy. Called on
another input (a cross-attention's k and v read the encoder's states, not the queries' input), a
projection runs its own rows of the fused weight instead, and the module stops sharing after the
first such call: never a wrong result, at worst three separate products again. The sharing is
plain Python around the operator, so a CUDA graph captures one product and ``torch.compile``
(``fullgraph=True`` too) traces one. As with the gate-up fusion, the state dict holds the fused
weight until ``undo`` rebuilds the three. With ``weights=`` as well, the stacked weight is packed
once (``PackedFusedProjections``), for inference like every packed layer.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from typing import Optional

import torch

from .call.api import linear
from .contract import DTYPES, TMA_ALIGN_BYTES, MatmulInputError
from .kernels.variant import activate, activation_name, gate_up, split_gate_up
from .quant import FORMATS, QuantizedWeight, quantize

__all__ = [
    "Linear",
    "QuantizedLinear",
    "GatedMLPForward",
    "FusedProjections",
    "PackedFusedProjections",
    "ProjectionSlice",
    "convert",
    "Conversion",
]

log = logging.getLogger(__name__)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias=None, activation: Optional[str] = None) -> torch.Tensor:
    """``matmul.linear`` where the kernels take the weight's dtype (float16 or bfloat16); else torch's
    own forward, as ``convert`` leaves a layer with such a weight: a converted model cast to float32
    afterwards (``model.float()``, for an evaluation in full precision) still runs. (Moved to the CPU
    in 16 bits, it gets ``MatmulInputError``, which says to move it back.)"""
    if weight.dtype in DTYPES:
        return linear(x, weight, bias, activation)
    return activate(torch.nn.functional.linear(x, weight, bias), activation_name(activation))


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose forward runs ``matmul.linear`` (with an optional fused ``activation``)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, activation=None
    ):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation

    @classmethod
    def sharing(cls, layer: torch.nn.Linear, activation: Optional[str] = None) -> "Linear":
        """A ``Linear`` over ``layer``'s own parameters (the same tensors, not copies)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = layer.in_features, layer.out_features
        new.weight = layer.weight
        new.bias = layer.bias
        new.activation = activation
        new.train(layer.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")


class QuantizedLinear(torch.nn.Module):
    """A linear layer whose weight is stored packed (``matmul.quantize``); its forward is
    ``matmul.linear(x, qw, bias)``. For inference (module doc)."""

    def __init__(self, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None):
        super().__init__()
        self.weight = weight
        self.out_features, self.in_features = weight.shape
        self.bias = bias

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, weights: str = "int4") -> "QuantizedLinear":
        """``layer``'s weight packed in the format ``weights``; its bias shared."""
        with torch.no_grad():
            return cls(quantize(layer.weight.detach(), format=weights), layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.weight.format}"


def quantizable(layer: torch.nn.Linear, weights: str) -> Optional[str]:
    """None if ``layer``'s weight can be packed in ``weights``; else why not."""
    group = FORMATS[weights][1]
    if group is not None and layer.in_features % group:
        return f"in_features {layer.in_features} is not a multiple of {weights}'s group of {group}"
    return None


def eligible(layer: torch.nn.Linear) -> Optional[str]:
    """None if the kernels can run ``layer``; else why not."""
    weight = layer.weight
    if weight.dtype not in DTYPES:
        return f"weight is {weight.dtype}; the kernels take float16 or bfloat16"
    if weight.device.type != "cuda":
        return f"weight is on {weight.device}; the kernels run on a CUDA GPU"
    if torch.cuda.get_device_capability(weight.device) not in ((9, 0), (10, 0)):
        return f"{torch.cuda.get_device_name(weight.device)} is neither Hopper nor Blackwell"
    if (layer.in_features * weight.element_size()) % TMA_ALIGN_BYTES:
        return (
            f"in_features {layer.in_features}: rows of {layer.in_features * weight.element_size()} bytes, which "
            f"TMA cannot read (a multiple of {TMA_ALIGN_BYTES} bytes)"
        )
    return None


class GatedMLPForward:
    """The forward of a gated MLP with its gate and up projections fused (see the module's docstring)."""

    def __init__(self, mlp: torch.nn.Module):
        gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
        self.rows = gate.shape[0]
        with torch.no_grad():
            mlp.gate_up_weight = torch.nn.Parameter(gate_up(gate, up), requires_grad=gate.requires_grad)
        self.kept = (gate, up)
        for weight in self.kept:  # released: the fused weight holds them (rebuilt by restore)
            weight.data = weight.data.new_empty(0)

    def __call__(self, mlp, x):
        hidden = dense_linear(x, mlp.gate_up_weight, None, "swiglu")
        # the padding columns (I rounded up to 8) only where there are any: a slice of every column
        # would still cost a backward that zero-fills and copies the whole gradient
        return mlp.down_proj(hidden if hidden.shape[-1] == self.rows else hidden[..., : self.rows])

    def unfused(self, tensors: dict) -> dict:
        """Tensors shaped as the fused parameter (by its name: its data, its gradient) split back
        into the tensors of the two projections' weights, by their names under the module."""
        gate, up = split_gate_up(tensors["gate_up_weight"], self.rows)
        return {"gate_proj.weight": gate, "up_proj.weight": up}

    def restore(self, mlp: torch.nn.Module) -> None:
        weights = self.unfused({"gate_up_weight": mlp.gate_up_weight.data})
        self.kept[0].data, self.kept[1].data = (
            weights[name].contiguous() for name in ("gate_proj.weight", "up_proj.weight")
        )
        del mlp.gate_up_weight
        del mlp.forward  # the class's own forward again


def _versions(x: torch.Tensor, weight: torch.Tensor) -> Optional[tuple[int, int]]:
    """The version counters of the input and the weight (bumped by every in-place change), or None
    for an inference tensor, which has none (asking raises, and an exception a call costs as much as
    a launch: hence the test first), and under ``torch.compile``, which traces the three calls into
    one graph (the identity of the input is what it checks there; dynamo cannot trace the test)."""
    if torch.compiler.is_compiling() or x.is_inference():
        return None
    return x._version, weight._version if isinstance(weight, torch.Tensor) else 0  # a packed weight: never changed


@dataclasses.dataclass
class _Product:
    """The fused product of one input, and which projections have not taken their columns yet."""

    x: torch.Tensor
    versions: tuple
    parts: tuple
    untaken: set


class FusedProjections:
    """Sibling projections of one input run as one product (see the module's docstring)."""

    WEIGHT, BIAS = "qkv_weight", "qkv_bias"

    def __init__(self, owner: torch.nn.Module, names: tuple[str, ...]):
        self.owner, self.names = owner, names
        layers = [getattr(owner, name) for name in names]
        self.in_features = layers[0].in_features
        self.sizes = [layer.out_features for layer in layers]
        self.starts = [sum(self.sizes[:i]) for i in range(len(names))]
        self.kept = self.stack(layers)
        self.pending: Optional[_Product] = None
        self.shared = True  # False once a projection was called on another input than its siblings
        for index, name in enumerate(names):
            setattr(owner, name, ProjectionSlice(self, index))

    def stack(self, layers: list) -> Optional[list]:
        """The layers' weights (and biases) stacked as the owner's parameters, theirs released; the
        layers, kept for ``restore``."""
        weights = [layer.weight for layer in layers]
        biases = [layer.bias for layer in layers]
        with torch.no_grad():
            setattr(self.owner, self.WEIGHT, torch.nn.Parameter(torch.cat(weights), weights[0].requires_grad))
            if biases[0] is not None:
                setattr(self.owner, self.BIAS, torch.nn.Parameter(torch.cat(biases), biases[0].requires_grad))
        for tensor in weights + biases:  # released: the fused parameters hold them (rebuilt by restore)
            if tensor is not None:
                tensor.data = tensor.data.new_empty(0)
        return layers

    def weight_and_bias(self, index: Optional[int] = None):
        """The fused weight and bias, or (``index``) one projection's rows of them: views, no copy."""
        parameters = self.owner._parameters  # not Module.__getattr__: this runs at every projection's call
        weight, bias = parameters[self.WEIGHT], parameters.get(self.BIAS)
        if index is None:
            return weight, bias
        rows = slice(self.starts[index], self.starts[index] + self.sizes[index])
        return weight[rows], None if bias is None else bias[rows]

    def project(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Projection ``index`` of ``x``: its columns of the fused product of ``x``."""
        weight, bias = self.weight_and_bias()
        versions = _versions(x, weight)
        pending = self.pending
        if pending is not None and pending.x is x and pending.versions == versions and index in pending.untaken:
            pending.untaken.discard(index)
            if not pending.untaken:
                self.pending = None  # every sibling served: let the product go
            return pending.parts[index]
        if pending is not None and self.shared:
            # a sibling's columns were never taken before another input came: these projections do
            # not share one input here, and a fused product would be computed for each of them
            self.shared = False
            self.pending = None
            log.info("%s: %s called on different inputs; each runs its own rows of the fused weight from now on",
                     type(self.owner).__name__, ", ".join(self.names))  # fmt: skip
        if not self.shared:
            return self.alone(x, index)
        parts = dense_linear(x, weight, bias).split(self.sizes, dim=-1)  # one autograd node: its backward is a cat
        self.pending = _Product(x, versions, parts, set(range(len(self.names))) - {index})
        return parts[index]

    def alone(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Projection ``index`` of an input its siblings do not share: its own rows of the weight."""
        return dense_linear(x, *self.weight_and_bias(index))

    def unfused(self, tensors: dict) -> dict:
        """Tensors shaped as the fused parameters (by their names: their data, their gradients)
        split back into the tensors of each projection's weight and bias, by their names under the
        module (views of the given tensors)."""
        out = {}
        for index, name in enumerate(self.names):
            rows = slice(self.starts[index], self.starts[index] + self.sizes[index])
            for fused, part in ((self.WEIGHT, "weight"), (self.BIAS, "bias")):
                if fused in tensors:
                    out[f"{name}.{part}"] = tensors[fused][rows]
        return out

    def restore(self, owner: torch.nn.Module) -> None:
        fused = {name: getattr(owner, name).data for name in (self.WEIGHT, self.BIAS) if hasattr(owner, name)}
        parts = self.unfused(fused)
        for name, layer in zip(self.names, self.kept):
            layer.weight.data = parts[f"{name}.weight"].clone()
            if layer.bias is not None:
                layer.bias.data = parts[f"{name}.bias"].clone()
            setattr(owner, name, layer)
        for name in fused:
            delattr(owner, name)
        self.pending = None


class PackedFusedProjections(FusedProjections):
    """``FusedProjections`` whose stacked weight is packed (``convert(weights=..., fuse_qkv=True)``):
    one ``matmul.quantize`` of the stacked weight, which quantizes each row as the separate weights'
    would be (a scale per row and group of K), so the product is the one the three packed weights
    give. For inference, as ``QuantizedLinear``: the packed weight is an attribute of the group, not
    a parameter, and the 16-bit layers are kept by the ``Conversion``, not here (as swapped layers:
    ``undo`` puts them back), so that dropping it frees them."""

    def __init__(self, owner: torch.nn.Module, names: tuple[str, ...], weights: str):
        self.format = weights
        super().__init__(owner, names)

    def stack(self, layers: list) -> Optional[list]:
        with torch.no_grad():
            self.packed = quantize(torch.cat([layer.weight.detach() for layer in layers]), format=self.format)
            biases = [layer.bias for layer in layers]
            self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        return None  # the Conversion keeps the layers

    def weight_and_bias(self, index: Optional[int] = None):
        if index is not None:
            raise ValueError("a packed weight is run whole (alone)")
        return self.packed, self.bias

    def alone(self, x: torch.Tensor, index: int) -> torch.Tensor:
        # a packed weight's rows are not a view of it: the whole product, this projection's columns
        start = self.starts[index]
        return linear(x, self.packed, self.bias)[..., start : start + self.sizes[index]]

    def unfused(self, tensors: dict) -> dict:
        return {}  # no parameters of its own

    def restore(self, owner: torch.nn.Module) -> None:
        self.pending = None  # the layers themselves come back as the Conversion's swapped ones


class ProjectionSlice(torch.nn.Module):
    """One of ``FusedProjections``' projections: its forward takes its columns of their product."""

    def __init__(self, group: FusedProjections, index: int):
        super().__init__()
        self._group = [group]  # in a list: not a submodule, so the owner's state dict is unchanged
        self.index = index
        self.in_features, self.out_features = group.in_features, group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._group[0].project(x, self.index)

    def extra_repr(self) -> str:
        start = self._group[0].starts[self.index]
        return f"in_features={self.in_features}, out_features={self.out_features}, rows {start}+ of the fused weight"


@dataclasses.dataclass
class Conversion:
    """What ``convert`` changed, and how to change it back (``undo``)."""

    model: torch.nn.Module
    swapped: list = dataclasses.field(default_factory=list)  # (parent, name, original layer)
    fused: list = dataclasses.field(default_factory=list)  # (module, GatedMLPForward or FusedProjections)
    skipped: dict = dataclasses.field(default_factory=dict)  # qualified name -> why

    def undo(self) -> torch.nn.Module:
        """Put every original layer and forward back; the model, as it was before ``convert``."""
        for module, fusion in reversed(self.fused):
            fusion.restore(module)
        for parent, name, layer in reversed(self.swapped):
            setattr(parent, name, layer)
        self.swapped.clear()
        self.fused.clear()
        return self.model


def _is_gated_mlp(module: torch.nn.Module) -> bool:
    layers = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(layer, torch.nn.Linear) for layer in layers):
        return False
    gate, up, _ = layers
    return (
        isinstance(getattr(module, "act_fn", None), torch.nn.SiLU)
        and gate.bias is None
        and up.bias is None
        and gate.weight.shape == up.weight.shape
        and eligible(gate) is None
    )


QKV = ("q_proj", "k_proj", "v_proj")


def _has_qkv(module: torch.nn.Module) -> bool:
    layers = [getattr(module, name, None) for name in QKV]
    if not all(type(layer) is torch.nn.Linear for layer in layers):
        return False
    first = layers[0]
    return (
        all(layer.in_features == first.in_features for layer in layers)
        and all(
            layer.weight.dtype == first.weight.dtype and layer.weight.device == first.weight.device for layer in layers
        )
        and len({layer.bias is None for layer in layers}) == 1
        and all(eligible(layer) is None for layer in layers)
    )


def convert(
    model: torch.nn.Module,
    *,
    fuse_gate_up: bool = False,
    fuse_qkv: bool = False,
    weights: Optional[str] = None,
    build: bool = True,
    progress: Optional[bool] = None,
) -> Conversion:
    """Run every eligible ``nn.Linear`` of ``model`` through the project's kernels (in place); with
    ``fuse_gate_up``, each gated MLP's gate and up projections as one swiglu kernel; with
    ``fuse_qkv``, each attention's q, k and v projections as one product; with
    ``weights`` (a format of ``matmul.quantize``), each weight packed (``QuantizedLinear``). Returns
    the ``Conversion``, whose ``undo()`` restores the model.

    With ``weights``, ``convert`` returns once every kernel the packed layers can run is built
    (``matmul.call.quantized.prepare``: build children in parallel, a tqdm bar where ``progress``, or
    stderr is a terminal): the model is fast from its first call, and a CUDA graph captured any time
    after holds V8. ``build=False`` returns at once instead; until its kernels are built a packed
    layer runs its weight widened by torch on each call, slower than the 16-bit model."""
    if weights is not None and weights not in FORMATS:
        raise MatmulInputError(f"weights={weights!r}: one of {', '.join(FORMATS)}, or None for 16-bit weights")
    if weights is not None and fuse_gate_up:
        raise MatmulInputError(
            "fuse_gate_up fuses the swiglu into the 16-bit kernels' epilogue; packed weights run a plain "
            "epilogue: convert with weights=... or fuse_gate_up=True, not both"
        )
    conversion = Conversion(model)
    if fuse_qkv:
        for attention in list(model.modules()):
            if not _has_qkv(attention):
                continue
            if weights is not None and quantizable(attention.q_proj, weights) is not None:
                continue  # the three share K: none packs, and the loop below says why for each
            if weights is None:
                conversion.fused.append((attention, FusedProjections(attention, QKV)))
            else:
                originals = [(attention, name, getattr(attention, name)) for name in QKV]
                try:  # packed before the module changes: a weight that cannot be packed leaves it as it was
                    fused = PackedFusedProjections(attention, QKV, weights)
                except MatmulInputError:
                    continue  # the loop below tries each layer alone and says why the one that fails does
                conversion.fused.append((attention, fused))
                conversion.swapped.extend(originals)
    if fuse_gate_up:
        for mlp in model.modules():
            if _is_gated_mlp(mlp) and "forward" not in vars(mlp):
                forward = GatedMLPForward(mlp)
                mlp.forward = types.MethodType(forward.__call__, mlp)
                conversion.fused.append((mlp, forward))
    for parent_name, parent in list(model.named_modules()):
        for name, layer in list(parent.named_children()):
            if type(layer) is not torch.nn.Linear:
                continue
            qualified = f"{parent_name}.{name}" if parent_name else name
            if any(
                layer in (mlp.gate_proj, mlp.up_proj)
                for mlp, fusion in conversion.fused
                if isinstance(fusion, GatedMLPForward)
            ):
                continue  # run by the fused forward
            why = eligible(layer)
            if why is not None:
                conversion.skipped[qualified] = why
                continue
            why = None if weights is None else quantizable(layer, weights)
            if why is not None:
                conversion.skipped[qualified] = why
                continue
            try:
                new = Linear.sharing(layer) if weights is None else QuantizedLinear.from_linear(layer, weights)
            except MatmulInputError as error:  # a weight that cannot be packed (non-finite values): torch's layer
                conversion.skipped[qualified] = str(error)
                continue
            setattr(parent, name, new)
            conversion.swapped.append((parent, name, layer))
    if weights is not None and build:
        _build_packed(conversion, progress)
    return conversion


def _build_packed(conversion: Conversion, progress: Optional[bool]) -> None:
    """Build every kernel the packed layers of ``conversion`` can run, and wait; a warning for any
    that did not build (its layers run the widened path)."""
    from .call import quantized

    packed = [fusion.packed for _, fusion in conversion.fused if isinstance(fusion, PackedFusedProjections)]
    for parent, name, _ in conversion.swapped:
        layer = getattr(parent, name)
        if isinstance(layer, QuantizedLinear):
            packed.append(layer.weight)
    if packed and not quantized.prepare(packed, progress=progress):
        log.warning(
            "convert: not every V8 kernel built (see the warnings above); the layers that would run one run "
            "their weight widened instead, correct and slower"
        )
