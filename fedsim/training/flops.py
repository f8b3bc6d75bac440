"""Counting a model's FLOPs: torch's FlopCounterMode, with formulas for the matrix products it
has none for on a CPU.

torch counts matrix products and convolutions only (normalisation, activations and lookups
are free), yet not a matrix times a vector; and on a CPU, scaled-dot-product attention and
the LSTM layer run as fused kernels its registry lacks, so a transformer or an LSTM would lose
that arithmetic. The formulas here count those kernels as torch counts their GPU twins
(`sdpa_flop_count`, `sdpa_backward_flop_count`) and the products the unfused LSTM does.
fedsim's clock counts one forward pass (training = 3 x forward, docs/timing.md); the backward
formulas make a forward-and-backward count agree with torch's on a GPU as well. Ops are looked
up by name: each exists from some torch version on, and torch's own formula wins once it has one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode, flop_registry


def _dims(x) -> tuple[int, ...]:
    """A tensor's shape (FlopCounterMode passes shapes to its formulas, older versions tensors)."""
    return tuple(x.shape) if isinstance(x, Tensor) else tuple(x)


def matrix_vector_flops(matrix, vector, *args, **kwargs) -> int:
    """A matrix [n, m] times a vector [m] (`h @ q` over tokens, as attention pooling does)."""
    return 2 * math.prod(_dims(matrix))


def matrix_vector_plus_flops(bias, matrix, vector, *args, **kwargs) -> int:
    """A bias plus a matrix times a vector (the bias is free)."""
    return matrix_vector_flops(matrix, vector)


def attention_flops(query, key, value, *args, **kwargs) -> int:
    """Q K^T and the weights times V, for q [..., L, E], v [..., S, Ev] (the query's heads when
    key and value have fewer): 2 L S E + 2 L S Ev per batch and head. A causal mask is not
    discounted, as in torch's formula."""
    *lead, length, e = _dims(query)
    s, ev = _dims(value)[-2:]
    return 2 * math.prod(lead) * length * s * (e + ev)


def attention_backward_flops(grad_out, query, key, value, *args, **kwargs) -> int:
    """torch's convention for the fused backward: the scores recomputed (L S E), then the
    gradients of the weights (L S Ev), of V (S L Ev), of Q (L S E) and of K (L S E)."""
    *lead, length, e = _dims(query)
    s, ev = _dims(value)[-2:]
    return 2 * math.prod(lead) * length * s * (3 * e + 2 * ev)


def rnn_layer_flops(input, w_ih, w_hh, *args, **kwargs) -> int:
    """One LSTM layer and direction over steps x batch inputs [..., I]: each step multiplies
    its input by W_ih [G, I] and the hidden state by W_hh [G, H], as the unfused LSTM's
    matrix products count (biases are free)."""
    gates, n_in = _dims(w_ih)
    return 2 * math.prod(_dims(input)[:-1]) * gates * (n_in + _dims(w_hh)[1])


def rnn_layer_backward_flops(input, w_ih, w_hh, *args, **kwargs) -> int:
    """Twice the forward: the gradients of the inputs and of the weights of each product."""
    return 2 * rnn_layer_flops(input, w_ih, w_hh)


_FORMULAS = {
    "mv": matrix_vector_flops,
    "addmv": matrix_vector_plus_flops,
    "_scaled_dot_product_flash_attention_for_cpu": attention_flops,
    "_scaled_dot_product_flash_attention_for_cpu_backward": attention_backward_flops,
    "mkldnn_rnn_layer": rnn_layer_flops,
    "mkldnn_rnn_layer_backward": rnn_layer_backward_flops,
}
# fedsim's formulas for the ops of this torch that its registry lacks
FORMULAS = {op: formula for name, formula in _FORMULAS.items()
            if (op := getattr(torch.ops.aten, name, None)) is not None and op not in flop_registry}


def flop_counter() -> FlopCounterMode:
    """torch's counter with fedsim's formulas."""
    return FlopCounterMode(display=False, custom_mapping=FORMULAS)


def counted(op) -> bool:
    """Whether the counter has a formula for `op` (an aten op overload packet)."""
    return op in flop_registry or op in FORMULAS
