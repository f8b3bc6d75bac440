"""Models as pure functions of one flat float32 parameter vector (docs/algorithms.md).

A model is a stack of layers; each layer names its parameters (for model.pt), knows how to
initialise them and applies itself two ways: `__call__` to one device's batch (evaluation,
the loop trainer) and `cohort` to the batches of m devices with stacked parameters [m, ...]
(the batched trainer). The cohort form is written by hand (batched matmuls, one grouped
convolution) rather than with `torch.func.vmap`, which any nn.Module gets instead
(fedsim/training/modules.py). The built-ins stay hand-batched because that is faster where
it matters: on a 2-core CPU (benchmarks/RESULTS.md, "nn.Module twins") LeNet-5 as an
nn.Module trains its cohort of 100 at 0.69x the hand-batched speed, and every module's loop
path (one `grad` call per device and step) is 1.4-2.4x slower than these layers' loop; softmax
regression and the MLP are on par either way. Dropout randomness comes
from keyed uniforms instead of torch's global generator. Parameters live in one flat vector
per device; `split` gives views of it, so training updates it in place. No BatchNorm (its
running statistics are not a function of the parameters).

Cohort layouts: vectors are [m, B, features]; images are [B, m, C, H, W], so that a
convolution over the cohort is one grouped convolution with m groups on the view
[B, m * C, H, W] (no copies between the layers of a CNN).
"""

from __future__ import annotations

import math
import inspect
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fedsim.config import ModelConfig
from fedsim.errors import FedsimError, first_line
from fedsim.training import rng
from fedsim.config.catalog import MODELS
from fedsim.training.modules import ModuleModel


@dataclass
class Param:
    name: str
    shape: tuple[int, ...]
    init: str  # "kaiming" (ReLU gain, fan-in), "zeros", "normal", "uniform" (+-1/sqrt(scale))
    scale: int = 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Layer:
    """One layer of a model, on one device (`__call__`) and on a cohort (`cohort`)."""

    params: tuple[Param, ...] = ()
    dropout: int = 0  # dropout uniforms this layer consumes per sample

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one sample's output for an input of `shape`."""
        return shape

    def __call__(self, p: dict[str, Tensor], x: Tensor, u: Tensor | None) -> Tensor:
        """The layer on one device: its parameters `p` by name, a batch `x`, and the dropout
        uniforms `u` it consumes (None without dropout)."""
        raise NotImplementedError

    def cohort(self, p: dict[str, Tensor], x: Tensor, u: Tensor | None) -> Tensor:
        """The layer on m devices at once: parameters [m, ...], x in the cohort layout."""
        return self(p, x, u)  # layers without parameters act elementwise in either layout

    def flops(self, shape: tuple[int, ...]) -> int:
        """Multiply-adds of the forward pass for one sample of input `shape` (0: negligible)."""
        return 0

    def shared(self, p: dict[str, Tensor], x: Tensor) -> Tensor | None:
        """The layer of m models (parameters [m, ...]) on one batch x that all of them read
        (evaluation on a shared test set), in the cohort layout; None: not written for it."""
        return None


class Dense(Layer):
    """Fully connected: `name.weight` [n_out, n_in] (Kaiming init) and `name.bias`."""

    def __init__(self, name: str, n_in: int, n_out: int):
        self.w, self.b = f"{name}.weight", f"{name}.bias"
        self.params = (Param(self.w, (n_out, n_in), "kaiming"), Param(self.b, (n_out,), "zeros"))

    def out_shape(self, shape):
        return (self.params[0].shape[0],)

    def __call__(self, p, x, u):
        return F.linear(x, p[self.w], p[self.b])

    def cohort(self, p, x, u):
        return torch.baddbmm(p[self.b].unsqueeze(1), x, p[self.w].transpose(1, 2))

    def shared(self, p, x):  # the m weight matrices side by side: one matmul, x read once
        return F.linear(x, p[self.w].flatten(0, 1), p[self.b].flatten()).unflatten(1, (len(p[self.w]), -1)).transpose(0, 1)

    def flops(self, shape):
        return self.params[0].numel


class Conv(Layer):
    """2-d convolution, square `kernel`, stride 1, `padding` on each side; `name.weight`
    [c_out, c_in, kernel, kernel] and `name.bias`."""

    def __init__(self, name: str, c_in: int, c_out: int, kernel: int, padding: int):
        self.w, self.b, self.k, self.pad = f"{name}.weight", f"{name}.bias", kernel, padding
        self.params = (Param(self.w, (c_out, c_in, kernel, kernel), "kaiming"),
                       Param(self.b, (c_out,), "zeros"))

    def out_shape(self, shape):
        c, h, w = shape
        return (self.params[0].shape[0], h + 2 * self.pad - self.k + 1, w + 2 * self.pad - self.k + 1)

    def __call__(self, p, x, u):
        return F.conv2d(x, p[self.w], p[self.b], padding=self.pad)

    def cohort(self, p, x, u):
        w, b, m = p[self.w], p[self.b], x.shape[1]
        out = F.conv2d(x.flatten(1, 2), w.flatten(0, 1), b.flatten(), padding=self.pad, groups=m)
        return out.unflatten(1, (m, -1))

    def shared(self, p, x):  # the m filter banks as one: [B, m * c_out, H, W] is the cohort layout
        out = F.conv2d(x, p[self.w].flatten(0, 1), p[self.b].flatten(), padding=self.pad)
        return out.unflatten(1, (len(p[self.w]), -1))

    def flops(self, shape):
        _, h, w = self.out_shape(shape)
        return self.params[0].numel * h * w


class ReLU(Layer):
    """max(x, 0)."""

    def __call__(self, p, x, u):
        return torch.relu(x)


class MaxPool(Layer):
    """2x2 max pooling, stride 2: [c, h, w] -> [c, h // 2, w // 2]. Without autograd (evaluation)
    as `pool_max`: the same numbers, ~6x faster on a CPU."""

    def out_shape(self, shape):
        c, h, w = shape
        return (c, h // 2, w // 2)

    def __call__(self, p, x, u):
        return F.max_pool2d(x, 2) if torch.is_grad_enabled() else pool_max(x)

    def cohort(self, p, x, u):
        if not torch.is_grad_enabled():
            return pool_max(x)
        return F.max_pool2d(x.flatten(1, 2), 2).unflatten(1, x.shape[1:3])


def pool_max(x: Tensor) -> Tensor:
    """2x2 max pooling (stride 2, floor mode) of the last two dimensions, in any layout, as the
    largest of four strided views. max_pool2d's CPU forward (which also finds the indices that
    a backward needs) took half of LeNet-5's test evaluation (benchmarks/bench_eval.py)."""
    x = x[..., : x.shape[-2] // 2 * 2, : x.shape[-1] // 2 * 2]
    return torch.maximum(torch.maximum(x[..., ::2, ::2], x[..., 1::2, ::2]),
                         torch.maximum(x[..., ::2, 1::2], x[..., 1::2, 1::2]))


class Flatten(Layer):
    """One sample's features as one vector."""

    def out_shape(self, shape):
        return (math.prod(shape),)

    def __call__(self, p, x, u):
        return x.flatten(1)

    def cohort(self, p, x, u):
        if x.dim() == 5:  # images [B, m, C, H, W] -> [m, B, C * H * W]
            return x.flatten(2).transpose(0, 1)
        return x


class Dropout(Layer):
    """Inverted dropout driven by the uniforms `u` [B, features] (None at evaluation)."""

    def __init__(self, features: int, rate: float):
        self.dropout, self.rate = features, rate

    def __call__(self, p, x, u):
        if u is None:
            return x
        return x * (u >= self.rate).to(x.dtype) / (1.0 - self.rate)


class Embedding(Layer):
    """Token ids [..., T] -> vectors [..., T, dim]: a learned table (parameters), or fixed word
    vectors (a constant of the model: neither trained nor sent, as LEAF's GloVe embedding)."""

    def __init__(self, vocab_size: int, dim: int, vectors=None):
        self.fixed = None if vectors is None else torch.as_tensor(vectors, dtype=torch.float32)
        self.w, self.dim = "embedding.weight", dim if vectors is None else self.fixed.shape[1]  # the vectors' size
        self.params = () if vectors is not None else (Param(self.w, (vocab_size, dim), "normal"),)
        self._on_device: dict[torch.device, Tensor] = {}

    def out_shape(self, shape):
        return (*shape, self.dim)

    def __call__(self, p, x, u):
        return F.embedding(x, p[self.w] if self.fixed is None else self._table(x.device))

    def cohort(self, p, x, u):
        if self.fixed is not None:
            return F.embedding(x, self._table(x.device))
        table = p[self.w]  # [m, V, dim]: device k looks up its own rows
        return table[torch.arange(len(table), device=x.device)[:, None, None], x]

    def _table(self, device: torch.device) -> Tensor:
        if device not in self._on_device:
            self._on_device[device] = self.fixed.to(device)
        return self._on_device[device]


class LSTM(Layer):
    """Stacked LSTM over a sequence of vectors (text), the rows of an image, or one step for a
    vector; returns the last h.

    Written with plain matmuls (`@` broadcasts over the cohort's leading device dimension),
    so one recurrence serves a device and a cohort.
    """

    def __init__(self, n_in: int, hidden: int, layers: int):
        self.hidden, self.layers, self.n_in = hidden, layers, n_in
        self.cell = lstm_cell  # `fuse` swaps in the compiled one (a GPU's run)
        self.params = tuple(
            Param(f"lstm.{kind}_l{i}", shape, "uniform", hidden)
            for i in range(layers)
            for kind, shape in (("weight_ih", (4 * hidden, n_in if i == 0 else hidden)),
                                ("weight_hh", (4 * hidden, hidden)), ("bias", (4 * hidden,)))
        )

    def out_shape(self, shape):
        return (self.hidden,)

    def flops(self, shape):
        steps = {3: shape[1], 2: shape[0]}.get(len(shape), 1)  # image rows, sequence steps, or one
        return steps * sum(q.numel for q in self.params)

    def __call__(self, p, x, u):
        # [T, B, features]: image rows (channels side by side), a sequence's steps, or one step
        seq = {4: lambda: x.permute(2, 0, 1, 3).flatten(2), 3: lambda: x.transpose(0, 1)}.get(x.dim(), lambda: x[None])
        return self._recur(p, seq())

    def cohort(self, p, x, u):
        # [T, m, B, features] from images [B, m, C, H, W], sequences [m, B, T, features] or vectors [m, B, features]
        seq = {5: lambda: x.permute(3, 1, 0, 2, 4).flatten(3), 4: lambda: x.permute(2, 0, 1, 3)}.get(x.dim(), lambda: x[None])
        return self._recur(p, seq())

    def _recur(self, p, seq: Tensor) -> Tensor:
        for i in range(self.layers):
            w_ih, w_hh, b = (p[f"lstm.{k}_l{i}"] for k in ("weight_ih", "weight_hh", "bias"))
            gates_in = seq @ w_ih.mT + b.unsqueeze(-2)  # [T, ..., B, 4H]: every step's input part
            h = c = gates_in.new_zeros(*gates_in.shape[1:-1], self.hidden)
            outs = []
            for g_in in gates_in:
                h, c = self.cell(torch.baddbmm(g_in, h, w_hh.mT) if h.dim() == 3 else g_in + h @ w_hh.mT, c)
                outs.append(h)
            seq = torch.stack(outs)
        return h

    def fuse(self) -> None:
        """On a GPU: the cell's pointwise arithmetic as fused kernels (torch.compile), forward
        and backward, instead of a dozen launches per time step and layer."""
        self.cell = fused_lstm_cell


def lstm_cell(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """(h, c) of one time step from its gate pre-activations [..., 4H] (torch's i, f, g, o order)."""
    i_g, f_g, c_g, o_g = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f_g) * c + torch.sigmoid(i_g) * torch.tanh(c_g)
    return torch.sigmoid(o_g) * torch.tanh(c), c


_FUSED: list = []  # the compiled cell, made at its first use (importing the compiler costs seconds)


def fused_lstm_cell(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """`lstm_cell` compiled; where the compiler fails (no C compiler, say), the plain cell with
    one warning."""
    if not _FUSED:
        try:
            _FUSED.append(torch.compile(lstm_cell, dynamic=True))
            return _FUSED[0](gates, c)
        except Exception as err:  # noqa: BLE001 - any compiler failure: the plain cell
            _FUSED[:] = [lstm_cell]
            print(f"warning: [client] compile: the LSTM cell could not be compiled ({first_line(err)}); "
                  f"running it unfused", file=sys.stderr)
    return _FUSED[0](gates, c)


class Model:
    """A layer stack with flat-vector bookkeeping: names, shapes, offsets, init, forward."""

    def __init__(self, name: str, layers: list[Layer], in_shape: tuple[int, ...]):
        self.name, self.layers, self.in_shape = name, layers, in_shape
        self.params = [q for layer in layers for q in layer.params]
        self.dim = sum(q.numel for q in self.params)
        self.dropout_features = sum(layer.dropout for layer in layers)
        self._no_draws: dict[tuple, Tensor] = {}  # (m, batch, 0, device) -> the empty dropout draw
        self.has_conv = any(isinstance(layer, Conv) for layer in layers)
        # softmax regression (Flatten, Dense): the batched trainer has its gradient in closed form
        self.is_linear = isinstance(layers[-1], Dense) and all(isinstance(l, Flatten) for l in layers[:-1])
        shapes = _shapes(layers, in_shape)
        self.activations = sum(map(math.prod, shapes))  # layer outputs per sample
        self.inference_layers = _inference_order(layers)
        # multiply-adds of one sample's forward pass: what the thread policy sizes a call by
        self.flops = sum(layer.flops(shape) for layer, shape in zip(layers, [in_shape, *shapes]))

    def split(self, flat: Tensor) -> tuple[Tensor, ...]:
        """Views of flat parameters [..., d] as the model's tensors [..., *shape], in order.

        Views, not copies: an optimizer step on them updates the flat vector in place."""
        lead = flat.shape[:-1]
        chunks = flat.split([q.numel for q in self.params], dim=-1)
        return tuple(c.view(*lead, *q.shape) for q, c in zip(self.params, chunks))

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """The named views of flat [..., d] vectors (state_dict naming)."""
        return {q.name: v for q, v in zip(self.params, self.split(flat))}

    def forward(self, params: tuple[Tensor, ...], x: Tensor, u: Tensor | None = None) -> Tensor:
        """Logits [B, C] of inputs x [B, *in_shape] for the tensors `params` (as `split` gives
        them); u [B, dropout_features] or None (no dropout)."""
        p = {q.name: v for q, v in zip(self.params, params)}
        used = 0
        for layer in self.layers:
            x = layer(p, x, None if u is None else u[:, used:used + layer.dropout])
            used += layer.dropout
        return x

    def predict(self, params: Tensor, x: Tensor) -> Tensor:
        """Logits [B, C] of inputs x [B, *in_shape] for flat parameters [d], for evaluation
        (under torch.inference_mode): the same numbers as `forward` without dropout."""
        p = self.unflatten(params)
        for layer in self.inference_layers:
            x = layer(p, x, None)
        return x

    def predict_together(self, params: Tensor, x: Tensor) -> Tensor | None:
        """Logits [m, B, C] of m flat parameter vectors [m, d] on the same inputs x [B, *in_shape]:
        the first layer with parameters as one call over the m weight sets (`Layer.shared`),
        the rest in the cohort layout. None where that layer has no shared form."""
        p = self.unflatten(params)
        layers = self.inference_layers
        first = next(i for i, layer in enumerate(layers) if layer.params)
        for layer in layers[:first]:
            x = layer(p, x, None)
        x = layers[first].shared(p, x)
        if x is None:
            return None
        for layer in layers[first + 1:]:
            x = layer.cohort(p, x, None)
        return x

    def cohort_forward(self, params: tuple[Tensor, ...], x: Tensor, u: Tensor) -> Tensor:
        """Logits [m, B, C] of m devices: parameters [m, ...] (as `split` gives them for a
        stack), inputs x [m, B, *in_shape], dropout uniforms u [m, B, dropout_features]."""
        p = {q.name: v for q, v in zip(self.params, params)}
        if x.dim() == 5 and isinstance(self.layers[0], Flatten):  # [m, B, C * H * W]: no copy
            x = x.flatten(2)
        elif x.dim() == 5:  # images: [B, m, C, H, W], the cohort layout, contiguous (convolutions
            x = x.transpose(0, 1).contiguous()  # on a strided input are ~3x slower on a CPU)
        used = 0
        for layer in self.layers:
            x = layer.cohort(p, x, u[..., used:used + layer.dropout])
            used += layer.dropout
        return x

    def shared_key(self) -> tuple:
        """What runs with this architecture must share to train in one call (nothing more)."""
        return ()

    def to(self, device: torch.device) -> Model:
        return self  # the parameters live in the flat vectors; fixed word vectors move on use

    def state_dict(self, flat: Tensor) -> dict[str, Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.unflatten(flat).items()}

    def load_state_dict(self, saved: dict[str, Tensor]) -> Tensor:
        return torch.cat([saved[q.name].reshape(-1).float() for q in self.params])

    def randomness(self, seed: int, rnd: int, ids: Tensor, step: int, batch: int) -> Tensor:
        """A local step's dropout uniforms [m, batch, dropout_features] (empty without dropout:
        one tensor for every step, so that a shared call stacks it once)."""
        if not self.dropout_features:
            shape = (len(ids), batch, 0, ids.device)
            if shape not in self._no_draws:
                self._no_draws[shape] = torch.empty(shape[:3], device=ids.device)
            return self._no_draws[shape]
        return rng.uniform(seed, rng.DROPOUT, rnd, ids, step, batch * self.dropout_features).view(
            len(ids), batch, self.dropout_features)

    def init(self, seed: int) -> Tensor:
        """Kaiming-normal weights (ReLU gain), zero biases; LSTM: torch's U(+-1/sqrt(H)). CPU, seeded."""
        gen = torch.Generator().manual_seed(int(seed))
        parts = []
        for q in self.params:
            if q.init == "kaiming":
                fan_in = math.prod(q.shape[1:])
                parts.append(torch.randn(q.numel, generator=gen) * math.sqrt(2.0 / fan_in))
            elif q.init == "normal":  # embeddings: N(0, 1), as torch's
                parts.append(torch.randn(q.numel, generator=gen))
            elif q.init == "uniform":
                bound = 1.0 / math.sqrt(q.scale)
                parts.append((torch.rand(q.numel, generator=gen) * 2 - 1) * bound)
            else:
                parts.append(torch.zeros(q.numel))
        return torch.cat(parts).to(torch.float32)


def _inference_order(layers: list[Layer]) -> list[Layer]:
    """The layers as evaluation applies them: dropout (a no-op there) left out, and a ReLU
    before a max pool moved after it (they commute exactly; it then reads a quarter of the values)."""
    order: list[Layer] = []
    for layer in layers:
        if isinstance(layer, MaxPool) and order and isinstance(order[-1], ReLU):
            order.insert(-1, layer)
        elif not isinstance(layer, Dropout):
            order.append(layer)
    return order


# --- architectures ---------------------------------------------------------------------------

def _head(sizes: list[int], rate: float, learned_input: bool = True) -> list[Layer]:
    """Dense stack sizes[0] -> ... -> sizes[-1] with ReLU between. Dropout goes before every
    dense layer that reads a learned representation (where FedAWE's CINIC-10 CNN has it)."""
    layers: list[Layer] = []
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        if rate > 0 and (learned_input or i > 0):
            layers.append(Dropout(n_in, rate))
        layers.append(Dense(f"fc{i + 1}", n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(ReLU())
    return layers


def _convs(channels: list[int], kernel: int, padding: int | list[int]) -> list[Layer]:
    """conv-ReLU-maxpool blocks, then flatten."""
    pads = padding if isinstance(padding, list) else [padding] * (len(channels) - 1)
    layers: list[Layer] = []
    for i, (c_in, c_out) in enumerate(zip(channels, channels[1:])):
        layers += [Conv(f"conv{i + 1}", c_in, c_out, kernel, pads[i]), ReLU(), MaxPool()]
    return layers + [Flatten()]


def _cnn(in_shape, n_classes, rate, channels, kernel, padding, hidden) -> list[Layer]:
    convs = _convs([in_shape[0], *channels], kernel, padding)
    flat = _shapes(convs, in_shape)[-1][0]
    return convs + _head([flat, *hidden, n_classes], rate)


def _shapes(layers: list[Layer], shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The output shape of every layer for one sample; ValueError if an image shrinks away."""
    out = []
    for layer in layers:
        shape = layer.out_shape(shape)
        if min(shape) < 1:
            raise ValueError(shape)
        out.append(shape)
    return out


# the architectures by name (fedsim/config/catalog.py MODELS): (input shape, classes, [model] config)
# -> the layers
def logreg(in_shape, n_classes, cfg):
    return [Flatten(), *_head([math.prod(in_shape), n_classes], 0.0)]


def mlp(in_shape, n_classes, cfg):
    return [Flatten(), *_head([math.prod(in_shape), cfg.hidden, n_classes], cfg.dropout, False)]


def lenet5(in_shape, n_classes, cfg):
    pad = 2 if in_shape[1] < 32 else 0  # 28x28 inputs padded to LeNet's 32x32
    return _cnn(in_shape, n_classes, cfg.dropout, [6, 16], 5, [pad, 0], [120, 84])


# FedAWE (002) Table 6: 3x3 convs, 32 channels, padding 1
def cnn_svhn(in_shape, n_classes, cfg):
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 32], 3, 1, [128])


def cnn_cifar(in_shape, n_classes, cfg):
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 32], 3, 1, [256, 64])


def cnn_cinic(in_shape, n_classes, cfg):
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 32], 3, 1, [512, 256])


# Wang & Ji (003) Table D.2: 5x5 convs, padding 2
def cnn_fmnist(in_shape, n_classes, cfg):
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 32], 5, 2, [128])


def cnn_cifar_wj(in_shape, n_classes, cfg):
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 64], 5, 2, [512, 128])


# LEAF's FEMNIST CNN (Caldas et al. 2018): 5x5 convs of 32 and 64 channels, "same" padding, 2048 dense
def cnn_femnist(in_shape, n_classes, cfg):
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 64], 5, 2, [2048])


def lstm(in_shape, n_classes, cfg):
    """2-layer LSTM, 16 hidden (FedLaAvg's Sent140 model), reading an image row by row, or a
    text through an embedding of 25 numbers (FedLaAvg's GloVe size) or the given word vectors."""
    layers = _embedding(in_shape, 25)
    width = _shapes(layers, in_shape)[-1][-1] if layers else (
        in_shape[0] * in_shape[2] if len(in_shape) == 3 else in_shape[0])
    return [*layers, LSTM(width, 16, 2), *_head([16, n_classes], cfg.dropout)]


def char_lstm(in_shape, n_classes, cfg):
    """The FedAvg paper's Shakespeare model (LEAF's too): an embedding of 8, two LSTM layers
    of 256, a dense layer to the next character."""
    layers = _embedding(in_shape, 8)
    if not layers:
        raise FedsimError("[model] name = 'char-lstm' reads text (token ids); use it with shakespeare, "
                          "sent140 or a parquet dataset with a text feature")
    return [*layers, LSTM(_shapes(layers, in_shape)[-1][-1], 256, 2), *_head([256, n_classes], cfg.dropout)]


class TokenShape(tuple):
    """The input shape (length,) of token rows, with what an embedding needs: the vocabulary
    size and the fixed word vectors, if any ([model] word_vectors)."""

    def __new__(cls, length: int, vocab_size: int, vectors=None):
        shape = super().__new__(cls, (length,))
        shape.vocab_size, shape.vectors = vocab_size, vectors
        return shape


def _embedding(in_shape, dim: int) -> list[Layer]:
    """[Embedding] for token input (word vectors fix its size), [] for any other input."""
    if not isinstance(in_shape, TokenShape):
        return []
    return [Embedding(in_shape.vocab_size, dim, in_shape.vectors)]


def input_shape(dataset, cfg: ModelConfig) -> tuple[int, ...]:
    """The model's input shape: the dataset's, or for text a TokenShape with the vocabulary
    (and the word vectors of `[model] word_vectors` for its words)."""
    if cfg.word_vectors and not dataset.vocabulary:
        raise FedsimError(f"[model] word_vectors = {cfg.word_vectors!r}: [data] dataset = {dataset.name!r} "
                          "has no word vocabulary (word vectors are for word-level text: sent140, or a "
                          "parquet text feature with tokens = 'words'); leave it empty")
    if not dataset.vocab_size:
        return dataset.shape
    from fedsim.data.text import read_word_vectors

    vectors = read_word_vectors(cfg.word_vectors, list(dataset.vocabulary)) if cfg.word_vectors else None
    return TokenShape(dataset.shape[0], dataset.vocab_size, vectors)


ARCHITECTURES = MODELS
IMAGE_ONLY = frozenset({"resnet18-gn", "lenet5", "cnn-svhn", "cnn-cifar", "cnn-cinic", "cnn-fmnist", "cnn-cifar-wj", "cnn-femnist"})
TEXT_MODELS = ("lstm", "char-lstm")  # the built-ins that read token ids (through an embedding)


def build_model(cfg: ModelConfig, in_shape: tuple[int, ...], n_classes: int, dataset: str,
                seed: int = 0) -> Model | ModuleModel:
    """The `[model]` network: a built-in or plugin factory's layer list, or its nn.Module."""
    factory = MODELS.lookup(cfg.name, "[model] name")
    if not 0 <= cfg.dropout < 1:
        raise FedsimError(f"[model] dropout = {cfg.dropout} must be in [0, 1)")
    if cfg.name == "logreg" and cfg.dropout:
        raise FedsimError(f"[model] dropout = {cfg.dropout}: logreg has no hidden layer to drop "
                          "units of (dropout sits before dense layers that read learned features); "
                          "set dropout = 0 or use mlp")
    if cfg.name == "mlp" and cfg.hidden < 1:
        raise FedsimError(f"[model] hidden = {cfg.hidden} must be >= 1")
    if isinstance(in_shape, TokenShape) and cfg.name in (*IMAGE_ONLY, "logreg", "mlp"):
        raise FedsimError(f"[model] name = {cfg.name!r} cannot read text: [data] dataset = {dataset!r} gives "
                          f"token ids; use {' or '.join(TEXT_MODELS)}")
    if cfg.name in IMAGE_ONLY and len(in_shape) != 3:
        raise FedsimError(
            f"[model] name = {cfg.name!r} needs images; [data] dataset = {dataset!r} has "
            f"vectors of {in_shape}: use logreg, mlp or lstm"
        )
    where = f"[model] name = {cfg.name!r}"
    try:
        built = _call_factory(factory, in_shape, n_classes, cfg, seed, where)
    except ValueError:
        raise FedsimError(
            f"[model] name = {cfg.name!r} needs larger images than [data] dataset = {dataset!r} "
            f"has ({'x'.join(map(str, in_shape[1:]))}); use a smaller model (logreg, mlp, cnn-svhn)"
        ) from None
    if isinstance(built, torch.nn.Module):
        model = ModuleModel(cfg.name, built, in_shape, n_classes, where)
        if cfg.local_buffers and not model.has_buffers:
            raise FedsimError(f"{where}: [model] local_buffers = true, but the module has no buffers (running "
                              "statistics) to keep on the devices; set local_buffers = false")
        model.local_buffers = cfg.local_buffers
    elif isinstance(built, (list, tuple)) and built and all(isinstance(layer, Layer) for layer in built):
        if cfg.local_buffers:
            raise FedsimError(f"{where}: [model] local_buffers = true, but a model of fedsim layers has no "
                              "buffers; set local_buffers = false")
        model = Model(cfg.name, list(built), in_shape)
    else:
        raise FedsimError(f"{where}: the factory returned {_describe(built)}, not a torch.nn.Module or a "
                          "list of fedsim layers; return the model it builds")
    if cfg.train_flops_per_sample:
        model.flops = cfg.train_flops_per_sample / 6  # multiply-adds of a forward pass (3 x forward, 2 per MAC)
    return model


def model_dim(cfg: ModelConfig, in_shape: tuple[int, ...], n_classes: int, seed: int = 0) -> int | None:
    """The floats of the model's state (the flat vector each device trains: trainable parameters
    and buffers), counted with its factory called on the meta device, which allocates nothing:
    how large a model is before it is built. None where the factory cannot build there (it
    reads its tensors' values, or fails: building it for real says why)."""
    factory = MODELS.lookup(cfg.name, "[model] name")
    try:
        with torch.device("meta"):
            built = _call_factory(factory, in_shape, n_classes, cfg, seed, f"[model] name = {cfg.name!r}")
    except (FedsimError, ValueError):
        return None
    if isinstance(built, torch.nn.Module):
        trainable = sum(p.numel() for p in built.parameters() if p.requires_grad)
        return trainable + sum(b.numel() for b in built.buffers())
    if isinstance(built, (list, tuple)) and built and all(isinstance(layer, Layer) for layer in built):
        return sum(q.numel for layer in built for q in layer.params)
    return None


def _call_factory(factory, in_shape, n_classes: int, cfg: ModelConfig, seed: int, where: str):
    """factory(in_shape, n_classes, cfg), its random initialisation seeded by the run's seed."""
    is_class = inspect.isclass(factory)
    fix = ("give a factory `def make(in_shape, n_classes, cfg)` that returns the module" if is_class
           else "fix the factory (it is called with (in_shape, n_classes, model_config))")
    try:
        inspect.signature(factory).bind(in_shape, n_classes, cfg)
    except TypeError as err:
        kind = "a class whose constructor" if is_class else "a function that"
        raise FedsimError(f"{where} is {kind} does not take fedsim's arguments (in_shape, n_classes, "
                          f"model_config): {err}; {fix}") from None
    except ValueError:  # no signature to read (a builtin): let the call decide
        pass
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            return factory(in_shape, n_classes, cfg)
        except FedsimError:
            raise
        except ValueError:
            if not is_class and cfg.name in MODELS:
                raise  # a built-in's images too small: the caller says so
            raise _failed(where, is_class, fix) from None
        except SystemExit as exit:  # the factory would end fedsim without a word
            raise FedsimError(f"{where}: the factory called sys.exit({exit.code!r}) while building the model; "
                              "raise an exception that says what is wrong instead (fedsim shows its first line)") from None
        except Exception:
            raise _failed(where, is_class, fix) from None


def _failed(where: str, is_class: bool, fix: str) -> FedsimError:
    err = sys.exc_info()[1]
    what = (" is a class whose constructor does not take fedsim's arguments (in_shape, n_classes, model_config): "
            "calling it" if is_class else ": building the model")
    return FedsimError(f"{where}{what} failed ({type(err).__name__}: {first_line(err)}); {fix}")


def _describe(obj) -> str:
    if isinstance(obj, (list, tuple)):
        bad = next((x for x in obj if not isinstance(x, Layer)), None)
        return f"a list holding {type(bad).__name__}" if bad is not None else "an empty list"
    return f"{type(obj).__name__} {obj!r}"[:120]
