"""The model concept: every model is an `nn.Module`, trained behind one `Model` protocol.

A `[model] name` names a factory `(in_shape, n_classes, model_config) -> nn.Module`: a built-in
(fedsim/training/architectures.py), a plugin, or a user's file. `build_model` calls it with the
run's seed and gives the trainers, the evaluator, CUDA graphs and lockstep studies a `Model`:
the module's state as one flat float32 vector per device, and how to train and evaluate it.
Two implementations sit under the protocol:

* `KernelModel` (fedsim/training/kernels.py): the built-ins, nn.Sequentials of layers that
  fedsim has hand-batched kernels for.
* `ModuleModel` (fedsim/training/modules.py): any other module, through torch.func
  (`functional_call`, `grad`, `vmap`). A user's nn.Sequential of layers with kernels trains on
  the kernels from training rules 2 (fedsim/training/rules.py), a class whose forward is a
  chain of them from rules 4; a run started under earlier rules resumes here, with its own
  numbers.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import ContextManager, Protocol

import torch
from torch import Tensor

from fedsim.config import ModelConfig
from fedsim.config.catalog import MODELS
from fedsim.errors import FedsimError, first_line
from fedsim.training import rules as training_rules
from fedsim.training.architectures import BUILT_IN, TokenShape
from fedsim.training.kernels import lower, lower_traced
from fedsim.training.losses import StepFn, StepLoss
from fedsim.training.modules import ModuleModel


class Model(Protocol):
    """What the trainers, the evaluator, CUDA graphs and lockstep know of a model."""

    name: str
    code: str  # what computes a cohort's step, as the manifest's `trainer` and the report name it
    loop_code: str  # what computes one device's step (the loop trainer)
    in_shape: tuple[int, ...]
    dim: int  # floats of the flat state: trainable parameters, then buffers
    param_dim: int  # of which the trainable parameters (the first param_dim floats)
    flops: float  # multiply-adds of one sample's forward pass (the thread rule)
    train_flops: float  # multiply-adds of one sample's training step, forward and backward (the device clock)
    activations: int  # floats of layer outputs per sample (how evaluation chunks the test set)
    # capabilities
    has_buffers: bool  # running statistics in the state
    local_buffers: bool  # [model] local_buffers: they stay on the devices
    batch_statistics: bool  # a layer mixes the samples of a batch (BatchNorm): never pad a batch
    samples_independent: bool  # a sample's output reads its own input and dropout numbers only
    draws_randomness: bool  # a step's inputs include numbers keyed by the run's seed (dropout)
    cohort_slow_on_cpu: str  # why the batched form is slower than a loop of devices on a CPU ('': it is not)
    stacks_evaluation: bool  # `predict_together` evaluates several states in one pass
    func_steps: bool  # its steps are torch.func calls (one thread each under auto: threads.py)
    reverse_mode_cohort: bool  # a cohort's step is reverse mode over vectors, no closed form (task.py's loop rule)
    plain_loop_step: bool  # its loop step is a plain PyTorch loop's: mean loss, torch's SGD update (rules 8)

    def to(self, device: torch.device) -> Model: ...
    def init(self, seed: int) -> Tensor: ...
    def split(self, flat: Tensor) -> tuple[Tensor, ...]: ...
    def trained_in_place(self, ws: tuple[Tensor, ...]) -> ContextManager[tuple[Tensor, ...]]: ...
    def state_dict(self, flat: Tensor) -> dict[str, Tensor]: ...
    def load_state_dict(self, saved: dict[str, Tensor]) -> Tensor: ...
    def predict(self, params: Tensor, x: Tensor) -> Tensor: ...
    def predict_together(self, params: Tensor, x: Tensor) -> Tensor | None: ...
    def randomness(self, seed: int, rnd: int, ids: Tensor, step: int | range, batch: int, own=None) -> Tensor: ...
    def dropout_numbers(self, batch: int) -> int: ...  # numbers a device's step of `batch` samples draws
    def step_fn(self, loss: StepLoss, batched: bool) -> StepFn: ...
    def batch_problem(self) -> str: ...
    def check_trains_on(self, batch: int) -> None: ...
    def shared_key(self) -> tuple: ...
    def evaluation_key(self) -> tuple | None: ...
    def fuse(self) -> None: ...


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


IMAGE_ONLY = frozenset({"resnet18-gn", "lenet5", "cnn-svhn", "cnn-cifar", "cnn-cinic", "cnn-fmnist", "cnn-cifar-wj", "cnn-femnist"})
TEXT_MODELS = ("lstm", "char-lstm")  # the built-ins that read token ids (through an embedding)


def build_model(cfg: ModelConfig, in_shape: tuple[int, ...], n_classes: int, dataset: str,
                seed: int = 0, rules: int = training_rules.CURRENT) -> Model:
    """The `[model]` network: its factory's nn.Module, on fedsim's kernels where its layers
    have them (fedsim/training/kernels.py; a user's module from training rules 2), through
    torch.func otherwise."""
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
    if not isinstance(built, torch.nn.Module):
        fix = "wrap them in torch.nn.Sequential(...)" if isinstance(built, (list, tuple)) else "return the module it builds"
        raise FedsimError(f"{where}: the factory returned {_describe(built)}, not a torch.nn.Module; {fix}")
    if factory in BUILT_IN:
        model = lower(cfg.name, built, in_shape)
    else:
        model = ModuleModel(cfg.name, built, in_shape, n_classes, where)  # every check a module gets
        if rules >= 2:
            model = lower(cfg.name, model.module, in_shape, rules) or model
        if rules >= 4 and isinstance(model, ModuleModel):
            model = lower_traced(cfg.name, model.module, in_shape, rules) or model
    model.rules = rules
    if cfg.local_buffers and not model.has_buffers:
        raise FedsimError(f"{where}: [model] local_buffers = true, but the module has no buffers (running "
                          "statistics) to keep on the devices; set local_buffers = false")
    model.local_buffers = cfg.local_buffers
    if cfg.train_flops_per_sample:
        model.flops = cfg.train_flops_per_sample / 6  # multiply-adds of a forward pass (3 x forward, 2 per MAC)
        model.train_flops = cfg.train_flops_per_sample / 2
    return model


def model_dim(cfg: ModelConfig, in_shape: tuple[int, ...], n_classes: int, seed: int = 0,
              rules: int = training_rules.CURRENT) -> int | None:
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
    if not isinstance(built, torch.nn.Module):
        return None
    if (factory in BUILT_IN or rules >= 2) and lower(cfg.name, built, in_shape, rules) is not None:  # (fixed vectors: constants)
        return sum(p.numel() for p in built.parameters())
    trainable = sum(p.numel() for p in built.parameters() if p.requires_grad)
    return trainable + sum(b.numel() for b in built.buffers())


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
    declared = getattr(factory, "options", None)  # a plugin's own keys: their defaults, then the config's
    if isinstance(declared, dict):
        cfg = dataclasses.replace(cfg, options={**declared, **cfg.options})
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
        return f"a {type(obj).__name__} of {', '.join(type(x).__name__ for x in obj[:4])}{', ...' * (len(obj) > 4)}"
    return f"{type(obj).__name__} {obj!r}"[:120]
