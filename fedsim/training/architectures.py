"""The built-in models, as ordinary `torch.nn.Module`s (docs/extending.md "The built-in models").

Each architecture is an `nn.Sequential` of named torch layers (`conv1`, `fc1`, ...: the names
model.pt holds), so a user can print it, subclass it, or load a run's model.pt into it with
plain torch. fedsim trains these with its hand-batched kernels (fedsim/training/kernels.py),
chosen by layer type; the modules are the definition.

Initialisation is the built-ins' own, the same in fedsim and outside it: Kaiming-normal
weights (ReLU gain, fan-in) and zero biases for dense and convolutional layers, N(0, 1)
embeddings, U(+-1/sqrt(hidden)) for the LSTM; drawn from torch's global generator in parameter
order, so `torch.manual_seed(s)` before building gives the weights of a run of seed s.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsim.errors import FedsimError


class TokenShape(tuple):
    """The input shape (length,) of token rows, with what an embedding needs: the vocabulary
    size and the fixed word vectors, if any ([model] word_vectors)."""

    def __new__(cls, length: int, vocab_size: int, vectors=None):
        shape = super().__new__(cls, (length,))
        shape.vocab_size, shape.vectors = vocab_size, vectors
        return shape


# --- layers torch does not have ----------------------------------------------------------------

class LastHiddenLSTM(nn.Module):
    """A stacked LSTM that returns the last hidden state of its top layer [B, hidden], reading
    a sequence of vectors [B, T, features], the rows of an image [B, C, H, W] (the C channels'
    rows side by side: H steps of C * W), or a vector [B, features] as one step.

    Parameters per layer i as torch's nn.LSTM names them (`weight_ih_l{i}`, `weight_hh_l{i}`),
    with one bias `bias_l{i}` (nn.LSTM's two biases only ever act as their sum)."""

    def __init__(self, n_in: int, hidden: int, layers: int):
        super().__init__()
        self.hidden, self.layers = hidden, layers
        for i in range(layers):
            self.register_parameter(f"weight_ih_l{i}", nn.Parameter(torch.empty(4 * hidden, n_in if i == 0 else hidden)))
            self.register_parameter(f"weight_hh_l{i}", nn.Parameter(torch.empty(4 * hidden, hidden)))
            self.register_parameter(f"bias_l{i}", nn.Parameter(torch.empty(4 * hidden)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's LSTM initialisation: every tensor U(+-1/sqrt(hidden))."""
        if self.weight_ih_l0.is_meta:
            return  # (a shape without values: nothing to draw)
        bound = 1.0 / math.sqrt(self.hidden)
        for p in self.parameters():
            with torch.no_grad():
                p.copy_((torch.rand(p.numel()) * 2 - 1).mul_(bound).view_as(p))

    def weights(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        return [tuple(getattr(self, f"{k}_l{i}") for k in ("weight_ih", "weight_hh", "bias"))
                for i in range(self.layers)]

    def forward(self, x: Tensor) -> Tensor:
        return last_hidden(self.weights(), as_sequence(x), lstm_cell)


def as_sequence(x: Tensor) -> Tensor:
    """[T, B, features] of one device's batch: image rows, a sequence's steps, or one step."""
    if x.dim() == 4:
        return x.permute(2, 0, 1, 3).flatten(2)
    return x.transpose(0, 1) if x.dim() == 3 else x[None]


def last_hidden(weights: list[tuple[Tensor, Tensor, Tensor]], seq: Tensor,
                cell: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> Tensor:
    """The top layer's last h of a stacked LSTM over seq [T, ..., B, features]. Plain matmuls
    (`@` broadcasts over leading dimensions), so one recurrence serves a device and a cohort
    whose weights carry a leading device dimension."""
    for w_ih, w_hh, b in weights:
        gates_in = seq @ w_ih.mT + b.unsqueeze(-2)  # [T, ..., B, 4H]: every step's input part
        h = c = gates_in.new_zeros(*gates_in.shape[1:-1], w_hh.shape[-1])
        outs = []
        for g_in in gates_in:
            h, c = cell(torch.baddbmm(g_in, h, w_hh.mT) if h.dim() == 3 else g_in + h @ w_hh.mT, c)
            outs.append(h)
        seq = torch.stack(outs)
    return h


def lstm_cell(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """(h, c) of one time step from its gate pre-activations [..., 4H] (torch's i, f, g, o order)."""
    i_g, f_g, c_g, o_g = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f_g) * c + torch.sigmoid(i_g) * torch.tanh(c_g)
    return torch.sigmoid(o_g) * torch.tanh(c), c


class FixedEmbedding(nn.Module):
    """Token ids [..., T] -> fixed word vectors [..., T, dim] (`[model] word_vectors`, as LEAF's
    GloVe embedding): a constant of the model, neither trained, sent nor saved."""

    def __init__(self, vectors):
        super().__init__()
        self.register_buffer("vectors", torch.as_tensor(vectors, dtype=torch.float32), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.embedding(x, self.vectors)


# --- initialisation ----------------------------------------------------------------------------

def init_builtin(module: nn.Module) -> nn.Module:
    """The built-ins' initialisation (module docstring), in place, layer by layer in order.
    A module on the meta device (shapes without values: how large it is) draws nothing."""
    if any(p.is_meta for p in module.parameters()):
        return module
    with torch.no_grad():
        for layer in module.children():
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                fan_in = math.prod(layer.weight.shape[1:])
                layer.weight.copy_((torch.randn(layer.weight.numel()) * math.sqrt(2.0 / fan_in)).view_as(layer.weight))
                layer.bias.zero_()
            elif isinstance(layer, nn.Embedding):
                layer.weight.copy_(torch.randn(layer.weight.numel()).view_as(layer.weight))
            elif isinstance(layer, LastHiddenLSTM):
                layer.reset_parameters()
    return module


def builtin(factory: Callable[..., nn.Sequential]) -> Callable[..., nn.Sequential]:
    """A built-in's factory: torch's own initialisation of each layer drawn and put back, then
    `init_builtin` (the global generator gives it the draws a run of the seed has)."""
    @functools.wraps(factory)
    def build(in_shape, n_classes, cfg) -> nn.Sequential:
        with torch.random.fork_rng(devices=[]):
            module = factory(in_shape, n_classes, cfg)
        return init_builtin(module)

    return build


def sequential(layers: list[tuple[str, nn.Module]]) -> nn.Sequential:
    return nn.Sequential(OrderedDict(layers))


# --- architectures ------------------------------------------------------------------------------

def _head(sizes: list[int], rate: float, learned_input: bool = True) -> list[tuple[str, nn.Module]]:
    """Dense stack sizes[0] -> ... -> sizes[-1] with ReLU between. Dropout goes before every
    dense layer that reads a learned representation (where FedAWE's CINIC-10 CNN has it)."""
    layers: list[tuple[str, nn.Module]] = []
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]), start=1):
        if rate > 0 and (learned_input or i > 1):
            layers.append((f"drop{i}", nn.Dropout(rate)))
        layers.append((f"fc{i}", nn.Linear(n_in, n_out)))
        if i < len(sizes) - 1:
            layers.append((f"relu_fc{i}", nn.ReLU()))
    return layers


def _cnn(in_shape, n_classes, rate, channels, kernel, padding: int | list[int], hidden) -> nn.Sequential:
    """conv-ReLU-maxpool blocks, flatten, then the dense head."""
    pads = padding if isinstance(padding, list) else [padding] * len(channels)
    layers: list[tuple[str, nn.Module]] = []
    c, h, w = in_shape
    for i, (c_in, c_out) in enumerate(zip([c, *channels], channels), start=1):
        layers += [(f"conv{i}", nn.Conv2d(c_in, c_out, kernel, padding=pads[i - 1])),
                   (f"relu{i}", nn.ReLU()), (f"pool{i}", nn.MaxPool2d(2))]
        h, w = (h + 2 * pads[i - 1] - kernel + 1) // 2, (w + 2 * pads[i - 1] - kernel + 1) // 2
        if min(h, w) < 1:
            raise ValueError(in_shape)  # the images shrink away: the caller names a smaller model
    return sequential([*layers, ("flatten", nn.Flatten()),
                       *_head([channels[-1] * h * w, *hidden, n_classes], rate)])


# the architectures by name (fedsim/config/catalog.py MODELS): (input shape, classes, [model] config)
# -> the module
@builtin
def logreg(in_shape, n_classes, cfg) -> nn.Sequential:
    return sequential([("flatten", nn.Flatten()), *_head([math.prod(in_shape), n_classes], 0.0)])


@builtin
def mlp(in_shape, n_classes, cfg) -> nn.Sequential:
    return sequential([("flatten", nn.Flatten()),
                       *_head([math.prod(in_shape), cfg.hidden, n_classes], cfg.dropout, False)])


@builtin
def lenet5(in_shape, n_classes, cfg) -> nn.Sequential:
    pad = 2 if in_shape[1] < 32 else 0  # 28x28 inputs padded to LeNet's 32x32
    return _cnn(in_shape, n_classes, cfg.dropout, [6, 16], 5, [pad, 0], [120, 84])


# FedAWE (002) Table 6: 3x3 convs, 32 channels, padding 1
@builtin
def cnn_svhn(in_shape, n_classes, cfg) -> nn.Sequential:
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 32], 3, 1, [128])


@builtin
def cnn_cifar(in_shape, n_classes, cfg) -> nn.Sequential:
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 32], 3, 1, [256, 64])


@builtin
def cnn_cinic(in_shape, n_classes, cfg) -> nn.Sequential:
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 32], 3, 1, [512, 256])


# Wang & Ji (003) Table D.2: 5x5 convs, padding 2
@builtin
def cnn_fmnist(in_shape, n_classes, cfg) -> nn.Sequential:
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 32], 5, 2, [128])


@builtin
def cnn_cifar_wj(in_shape, n_classes, cfg) -> nn.Sequential:
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 64], 5, 2, [512, 128])


# LEAF's FEMNIST CNN (Caldas et al. 2018): 5x5 convs of 32 and 64 channels, "same" padding, 2048 dense
@builtin
def cnn_femnist(in_shape, n_classes, cfg) -> nn.Sequential:
    return _cnn(in_shape, n_classes, cfg.dropout, [32, 64], 5, 2, [2048])


@builtin
def lstm(in_shape, n_classes, cfg) -> nn.Sequential:
    """2-layer LSTM, 16 hidden (FedLaAvg's Sent140 model), reading an image row by row, or a
    text through an embedding of 25 numbers (FedLaAvg's GloVe size) or the given word vectors."""
    embedding, width = _embedding(in_shape, 25)
    if not embedding:  # image rows (channels side by side) or one vector
        width = in_shape[0] * in_shape[2] if len(in_shape) == 3 else in_shape[0]
    return sequential([*embedding, ("lstm", LastHiddenLSTM(width, 16, 2)), *_head([16, n_classes], cfg.dropout)])


@builtin
def char_lstm(in_shape, n_classes, cfg) -> nn.Sequential:
    """The FedAvg paper's Shakespeare model (LEAF's too): an embedding of 8, two LSTM layers
    of 256, a dense layer to the next character."""
    embedding, width = _embedding(in_shape, 8)
    if not embedding:
        raise FedsimError("[model] name = 'char-lstm' reads text (token ids); use it with shakespeare, "
                          "sent140 or a parquet dataset with a text feature")
    return sequential([*embedding, ("lstm", LastHiddenLSTM(width, 256, 2)), *_head([256, n_classes], cfg.dropout)])


def _embedding(in_shape, dim: int) -> tuple[list[tuple[str, nn.Module]], int]:
    """([("embedding", ...)], its vector size) for token input (word vectors fix the size);
    ([], 0) for any other input."""
    if not isinstance(in_shape, TokenShape):
        return [], 0
    if in_shape.vectors is not None:
        fixed = FixedEmbedding(in_shape.vectors)
        return [("embedding", fixed)], fixed.vectors.shape[1]
    return [("embedding", nn.Embedding(in_shape.vocab_size, dim))], dim


# the factories whose modules fedsim trains with its kernels (fedsim/training/kernels.py)
BUILT_IN = (logreg, mlp, lenet5, cnn_svhn, cnn_cifar, cnn_cinic, cnn_fmnist, cnn_cifar_wj, cnn_femnist,
            lstm, char_lstm)
