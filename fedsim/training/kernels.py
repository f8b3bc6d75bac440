"""fedsim's hand-batched kernels: how the built-in models (fedsim/training/architectures.py)
train, chosen by layer type.

A module made only of layers these kernels know (nn.Flatten, nn.Linear, nn.Conv2d, nn.ReLU,
nn.MaxPool2d(2), nn.Dropout, nn.Embedding, from training rules 7 nn.GELU, nn.Tanh, nn.Sigmoid,
nn.SiLU, nn.LeakyReLU and nn.LayerNorm on vectors, from rules 10 nn.BatchNorm1d and nn.BatchNorm2d
(running statistics as the model's buffers), and the built-ins' LastHiddenLSTM and FixedEmbedding,
in an nn.Sequential, or a class whose forward is a chain of them, from rules 9 with residual
blocks `h + block(h)` in it: `lower_traced`) is lowered
here to a `KernelModel`: a pure function of one flat float32 parameter vector per device.
Each layer applies itself two ways: `__call__` to one device's
batch (evaluation, the loop trainer) and `cohort` to the batches of m devices with stacked
parameters [m, ...] (the batched trainer), written by hand (batched matmuls, one grouped
convolution) rather than with `torch.func.vmap`, which any other module gets
(fedsim/training/modules.py): on a 2-core CPU that is up to 2.3x faster for softmax
regression and the MLP (benchmarks/RESULTS.md, "nn.Module twins"). Dropout randomness comes
from keyed uniforms instead of torch's global generator. `split` gives views of the flat
vector, so training updates it in place. One device's step (the loop trainer) is reverse mode
written out layer by layer (`Layer.backward`, `reverse_step`) with autograd's own kernels: its
numbers, without its graph.

Cohort layouts: vectors are [m, B, features]; images are [B, m, C, H, W], so that a
convolution over the cohort is one grouped convolution with m groups on the view
[B, m * C, H, W] (no copies between the layers of a CNN).
"""

from __future__ import annotations

import math
import operator
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from fedsim.errors import FedsimError, first_line
from fedsim.training import rng
from fedsim.training import rules as training_rules
from fedsim.training.architectures import FixedEmbedding, LastHiddenLSTM, as_sequence, last_hidden, lstm_cell
from fedsim.training.losses import StepFn, StepLoss, weighted_cross_entropy


@dataclass
class Param:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Layer:
    """One layer of a model, on one device (`__call__`) and on a cohort (`cohort`)."""

    params: tuple[Param, ...] = ()  # (name, shape) of each parameter, in the module's order
    buffers: tuple[Param, ...] = ()  # (name, shape) of each buffer (running statistics), in the module's order
    dropout: int = 0  # dropout uniforms this layer consumes per sample
    writes_backward = False  # has `forward_saving` and `backward` (`reverse_step`)

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

    def forward_saving(self, p: dict[str, Tensor], x: Tensor, u: Tensor | None) -> tuple[Tensor, object]:
        """The layer on one device, as `__call__`, and what its `backward` reads."""
        raise NotImplementedError

    def backward(self, p: dict[str, Tensor], grad: Tensor, saved, input_grad: bool) \
            -> tuple[Tensor | None, tuple[Tensor, ...]]:
        """The gradients of the layer's input (None unless `input_grad`) and of its parameters,
        from its output's gradient: the kernels, operands and order of autograd's own backward
        of `__call__`, so that `reverse_step` gives reverse mode's numbers bit for bit."""
        raise NotImplementedError


class Dense(Layer):
    """Fully connected: `name.weight` [n_out, n_in] (Kaiming init) and `name.bias`."""

    def __init__(self, name: str, n_in: int, n_out: int):
        self.w, self.b = f"{name}.weight", f"{name}.bias"
        self.params = (Param(self.w, (n_out, n_in)), Param(self.b, (n_out,)))

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

    writes_backward = True

    def forward_saving(self, p, x, u):
        return self(p, x, u), x

    def backward(self, p, grad, x, input_grad):  # addmm's: the weight's as (grad^T x), its input's grad W
        return grad.mm(p[self.w]) if input_grad else None, (grad.t().mm(x), grad.sum(0))


class Conv(Layer):
    """2-d convolution, square `kernel`, stride 1, `padding` on each side; `name.weight`
    [c_out, c_in, kernel, kernel] and `name.bias`."""

    def __init__(self, name: str, c_in: int, c_out: int, kernel: int, padding: int):
        self.w, self.b, self.k, self.pad = f"{name}.weight", f"{name}.bias", kernel, padding
        self.params = (Param(self.w, (c_out, c_in, kernel, kernel)), Param(self.b, (c_out,)))

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

    writes_backward = True

    def forward_saving(self, p, x, u):
        return self(p, x, u), x

    def backward(self, p, grad, x, input_grad):
        w = p[self.w]
        dx, dw, db = torch.ops.aten.convolution_backward(grad, x, w, [w.shape[0]], [1, 1], [self.pad] * 2, [1, 1],
                                                         False, [0, 0], 1, [input_grad, True, True])
        return dx, (dw, db)


class ReLU(Layer):
    """max(x, 0)."""

    writes_backward = True

    def __call__(self, p, x, u):
        return torch.relu(x)

    def forward_saving(self, p, x, u):
        out = torch.relu(x)
        return out, out

    def backward(self, p, grad, out, input_grad):
        return torch.ops.aten.threshold_backward(grad, out, 0), ()


class Activation(Layer):
    """An elementwise activation other than ReLU: GELU (either approximation), tanh, sigmoid,
    SiLU, leaky ReLU from training rules 7; ELU, CELU, SELU, softplus, Mish, hardswish,
    hardsigmoid, hardtanh and ReLU6 from rules 8. Its backward is the kernel autograd runs for it
    (aten's `*_backward`), reading what autograd saves (the input, or for tanh and sigmoid the
    output), so `reverse_step` keeps reverse mode's numbers bit for bit."""

    writes_backward = True

    def __init__(self, kind: str, forward: Callable[[Tensor], Tensor],
                 backward: Callable[[Tensor, Tensor], Tensor], reads_output: bool):
        self.kind, self._forward, self._backward, self.reads_output = kind, forward, backward, reads_output

    def __call__(self, p, x, u):
        return self._forward(x)

    def forward_saving(self, p, x, u):
        out = self._forward(x)
        return out, out if self.reads_output else x

    def backward(self, p, grad, saved, input_grad):
        return self._backward(grad, saved), ()


SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946  # (ATen's)


def activation(layer: nn.Module, rules: int = training_rules.CURRENT) -> Activation | None:
    """The kernel of an activation module other than nn.ReLU under training `rules`, or None."""
    aten = torch.ops.aten
    kind = type(layer)
    if rules >= 8 and not getattr(layer, "inplace", False):  # (in place, autograd saves the output instead)
        if (elu := _elu_family(layer)) is not None:
            return elu
        if kind is nn.Softplus:
            beta, threshold = layer.beta, layer.threshold
            return Activation(f"Softplus {beta} {threshold}", lambda x: F.softplus(x, beta, threshold),
                              lambda g, x: aten.softplus_backward(g, x, beta, threshold), False)
        simple = {nn.Mish: (F.mish, aten.mish_backward), nn.Hardswish: (F.hardswish, aten.hardswish_backward),
                  nn.Hardsigmoid: (F.hardsigmoid, aten.hardsigmoid_backward)}
        if kind in simple:
            forward, backward = simple[kind]
            return Activation(kind.__name__, forward, backward, False)
        if kind in (nn.Hardtanh, nn.ReLU6):  # (ReLU6 is hardtanh between 0 and 6)
            low, high = layer.min_val, layer.max_val
            return Activation(f"Hardtanh {low} {high}", lambda x: F.hardtanh(x, low, high),
                              lambda g, x: aten.hardtanh_backward(g, x, low, high), False)
    if rules < 7:
        return None
    if kind is nn.GELU:
        approximate = layer.approximate
        return Activation(f"GELU {approximate}", lambda x: F.gelu(x, approximate=approximate),
                          lambda g, x: aten.gelu_backward(g, x, approximate=approximate), False)
    if kind is nn.Tanh:
        return Activation("Tanh", torch.tanh, aten.tanh_backward, True)
    if kind is nn.Sigmoid:
        return Activation("Sigmoid", torch.sigmoid, aten.sigmoid_backward, True)
    if kind is nn.SiLU and not layer.inplace:  # (in place, autograd's backward reads a changed input)
        return Activation("SiLU", F.silu, aten.silu_backward, False)
    if kind is nn.LeakyReLU and layer.negative_slope > 0:  # (in place or not: the same signs)
        slope = layer.negative_slope
        return Activation(f"LeakyReLU {slope}", lambda x: F.leaky_relu(x, slope),
                          lambda g, x: aten.leaky_relu_backward(g, x, slope, False), False)
    return None


def _elu_family(layer: nn.Module) -> Activation | None:
    """ELU, CELU and SELU: torch computes each as `elu(x, alpha, scale, input_scale)`, and
    autograd differentiates it with `elu_backward` on the input."""
    kind = type(layer)
    if kind is nn.ELU:
        alpha, scale, input_scale = layer.alpha, 1.0, 1.0
    elif kind is nn.CELU:
        alpha, scale, input_scale = layer.alpha, 1.0, 1.0 / layer.alpha
    elif kind is nn.SELU:
        alpha, scale, input_scale = SELU_ALPHA, SELU_SCALE, 1.0
    else:
        return None
    elu, backward = torch.ops.aten.elu, torch.ops.aten.elu_backward
    return Activation(f"ELU {alpha} {scale} {input_scale}", lambda x: elu(x, alpha, scale, input_scale),
                      lambda g, x: backward(g, alpha, scale, input_scale, False, x), False)


class LayerNorm(Layer):
    """nn.LayerNorm over vectors, with its weight and bias (from training rules 7); one device's
    forward and backward are aten's `native_layer_norm` and its backward, as autograd's."""

    writes_backward = True

    def __init__(self, name: str, features: int, eps: float):
        self.params = (Param(f"{name}.weight", (features,)), Param(f"{name}.bias", (features,)))
        self.shape, self.eps = [features], eps

    def _affine(self, p: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return p[self.params[0].name], p[self.params[1].name]

    def __call__(self, p, x, u):
        return F.layer_norm(x, self.shape, *self._affine(p), self.eps)

    def cohort(self, p, x, u):
        return self.cohort_saving(*self._affine(p), x)[0]

    def forward_saving(self, p, x, u):
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, self.shape, *self._affine(p), self.eps)
        return out, (x, mean, rstd)

    def backward(self, p, grad, saved, input_grad):
        x, mean, rstd = saved
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(grad, x, self.shape, mean, rstd, *self._affine(p),
                                                               [input_grad, True, True])
        return dx, (dw, db)

    def cohort_saving(self, weight: Tensor, bias: Tensor, x: Tensor) -> tuple[Tensor, tuple]:
        """The cohort form (x [m, B, F], weight and bias [m, F]) and what `cohort_backward` reads."""
        normal, mean, rstd = torch.ops.aten.native_layer_norm(x, self.shape, None, None, self.eps)
        return torch.addcmul(bias.unsqueeze(1), normal, weight.unsqueeze(1)), (x, normal, mean, rstd)

    def cohort_backward(self, weight: Tensor, grad: Tensor, saved: tuple) -> tuple[Tensor, Tensor, Tensor]:
        """The gradients of the cohort form's input, weight and bias from its output's."""
        x, normal, mean, rstd = saved
        dx = torch.ops.aten.native_layer_norm_backward(grad * weight.unsqueeze(1), x, self.shape, mean, rstd, None,
                                                       None, [True, False, False])[0]
        return dx, (grad * normal).sum(dim=1), grad.sum(dim=1)


class BatchNorm(Layer):
    """nn.BatchNorm1d on vectors and nn.BatchNorm2d on images, with a weight, a bias and running
    statistics updated with a momentum (from training rules 10): in training each batch is
    normalised by its own mean and variance per feature (channel), and the running mean and
    variance move towards them in place (`num_batches_tracked` counts the steps); evaluation
    (`inference`) reads the running ones. One device's forward and backward are aten's
    `native_batch_norm` and its backward, as autograd's; a cohort's computes each device's
    statistics over its own batch."""

    writes_backward = True

    def __init__(self, name: str, features: int, eps: float, momentum: float, on_vectors: bool):
        self.params = (Param(f"{name}.weight", (features,)), Param(f"{name}.bias", (features,)))
        self.buffers = (Param(f"{name}.running_mean", (features,)), Param(f"{name}.running_var", (features,)),
                        Param(f"{name}.num_batches_tracked", ()))
        self.name, self.eps, self.momentum = name, eps, momentum
        self.on_vectors = on_vectors  # (a BatchNorm1d: a feature normalised over the batch's samples alone)

    def _state(self, p: dict[str, Tensor]) -> list[Tensor]:
        return [p[q.name] for q in (*self.params, *self.buffers)]

    def __call__(self, p, x, u):
        return self.forward_saving(p, x, u)[0]

    def forward_saving(self, p, x, u):
        weight, bias, mean, var, steps = self._state(p)
        out, batch_mean, rstd = torch.ops.aten.native_batch_norm(x, weight, bias, mean, var, True, self.momentum,
                                                                 self.eps)
        steps.add_(1.0)
        return out, (x, mean, var, batch_mean, rstd)

    def backward(self, p, grad, saved, input_grad):
        x, mean, var, batch_mean, rstd = saved
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(grad, x, p[self.params[0].name], mean, var, batch_mean,
                                                               rstd, True, self.eps, [input_grad, True, True])
        return dx, (dw, db)

    def cohort(self, p, x, u):
        """m devices' batches: vectors [m, B, F], images [B, m, C, H, W]; parameters and statistics [m, F]."""
        weight, bias, mean, var, steps = self._state(p)
        over, at = _per_feature(x)
        batch_var, batch_mean = torch.var_mean(x, dim=over, correction=0)
        out = (x - at(batch_mean)) * at(torch.rsqrt(batch_var + self.eps)) * at(weight) + at(bias)
        n = x.numel() // batch_mean.numel()  # values per device and feature
        with torch.no_grad():
            mean.mul_(1.0 - self.momentum).add_(batch_mean, alpha=self.momentum)
            var.mul_(1.0 - self.momentum).add_(batch_var * (n / max(n - 1, 1)), alpha=self.momentum)
            steps.add_(1.0)
        return out

    def inference(self) -> Layer:
        """The layer as evaluation applies it: normalised by the running statistics."""
        return _BatchNormInference(self)


def _per_feature(x: Tensor) -> tuple[tuple[int, ...], Callable[[Tensor], Tensor]]:
    """For a cohort's batches x (vectors [m, B, F], images [B, m, C, H, W]): the dimensions a
    device's feature (channel) spans, and how its [m, F] values broadcast over x."""
    if x.dim() == 3:
        return (1,), lambda t: t.unsqueeze(1)
    return (0, 3, 4), lambda t: t[None, :, :, None, None]


class _BatchNormInference(Layer):
    """A BatchNorm layer in evaluation: `(x - running mean) / sqrt(running var + eps) * weight + bias`."""

    def __init__(self, layer: BatchNorm):
        self.layer, self.params, self.buffers = layer, layer.params, layer.buffers
        self.kind = "BatchNorm"

    def __call__(self, p, x, u):
        weight, bias, mean, var, _ = self.layer._state(p)
        return F.batch_norm(x, mean, var, weight, bias, False, 0.0, self.layer.eps)

    def cohort(self, p, x, u):
        weight, bias, mean, var, _ = self.layer._state(p)
        at = _per_feature(x)[1]
        return (x - at(mean)) * at(torch.rsqrt(var + self.layer.eps)) * at(weight) + at(bias)


class Residual(Layer):
    """x + block(x): a chain of kernels `layers` whose output has its input's shape, added to
    that input (from training rules 9, read from a class's forward: `h + F.relu(self.fc(h))`).
    Its backward is autograd's: the output's gradient back through the block, plus itself
    for the identity (a sum of two, the same bits in either order)."""

    def __init__(self, layers: list[Layer]):
        self.layers = layers
        self.params = tuple(q for layer in layers for q in layer.params)
        self.buffers = tuple(q for layer in layers for q in layer.buffers)
        self.dropout = sum(layer.dropout for layer in layers)
        self.writes_backward = all(layer.writes_backward for layer in layers)
        self.kind = f"Residual[{', '.join(map(kind, layers))}]"

    def _each(self, u: Tensor | None):
        """Each layer of the block with the dropout uniforms it consumes."""
        used = 0
        for layer in self.layers:
            yield layer, None if u is None or not layer.dropout else u[..., used:used + layer.dropout]
            used += layer.dropout

    def __call__(self, p, x, u):
        y = x
        for layer, mine in self._each(u):
            y = layer(p, y, mine)
        return x + y

    def cohort(self, p, x, u):
        y = x
        for layer, mine in self._each(u):
            y = layer.cohort(p, y, mine)
        return x + y

    def flops(self, shape):
        return sum(layer.flops(s) for layer, s in zip(self.layers, [shape, *_shapes(self.layers, shape)]))

    def forward_saving(self, p, x, u):
        y, saved = x, []
        for layer, mine in self._each(u):
            y, keep = layer.forward_saving(p, y, mine)
            saved.append(keep)
        return x + y, saved

    def backward(self, p, grad, saved, input_grad):
        block, grads = grad, []
        for i in range(len(self.layers) - 1, -1, -1):
            block, own = self.layers[i].backward(p, block, saved[i], i > 0 or input_grad)
            grads[:0] = own
        return block + grad if input_grad else None, tuple(grads)


def _inference(layers: list[Layer]) -> list[Layer]:
    """`layers` as evaluation applies them: without dropout (a no-op there), BatchNorm on its
    running statistics (in residual blocks too)."""
    out: list[Layer] = []
    for layer in layers:
        if isinstance(layer, Residual):
            out.append(Residual(_inference(layer.layers)))
        elif isinstance(layer, BatchNorm):
            out.append(layer.inference())
        elif not isinstance(layer, Dropout):
            out.append(layer)
    return out


def flat_layers(layers: list[Layer]) -> list[Layer]:
    """`layers` with each residual block's own layers in its place."""
    return [inner for layer in layers for inner in (flat_layers(layer.layers) if isinstance(layer, Residual)
                                                     else [layer])]


def kind(layer: Layer) -> str:
    """A layer's kernel, as the keys of shared calls and shared evaluations tell them apart."""
    return getattr(layer, "kind", type(layer).__name__)


class MaxPool(Layer):
    """2x2 max pooling, stride 2: [c, h, w] -> [c, h // 2, w // 2]. Without autograd (evaluation)
    as `pool_max`: the same numbers, ~6x faster on a CPU; in training on a CPU as
    `MaxPoolChannelsLast`: the same numbers and gradients, 3x faster for a CNN's first pool."""

    def out_shape(self, shape):
        c, h, w = shape
        return (c, h // 2, w // 2)

    def __call__(self, p, x, u):
        return max_pool_2x2(x) if torch.is_grad_enabled() else pool_max(x)

    def cohort(self, p, x, u):
        if not torch.is_grad_enabled():
            return pool_max(x)
        return max_pool_2x2(x.flatten(1, 2)).unflatten(1, x.shape[1:3])

    writes_backward = True

    def forward_saving(self, p, x, u):
        out, indices = _pool_channels_last(x) if x.device.type == "cpu" else \
            torch.ops.aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
        return out, (x, indices)

    def backward(self, p, grad, saved, input_grad):
        return _pool_backward(grad, *saved), ()


def max_pool_2x2(x: Tensor) -> Tensor:
    """max_pool2d(x, 2) of a batch [B, C, H, W] for training: on a CPU through the channels-last
    kernel (`MaxPoolChannelsLast`), elsewhere as it is."""
    return MaxPoolChannelsLast.apply(x) if x.device.type == "cpu" else F.max_pool2d(x, 2)


_WINDOW_2X2 = ([2, 2], [2, 2], [0, 0], [1, 1], False)  # kernel, stride, padding, dilation, ceil_mode


def _pool_channels_last(x: Tensor, window: tuple = _WINDOW_2X2) -> tuple[Tensor, Tensor]:
    """max_pool2d_with_indices of [B, C, H, W] over `window` computed on a channels-last copy:
    the same output and indices, in the default layout."""
    out, indices = torch.ops.aten.max_pool2d_with_indices(x.contiguous(memory_format=torch.channels_last), *window)
    return out.contiguous(), indices.contiguous()


def _pool_backward(grad: Tensor, x: Tensor, indices: Tensor, window: tuple = _WINDOW_2X2) -> Tensor:
    return torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, *window, indices)


class MaxPoolChannelsLast(torch.autograd.Function):
    """2x2 max pooling whose forward runs on a channels-last copy of its input: on a CPU, torch's
    max_pool2d with indices over [B, C, H, W] in the default layout scans one window at a time
    (1.3 ms of a 9 ms cnn-fmnist step for its first pool, a quarter of the step), while its
    channels-last kernel vectorises over the channels (a copy there and back included, 3x
    faster; benchmarks/RESULTS.md, "The loop's convolutional step"). The output and the
    indices are those of the default layout's kernel element for element (both take a window's
    first largest value), and the backward is that kernel's backward with them: a model's
    numbers do not change."""

    @staticmethod
    def forward(ctx, x: Tensor, window: tuple = _WINDOW_2X2) -> Tensor:
        out, indices = _pool_channels_last(x, window)
        ctx.save_for_backward(x, indices)
        ctx.window = window
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _pool_backward(grad, *ctx.saved_tensors, ctx.window), None


def max_pool2d_channels_last(x: Tensor, kernel_size, stride=None, padding=0, dilation=1,
                             ceil_mode: bool = False) -> Tensor:
    """`F.max_pool2d` of a CPU batch [B, C, H, W] with any window, through `MaxPoolChannelsLast`:
    the same output and input gradient (a module's own pooling on the loop trainer)."""
    pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
    window = (pair(kernel_size), pair(kernel_size if stride is None or stride == [] else stride), pair(padding),
              pair(dilation), bool(ceil_mode))
    return MaxPoolChannelsLast.apply(x, window)


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

    writes_backward = True

    def forward_saving(self, p, x, u):
        return x.flatten(1), x.shape

    def backward(self, p, grad, shape, input_grad):
        return grad.reshape(shape), ()


class Dropout(Layer):
    """Inverted dropout driven by the uniforms `u` [B, features] (None at evaluation): a sample's
    features, or an image's values in their order (C, H, W)."""

    def __init__(self, features: int, rate: float):
        self.dropout, self.rate = features, rate

    def __call__(self, p, x, u):
        if u is None:
            return x
        return x * (u.view(x.shape) >= self.rate).to(x.dtype) / (1.0 - self.rate)

    def cohort(self, p, x, u):
        if u is not None and x.dim() == 5:  # images [B, m, C, H, W]; the uniforms are [m, B, C * H * W]
            u = u.transpose(0, 1).reshape(x.shape)
        return self(p, x, u)

    writes_backward = True

    def forward_saving(self, p, x, u):
        keep = (u.view(x.shape) >= self.rate).to(x.dtype)
        return x * keep / (1.0 - self.rate), keep

    def backward(self, p, grad, keep, input_grad):  # the division's backward, then the product's
        return grad / (1.0 - self.rate) * keep, ()


class LogSoftmax(Layer):
    """log softmax over the classes (a module that returns log-probabilities: the loss's own
    log softmax then leaves them as they are, up to rounding)."""

    writes_backward = True

    def __call__(self, p, x, u):
        return torch.log_softmax(x, -1)

    def forward_saving(self, p, x, u):
        out = torch.log_softmax(x, -1)
        return out, out

    def backward(self, p, grad, out, input_grad):
        return torch.ops.aten._log_softmax_backward_data(grad, out, out.dim() - 1, out.dtype), ()


class Embedding(Layer):
    """Token ids [..., T] -> vectors [..., T, dim]: a learned table `name.weight` (nn.Embedding),
    or fixed word vectors (FixedEmbedding: a constant of the model, neither trained nor sent)."""

    def __init__(self, name: str, vocab_size: int, dim: int, vectors: Tensor | None = None):
        self.fixed, self.w, self.dim = vectors, f"{name}.weight", dim
        self.params = () if vectors is not None else (Param(self.w, (vocab_size, dim)),)
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
    """architectures.LastHiddenLSTM: the same recurrence (`last_hidden`) on one device's batch
    and, with the weights' leading device dimension, on a cohort's."""

    def __init__(self, name: str, n_in: int, hidden: int, layers: int):
        self.hidden, self.layers = hidden, layers
        self.cell = lstm_cell  # `fuse` swaps in the compiled one (a GPU's run)
        self.names = [tuple(f"{name}.{k}_l{i}" for k in ("weight_ih", "weight_hh", "bias")) for i in range(layers)]
        self.params = tuple(
            Param(f"{name}.{kind}_l{i}", shape)
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
        return last_hidden(self._weights(p), as_sequence(x), self.cell)

    def cohort(self, p, x, u):
        # [T, m, B, features] from images [B, m, C, H, W], sequences [m, B, T, features] or vectors [m, B, features]
        seq = {5: lambda: x.permute(3, 1, 0, 2, 4).flatten(3), 4: lambda: x.permute(2, 0, 1, 3)}.get(x.dim(), lambda: x[None])
        return last_hidden(self._weights(p), seq(), self.cell)

    def _weights(self, p: dict[str, Tensor]) -> list[tuple[Tensor, Tensor, Tensor]]:
        return [tuple(p[n] for n in names) for names in self.names]

    def fuse(self) -> None:
        """On a GPU: the cell's pointwise arithmetic as fused kernels (torch.compile), forward
        and backward, instead of a dozen launches per time step and layer."""
        self.cell = fused_lstm_cell


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


def convolutions_loop(code: str) -> str:
    """Why `auto` trains convolutions on a CPU on the loop (`cohort_slow_on_cpu`)."""
    return f"convolutions on {code} on a CPU, where a loop of them is faster than one grouped convolution"


class KernelModel:
    """A module lowered to kernels (`lower`), behind fedsim's Model protocol (fedsim/training/models.py)."""

    code = loop_code = "fedsim's kernels"
    local_buffers = False  # [model] local_buffers (set by build_model)
    stacks_evaluation = True  # `predict_together`: several runs' parameters on one test set
    func_steps = False  # hand-batched kernels: calls above the crossover take every thread
    plain_loop_step = False  # its loop step is the kernels' (the batched call's arithmetic, device by device)
    rules = training_rules.CURRENT  # the training rules the run started under (fedsim/training/rules.py)

    def __init__(self, name: str, module: nn.Module, layers: list[Layer], in_shape: tuple[int, ...]):
        self.name, self.module, self.layers, self.in_shape = name, module, layers, in_shape
        self.params = [q for layer in layers for q in layer.params]
        self.buffers = [q for layer in layers for q in layer.buffers]  # (BatchNorm's: from training rules 10)
        self.names = [q.name for q in (*self.params, *self.buffers)]  # the flat state's tensors, in order
        self.param_dim = sum(q.numel for q in self.params)
        self.dim = self.param_dim + sum(q.numel for q in self.buffers)  # the flat state: parameters, then buffers
        self.has_buffers = bool(self.buffers)
        # a BatchNorm layer normalises a sample by its batch's statistics: never pad a batch
        self.batch_statistics = any(isinstance(layer, BatchNorm) for layer in flat_layers(layers))
        self.samples_independent = not self.batch_statistics  # (else every layer reads its own sample only)
        self.dropout_features = sum(layer.dropout for layer in layers)
        self._no_draws: dict[tuple, Tensor] = {}  # (shape, device) -> the empty dropout draw
        # a CPU's cohort convolution (one grouped convolution) is slower than a loop of ordinary ones
        convolutions = any(isinstance(layer, Conv) for layer in flat_layers(layers))
        self.cohort_slow_on_cpu = convolutions_loop(self.code) if convolutions else ""
        self.draws_randomness = bool(self.dropout_features)
        # softmax regression (Flatten, Dense): the batched trainer has its gradient in closed form,
        # and from training rules 3 so has a stack of dense layers with ReLUs between them (from
        # rules 7 any activation with a kernel)
        self.is_linear = isinstance(layers[-1], Dense) and all(isinstance(l, Flatten) for l in layers[:-1])
        self.dense_stack = _dense_stack(layers)
        # a cohort's step of vector layers by reverse mode (no closed form: residual blocks, a last log softmax)
        self.reverse_mode_cohort = self.dense_stack is None and all(
            isinstance(layer, (Flatten, Dense, ReLU, Activation, LayerNorm, Dropout, LogSoftmax, BatchNorm))
            for layer in flat_layers(layers))
        shapes = _shapes(layers, in_shape)
        # layer outputs per sample (a residual block's own layers' too)
        self.activations = sum(map(math.prod, shapes)) + sum(
            math.prod(s) for layer, shape in zip(layers, [in_shape, *shapes]) if isinstance(layer, Residual)
            for s in _shapes(layer.layers, shape))
        # training and evaluation apply a ReLU before a max pool after it: they commute exactly,
        # forward and backward (the pool's window maximum is the same element either way, and
        # the ReLU passes its gradient exactly where that maximum is positive), and the ReLU
        # then reads a quarter of the values; evaluation also leaves dropout (a no-op there) out
        self.train_layers = _pool_first(layers)
        self.inference_layers = _inference(self.train_layers)
        # multiply-adds of one sample's forward pass: what the thread policy sizes a call by
        self.flops = sum(layer.flops(shape) for layer, shape in zip(layers, [in_shape, *shapes]))
        self.train_flops = 3 * self.flops  # forward and backward (the device clock)

    def split(self, flat: Tensor) -> tuple[Tensor, ...]:
        """Views of flat parameters [..., d] as the model's tensors [..., *shape], in order.

        Views, not copies: an optimizer step on them updates the flat vector in place."""
        lead, tensors = flat.shape[:-1], [*self.params, *self.buffers]
        chunks = flat.split([q.numel for q in tensors], dim=-1)
        return tuple(c.view((*lead, *q.shape)) for q, c in zip(tensors, chunks))

    def trained_in_place(self, ws: tuple[Tensor, ...]) -> ContextManager[tuple[Tensor, ...]]:
        """A device's loop steps update its views `ws` themselves (the kernels read them as they are)."""
        return nullcontext(ws)

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """The named views of flat [..., d] vectors (state_dict naming)."""
        return dict(zip(self.names, self.split(flat)))

    def forward(self, params: tuple[Tensor, ...], x: Tensor, u: Tensor | None = None) -> Tensor:
        """Logits [B, C] of inputs x [B, *in_shape] for the tensors `params` (as `split` gives
        them); u [B, dropout_features] or None (no dropout)."""
        p = dict(zip(self.names, params))
        used = 0
        for layer in self.train_layers:
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
        p = dict(zip(self.names, params))
        if x.dim() == 5 and isinstance(self.layers[0], Flatten):  # [m, B, C * H * W]: no copy
            x = x.flatten(2)
        elif x.dim() == 5:  # images: [B, m, C, H, W], the cohort layout, contiguous (convolutions
            x = x.transpose(0, 1).contiguous()  # on a strided input are ~3x slower on a CPU)
        used = 0
        for layer in self.train_layers:
            x = layer.cohort(p, x, u[..., used:used + layer.dropout])
            used += layer.dropout
        return x

    def step_fn(self, loss: StepLoss, batched: bool) -> StepFn:
        """(tensors as `split` gives them, x, y, weight, dropout uniforms) -> (gradients, losses);
        `batched`: every input has a leading device dimension."""
        if batched and loss is weighted_cross_entropy and self.dense_stack is not None and \
                (self.is_linear or self.rules >= 3):
            return dense_cohort_step(self.dense_stack)
        trainable = len(self.params)  # (the buffers after them change in place)
        if batched:
            return autograd_step(self.cohort_forward, loss, trainable)
        if loss is weighted_cross_entropy and all(layer.writes_backward for layer in self.train_layers):
            return reverse_step(self.names, self.train_layers)
        return autograd_step(lambda ps, x, u: self.forward(ps, x, u if u.shape[-1] else None), loss, trainable)

    def batch_problem(self) -> str:
        return ""  # every kernel has its cohort form

    def check_trains_on(self, batch: int) -> None:
        """FedsimError where a training forward of `batch` samples cannot run: a BatchNorm1d on
        one sample (no variance to normalise by; torch raises)."""
        norm = next((layer for layer in flat_layers(self.layers) if isinstance(layer, BatchNorm) and layer.on_vectors),
                    None)
        if batch == 1 and norm is not None:
            raise FedsimError(f"[model] name = {self.name!r}: its BatchNorm1d {norm.name!r} cannot train on a "
                              "minibatch of one sample (one value per feature has no variance; torch raises); set "
                              "[client] batch_size >= 2")

    def shared_key(self) -> tuple:
        """What runs with this architecture must share to train in one call (nothing more)."""
        return (self.name, tuple(map(kind, self.layers)), self.dropout_features)

    def evaluation_key(self) -> tuple:
        """What runs must share to be evaluated in one call (with one test set)."""
        layers = tuple((kind(layer), getattr(layer, "pad", None)) for layer in self.layers)
        return (self.name, tuple(self.in_shape), layers, tuple((q.name, q.shape) for q in self.params))

    def fuse(self) -> None:
        """On a GPU with `[client] compile`: the LSTM cells compiled."""
        for layer in flat_layers(self.layers):
            if isinstance(layer, LSTM):
                layer.fuse()

    def to(self, device: torch.device) -> KernelModel:
        return self  # the parameters live in the flat vectors; fixed word vectors move on use

    def init(self, seed: int) -> Tensor:
        """The parameters and buffers the factory built (its initialisation seeded by the run's seed)."""
        # (by name: a module's own order may not be its layers')
        own = dict(self.module.named_parameters()) | dict(self.module.named_buffers())
        return torch.cat([own[name].detach().reshape(-1).float() for name in self.names])

    def state_dict(self, flat: Tensor) -> dict[str, Tensor]:
        """The module's state_dict, in its order: a buffer in its own dtype (BatchNorm's step count an
        integer)."""
        views = self.unflatten(flat)
        own = self.module.state_dict(keep_vars=True)
        return {k: views[k].detach().cpu().to(v.dtype).clone() for k, v in own.items()}

    def load_state_dict(self, saved: dict[str, Tensor]) -> Tensor:
        return torch.cat([saved[name].reshape(-1).float() for name in self.names])

    def randomness(self, seed: int, rnd: int, ids: Tensor, step: int | range, batch: int, own=None) -> Tensor:
        """A local step's dropout uniforms [m, batch, dropout_features] ([S, m, ...] for a range of
        S steps; empty without dropout: one tensor for every step, so that a shared call stacks it
        once); each sample's own, so a device's samples take theirs whatever the padding (`own`
        is not needed)."""
        lead = (len(step), len(ids)) if isinstance(step, range) else (len(ids),)
        if not self.dropout_features:
            shape = (*lead, batch, 0)
            if (shape, ids.device) not in self._no_draws:
                self._no_draws[shape, ids.device] = torch.empty(shape, device=ids.device)
            return self._no_draws[shape, ids.device]
        return rng.uniform(seed, rng.DROPOUT, rnd, ids, step, batch * self.dropout_features).view(
            *lead, batch, self.dropout_features)

    def dropout_numbers(self, batch: int) -> int:
        return batch * self.dropout_features


def _dense_stack(layers: list[Layer]) -> tuple[tuple[LayerNorm | None, Layer, float | None], ...] | None:
    """For a model that is (Flatten,) Dense, then (LayerNorm?, activation, Dropout?, Dense) any
    number of times: each hidden layer's LayerNorm (None: none), activation (a ReLU, or from
    training rules 7 another `Activation`) and the dropout rate after it (None: no dropout layer),
    as `dense_cohort_step` takes them; else None."""
    rest = layers[isinstance(layers[0], Flatten):]
    if not rest or not isinstance(rest[0], Dense):
        return None
    hidden, i = [], 1
    while i < len(rest):
        norm = rest[i] if isinstance(rest[i], LayerNorm) else None
        i += norm is not None
        if i >= len(rest) or not isinstance(rest[i], (ReLU, Activation)):
            return None
        rate = rest[i + 1].rate if i + 1 < len(rest) and isinstance(rest[i + 1], Dropout) else None
        hidden.append((norm, rest[i], rate))
        i += 1 if rate is None else 2
        if i >= len(rest) or not isinstance(rest[i], Dense):
            return None
        i += 1
    return tuple(hidden)


def _pool_first(layers: list[Layer]) -> list[Layer]:
    """The layers with a ReLU before a max pool moved after it."""
    order: list[Layer] = []
    for layer in layers:
        if isinstance(layer, MaxPool) and order and isinstance(order[-1], ReLU):
            order.insert(-1, layer)
        else:
            order.append(layer)
    return order


def _shapes(layers: list[Layer], shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The output shape of every layer for one sample."""
    out = []
    for layer in layers:
        shape = layer.out_shape(shape)
        out.append(shape)
    return out


# --- lowering a module ---------------------------------------------------------------------------

def lower(name: str, module: nn.Module, in_shape: tuple[int, ...],
          rules: int = training_rules.CURRENT) -> KernelModel | None:
    """The kernels of an nn.Sequential whose every layer has one (see the module docstring), as
    the layer is configured (stride-1 square convolutions with symmetric zero padding and a bias,
    2x2 pooling, dense layers with a bias, dropout on vectors, and from training rules 4 on
    images, log softmax); None for any other module."""
    if not isinstance(module, nn.Sequential) or any(p.requires_grad is False for p in module.parameters()):
        return None
    layers: list[Layer] = []
    shape = tuple(in_shape)
    for child, layer in module._modules.items():  # (named_children() lists a layer used twice once)
        kernel = _kernel(child, layer, shape, rules)
        if kernel is None:
            return None
        layers.append(kernel)
        shape = kernel.out_shape(shape)
    names = [n for n, _ in module.named_parameters()]
    if names != [q.name for layer in layers for q in layer.params] or \
            _state_buffers(module) != [q.name for layer in layers for q in layer.buffers]:
        return None  # (a layer with parameters in two places of the stack: tied weights; a buffer no layer keeps)
    return KernelModel(name, module, layers, in_shape)


def lower_traced(name: str, module: nn.Module, in_shape: tuple[int, ...],
                 rules: int = training_rules.CURRENT) -> KernelModel | None:
    """The kernels of a module written as a class whose forward is a chain of layers the kernels
    know (as `lower` takes them in an nn.Sequential: submodules, or `F.relu`, `torch.relu`,
    `F.max_pool2d(x, 2)`, `torch.flatten(x, 1)`, `x.flatten(1)`, `x.view(x.size(0), -1)`,
    `x.view(-1, features)`, `x.relu()`, `F.dropout(x, p, self.training)` on vectors), each step
    reading the one before: how a LeNet-5 is usually written. Read from
    `torch.fx.symbolic_trace`, and kept only where the kernels give the module's own logits; from
    training rules 9 a residual block in the chain too (`h + block(h)`: `Residual`). None for
    any other module (control flow, another branch, buffers, frozen or shared parameters, a call
    the kernels do not know), which trains through torch.func."""
    if isinstance(module, nn.Sequential) or any(not p.requires_grad for p in module.parameters()):
        return None
    training = module.training
    try:  # the forward as it trains and as it evaluates: one chain (a forward may read self.training)
        chains = [_chain(module.train(mode), in_shape, rules) for mode in (True, False)]
    finally:
        module.train(training)
    layers = chains[0]
    if layers is None or chains[1] is None or _described(layers) != _described(chains[1]):
        return None
    names = sorted(n for n, _ in module.named_parameters(remove_duplicate=False))
    buffers = sorted(_state_buffers(module))
    if names != sorted(q.name for layer in layers for q in layer.params) or \
            buffers != sorted(q.name for layer in layers for q in layer.buffers):
        return None  # (a parameter the chain leaves out, or one used twice; a buffer no layer keeps)
    lowered = KernelModel(name, module, layers, in_shape)
    return lowered if _same_logits(lowered, module) else None


def _state_buffers(module: nn.Module) -> list[str]:
    """The names of the buffers in the module's state_dict (a fixed embedding's vectors are not state)."""
    params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    return [k for k in module.state_dict(keep_vars=True) if k not in params]


def _described(layers: list[Layer]) -> list[tuple]:
    return [(kind(layer), [q.name for q in layer.params], getattr(layer, "rate", None)) for layer in layers]


def _chain(module: nn.Module, in_shape: tuple[int, ...], rules: int) -> list[Layer] | None:
    """The kernels of the module's traced forward (in its present mode) if it is a chain of them,
    from training rules 9 with residual blocks in it (`x + block(x)`, not nested)."""
    try:
        graph = torch.fx.symbolic_trace(module).graph
    except Exception:  # (whatever fx cannot trace: the module trains as it is)
        return None
    layers: list[Layer] = []
    shape, last = tuple(in_shape), None
    block = None  # while in a residual block: (the layers before it, its input's shape, its input, its sum)
    for node in graph.nodes:
        if node.op == "placeholder":
            if last is not None:
                return None  # (a second input)
            last = node
            continue
        if node.op == "output":
            if node.args[0] is not last or block is not None:
                return None
            break
        if _batch_size(node, last):
            continue  # (read by a view of `last`)
        if block is not None and node is block[3]:  # the block's sum: its input plus its output
            outer, outer_shape, head, _ = block
            if not layers or shape != outer_shape or {*node.args} != {head, last} or len(node.args) != 2:
                return None
            layers, last, block = [*outer, Residual(layers)], node, None
            continue
        total = _residual_sum(last) if rules >= 9 else None
        if total is not None:
            if block is not None or _in_place(module, node):
                return None  # (a residual block in a residual block; one changing its input in place)
            block, layers = (layers, shape, last, total), []
        branches = _readers(node) > 1 and (rules < 9 or _residual_sum(node) is None)
        if not node.args or node.args[0] is not last or branches \
                or any(isinstance(a, torch.fx.Node) and not _batch_size(a, last)
                       for a in (*node.args[1:], *node.kwargs.values())):
            return None  # (not a chain)
        kernel = _traced_kernel(module, node, shape, rules)
        if kernel is None:
            return None
        layers.append(kernel)
        shape, last = kernel.out_shape(shape), node
    return layers or None


def _in_place(module: nn.Module, node) -> bool:
    """Whether a traced call may write its input (`inplace=True`, a method `x.relu_()`)."""
    if node.op == "call_module":
        return bool(getattr(module.get_submodule(node.target), "inplace", False))
    if node.op == "call_method":
        return node.target.endswith("_")
    return bool(node.kwargs.get("inplace")) or (node.target is F.dropout and len(node.args) > 3 and node.args[3])


def _readers(node) -> int:
    """How many traced calls read `node` (its batch size aside)."""
    return sum(not _batch_size(u, node) for u in node.users)


_SUMS = (("call_function", operator.add), ("call_function", torch.add), ("call_method", "add"))


def _residual_sum(node):
    """The traced sum `node + block(node)` (or `block(node) + node`) where `node` is read by that
    sum and by the block's first call alone; else None."""
    if _readers(node) != 2:
        return None
    sums = [u for u in node.users if (u.op, u.target) in _SUMS and len(u.args) == 2 and not u.kwargs
            and node in u.args and u.args[0] is not u.args[1]]
    return sums[0] if len(sums) == 1 else None


def _same_logits(lowered: KernelModel, module: nn.Module) -> bool:
    """Whether the kernels compute the module's own forward (eval mode) on a probe batch: what
    the trace reads is the forward's calls, and this checks that nothing else it does was missed."""
    shape, training = lowered.in_shape, module.training
    g = torch.Generator().manual_seed(0)
    vocab = getattr(shape, "vocab_size", None)
    x = torch.randint(0, vocab, (4, *shape), generator=g) if vocab else torch.rand(4, *shape, generator=g)
    try:
        with torch.no_grad():
            theirs, ours = module.eval()(x), lowered.predict(lowered.init(0), x)
    except Exception:
        return False
    finally:
        module.train(training)
    return theirs.shape == ours.shape and torch.allclose(theirs, ours, rtol=1e-4, atol=1e-5)


def _batch_size(node, of) -> bool:
    """Whether a traced `node` is `of.size(0)`, the batch size (as `x.view(x.size(0), -1)` reads it)."""
    return node.op == "call_method" and node.target == "size" and node.args == (of, 0) and not node.kwargs


def _traced_kernel(module: nn.Module, node, shape: tuple[int, ...], rules: int) -> Layer | None:
    """The kernel of one traced call (`lower_traced`), or None."""
    args, kwargs = node.args[1:], node.kwargs
    if node.op == "call_module":
        return _kernel(node.target, module.get_submodule(node.target), shape, rules) if not args and not kwargs \
            else None
    call = (node.op, node.target)
    if call in (("call_function", F.relu), ("call_function", torch.relu), ("call_method", "relu")):
        return ReLU() if not args and set(kwargs) <= {"inplace"} else None  # (in place or not: a chain's own)
    if node.op == "call_method" and node.target in ("view", "reshape") and len(args) == 2 and not kwargs:
        batch, features = args
        whole = (isinstance(batch, torch.fx.Node) or batch == -1) and features in (-1, math.prod(shape)) \
            and not batch == features == -1
        return Flatten() if whole else None
    if call in (("call_function", torch.flatten), ("call_method", "flatten")):
        start, end = (list(args) + [kwargs.get("start_dim", 0), kwargs.get("end_dim", -1)][len(args):])[:2]
        return Flatten() if (start, end) == (1, -1) and not set(kwargs) - {"start_dim", "end_dim"} else None
    if call in _FUNCTIONAL_ACTIVATIONS:  # F.gelu(x, approximate="tanh") as nn.GELU(approximate="tanh")
        try:
            return _kernel(node.name, _FUNCTIONAL_ACTIVATIONS[call](*args, **kwargs), shape, rules)
        except TypeError:  # (arguments the module does not take)
            return None
    if call == ("call_function", F.dropout) and len(shape) in (1, 3):  # as nn.Dropout: dropping only in training
        given = dict(zip(("p", "training", "inplace"), args))
        given.update(kwargs)
        rate, training = given.get("p", 0.5), given.get("training", True)
        return Dropout(math.prod(shape), float(rate)) if isinstance(rate, (int, float)) and 0 <= rate < 1 \
            and training is module.training and set(given) <= {"p", "training", "inplace"} else None
    if call in (("call_function", F.log_softmax), ("call_function", torch.log_softmax),
                ("call_method", "log_softmax")) and len(shape) == 1:
        given = dict(zip(("dim", "_stacklevel", "dtype"), args))
        given.update(kwargs)
        return LogSoftmax() if given.get("dim") in (1, -1) and given.get("dtype") is None else None
    if call == ("call_function", F.max_pool2d) and len(shape) == 3:
        given = dict(zip(("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"), args))
        given.update(kwargs)
        kernel, stride = given.get("kernel_size"), given.get("stride") or given.get("kernel_size")
        plain = (_pairs(kernel, stride) == (2, 2) and _pairs(given.get("padding", 0), given.get("dilation", 1)) == (0, 1)
                 and not given.get("ceil_mode", False) and not given.get("return_indices", False))
        return MaxPool() if plain else None
    return None


_FUNCTIONAL_ACTIVATIONS = {  # a traced call -> the module taking the same arguments after the input
    ("call_function", F.gelu): nn.GELU,
    **{("call_function", f): nn.Tanh for f in (torch.tanh, F.tanh)}, ("call_method", "tanh"): nn.Tanh,
    **{("call_function", f): nn.Sigmoid for f in (torch.sigmoid, F.sigmoid)}, ("call_method", "sigmoid"): nn.Sigmoid,
    ("call_function", F.silu): nn.SiLU, ("call_function", F.leaky_relu): nn.LeakyReLU,
    # (training rules 8)
    ("call_function", F.elu): nn.ELU, ("call_function", F.celu): nn.CELU, ("call_function", F.selu): nn.SELU,
    ("call_function", F.softplus): nn.Softplus, ("call_function", F.mish): nn.Mish,
    ("call_function", F.hardswish): nn.Hardswish, ("call_function", F.hardsigmoid): nn.Hardsigmoid,
    ("call_function", F.hardtanh): nn.Hardtanh, ("call_function", F.relu6): nn.ReLU6,
}


def _kernel(name: str, layer: nn.Module, shape: tuple[int, ...], rules: int) -> Layer | None:
    """The kernel of one layer reading one sample of `shape`, or None (dropout on images and
    log softmax from training rules 4, activations other than ReLU and LayerNorm from rules 7,
    BatchNorm from rules 10)."""
    if type(layer) is nn.Flatten and layer.start_dim == 1 and layer.end_dim == -1:
        return Flatten()
    if type(layer) is nn.ReLU:
        return ReLU()
    if (elementwise := activation(layer, rules)) is not None:
        return elementwise
    if rules >= 7 and type(layer) is nn.LayerNorm and len(shape) == 1 and tuple(layer.normalized_shape) == shape \
            and layer.weight is not None and layer.bias is not None:
        return LayerNorm(name, shape[0], layer.eps)
    if rules >= 10 and type(layer) in (nn.BatchNorm1d, nn.BatchNorm2d) and layer.affine and layer.track_running_stats \
            and layer.momentum is not None and len(shape) == (1 if type(layer) is nn.BatchNorm1d else 3) \
            and shape[0] == layer.num_features:
        return BatchNorm(name, layer.num_features, layer.eps, layer.momentum, on_vectors=len(shape) == 1)
    if type(layer) is nn.Linear and layer.bias is not None and shape == (layer.in_features,):
        return Dense(name, layer.in_features, layer.out_features)
    if type(layer) is nn.Dropout and (len(shape) == 1 or len(shape) == 3 and rules >= 4):
        return Dropout(math.prod(shape), layer.p)
    if type(layer) is nn.LogSoftmax and len(shape) == 1 and layer.dim in (1, -1) and rules >= 4:
        return LogSoftmax()
    if type(layer) is nn.MaxPool2d and len(shape) == 3 and _pairs(layer.kernel_size, layer.stride) == (2, 2) \
            and _pairs(layer.padding, layer.dilation) == (0, 1) and not layer.ceil_mode and not layer.return_indices:
        return MaxPool()
    if type(layer) is nn.Conv2d and len(shape) == 3 and shape[0] == layer.in_channels and layer.bias is not None \
            and layer.groups == 1 \
            and layer.padding_mode == "zeros" and layer.stride == (1, 1) and layer.dilation == (1, 1) \
            and isinstance(layer.padding, tuple) and layer.padding[0] == layer.padding[1] \
            and layer.kernel_size[0] == layer.kernel_size[1]:
        return Conv(name, layer.in_channels, layer.out_channels, layer.kernel_size[0], layer.padding[0])
    if type(layer) is nn.Embedding and layer.padding_idx is None and layer.max_norm is None \
            and not layer.scale_grad_by_freq and not layer.sparse:
        return Embedding(name, layer.num_embeddings, layer.embedding_dim)
    if type(layer) is FixedEmbedding:
        return Embedding(name, 0, layer.vectors.shape[1], layer.vectors)
    if type(layer) is LastHiddenLSTM:
        n_in = layer.weight_ih_l0.shape[1]
        return LSTM(name, n_in, layer.hidden, layer.layers)
    return None


def _pairs(a, b) -> tuple:
    one = lambda v: v if isinstance(v, int) else (  # noqa: E731
        v[0] if isinstance(v, (tuple, list)) and len(v) == 2 and v[0] == v[1] else None)
    return one(a), one(b)


# --- gradients ---------------------------------------------------------------------------------

def autograd_step(logits_of: Callable[..., Tensor], loss: StepLoss, trainable: int | None = None) -> StepFn:
    """Gradients by plain reverse mode. For a cohort the losses of the devices are summed first:
    they share no parameters, so the gradient of the sum holds each device's own gradient. The
    tensors after the first `trainable` (buffers) are updated by the forward: on copies, written
    back after the backward (they share a version counter with the parameters' rows, which
    autograd checks)."""
    def step(params: tuple[Tensor, ...], x: Tensor, y: Tensor, weight: Tensor, u: Tensor):
        leaves = tuple(p.detach().requires_grad_() for p in params[:trainable])
        buffers = tuple(b.clone() for b in params[len(leaves):])
        with torch.enable_grad():
            losses = loss(logits_of((*leaves, *buffers), x, u), y, weight)
            grads = torch.autograd.grad(losses.sum(), leaves)
        for b, new in zip(params[len(leaves):], buffers):
            b.copy_(new)
        return grads, losses.detach()

    return step


def reverse_step(names: list[str], layers: list[Layer]) -> StepFn:
    """One device's gradients by reverse mode written out (`Layer.forward_saving` and
    `Layer.backward`), the loss as `weighted_cross_entropy` computes it: the kernels autograd
    runs, on the same operands in the same order, so the numbers are reverse mode's bit for bit,
    without building and walking its graph at every step (LeNet-5's step on one thread: 15 %
    faster, the MLP's 2x; benchmarks/RESULTS.md, "The loop's convolutional step"). `names`: the
    state's tensors in order (parameters, then buffers, which the forward updates in place)."""
    first = next(i for i, layer in enumerate(layers) if layer.params)  # no gradient before it

    def step(tensors: tuple[Tensor, ...], x: Tensor, y: Tensor, weight: Tensor, u: Tensor):
        p = dict(zip(names, tensors))
        saved, used = [], 0
        for layer in layers:
            x, keep = layer.forward_saving(p, x, u[:, used:used + layer.dropout] if layer.dropout else None)
            saved.append(keep)
            used += layer.dropout
        log_p = torch.log_softmax(x, 1)  # cross_entropy as torch composes it: log_softmax, then nll_loss
        ce, total = torch.ops.aten.nll_loss_forward(log_p, y, None, 0, -100)
        loss = (ce * weight).sum(dim=-1)
        grad = torch.ops.aten.nll_loss_backward(weight, log_p, y, None, 0, -100, total)
        grad = torch.ops.aten._log_softmax_backward_data(grad, log_p, 1, log_p.dtype)
        grads: list[Tensor] = []
        for i in range(len(layers) - 1, first - 1, -1):
            grad, own = layers[i].backward(p, grad, saved.pop(), i > first)  # (freed as autograd frees
            grads[:0] = own  # them: memory that the next layer's gradients reuse, still in cache)
        return tuple(grads), loss

    return step


def dense_cohort_step(hidden: tuple[tuple[LayerNorm | None, Layer, float | None], ...] = ()) -> StepFn:
    """The gradient of a stack of dense layers with activations between them (softmax
    regression, the MLP), each hidden layer's (from training rules 7) LayerNorm `hidden[i][0]`
    (None: none) and activation `hidden[i][1]` followed by inverted dropout at the rate
    `hidden[i][2]` (None: none), in closed form, for m devices at once. With
    p = softmax(logits), dL/dlogits = weight * (p - onehot(y)); each dense layer's dW is its
    output's gradient times its input (transposed), db that gradient's sum, and its input's
    gradient that gradient times W, back through the dropout's mask, the activation (its
    kernel's backward, as reverse mode's) and the LayerNorm (aten's backward of the normalisation
    for the input; the affine's gradients as sums over the batch). The logits are kept as
    [m, C, B], so that the reductions over the C classes
    run along a strided dimension, which vectorises over the batch (along a last dimension of 10
    they cost as much as the matmul). Softmax regression: about 4x faster than reverse mode at
    10-100 devices; the MLP (training rules 3): 2-2.6x a step (benchmarks/RESULTS.md, "The MLP's
    gradient in closed form"), where reverse mode's cost is per-call overhead, not arithmetic."""
    def step(params: tuple[Tensor, ...], x: Tensor, y: Tensor, weight: Tensor, u: Tensor):
        x = x.flatten(2)  # [m, B, F]
        # each dense layer's input [m, B, features]; what each activation's and LayerNorm's backward
        # reads; the dropout masks
        inputs, saved, normed, kept, used = [x], [], [], [], 0
        for j, (norm, act, rate) in enumerate(hidden):
            w, b = params[dense_at[j]:dense_at[j] + 2]
            z = torch.baddbmm(b.unsqueeze(1), inputs[-1], w.mT)
            if norm is not None:
                z, keep_norm = norm.cohort_saving(*params[dense_at[j] + 2:dense_at[j] + 4], z)
                normed.append(keep_norm)
            out, read = act.forward_saving(None, z, None)
            saved.append(read)
            if rate is not None:  # as the Dropout kernel: x * (u >= rate) / (1 - rate)
                keep = (u[..., used:used + out.shape[-1]] >= rate).to(out.dtype)
                used += out.shape[-1]
                kept.append(keep)
                out = out * keep / (1.0 - rate)
            else:
                kept.append(None)
            inputs.append(out)
        w, b = params[-2:]
        logits = torch.bmm(w, inputs[-1].mT).add_(b.unsqueeze(-1))  # [m, C, B]
        top = logits.amax(dim=1, keepdim=True)
        p = (logits - top).exp_()
        total = p.sum(dim=1, keepdim=True)
        target = y.unsqueeze(1)
        losses = ((total.log() + top - logits.gather(1, target)).squeeze(1) * weight).sum(dim=-1)
        p.div_(total).scatter_add_(1, target, torch.full(target.shape, -1.0, device=p.device))
        p.mul_(weight.unsqueeze(1))  # dL/dlogits [m, C, B]
        grads = [torch.bmm(p, inputs[-1]), p.sum(dim=-1)]
        out = p.mT  # the gradient of the last layer's output [m, B, C]
        for i in range(len(inputs) - 1, 0, -1):  # back through each hidden layer: dropout, activation, LayerNorm
            norm, act, rate = hidden[i - 1]
            out = torch.bmm(out, params[dense_at[i]])  # [m, B, H]
            if kept[i - 1] is not None:
                out.mul_(kept[i - 1]).div_(1.0 - rate)
            out = act.backward(None, out, saved[i - 1], True)[0]
            affine = ()
            if norm is not None:
                out, *affine = norm.cohort_backward(params[dense_at[i - 1] + 2], out, normed.pop())
            grads[:0] = [torch.bmm(out.mT, inputs[i - 1]), out.sum(dim=1), *affine]
        return tuple(grads), losses

    dense_at = [0]  # where each dense layer's weight is among the parameters
    for norm, _, _ in hidden:
        dense_at.append(dense_at[-1] + (4 if norm is not None else 2))
    return step
