"""Models that are `torch.nn.Module`s (docs/extending.md "A model"), kept as flat vectors.

The algorithms see a model as one flat float32 vector per device: here a module's state is
laid out by name, its trainable parameters first (in `named_parameters` order), then its
buffers (BatchNorm's running statistics; an integer or boolean buffer as float32 numbers,
rounded back to its own dtype where the forward reads it). Frozen parameters (requires_grad=False)
are constants of the module: never trained, sent or averaged, but saved in model.pt.

Training over the cohort's stacked states (the batched trainer) is `functional_call` of the
module differentiated by `torch.func`'s `grad_and_value` under `vmap`; one device's (the loop
trainer) is a plain PyTorch step of a working copy of the module whose tensors take the
device's state (before training rules 4, `functional_call` under torch.func's `grad` too: the
same numbers for most modules, at 1.2-1.7x the time a step).
Buffers are updated by the forward as in torch (train mode in local steps, eval mode for
evaluation). Randomness must not come from torch's generator, whose draws would depend on the
cohort's order: dropout (`F.dropout`, attention dropout) takes keyed random numbers of
(seed, round, device, step) instead, drawn for the whole cohort in one call before each step
(`ModuleModel.randomness`, fedsim/training/rng.py); any other op that draws is refused
(`draws_random_numbers`: one that could but draws nothing, attention at dropout_p = 0, is not).
A forward may update its buffers in place; one that changes a parameter, assigns a new tensor
to the state or keeps Python state across calls is refused at build time (`_check_state_kept`);
one that vmap cannot batch (a value read on the host, a shape that depends on the data) trains
on the loop (`batch_problem`, `why_failed` name the call).
"""

from __future__ import annotations

import copy
import functools
import math
import re
import threading
import warnings
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._python_dispatch import TorchDispatchMode

from fedsim.errors import FedsimError, first_line
from fedsim.training import rng
from fedsim.training import rules as training_rules
from fedsim.training.flops import counted, flop_counter
from fedsim.training.kernels import convolutions_loop, max_pool2d_channels_last
from fedsim.training.losses import StepLoss

# images of at least this many pixels make a module's convolutions slower batched than looped on
# a CPU (`ModuleModel.cohort_slow_on_cpu`), from training rules 6 where they are at least this
# share of its forward's multiply-adds (CNNs: 86-99 %; a vision transformer's patch embedding: 7 %)
CONV_LOOP_PIXELS = 16 * 16
CONV_LOOP_SHARE = 0.5
# torch's warning of an op vmap has no batching rule for (it runs the op device by device)
_UNBATCHED = re.compile(r"not yet implemented the batching rule for (\S+?)\.? ")
SHORT_KEYS = 16  # attention over fewer keys takes its softmax along another dimension (`_attention_weights`)

# --- keyed dropout ---------------------------------------------------------------------------

_DROPOUT, _SDPA, _MAX_POOL2D = F.dropout, F.scaled_dot_product_attention, F.max_pool2d
# vmap runs an op it has no batching rule for device by device, and torch warns of it: fedsim's
# probe records those ops (`_vmap_probe`) for `auto` and the manifest, so the warning is noise
warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented")


class _Draws(threading.local):
    """The random numbers of the forward pass running now in this thread: one device's row of a
    step's `ModuleModel.randomness` (batched under vmap; None: count them only), how many it has
    used, and whose they are (for the error). Per thread: the parts of a call train at once,
    each on a thread of its own."""
    on = False
    loop = False  # the forward is one device's, outside vmap (the loop trainer)
    rules = training_rules.CURRENT  # the training rules of the forward's run
    numbers: Tensor | None = None
    used = 0
    where = ""
    rates: list[float]  # while counting: each dropout call's probability, per number
    shapes: list[tuple[int, ...]]  # while counting: each dropout call's input shape


def _next_numbers(n: int) -> Tensor | None:
    """The forward's next n numbers (`rng.dropout_bits`; None while counting them): each dropout
    call takes the numbers after the previous call's, as per-call draws of (seed, round,
    device, step) gave them."""
    start, _draws.used = _draws.used, _draws.used + n
    if _draws.numbers is None:
        return None
    drawn = _draws.numbers.shape[-1]
    if _draws.used > drawn:
        raise FedsimError(f"{_draws.where}: the module's dropout in training used more random numbers "
                          f"({_draws.used:,} so far) than on a batch of zeros of the same size ({drawn:,}); fedsim "
                          "draws a step's dropout numbers before its forward: keep the shapes that dropout "
                          "applies to independent of the data")
    return _draws.numbers[start:_draws.used]


_draws = _Draws()
_swap = threading.Lock()  # guards `_forwards`: torch's functions are swapped while any forward runs
_forwards = 0


def _keyed_dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    if not training or p == 0:
        return input
    if not _draws.on:
        return _DROPOUT(input, p, training, inplace)
    return _masked(input, p, tuple(input.shape))


def _keyed_feature_dropout(unkeyed, batched_dims: tuple[int, ...]):
    """F.dropout1d / 2d / 3d keyed: whole channels dropped, one number per (sample, channel)
    of a batched input (of `batched_dims` dimensions, as torch reads them), one per channel of
    an unbatched one."""
    def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
        if not training or p == 0 or not _draws.on:
            return unkeyed(input, p, training, inplace) if training and p else input
        lead = 2 if input.dim() in batched_dims else 1
        return _masked(input, p, (*input.shape[:lead], *[1] * (input.dim() - lead)))
    return dropout


def _masked(input: Tensor, p: float, shape: tuple[int, ...]) -> Tensor:
    """`input` with the units of a mask of `shape` (broadcast over the input) kept with
    probability 1 - p and scaled by 1 / (1 - p), the mask from the forward's next numbers."""
    numbers = _next_numbers(math.prod(shape))
    if numbers is None:  # counting
        _draws.rates.append(p)
        _draws.shapes.append(shape)
        return input
    if numbers.is_floating_point():  # a CPU step's divisors: 1 - p where kept, inf where dropped
        return input / numbers.view(shape)
    if numbers.dtype == torch.bool:  # a GPU step's keep-mask
        return input * numbers.view(shape) / (1.0 - p)
    threshold = rng.keep_threshold(p)
    if threshold is None:  # no uniform reaches p: every unit dropped
        return input * 0.0
    return input * (numbers.view(shape) >= threshold) / (1.0 - p)  # (bools multiply as 1.0 and 0.0)


# F's channel dropouts: the dimensions of an input they read as batched (dropout2d reads a 3-d
# input as a batch of 1-d channels, with a warning)
_FEATURE_DROPOUT = {"dropout1d": (3,), "dropout2d": (3, 4), "dropout3d": (5,)}
_UNKEYED = {name: getattr(F, name) for name in _FEATURE_DROPOUT}
_KEYED = {name: _keyed_feature_dropout(_UNKEYED[name], dims) for name, dims in _FEATURE_DROPOUT.items()}


def _keyed_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """scaled_dot_product_attention written out when it drops attention weights (keyed)."""
    if dropout_p == 0 or not _draws.on:
        return _SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                     scale=scale, enable_gqa=enable_gqa)
    scores = query @ key.transpose(-2, -1) * (scale or 1.0 / math.sqrt(query.size(-1)))
    if is_causal:
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return _keyed_dropout(_attention_weights(scores), dropout_p) @ value


def _attention_weights(scores: Tensor) -> Tensor:
    """softmax(scores) over the keys. From training rules 5, on a CPU over fewer than
    `SHORT_KEYS` keys along the other dimension of the transposed scores: torch's CPU softmax
    along a last dimension shorter than 16 is not vectorised (forward and backward 3-4x the
    time; a transformer reading 8 tokens: 12 % of its batched step), along another one it is.
    The same sums in another order: float rounding. (A forward that only counts, `probe_forward`,
    takes torch's: the chunks that a module's batched calls are cut into stay as they were.)"""
    if _draws.numbers is not None and _draws.rules >= 5 and scores.device.type == "cpu" \
            and scores.shape[-1] < SHORT_KEYS:
        return torch.softmax(scores.transpose(-2, -1), dim=-2).transpose(-2, -1)
    return torch.softmax(scores, dim=-1)


def _loop_max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                     return_indices=False):
    """`F.max_pool2d`, on the loop trainer's CPU forward through torch's channels-last kernel
    (`kernels.max_pool2d_channels_last`): the same output and gradient, 2-3x faster a pool."""
    if _draws.loop and input.device.type == "cpu" and input.dim() == 4 and not return_indices:
        return max_pool2d_channels_last(input, kernel_size, stride, padding, dilation, ceil_mode)
    return _MAX_POOL2D(input, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode,
                       return_indices=return_indices)


@contextmanager
def keyed_randomness(numbers: Tensor | None, where: str = "", rules: int = training_rules.CURRENT):
    """Dropout inside takes its random numbers from `numbers` (one device's; batched under
    vmap), in the order of its calls; None: it only counts them (`.used` of what it yields,
    after the forward). torch's dropout functions are swapped for the keyed ones while any
    forward runs: modules call them through `torch.nn.functional`, whatever module they sit in
    (nn.Dropout, nn.Dropout1d/2d/3d, attention); max pooling too (`_loop_max_pool2d`, for the
    loop's forwards)."""
    global _forwards
    _draws.on, _draws.numbers, _draws.used, _draws.where, _draws.rates, _draws.shapes = True, numbers, 0, where, [], []
    _draws.rules = rules
    with _swap:
        _forwards += 1
        F.dropout, F.scaled_dot_product_attention, F.max_pool2d = _keyed_dropout, _keyed_attention, _loop_max_pool2d
        for name, keyed in _KEYED.items():
            setattr(F, name, keyed)
    try:
        yield _draws
    finally:
        with _swap:
            _forwards -= 1
            if not _forwards:
                F.dropout, F.scaled_dot_product_attention, F.max_pool2d = _DROPOUT, _SDPA, _MAX_POOL2D
                for name, unkeyed in _UNKEYED.items():
                    setattr(F, name, unkeyed)
        _draws.on, _draws.numbers = False, None


def _hooks(module: nn.Module) -> tuple[dict, ...]:
    """The hooks a module's forward and backward call."""
    return tuple(getattr(module, name, {}) for name in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks",
                                                        "_backward_hooks"))


# --- counting FLOPs --------------------------------------------------------------------------

# aten ops that do a model's arithmetic (matrix products, convolutions, recurrences, attention):
# one the counter has no formula for is named in a warning
_HEAVY = re.compile(r"mm|matmul|conv|linear|lstm|gru|rnn|attention|transformer|einsum|tensordot|fft|bilinear")


def draws_random_numbers(func, args: tuple, kwargs: dict) -> bool:
    """Whether an aten op draws from torch's generator with these arguments. Ops that may
    draw (tagged nondeterministic_seeded) draw nothing with a dropout probability of 0 or
    outside training: attention with dropout_p = 0 (CPU scaled-dot-product attention is
    tagged for its dropout), dropout in eval mode."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    given = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    given |= {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
    if given.get("train", given.get("training")) is False:
        return False
    p = given.get("dropout_p", given.get("p") if "dropout" in func.__name__ else None)
    return p is None or p != 0


def _written(func, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors an aten op writes into (its in-place and out= arguments)."""
    given = [*zip(func._schema.arguments, args), *((a, kwargs[a.name]) for a in func._schema.arguments
                                                    if a.name in kwargs)]
    return [v for a, v in given if a.alias_info is not None and a.alias_info.is_write and isinstance(v, Tensor)]


class _Outputs(TorchDispatchMode):
    """Records every aten op of a forward pass, the floats it outputs, the random ops and the
    ops that write into a parameter (`parameters`: storage address -> name)."""

    def __init__(self, parameters: dict[int, str]):
        super().__init__()
        self.ops: set = set()
        self.random: set = set()
        self.floats = 0
        self.parameters = parameters
        self.written: dict[str, str] = {}  # parameter -> the first op that wrote into it
        self.replaced: list[str] = []  # state names the forward assigned another tensor to
        self.convolution_flops = 0.0  # multiply-adds per sample of its convolutions (`probe_forward`)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable:
            for t in _written(func, args, kwargs):
                name = self.parameters.get(t.untyped_storage().data_ptr())
                if name:
                    self.written.setdefault(name, str(func._overloadpacket))
        out = func(*args, **kwargs)
        self.ops.add(func._overloadpacket)
        if draws_random_numbers(func, args, kwargs):
            self.random.add(str(func._overloadpacket))
        self.floats += sum(t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                           if isinstance(t, Tensor) and t.is_floating_point())
        return out


def probe_forward(module: nn.Module, state: dict[str, Tensor], samples: Tensor, where: str):
    """(logits, multiply-adds per sample, floats of outputs per sample, what the forward did)
    of `module`'s training-mode forward pass (with `state`, left as it was) on `samples`. The
    multiply-adds are counted by torch's FlopCounterMode with fedsim's formulas for CPU
    attention and LSTM layers (FLOPs / 2, fedsim/training/flops.py), in training mode: the
    cost the clock times (eval mode may take fused fast paths the counter does not know). A
    warning names any op that does arithmetic the counter cannot count (`[model]
    train_flops_per_sample` then sets the cost). Dropout counts six floats a number (what its
    uniform, mask and products counted when the forward drew them itself), so that a cohort's
    chunks stay as they were. What the forward did (`_Outputs`): `random`, torch's own draws
    (keyed dropout draws none); `written`, parameters it changed in place (an op, or `.data
    =`); `replaced`, state names it assigned another tensor to."""
    state = {n: t.clone() for n, t in state.items()}
    held = dict(module.named_parameters(remove_duplicate=False))
    parameters = {n: state.get(n, t) for n, t in held.items()}
    storage = {n: t.untyped_storage().data_ptr() for n, t in parameters.items()}
    outputs, counter = _Outputs({ptr: n for n, ptr in storage.items() if ptr}), flop_counter()

    def check_names(root, args, out):  # inside functional_call, while `state` stands in for the module's
        now = dict(root.named_parameters(remove_duplicate=False)) | dict(root.named_buffers(remove_duplicate=False))
        outputs.replaced += [n for n, t in state.items() if now.get(n) is not t]

    hook = module.register_forward_hook(check_names)
    try:
        with torch.no_grad(), keyed_randomness(None) as draws, counter, outputs:
            logits = functional_call(module.train(), state, (samples,))
    finally:
        hook.remove()
        module.eval()
    for n, t in parameters.items():
        if t.untyped_storage().data_ptr() != storage[n]:
            outputs.written.setdefault(n, ".data =")
    unknown = sorted(str(op) for op in outputs.ops if not counted(op) and _HEAVY.search(str(op)))
    if unknown:
        warnings.warn(f"{where}: FLOPs of {', '.join(unknown)} are not counted (torch's FlopCounterMode "
                      "has no formula); the device clock under-counts this model: set [model] "
                      "train_flops_per_sample", stacklevel=2)
    n = len(samples)
    outputs.convolution_flops = sum(flops for op, flops in counter.get_flop_counts().get("Global", {}).items()
                                    if "convolution" in str(op)) / 2 / n
    return logits, counter.get_total_flops() / 2 / n, (outputs.floats + 6 * draws.used) // n, outputs


def count_dropout_numbers(module: nn.Module, state: dict[str, Tensor],
                          samples: Tensor) -> tuple[int, set[float], list[tuple[int, ...]]]:
    """How many random numbers the dropout of `module`'s training-mode forward pass (with
    `state`, left as it was) uses on `samples`, the dropout probabilities of its calls, and
    their input shapes in order."""
    state = {n: t.clone() for n, t in state.items()}
    try:
        with torch.no_grad(), keyed_randomness(None) as draws:
            functional_call(module.train(), state, (samples,))
    finally:
        module.eval()
    return draws.used, set(draws.rates), draws.shapes


# --- the model -------------------------------------------------------------------------------

class ModuleModel:
    """An nn.Module behind fedsim's Model protocol (fedsim/training/models.py)."""

    code = "torch.func"
    local_buffers = False
    samples_independent = False  # its layers may mix a batch's samples; dropout draws follow shapes
    draws_randomness = True  # a step's keys are the seed's
    stacks_evaluation = False  # each module's state is evaluated on its own
    func_steps = True  # torch.func calls: one thread each under auto (fedsim/training/threads.py)
    reverse_mode_cohort = True  # (vmap of reverse mode: the loop's rule is rules 8's, `func_steps`)
    rules = training_rules.CURRENT  # the training rules the run started under (fedsim/training/rules.py)

    @property
    def plain_loop_step(self) -> bool:
        """Whether one device's step is a plain PyTorch loop's arithmetic (training rules 8):
        the mean loss and torch.optim.SGD's fused update."""
        return self.rules >= 8

    @property
    def loop_code(self) -> str:
        """One device's step: autograd through the module (a working copy of it) from rules 4."""
        return "torch's autograd" if self.rules >= 4 else self.code

    def __init__(self, name: str, module: nn.Module, in_shape: tuple[int, ...], n_classes: int, where: str):
        self.name, self.in_shape, self.where = name, in_shape, where
        check_state(module, where)
        self.module = module
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not trainable:
            raise FedsimError(f"{where}: the module has no trainable parameters (none with requires_grad=True); "
                              "give a module with parameters to train")
        buffers = [(n, b) for n, b in module.named_buffers()]
        self.n_trainable = len(trainable)
        self.names = [n for n, _ in trainable] + [n for n, _ in buffers]
        self.shapes = [tuple(t.shape) for _, t in trainable + buffers]
        self.dtypes = [t.dtype for _, t in trainable + buffers]
        self.numels = [t.numel() for _, t in trainable + buffers]
        self.dim = sum(self.numels)
        self.param_dim = sum(self.numels[:self.n_trainable])
        self.has_buffers = bool(buffers)
        self._integers = {n: b.dtype for n, b in buffers if not b.dtype.is_floating_point}
        # layers whose training output depends on the other samples of the batch (not only on
        # their own): padding a batch would change what they compute
        self.batch_statistics = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
        self._init = torch.cat([t.detach().reshape(-1).float() for _, t in trainable + buffers])
        self.flops, self.activations = self._probe(n_classes)
        self._one = grad_and_value(self._loss, has_aux=True)
        self._vmap_checked: tuple[str, list[str]] | None = None  # (`_vmap_probe`)
        self._numbers: dict[int, tuple[int, set[float]]] = {}  # batch size -> dropout numbers, rates
        self._call_shapes: dict[int, list[tuple[int, ...]]] = {}  # batch size -> its dropout calls' input shapes
        self._own_positions: dict[tuple, Tensor] = {}  # (padded, own batch size, device) -> `own_positions`
        self._divisors: dict[float, tuple[int, Tensor]] = {}  # p -> (threshold, a kept unit's divisor)
        self._no_numbers: dict[tuple, Tensor] = {}  # (shape, device) -> `randomness` of a module that draws none
        self._working: dict[int, tuple[nn.Module, list[Tensor]] | None] = {}  # thread -> `_working_copy`
        # the module itself: functional_call swaps its tensors (and sets its mode) for a call, so
        # the threads that train a run's devices side by side (loop.py) take turns with it
        self._module_lock = threading.RLock()
        # a step's forward and backward (the device clock): 3 x forward, or counted where frozen
        # parameters take no gradient (a frozen backbone: about the forward alone)
        self.train_flops = 3 * self.flops if len(trainable) == len(list(module.parameters())) else self._step_flops()
        self.tied = tied_names(module, self.names)
        frozen = any(n not in self.names and n not in self.tied for n in module.state_dict())  # its own constants
        self._shared_key = (tuple(zip(self.names, self.shapes)), id(module) if frozen else None)
        self._convolves_images = len(in_shape) == 3 and in_shape[1] * in_shape[2] >= CONV_LOOP_PIXELS \
            and any(isinstance(m, nn.Conv2d) for m in module.modules())

    @property
    def cohort_slow_on_cpu(self) -> str:
        """Why a loop of devices is faster on a CPU than the cohort in one vmap call ('' where it
        is not). From training rules 4: 2-d convolutions over images of 16x16 pixels or more,
        which vmap makes one grouped convolution over the cohort (a BatchNorm CNN on 28x28
        images: 1.3x a loop's round; on 8x8 images the batched call is faster:
        benchmarks/RESULTS.md, "A module written as a class"); from rules 6 only where they are
        at least half of the forward's multiply-adds (a vision transformer whose patch embedding
        is 7 % of them: 0.61-0.75x a plain loop's round batched, 0.81-1.01x on the loop;
        "Training rules 6"). From rules 5: an op that vmap has
        no batching rule for, which it runs device by device behind the cohort's call (torch's
        LSTM on a CPU: a 2-layer LSTM's round 2.4x a plain loop's, 1.2x on the loop)."""
        mostly_convolutions = self.rules < 6 or self._convolution_share >= CONV_LOOP_SHARE
        if self.rules >= 4 and self._convolves_images and mostly_convolutions:
            return convolutions_loop(self.code)
        unbatched = self._vmap_probe()[1] if self.rules >= 5 and next(self.module.parameters()).device.type == "cpu" \
            else []
        return (f"{', '.join(unbatched)} has no batching rule in torch.func.vmap, which runs it device by device: "
                "a loop of devices is faster on a CPU") if unbatched else ""

    # -- the flat layout ------------------------------------------------------------------------
    def shared_key(self) -> tuple:
        """Runs may train in one batched call (with one run's module) when their states have the
        same layout and their modules no constants of their own (frozen parameters)."""
        return self._shared_key

    def to(self, device: torch.device) -> ModuleModel:
        self.module.to(device)
        self._working.clear()
        return self

    def init(self, seed: int) -> Tensor:
        """The state the factory built (seeded by the run's seed at build time)."""
        return self._init.clone()

    def split(self, flat: Tensor) -> tuple[Tensor, ...]:
        """Views of flat states [..., d]: the trainable tensors, then the buffers."""
        lead = flat.shape[:-1]
        return tuple(c.view((*lead, *s)) for c, s in zip(flat.split(self.numels, dim=-1), self.shapes))

    def state_dict(self, flat: Tensor) -> dict[str, Tensor]:
        """The module's own state_dict (its names, order and dtypes) with the state `flat`."""
        state = {n: (t, dtype) for n, t, dtype in zip(self.names, self.split(flat.detach().cpu()), self.dtypes)}

        def saved(name: str, own: Tensor) -> Tensor:
            name = self.tied.get(name, name)
            if name not in state:  # a frozen parameter
                return own.detach().cpu().clone()
            t, dtype = state[name]  # an integer buffer (num_batches_tracked) averaged as a float
            return (t if dtype.is_floating_point else t.round()).to(dtype).clone()

        return {n: saved(n, t) for n, t in self.module.state_dict().items()}

    def load_state_dict(self, saved: dict[str, Tensor]) -> Tensor:
        """The flat state of a state_dict (checked by the caller); its frozen parameters become
        the module's. A buffer that the state_dict leaves out (persistent=False) keeps the
        module's own value."""
        frozen = {n: saved[n] for n in self.module.state_dict() if n not in self.names and n not in self.tied}
        self.module.load_state_dict(frozen, strict=False)
        own = dict(self.module.named_buffers())
        return torch.cat([(saved[n] if n in saved else own[n].detach().cpu()).reshape(-1).float() for n in self.names])

    # -- forward and steps ------------------------------------------------------------------------
    def typed(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """`state` as the forward reads it: integer and boolean buffers (an index, a mask, a
        counter) in their own dtype, from the float32 numbers fedsim sends and averages."""
        if not self._integers:  # (most modules: nothing to convert, every step)
            return state
        return {n: t.round().to(self._integers[n]) if n in self._integers else t for n, t in state.items()}

    def forward(self, params: tuple[Tensor, ...], x: Tensor, u: Tensor | None = None) -> Tensor:
        """Logits of x [B, *in_shape] in eval mode (evaluation)."""
        try:
            with self._module_lock:
                return functional_call(self.module.eval(), self.typed(dict(zip(self.names, params))), (x,))
        except Exception as err:
            raise self._failed(err, x, f"the module's forward raised {type(err).__name__} ({first_line(err)}) in "
                                       f"evaluation (eval mode) on a batch of {len(x)} samples; fix the forward (it "
                                       "ran on a batch of 2 in training mode at build time)") from None

    def _failed(self, err: Exception, x: Tensor, line: str) -> FedsimError:
        """The one line of a forward that raised `err` on x past the build-time checks; `err`
        itself where it is not the module's (`from_the_module`)."""
        if not from_the_module(err, x):
            raise err
        return FedsimError(f"{self.where}: {line}")

    def predict(self, params: Tensor, x: Tensor) -> Tensor:
        """Logits of x for a flat state [d] (evaluation), as Model.predict."""
        return self.forward(self.split(params), x)

    def predict_together(self, params: Tensor, x: Tensor) -> None:
        return None  # each module's state is evaluated on its own

    def evaluation_key(self) -> None:
        return None

    def fuse(self) -> None:
        pass  # (torch's own layers: nothing of fedsim's to compile)

    def randomness(self, seed: int, rnd: int, ids: Tensor, step: int | range, batch: int, own=None) -> Tensor:
        """The random numbers [m, n] of a local step's dropout, drawn for the cohort in one call:
        the n numbers (`dropout_numbers`) a forward of `batch` samples takes, call after call
        ([S, m, n] for a range of S steps, drawn in one call: the same numbers; `own` None).
        `own` (int [m], host): each device's own samples in the batch (the rest padding: an
        epoch's last minibatch, unequal full local data); from training rules 12 a device with
        fewer takes the numbers of a forward of its own samples (`own_positions`), as the loop
        trainer and a cohort without padding give it.
        Where every dropout call has one probability p, the numbers are what each call needs:
        on a CPU divisors (1 - p where `rng.keep_threshold` keeps a unit, inf where it drops
        it): each call in the forward is then one division, input / (1 - p) or 0 exactly as
        input * mask / (1 - p) computes it, forward and backward, where the mask and its
        products cost a quarter of a transformer's step (benchmarks/RESULTS.md, "Keyed
        dropout"); on a GPU, where division by a scalar is a product with its reciprocal, the
        keep-mask itself (bool: the same product as the comparison in the forward gave)."""
        n, rates = self._dropout(batch)
        lead = (len(step), len(ids)) if isinstance(step, range) else (len(ids),)
        if not n:  # (none: the same empty tensor every step)
            key = (lead, ids.device)
            if key not in self._no_numbers:
                self._no_numbers[key] = torch.empty(*lead, 0, dtype=torch.int64, device=ids.device)
            return self._no_numbers[key]
        keys = rng.keys(seed, rng.MODULE, rnd, ids, step).reshape(-1)
        threshold = rng.keep_threshold(next(iter(rates))) if len(rates) == 1 else None
        if not rng.in_blocks(ids.device) or threshold is None:
            numbers = rng.dropout_bits(keys, n, keep=threshold)
        else:
            p = next(iter(rates))
            if p not in self._divisors:
                self._divisors[p] = (threshold, torch.tensor(1.0 - p, dtype=torch.float32))
            numbers = rng.dropout_bits(keys, n, divisors=self._divisors[p])
        return self._as_own(numbers, batch, own).view(*lead, n)

    def _as_own(self, numbers: Tensor, batch: int, own) -> Tensor:
        """`numbers` of a padded forward of `batch` samples, each device's row rearranged so that
        its own samples take the numbers of a forward of them alone (training rules 12)."""
        if own is None or self.rules < 12:
            return numbers
        for b in np.unique(own[own < batch]):
            rows = torch.as_tensor(np.flatnonzero(own == b), device=numbers.device)
            numbers[rows] = numbers[rows].index_select(1, self.own_positions(batch, int(b), numbers.device))
        return numbers

    def own_positions(self, batch: int, own: int, device: torch.device) -> Tensor:
        """int64 [n(batch)]: for each number a forward of `batch` samples takes, the position
        that a forward of the first `own` of them takes for the same unit of the same dropout
        call (its padding samples: that call's first). Each call's input is laid out by its
        shapes at the two batch sizes: the dimension that differs is the batch's, wherever it is
        (a sequence-first transformer's [L, B, E]); where more than one differs, the own
        samples' numbers are taken as the first."""
        key = (batch, own, str(device))
        if key not in self._own_positions:
            self._dropout(batch), self._dropout(own)
            padded, alone = self._call_shapes[batch], self._call_shapes[own]
            parts, start = [], 0
            for big, small in zip(padded, alone):
                taken = math.prod(small)
                source = torch.arange(start, start + taken).view(small)
                differ = [k for k, (a, b) in enumerate(zip(big, small)) if a != b] if len(big) == len(small) else []
                if len(differ) == 1:
                    k = differ[0]
                    fill = list(small)
                    fill[k] = big[k] - small[k]
                    part = torch.cat([source, source.narrow(k, 0, 1).expand(fill)], dim=k).reshape(-1)
                else:
                    part = torch.cat([source.reshape(-1), torch.full((math.prod(big) - taken,), start)])
                parts.append(part)
                start += taken
            positions = torch.cat(parts) if parts and len(padded) == len(alone) else torch.arange(self._dropout(batch)[0])
            self._own_positions[key] = positions.to(device)
        return self._own_positions[key]

    def check_trains_on(self, batch: int) -> None:
        """FedsimError where the module's training forward of `batch` samples raises (BatchNorm1d
        on one sample): tried once per batch size."""
        self._dropout(batch)

    def dropout_numbers(self, batch: int) -> int:
        return self._dropout(batch)[0]

    def _dropout(self, batch: int) -> tuple[int, set[float]]:
        """Random numbers the dropout of a training forward of `batch` samples uses, and its
        calls' probabilities: counted on a batch of zeros once per batch size (a forward that
        uses more is refused in one line)."""
        if batch not in self._numbers:
            device = next(self.module.parameters()).device
            state = self.typed(dict(zip(self.names, self.split(self._init.to(device)))))
            x = self._sample(batch).to(device)

            def count() -> tuple[int, set[float], list]:
                return count_dropout_numbers(self.module, state, x)

            try:
                with self._module_lock:
                    n, rates, self._call_shapes[batch] = count()
                    self._numbers[batch] = n, rates
            except Exception as err:
                fix = "set [client] batch_size >= 2" if batch == 1 and "more than 1 value per channel" in str(err) \
                    else "fix the forward (it ran on a batch of 2 at build time)"  # (BatchNorm's on one sample)
                raise self._failed(err, x, f"the module cannot train on a batch of {batch} samples: "
                                           f"{why_failed(err, count)}; {fix}") from None
        return self._numbers[batch]

    def _loss(self, params: dict, buffers: dict, numbers: Tensor, x: Tensor, y: Tensor, weight: Tensor,
              loss: StepLoss):
        # the forward updates them: float ones cloned, integer ones made anew by `typed`
        buffers = self.typed({n: b if n in self._integers else b.clone() for n, b in buffers.items()})
        with keyed_randomness(numbers, self.where, self.rules), self._module_lock:
            logits = functional_call(self.module, {**params, **buffers}, (x,))
        return loss(logits, y, weight), buffers

    def _working_copy(self) -> tuple[nn.Module, list[Tensor]] | None:
        """The loop's own copy of the module, in training mode, and its tensors in `names` order
        (one per thread: the parts of a lockstep call train at once). Its frozen parameters are
        the module's own (a resumed run loads them there). None for a module that cannot be
        copied (one holding a lock or a file) or whose hooks are closures, which would read the
        module itself, not the copy (a bound method is bound to the copy)."""
        thread = threading.get_ident()
        if thread not in self._working:
            with self._module_lock:
                self._working[thread] = self._copy()
        return self._working[thread]

    def _copy(self) -> tuple[nn.Module, list[Tensor]] | None:
        """`_working_copy`'s copy of the module (None: it cannot have one)."""
        frozen = {id(p): p for p in self.module.parameters() if not p.requires_grad}
        try:
            work = copy.deepcopy(self.module, frozen).train()
        except Exception:
            return None
        if any(getattr(hook, "__closure__", None) or isinstance(hook, functools.partial)
               for m in work.modules() for hooks in _hooks(m) for hook in hooks.values()):
            return None
        tensors = dict(work.named_parameters()) | dict(work.named_buffers())
        return work, [tensors[n] for n in self.names]

    @contextmanager
    def trained_in_place(self, ws: tuple[Tensor, ...]):
        """A device's loop steps on the working copy's own tensors (`_loop_step`), which hold
        its state `ws` from before its first step and write it back after its last: two copies a
        device, not one a step (the copy was 4 % of a 118 k-parameter MLP's loop step). `ws`
        themselves where the step has no working copy (it swaps them in by functional_call)."""
        working = self._working_copy() if self.rules >= 4 else None
        if working is None:
            yield ws
            return
        tensors = working[1]
        self._copy_in(tensors, ws)
        try:
            yield tuple(tensors)
        finally:
            with torch.no_grad():
                for own, w in zip(tensors, ws):
                    w.copy_(own)

    def _copy_in(self, tensors: list[Tensor], ws: tuple[Tensor, ...]) -> None:
        """The state `ws` into the working copy's `tensors` (an integer buffer from its float)."""
        k = self.n_trainable
        with torch.no_grad():
            torch._foreach_copy_(tensors[:k], list(ws[:k]))
            for name, own, w in zip(self.names[k:], tensors[k:], ws[k:]):
                own.copy_(w.round() if name in self._integers else w)

    def _loop_step(self, ws: tuple[Tensor, ...], x: Tensor, y: Tensor, weight: Tensor, numbers: Tensor,
                   loss: StepLoss):
        """One device's step (training rules 4) as a plain loop takes it: the device's state
        copied into the working module's own tensors, its forward, autograd's gradients, its
        buffers (updated by the forward) copied back. The numbers of `_one` (torch.func's
        `grad_and_value` over `functional_call`) bit for bit for most modules (to float rounding
        where torch.func decomposes a backward: GroupNorm's), without functional_call swapping
        every tensor in and out each step (a transformer's loop round: 1.4x a plain loop's). A
        module without a working copy gets the state swapped in by functional_call (the same
        numbers, slower)."""
        working, k = self._working_copy(), self.n_trainable
        in_place = working is not None and ws[0] is working[1][0]  # (`trained_in_place`'s tensors)
        if working is not None:
            forward, tensors = working
            if not in_place:
                self._copy_in(tensors, ws)
        else:
            buffers = {n: w if n in self._integers else w.clone() for n, w in zip(self.names[k:], ws[k:])}
            tensors = [w.detach().requires_grad_() for w in ws[:k]] + list(self.typed(buffers).values())
            state = dict(zip(self.names, tensors))
            forward = lambda x: functional_call(  # noqa: E731  (train() walks every submodule: only when needed)
                self.module if self.module.training else self.module.train(), state, (x,))
        _draws.loop = True
        try:  # (the module itself, without a working copy, is one thread's at a time)
            with torch.enable_grad(), keyed_randomness(numbers, self.where, self.rules), \
                    (self._module_lock if working is None else nullcontext()):
                losses = loss(forward(x), y, weight)
                grads = torch.autograd.grad(losses, tensors[:k], allow_unused=True, materialize_grads=True)
        finally:
            _draws.loop = False
        if not in_place:
            with torch.no_grad():
                for own, w in zip(tensors[k:], ws[k:]):
                    w.copy_(own)
        return grads, losses.detach()

    def _call(self, loss: StepLoss, batched: bool):
        """(tensors as `split` gives them, x, y, weight, dropout numbers) -> (gradients, losses);
        the buffers are updated in place."""
        if not batched and self.rules >= 4:
            return lambda ws, x, y, weight, numbers: self._loop_step(ws, x, y, weight, numbers, loss)
        fn = vmap(self._one, in_dims=(0, 0, 0, 0, 0, 0, None), randomness="error") if batched else self._one
        k = self.n_trainable

        def call(ws, x, y, weight, numbers):
            if not self.module.training:  # (evaluation leaves it in eval mode; train() walks every submodule)
                self.module.train()
            grads, (losses, buffers) = fn(dict(zip(self.names[:k], ws[:k])), dict(zip(self.names[k:], ws[k:])),
                                          numbers, x, y, weight, loss)
            for b, new in zip(ws[k:], buffers.values()):
                b.copy_(new)
            return tuple(grads.values()), losses.detach()

        return call

    def step_fn(self, loss: StepLoss, batched: bool):
        """(tensors as `split` gives them, x, y, weight, dropout numbers) -> (gradients of the trainable
        tensors, loss); the buffers are updated in place. `batched`: every input has a leading
        device dimension. A forward that fails here (on other samples or another batch width than
        the build-time checks) is one line naming what failed."""
        call = self._call(loss, batched)

        def step(ws, x, y, weight, numbers):
            try:
                return call(ws, x, y, weight, numbers)
            except Exception as err:
                width = f"{x.shape[0]} devices x {x.shape[1]} samples under torch.func.vmap" if batched \
                    else f"a batch of {x.shape[0]} samples"
                fix = "set [client] trainer = 'loop', or fix the forward" if batched else "fix the forward"
                raise self._failed(err, x, f"the module cannot train on {width}: "
                                           f"{why_failed(err, lambda: call(ws, x, y, weight, numbers))}; {fix} (it ran "
                                           "on a batch of 2 at build time)") from None

        return step

    # -- build-time checks ------------------------------------------------------------------------
    def _sample(self, n: int) -> Tensor:
        dtype = torch.int64 if getattr(self.in_shape, "vocab_size", None) else torch.float32
        return torch.zeros(n, *self.in_shape, dtype=dtype)

    def _step_flops(self) -> float:
        """Multiply-adds per sample of a training step, forward and backward, as FlopCounterMode
        counts them on 2 inputs: the backward computes the gradients of trainable parameters
        only (and of no layer's input before the first of them)."""
        state = self.typed(dict(zip(self.names, self.split(self._init.clone()))))
        trainable = [state[n].requires_grad_() for n in self.names[:self.n_trainable]]
        x = self._sample(2)
        with self._module_lock, keyed_randomness(None), flop_counter() as counter:
            try:
                out = functional_call(self.module.train(), state, (x,))
                torch.autograd.grad(out.float().sum(), trainable, allow_unused=True)
            finally:
                self.module.eval()
        return counter.get_total_flops() / 2 / len(x)

    def _probe(self, n_classes: int) -> tuple[float, int]:
        """(multiply-adds, floats of outputs) per sample of a forward pass on 2 inputs of the
        dataset's shape, after checking that it runs, gives [B, n_classes] logits and draws no
        random numbers of its own (they would make runs depend on the order of the cohort); the
        convolutions' share of those multiply-adds is kept (`cohort_slow_on_cpu`)."""
        x = self._sample(2)
        state = self.typed(dict(zip(self.names, self.split(self._init))))
        before = plain_attributes(self.module)
        try:
            out, flops, floats, did = probe_forward(self.module, state, x, self.where)
        except (Exception, SystemExit) as err:
            raise self._forward_failed(err, x) from None
        if isinstance(out, (tuple, list)):  # which element holds the logits is the module's to say
            parts = ", ".join(str(list(t.shape)) if isinstance(t, Tensor) else type(t).__name__ for t in out)
            raise FedsimError(f"{self.where}: the module returns a {type(out).__name__} ({parts}) for a batch of 2 "
                              f"inputs; it must return logits [batch, {n_classes}] alone: return them from forward "
                              "(or wrap the module in one whose forward returns the logits' element)")
        if not isinstance(out, Tensor) or tuple(out.shape) != (2, n_classes):
            got = list(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise FedsimError(f"{self.where}: the module returns {got} for a batch of 2 inputs; it must return "
                              f"logits [batch, {n_classes}] (one per class of the dataset)")
        if not out.is_floating_point():
            raise FedsimError(f"{self.where}: the module returns logits of {out.dtype} for a batch of 2 inputs; it "
                              f"must return floating-point logits [batch, {n_classes}] (scores before softmax, "
                              "not class indices)")
        if did.random:
            alpha = [f"nn.{type(m).__name__} at {name!r}" if name else f"nn.{type(m).__name__}"
                     for name, m in self.module.named_modules() if isinstance(m, (nn.AlphaDropout, nn.FeatureAlphaDropout))]
            raise FedsimError(f"{self.where}: the module draws random numbers other than dropout "
                              f"({', '.join(sorted(did.random))}{', by ' + ', '.join(alpha) if alpha else ''}); fedsim "
                              "keys only dropout (nn.Dropout, nn.Dropout1d/2d/3d, attention dropout) by (seed, round, "
                              "device, step), so that runs repeat and resume exactly: use one of those, or take the "
                              "draw out of the forward")
        self._check_state_kept(did, before, state, x)
        self._convolution_share = did.convolution_flops / flops if flops else 0.0
        return flops, floats

    def _check_state_kept(self, did, before: dict, state: dict[str, Tensor], x: Tensor) -> None:
        """Refuse a forward that keeps state where fedsim cannot see it. fedsim's state is the
        tensors it passes in: changed only by its optimiser (parameters) or in place by the
        forward (buffers, as BatchNorm's running statistics); the rest would silently differ
        between trainers, evaluations and resumed runs."""
        if did.written:
            name, op = next(iter(did.written.items()))
            raise FedsimError(f"{self.where}: the module's forward changes parameter {name!r} in place ({op}), "
                              "behind the optimiser's back: fedsim would train, evaluate and average a state "
                              "the forward rewrites; compute a new tensor from it instead (w.clamp(-1, 1), not "
                              "w.data.clamp_) or register a parametrization (torch.nn.utils.parametrize)")
        if did.replaced:
            name = did.replaced[0]
            if name in self.names[:self.n_trainable]:
                fix = ("compute a new tensor from it in forward (a local variable) or register a parametrization "
                       "(torch.nn.utils.parametrize)")
            else:
                attribute = name.rpartition(".")[2]
                fix = (f"update it in place under torch.no_grad() (self.{attribute}.mul_(0.9).add_(...)), as "
                       "BatchNorm updates its running statistics")
            raise FedsimError(f"{self.where}: the module's forward assigns a new tensor to {name!r}, which fedsim "
                              f"never sees (it trains and sends the tensor it passed in); {fix}")
        after = plain_attributes(self.module)
        if after != before:  # once may be a lazy set-up (a cache filled on the first call); again is state
            try:
                with torch.no_grad(), keyed_randomness(torch.zeros((), dtype=torch.int64)):
                    functional_call(self.module.train(), {n: t.clone() for n, t in state.items()}, (x,))
            except (Exception, SystemExit) as err:
                raise self._forward_failed(err, x) from None
            finally:
                self.module.eval()
            again = {n: (after.get(n), v) for n, v in plain_attributes(self.module).items()
                     if after.get(n) is not v and after.get(n) != v}
            if again:
                name, (old, new) = next(iter(again.items()))
                raise FedsimError(f"{self.where}: the module's forward changes its attribute {name!r} at every call "
                                  f"({old!r} -> {new!r}): state outside its tensors, which fedsim neither sends, "
                                  "averages nor saves, and which counts fedsim's own calls (evaluations, one call "
                                  "for a batched cohort); keep it in a buffer (register_buffer, updated in place) "
                                  "or compute it from the input")

    def _forward_failed(self, err: BaseException, x: Tensor) -> FedsimError:
        """The line for a forward that raised: the module's own doing, or (when it runs as built,
        with its own state) its reading of state that torch.func.functional_call does not swap."""
        raised = f"{type(err).__name__} ({first_line(err)})"
        try:
            with torch.no_grad():
                self.module.eval()(x)  # eval mode: its running statistics stay as they are
        except (Exception, SystemExit):
            return FedsimError(f"{self.where}: the module's own forward raised {raised} on a batch of 2 of the "
                               f"dataset's inputs; fix the forward (hint: its input is [batch, "
                               f"{', '.join(map(str, self.in_shape))}])")
        return FedsimError(f"{self.where}: the module's forward runs as built, but raised {raised} with the state "
                           "fedsim gives it (through torch.func.functional_call); read parameters and buffers as "
                           "module attributes, not through tensors kept elsewhere (a list or dict of them)")

    def batch_problem(self) -> str:
        """Why the module cannot train under vmap ('' if it can)."""
        return self._vmap_probe()[0]

    def _vmap_probe(self) -> tuple[str, list[str]]:
        """One batched step of 2 devices (once; the batched trainer asks before training): why
        it failed ('' if it ran), and the ops that vmap ran device by device (torch warns of each
        op it has no batching rule for)."""
        if self._vmap_checked is None:
            m, b = 2, 2
            device = next(self.module.parameters()).device
            x = self._sample(m * b).view(m, b, *self.in_shape).to(device)
            ws = self.split(self._init.to(device).expand(m, -1).clone())
            call = self._call(lambda logits, y, w: F.cross_entropy(logits, y), batched=True)
            inputs = (ws, x, torch.zeros(m, b, dtype=torch.int64, device=device), torch.ones(m, b, device=device),
                      self.randomness(0, 0, torch.arange(m, device=device), 0, b))
            problem = ""
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    call(*inputs)
                except Exception as err:
                    problem = why_failed(err, lambda: call(*inputs))
                finally:
                    self.module.eval()
            unbatched = (_UNBATCHED.search(str(w.message)) for w in caught)
            self._vmap_checked = (problem, sorted({found.group(1) for found in unbatched if found}))
        return self._vmap_checked


# --- why a forward failed in training --------------------------------------------------------

def from_the_module(err: Exception, x: Tensor) -> bool:
    """Whether an exception from a module's forward is the module's (one line for the user),
    not fedsim's own refusal, nor memory running out, nor a failure to capture a CUDA graph
    (which fedsim/training/cuda_graphs.py takes as "train eagerly")."""
    return not isinstance(err, (FedsimError, MemoryError, torch.cuda.OutOfMemoryError)) and \
        not (x.is_cuda and torch.cuda.is_current_stream_capturing())


class _Failing(TorchFunctionMode):
    """Records the innermost torch call that raised, by the name a user writes (torch.nonzero,
    torch.Tensor.item): torch's own message names an aten op, or none."""

    def __init__(self):
        super().__init__()
        self.failed = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            self.failed = self.failed or func
            raise


# Python calls that read a tensor's value on the host (vmap cannot: the value differs per device)
_HOST_READS = {"item": "Tensor.item()", "tolist": "Tensor.tolist()", "numpy": "Tensor.numpy()",
               "__bool__": "bool() of a tensor (an if, and, or, while on its value)",
               "__float__": "float() of a tensor", "__int__": "int() of a tensor",
               "__index__": "a tensor as a Python index"}


def why_failed(err: Exception, again: Callable[[], object]) -> str:
    """What in a forward made it raise `err`: `again` (the call that raised) is repeated under
    `_Failing` to name the torch call. Values read on the host and shapes that depend on the
    data are what vmap cannot batch (the loop can)."""
    failing = _Failing()
    try:
        with failing:
            again()
    except Exception as repeated:  # (the same failure, normally)
        err = repeated
    name = (resolve_name(failing.failed) or getattr(failing.failed, "__qualname__", "")) if failing.failed else ""
    short = name.rpartition(".")[2]
    if short in _HOST_READS:
        return (f"its forward calls {_HOST_READS[short]}, which reads a tensor's value on the host; keep the "
                "value a tensor (tensor arithmetic, torch.where instead of an if)")
    if name and re.search(r"dynamic|differently shaped", str(err)):  # (torch's words for it)
        call = name.replace("torch.functional.", "torch.")  # (torch.unique)
        if short == "__getitem__":
            call = "x[mask] (indexing by a boolean mask)"
        return (f"its forward calls {call}, whose output's shape depends on the data; give it a fixed shape "
                "(torch.where, or multiply by the mask)")
    return f"its forward raised {type(err).__name__} ({first_line(err)}){f' in {name}' if name else ''}"


def plain_attributes(module: nn.Module) -> dict[str, object]:
    """The Python numbers and strings the module and its submodules hold (`training` aside)."""
    return {f"{prefix}.{k}".lstrip("."): v for prefix, m in module.named_modules() for k, v in vars(m).items()
            if isinstance(v, (int, float, str)) and k != "training"}


def tied_names(module: nn.Module, names: list[str]) -> dict[str, str]:
    """The other names under which the module holds a tensor of `names` (tied weights: an output
    layer that shares the embedding's), each -> its name in `names`: model.pt saves the trained
    tensor under both, as the module's own state_dict does."""
    held = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    first = {id(t): n for n, t in reversed(held) if n in names}
    return {n: first[id(t)] for n, t in held if n not in names and id(t) in first}


def check_state(module: nn.Module, where: str) -> None:
    """The module's parameters and buffers as fedsim holds them (float32 numbers it averages):
    with values (not on the meta device), real, and finite as the factory built them."""
    for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, t in named:
            if t.is_meta:
                raise FedsimError(f"{where}: {kind} {name!r} is on the meta device (a shape without values); "
                                  "build the module with values in the factory (not device='meta', or load its "
                                  "weights there)")
            if t.is_complex():
                raise FedsimError(f"{where}: {kind} {name!r} is {t.dtype}; fedsim trains and averages real "
                                  "numbers: keep a complex weight as two real ones (real and imaginary parts)")
            if t.is_floating_point() and t.dtype != torch.float32:
                raise FedsimError(f"{where}: {kind} {name!r} is {t.dtype}; fedsim trains, sends and averages "
                                  "float32 numbers (other precisions are not simulated): build the module in "
                                  "float32 (without .double(), .half() or .to(dtype))")
            if kind == "parameter" and not t.numel():
                raise FedsimError(f"{where}: parameter {name!r} has shape {tuple(t.shape)}, no numbers to train; "
                                  "check the sizes the factory built it with (a width of 0?)")
            largest = int(t.long().abs().max()) if kind == "buffer" and not t.is_floating_point() and t.numel() else 0
            if largest > 2**24:
                raise FedsimError(f"{where}: buffer {name!r} holds the integer {largest}, beyond 2**24, which fedsim's "
                                  "float32 copy of the state (sent and averaged) cannot hold exactly; keep such numbers "
                                  "out of buffers (a Python constant, or a tensor made in forward)")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise FedsimError(f"{where}: {kind} {name!r} holds nan or inf as the factory built it (fedsim "
                                  "sends and averages it, and inf - inf is nan); give it finite numbers (a mask: "
                                  "a bool buffer, or a large negative number instead of -inf)")

