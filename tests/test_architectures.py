"""The built-in models are ordinary nn.Modules (issue 38): readable, loadable with plain torch,
and trained by fedsim's kernels with exactly the numbers they always had."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.config import ModelConfig
from fedsim.config.catalog import MODELS
from fedsim.training import architectures
from fedsim.training.architectures import TokenShape
from fedsim.training.kernels import KernelModel, lower, lower_traced
from fedsim.training.models import build_model
from fedsim.training.modules import ModuleModel

SHAPES = {"logreg": (1, 8, 8), "mlp": (1, 8, 8), "lenet5": (1, 12, 12), "lstm": (1, 8, 8),
          "cnn-fmnist": (1, 8, 8), "cnn-svhn": (3, 8, 8), "cnn-cifar": (3, 8, 8), "cnn-cinic": (3, 8, 8),
          "cnn-cifar-wj": (3, 8, 8), "cnn-femnist": (1, 8, 8), "char-lstm": TokenShape(7, 12)}
WORDS = np.random.default_rng(0).normal(size=(12, 5)).astype(np.float32)


def inputs(shape, n=6):
    if isinstance(shape, TokenShape):
        return torch.randint(0, 12, (n, *shape), generator=torch.Generator().manual_seed(1))
    return torch.rand(n, *shape, generator=torch.Generator().manual_seed(1))


def test_every_builtin_but_resnet_is_written_here():
    assert set(SHAPES) | {"resnet18-gn"} == set(MODELS)
    assert {f.__name__.replace("_", "-") for f in architectures.BUILT_IN} == set(SHAPES)


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_builtin_is_a_plain_module_that_fedsims_kernels_compute_exactly(name):
    """The factory gives an nn.Sequential of torch layers; seeded as a run seeds it, it holds the
    run's initial model; its own forward (eval mode) gives the logits fedsim's kernels give."""
    cfg = ModelConfig(name=name, dropout=0.3 if name != "logreg" else 0.0, hidden=16)
    model = build_model(cfg, SHAPES[name], 10, "tiny", seed=11)
    assert isinstance(model, KernelModel)
    torch.manual_seed(11)
    module = MODELS.lookup(name, "name")(SHAPES[name], 10, cfg)
    assert isinstance(module, nn.Sequential)
    assert list(module.state_dict()) == list(model.state_dict(model.init(11)))
    assert torch.equal(torch.cat([p.detach().flatten() for p in module.parameters()]), model.init(11))
    x = inputs(SHAPES[name])
    with torch.no_grad():
        torch.testing.assert_close(module.eval()(x), model.predict(model.init(11), x), rtol=1e-5, atol=1e-5)


def test_the_initialisation_is_the_builtins_rule():
    """Kaiming-normal dense and convolutional weights (ReLU gain, fan-in), zero biases."""
    torch.manual_seed(3)
    module = architectures.lenet5((1, 28, 28), 10, ModelConfig())
    for layer in (module.conv1, module.conv2, module.fc1, module.fc3):
        fan_in = layer.weight[0].numel()
        assert layer.weight.std().item() == pytest.approx((2 / fan_in) ** 0.5, rel=0.25)
        assert not layer.bias.any()
    assert module.conv1.padding == (2, 2)  # 28x28 padded to LeNet's 32x32


def test_word_vectors_are_a_constant_not_a_parameter():
    cfg = ModelConfig(name="lstm")
    shape = TokenShape(7, 12, WORDS)
    model = build_model(cfg, shape, 3, "tiny", seed=0)
    assert "embedding.vectors" not in model.state_dict(model.init(0))
    assert model.dim == sum(p.numel() for p in architectures.lstm(shape, 3, cfg).parameters())
    torch.manual_seed(0)
    module = architectures.lstm(shape, 3, cfg)
    x = inputs(shape)
    with torch.no_grad():
        torch.testing.assert_close(module(x), model.predict(model.init(0), x), rtol=1e-5, atol=1e-5)


def test_a_users_sequential_of_kernel_layers_trains_on_the_kernels_under_rules_2():
    """Training rules 2 lower a user's nn.Sequential by its layers' types (model.pt keeps the
    module's own names); a run started under rules 1 keeps it on torch.func."""
    MODELS.register("user-seq-mlp", lambda s, n, cfg: nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(),
                                                                    nn.Dropout(0.1), nn.Linear(16, n)))
    try:
        model = build_model(ModelConfig(name="user-seq-mlp"), (1, 8, 8), 10, "tiny", seed=4)
        old = build_model(ModelConfig(name="user-seq-mlp"), (1, 8, 8), 10, "tiny", seed=4, rules=1)
    finally:
        del MODELS["user-seq-mlp"]
    assert isinstance(model, KernelModel) and isinstance(old, ModuleModel)
    assert list(model.state_dict(model.init(4))) == ["1.weight", "1.bias", "4.weight", "4.bias"]
    assert torch.equal(model.init(4), old.init(4))
    x = inputs((1, 8, 8))
    with torch.no_grad():
        torch.testing.assert_close(model.predict(model.init(4), x), old.predict(old.init(4), x))


@pytest.mark.parametrize("layer", [nn.Conv2d(1, 2, 3, stride=2), nn.Conv2d(1, 2, 3, bias=False),
                                   nn.Conv2d(1, 2, 3, padding=(1, 0)), nn.MaxPool2d(3), nn.AvgPool2d(2),
                                   nn.Dropout2d(0.1)])
def test_layers_without_a_kernel_are_not_lowered(layer):
    assert lower("x", nn.Sequential(layer), (1, 8, 8)) is None
    assert lower("x", nn.Sequential(nn.Conv2d(1, 2, 3, padding=1)), (1, 8, 8)) is not None


def test_a_runs_model_pt_loads_into_the_builtin_with_plain_torch(cli_run, tmp_path):
    """`fedsim run` with cnn-svhn on digits; model.pt loads (strict) into the module the factory
    builds, and the module scores the run's final test accuracy on the test set."""
    run = cli_run({"run": {"rounds": 3, "eval_every": 3},
                   "data": {"dataset": "digits", "clients": 6},
                   "model": {"name": "cnn-svhn"},
                   "server": {"timing": "ideal", "clients_per_round": 3},
                   "client": {"local_steps": 2, "batch_size": 8}}, name="cnn")
    module = architectures.cnn_svhn((1, 8, 8), 10, ModelConfig(name="cnn-svhn"))
    logits, labels = scores_the_runs_final_accuracy(module, run)
    assert float(F.cross_entropy(logits, labels)) > 0


def scores_the_runs_final_accuracy(module: nn.Module, run) -> tuple[torch.Tensor, torch.Tensor]:
    """Load the run's model.pt (strict) into `module`, score digits' test set with it: its
    accuracy is the run's final test accuracy. The logits and the labels."""
    from fedsim.config import DataConfig
    from fedsim.data.datasets import load_dataset

    module.load_state_dict(torch.load(run / "model.pt"))
    data = load_dataset(DataConfig(dataset="digits", clients=6), 0)
    x = torch.as_tensor(data.x_test, dtype=torch.float32) * data.scale
    with torch.no_grad():
        logits = module.eval()(x.view(-1, 1, 8, 8))
    accuracy = float((logits.argmax(1) == torch.as_tensor(data.y_test)).double().mean())
    final = pl.read_parquet(run / "rounds.parquet").drop_nulls("test_acc")["test_acc"][-1]
    assert accuracy == pytest.approx(final, abs=1e-9)
    return logits, torch.as_tensor(data.y_test)


FMNIST = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not __import__("pathlib").Path(FMNIST).exists(),
                    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
def test_the_guides_scoring_snippet_runs_as_written_on_a_runs_model_pt(cli_run, tmp_path, monkeypatch):
    """docs/extending.md's `score_lenet5.py` on a lenet5 run of Fashion-MNIST: the classes it
    prints are those fedsim's evaluation computes with the run's model."""
    import subprocess
    import sys

    from fedsim.config import DataConfig
    from fedsim.data.datasets import load_dataset
    from test_plugins import doc_blocks

    monkeypatch.chdir(tmp_path)
    (tmp_path / "score_lenet5.py").write_text(doc_blocks("score_lenet5.py")[0])
    run = cli_run({"run": {"rounds": 2, "eval_every": 2},
                   "data": {"dataset": "fashion-mnist", "root": FMNIST, "clients": 10},
                   "model": {"name": "lenet5"},
                   "server": {"timing": "ideal", "clients_per_round": 2},
                   "client": {"local_steps": 5, "batch_size": 16}}, name="lenet")
    data = load_dataset(DataConfig(dataset="fashion-mnist", root=FMNIST, clients=10), 0)
    images = torch.as_tensor(data.x_test[:50], dtype=torch.float32).mul(data.scale)
    torch.save(images, tmp_path / "images.pt")
    out = subprocess.run([sys.executable, "score_lenet5.py", str(run / "model.pt"), "images.pt"],
                         capture_output=True, text=True, check=True).stdout
    model = build_model(ModelConfig(name="lenet5"), (1, 28, 28), 10, "fashion-mnist")
    flat = model.load_state_dict(torch.load(run / "model.pt"))
    with torch.inference_mode():
        expected = model.predict(flat, images).argmax(dim=1).tolist()
    assert json.loads(out) == expected and len(set(expected)) > 1


@pytest.mark.parametrize("name", ["lenet5", "cnn-fmnist"])
def test_the_pool_before_its_relu_trains_exactly_as_the_modules_order(name):
    """The kernels apply a max pool before the ReLU the module puts first (a quarter of the
    ReLU's work): the same logits and the same gradients, bit for bit, one device and a cohort."""
    from fedsim.training.kernels import autograd_step
    from fedsim.training.losses import weighted_cross_entropy

    model = build_model(ModelConfig(name=name, dropout=0.2), (1, 12, 12), 10, "tiny", seed=2)
    assert [type(l).__name__ for l in model.train_layers[:3]] == ["Conv", "MaxPool", "ReLU"]
    g = torch.Generator().manual_seed(3)
    params = model.init(2)[None].expand(3, -1) + 0.05 * torch.randn(3, model.dim, generator=g)
    x, y = torch.randn(3, 8, 1, 12, 12, generator=g), torch.randint(0, 10, (3, 8), generator=g)
    weight, u = torch.full((3, 8), 1 / 8), torch.rand(3, 8, model.dropout_features, generator=g)

    def module_order(ps, x, u):  # the layers as the module lists them
        p, used = {q.name: v for q, v in zip(model.params, ps)}, 0
        for layer in model.layers:
            x = layer(p, x, u[:, used:used + layer.dropout])
            used += layer.dropout
        return x

    ours = model.step_fn(weighted_cross_entropy, batched=False)
    theirs = autograd_step(module_order, weighted_cross_entropy)
    for k in range(3):
        a, b = ours(model.split(params[k]), x[k], y[k], weight[k], u[k]), \
            theirs(model.split(params[k]), x[k], y[k], weight[k], u[k])
        assert torch.equal(a[1], b[1]) and all(torch.equal(s, t) for s, t in zip(a[0], b[0]))


@pytest.mark.parametrize("name,shape", [("logreg", (1, 8, 8)), ("mlp", (1, 8, 8)), ("lenet5", (1, 12, 12)),
                                        ("cnn-fmnist", (1, 8, 8)), ("cnn-svhn", (3, 9, 9))])
def test_one_devices_step_is_torch_autograd_through_the_module_bit_for_bit(name, shape):
    """The loop's step (reverse mode written out by the kernels, each max pool on a
    channels-last copy and before its ReLU) gives the loss and gradients of torch's autograd
    through the built-in nn.Module itself, bit for bit. A blank band in the images makes
    pooling windows tie (a convolution of zeros is its bias): the gradient goes where torch's
    sends it; 9x9 images pool with a row and a column left over."""
    from fedsim.training.kernels import reverse_step
    from fedsim.training.losses import weighted_cross_entropy

    cfg = ModelConfig(name=name, hidden=16)
    model = build_model(cfg, shape, 10, "tiny", seed=4)
    step = model.step_fn(weighted_cross_entropy, batched=False)
    assert step.__qualname__.startswith(reverse_step.__name__)
    torch.manual_seed(4)
    module = MODELS.lookup(name, "name")(shape, 10, cfg)
    g = torch.Generator().manual_seed(5)
    x, y = torch.rand(8, *shape, generator=g), torch.randint(0, 10, (8,), generator=g)
    x[:, :, : shape[1] // 2] = 0.0
    weight = torch.rand(8, generator=g)
    loss = (F.cross_entropy(module(x), y, reduction="none") * weight).sum()
    expected = torch.autograd.grad(loss, list(module.parameters()))
    grads, ours = step(model.split(model.init(4)), x, y, weight, torch.empty(8, 0))
    assert torch.equal(ours, loss.detach())
    assert len(grads) == len(expected) and all(torch.equal(a, b) for a, b in zip(grads, expected))


class TracedActivations(torch.nn.Module):
    """A class whose forward calls the activations functionally (read by torch.fx)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(64, 24), torch.nn.Linear(24, 16), torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.sigmoid(F.gelu(self.a(x.flatten(1)), approximate="tanh"))
        return self.c(F.leaky_relu(F.silu(self.b(x)), 0.2).tanh())


class TracedActivations8(torch.nn.Module):
    """The activations of training rules 8 called functionally in a class's forward."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(64, 24), torch.nn.Linear(24, 16), torch.nn.Linear(16, 10)

    def forward(self, x):
        x = F.hardtanh(F.selu(F.celu(F.elu(self.a(x.flatten(1)), 0.7), 1.3)), -0.5, 0.8)
        x = F.mish(F.softplus(F.relu6(self.b(x)), beta=2.0, threshold=1.0))
        return self.c(F.hardsigmoid(F.hardswish(x)))


ACTIVATION_NETS = {  # training rules 7: the activations fedsim has kernels for, in a CNN and in a chain
    "gelu cnn": lambda: torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.GELU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(64, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10)),
    "functional calls in a class": TracedActivations,
    "layer norm": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 24), torch.nn.LayerNorm(24), torch.nn.GELU(), torch.nn.Linear(24, 10)),
    # training rules 8
    "elu cnn": lambda: torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ELU(0.5), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(64, 16), torch.nn.SELU(), torch.nn.Linear(16, 12), torch.nn.CELU(2.0), torch.nn.Linear(12, 10)),
    "softplus, mish, hard ones": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 24), torch.nn.Softplus(2.0, 1.0), torch.nn.Linear(24, 20),
        torch.nn.Mish(), torch.nn.Linear(20, 16), torch.nn.Hardswish(), torch.nn.Linear(16, 14), torch.nn.Hardsigmoid(),
        torch.nn.Linear(14, 12), torch.nn.ReLU6(), torch.nn.Linear(12, 11), torch.nn.Hardtanh(-0.2, 0.3),
        torch.nn.Linear(11, 10)),
    "rules 8 functional calls in a class": TracedActivations8,
}
RULES_8_NETS = ("elu cnn", "softplus, mish, hard ones", "rules 8 functional calls in a class")


@pytest.mark.parametrize("name", ACTIVATION_NETS)
def test_one_devices_step_through_each_activation_is_torch_autograd_bit_for_bit(name):
    """GELU (both forms), tanh, sigmoid, SiLU, leaky ReLU and LayerNorm on vectors have kernels
    from training rules 7, ELU, CELU, SELU, softplus, Mish, hardswish, hardsigmoid, hardtanh and
    ReLU6 from rules 8 (under earlier rules such a module trains through torch.func): the loop's
    step gives autograd's loss and gradients through the module, bit for bit; the batched step
    each device's to float rounding."""
    steps_are_autograds(name, ACTIVATION_NETS[name](), 7 if name in RULES_8_NETS else 6)


class ResidualMLP(torch.nn.Module):
    """A dense layer, a residual block `h + relu(fc(h))`, the head."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(64, 24), torch.nn.Linear(24, 24), torch.nn.Linear(24, 10)

    def forward(self, x):
        h = F.relu(self.a(x.flatten(1)))
        return self.c(h + F.relu(self.b(h)))


class TwoResidualBlocks(torch.nn.Module):
    """Blocks summed either way round (`torch.add`, `.add`), a LayerNorm and two layers in one,
    and the flattened input itself as the first block's input."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(64, 32), torch.nn.Linear(32, 64), torch.nn.Linear(64, 64)
        self.norm, self.head = torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)

    def forward(self, x):
        h = x.flatten(1)
        h = torch.add(self.b(F.gelu(self.a(h))), h)
        return self.head(h.add(self.norm(F.elu(self.c(h)))))


class ConvResidual(torch.nn.Module):
    """A residual block of two padded convolutions on images."""

    def __init__(self):
        super().__init__()
        self.stem, self.one, self.two = (torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 3, padding=1),
                                         torch.nn.Conv2d(4, 4, 5, padding=2))
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        h = F.relu(self.stem(x))
        h = self.two(F.relu(self.one(h))) + h
        return self.fc(F.max_pool2d(F.relu(h), 2).flatten(1))


RESIDUAL_NETS = {"residual block": ResidualMLP, "two residual blocks": TwoResidualBlocks,
                 "convolutions": ConvResidual}


@pytest.mark.parametrize("name", RESIDUAL_NETS)
def test_one_devices_step_through_residual_blocks_is_torch_autograd_bit_for_bit(name):
    """From training rules 9 a residual block (`h + block(h)`, either way round) in a class's
    chain has a kernel: the loop's step is autograd's through the module, bit for bit, the
    batched step each device's to float rounding; under rules 8 the module trains through
    torch.func."""
    steps_are_autograds(name, RESIDUAL_NETS[name](), 8)


class BatchNormResidual(torch.nn.Module):
    """BatchNorm in a residual block of convolutions, and after a dense layer."""

    def __init__(self):
        super().__init__()
        self.stem, self.conv = torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 3, padding=1)
        self.norm2d, self.fc, self.norm1d = torch.nn.BatchNorm2d(4, momentum=0.3), torch.nn.Linear(64, 16), \
            torch.nn.BatchNorm1d(16, eps=1e-3)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        h = F.relu(self.stem(x))
        h = F.max_pool2d(F.relu(h + self.norm2d(self.conv(h))), 2)
        return self.head(F.relu(self.norm1d(self.fc(h.flatten(1)))))


BATCH_NORM_NETS = {
    "batch norm mlp": lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32),
                                                  torch.nn.ReLU(), torch.nn.Linear(32, 10)),
    "batch norm cnn": lambda: torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                                  torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                                  torch.nn.Linear(64, 10)),
    "batch norm in a residual block": BatchNormResidual,
}


@pytest.mark.parametrize("name", BATCH_NORM_NETS)
def test_one_devices_step_through_batch_norm_is_torch_autograd_bit_for_bit(name):
    """From training rules 10 nn.BatchNorm1d (vectors) and nn.BatchNorm2d (images) have kernels:
    the loop's step is autograd's through the module and the running statistics move as the
    module's own, bit for bit; the batched step each device's to float rounding; under rules 9
    the module trains through torch.func."""
    module = BATCH_NORM_NETS[name]()
    with torch.no_grad():  # (running statistics away from their zeros and ones)
        for key, b in module.named_buffers():
            if "running" in key:
                b.add_(torch.rand_like(b))
    steps_are_autograds(name, module, 9)


@pytest.mark.parametrize("layer", [torch.nn.BatchNorm1d(32, affine=False), torch.nn.BatchNorm1d(32, momentum=None),
                                   torch.nn.BatchNorm1d(32, track_running_stats=False)])
def test_a_batch_norm_the_kernels_do_not_know_trains_through_torch_func(layer):
    """Without an affine transform, with a cumulative average (momentum None) or without running
    statistics: not lowered."""
    from fedsim.training.kernels import lower

    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), layer, torch.nn.Linear(32, 10))
    assert lower("x", module, (1, 8, 8)) is None


class _NestedResidual(ResidualMLP):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(24, 24)

    def forward(self, x):
        h = F.relu(self.a(x.flatten(1)))
        g = F.relu(self.b(h))
        return self.c(h + F.relu(g + self.inner(g)))


class _ReadThrice(ResidualMLP):
    def forward(self, x):
        h = F.relu(self.a(x.flatten(1)))
        return self.c(h + F.relu(self.b(h)) + h)


class _ScaledSum(ResidualMLP):
    def forward(self, x):
        h = F.relu(self.a(x.flatten(1)))
        return self.c(torch.add(h, F.relu(self.b(h)), alpha=0.5))


class _InPlaceFirst(ResidualMLP):
    def forward(self, x):
        h = self.a(x.flatten(1))
        return self.c(h + self.b(F.relu(h, inplace=True)))


@pytest.mark.parametrize("cls", [_NestedResidual, _ReadThrice, _ScaledSum, _InPlaceFirst])
def test_a_residual_sum_the_kernels_do_not_know_trains_through_torch_func(cls):
    """A block in a block, an input read three times, a scaled sum, a block whose first call
    changes its input in place (the sum then reads the changed input): not lowered."""
    from fedsim.training.kernels import lower_traced

    assert lower_traced("x", ResidualMLP(), (1, 8, 8)) is not None
    assert lower_traced("x", cls(), (1, 8, 8)) is None


def steps_are_autograds(name: str, module: torch.nn.Module, before: int) -> None:
    """`module` lowers to the kernels, not under training rules `before`; one device's step is
    torch autograd's through the module bit for bit, and a cohort's step each device's to float
    rounding; buffers (BatchNorm's running statistics) move as the module's own, bit for bit on
    one device."""
    from fedsim.training.kernels import lower, lower_traced, reverse_step
    from fedsim.training.losses import weighted_cross_entropy

    torch.manual_seed(6)
    with torch.no_grad():  # (LayerNorm's weight and bias away from their ones and zeros)
        for q in module.parameters():
            q.add_(0.1 * torch.randn_like(q))
    model = lower(name, module, (1, 8, 8)) or lower_traced(name, module, (1, 8, 8))
    assert lower(name, module, (1, 8, 8), rules=before) is lower_traced(name, module, (1, 8, 8), rules=before) is None
    step = model.step_fn(weighted_cross_entropy, batched=False)
    assert step.__qualname__.startswith(reverse_step.__name__)
    g = torch.Generator().manual_seed(7)
    x, y, weight = torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g), torch.rand(8, generator=g)
    state = model.init(0).clone()
    loss = (F.cross_entropy(module(x), y, reduction="none") * weight).sum()
    expected = torch.autograd.grad(loss, list(module.parameters()))
    grads, ours = step(model.split(state), x, y, weight, torch.empty(8, 0))
    assert torch.equal(ours, loss.detach())
    assert len(grads) == len(expected) and all(torch.equal(a, b) for a, b in zip(grads, expected))
    theirs = module.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict(state).items())
    starts = model.init(0)[None] + 0.05 * torch.randn(3, model.dim, generator=g)
    stepped = starts.clone()
    xs, ys, weights = torch.randn(3, 8, 1, 8, 8, generator=g), torch.randint(0, 10, (3, 8), generator=g), torch.rand(3, 8)
    cohort, losses = model.step_fn(weighted_cross_entropy, batched=True)(model.split(stepped), xs, ys, weights,
                                                                         torch.empty(3, 8, 0))
    for k in range(3):
        own_state = starts[k].clone()
        alone, own = step(model.split(own_state), xs[k], ys[k], weights[k], torch.empty(8, 0))
        torch.testing.assert_close(losses[k], own)
        torch.testing.assert_close(stepped[k], own_state)
        for a, b in zip(cohort, alone):  # (a bias before BatchNorm has the gradient 0 up to rounding)
            torch.testing.assert_close(a[k], b, rtol=1e-5, atol=1e-5 if model.batch_statistics else 1e-6)


@pytest.mark.parametrize("shape", [(16, 32, 28, 28), (3, 6, 9, 7), (2, 60, 10, 10)])
def test_the_channels_last_pool_is_torchs_max_pool_forward_and_backward(shape):
    """Training's 2x2 max pool on a CPU (a channels-last copy through torch's kernel) gives
    max_pool2d's output and input gradient, ties and odd sizes included."""
    from fedsim.training.kernels import max_pool_2x2

    g = torch.Generator().manual_seed(6)
    x = torch.relu(torch.randn(*shape, generator=g))  # zeros tie
    x[:, :, :3] = 0.5
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = max_pool_2x2(ours), F.max_pool2d(theirs, 2)
    grad = torch.randn(expected.shape, generator=g)
    out.backward(grad)
    expected.backward(grad)
    assert torch.equal(out, expected) and out.is_contiguous()
    assert torch.equal(ours.grad, theirs.grad)


class _ClassLeNet(nn.Module):
    """LeNet-5 as users write it: attributes declared in another order than the forward uses
    them, functional ReLUs and pools, a flatten."""

    def __init__(self, n_classes=10):
        super().__init__()
        self.fc = nn.Linear(16 * 2 * 2, n_classes)
        self.conv1, self.conv2 = nn.Conv2d(1, 6, 3, padding=1), nn.Conv2d(6, 16, 3, padding=1)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), (2, 2))
        return self.fc(torch.flatten(x, 1))


class _Tutorial(nn.Module):
    """The PyTorch tutorial's form (a pool module, `x.view(-1, features)`), with a nested
    Sequential."""

    def __init__(self, n_classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
        self.pool, self.fc1, self.fc2 = nn.MaxPool2d(2, 2), nn.Linear(4 * 4 * 4, 12), nn.Linear(12, n_classes)

    def forward(self, x):
        x = self.pool(self.features(x)).view(-1, 4 * 4 * 4)
        return self.fc2(F.relu(self.fc1(x)))


class _SizeView(_ClassLeNet):
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(F.dropout(x.view(x.size(0), -1), 0.25, self.training))


class _AlwaysDrops(_ClassLeNet):
    """F.dropout's `training` left at its default: it drops in evaluation too."""

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc(F.dropout(torch.flatten(F.max_pool2d(F.relu(self.conv2(x)), 2), 1), 0.25))


class _Residual(_ClassLeNet):
    def forward(self, x):
        h = F.relu(self.conv1(x))
        return self.fc(F.max_pool2d(F.max_pool2d(self.conv2(h) + h.sum(1, keepdim=True), 2), 2).flatten(1))


class _AvgPooled(_ClassLeNet):
    def forward(self, x):
        x = F.avg_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc(torch.flatten(F.max_pool2d(F.relu(self.conv2(x)), 2), 1))


class _WithNorm(_ClassLeNet):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(6)

    def forward(self, x):
        return super().forward(self.norm(x.expand(-1, 6, -1, -1))[:, :1])


def _registered(name, factory):
    MODELS.register(name, factory)
    return name


@pytest.mark.parametrize("cls", [_ClassLeNet, _Tutorial, _SizeView])
def test_a_users_class_whose_forward_is_a_chain_of_kernel_layers_trains_on_the_kernels_under_rules_4(cls):
    """Training rules 4 read a module written as a class (its forward traced by torch.fx) and
    train it on the kernels when the forward is a chain of layers they know: its own names in
    model.pt, its own initial values, its own logits. A run started under rules 3 keeps it on
    torch.func."""
    name = _registered("user-class", lambda s, n, cfg: cls(n))
    try:
        model = build_model(ModelConfig(name=name), (1, 8, 8), 10, "tiny", seed=4)
        old = build_model(ModelConfig(name=name), (1, 8, 8), 10, "tiny", seed=4, rules=3)
    finally:
        del MODELS[name]
    assert isinstance(model, KernelModel) and isinstance(old, ModuleModel)
    assert model.state_dict(model.init(4)).keys() == old.state_dict(old.init(4)).keys()
    saved = model.state_dict(model.init(4))
    assert all(torch.equal(saved[k], v) for k, v in old.state_dict(old.init(4)).items())
    x = inputs((1, 8, 8))
    with torch.no_grad():
        torch.testing.assert_close(model.predict(model.init(4), x), old.predict(old.init(4), x))


@pytest.mark.parametrize("cls", [_Residual, _AvgPooled, _WithNorm, _AlwaysDrops])
def test_a_class_whose_forward_is_not_such_a_chain_trains_through_torch_func(cls):
    """A branch that is not a residual block, a layer the kernels do not know (average pooling),
    BatchNorm on an input the kernels do not know (expanded, sliced), dropout in evaluation too:
    the module is not lowered."""
    name = _registered("user-class", lambda s, n, cfg: cls())
    try:
        assert isinstance(build_model(ModelConfig(name=name), (1, 8, 8), 10, "tiny", seed=4), ModuleModel)
    finally:
        del MODELS[name]


def test_a_run_of_a_users_class_lenet_trains_on_the_kernels_and_its_model_pt_loads_into_the_class(
        cli_run, tmp_path, monkeypatch):
    """Through the CLI (`[model] name = "file:factory"`): the manifest names fedsim's kernels as
    the code and the loop as the path on a CPU; model.pt loads (strict) into the user's class,
    which scores the run's final test accuracy."""
    (tmp_path / "netdef.py").write_text(
        "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, n_classes):\n"
        "        super().__init__()\n"
        "        self.conv1, self.conv2 = nn.Conv2d(1, 6, 3, padding=1), nn.Conv2d(6, 16, 3, padding=1)\n"
        "        self.fc = nn.Linear(16 * 2 * 2, n_classes)\n\n"
        "    def forward(self, x):\n"
        "        x = F.max_pool2d(F.relu(self.conv1(x)), 2)\n"
        "        x = F.max_pool2d(F.relu(self.conv2(x)), 2)\n"
        "        return self.fc(x.view(x.size(0), -1))\n\n\n"
        "def make(in_shape, n_classes, cfg):\n"
        "    return Net(n_classes)\n")
    monkeypatch.chdir(tmp_path)
    run = cli_run({"run": {"rounds": 3, "eval_every": 3}, "data": {"dataset": "digits", "clients": 6},
                   "model": {"name": "netdef:make"}, "server": {"timing": "ideal", "clients_per_round": 3},
                   "client": {"local_steps": 2, "batch_size": 8}}, name="classnet")
    trainer = json.loads((run / "manifest.json").read_text())["trainer"]
    assert trainer["code"] == "fedsim's kernels" and trainer["path"] == "loop"
    scores_the_runs_final_accuracy(users_module(tmp_path, "netdef", "Net", 10), run)


class _TrainsOtherwise(_ClassLeNet):
    """A forward that reads self.training: a chain in evaluation, another computation in training."""

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        if self.training:
            x = x * 2.0
        return self.fc(torch.flatten(F.max_pool2d(F.relu(self.conv2(x)), 2), 1))


def test_a_class_whose_training_forward_differs_from_its_evaluation_trains_through_torch_func():
    """The trace is read in both modes: the kernels would compute the evaluation's chain in
    training too."""
    for mode in (True, False):
        module = _TrainsOtherwise().train(mode)
        assert lower_traced("x", module, (1, 8, 8)) is None and module.training == mode
    assert lower_traced("x", _ClassLeNet().eval(), (1, 8, 8)) is not None


class _ExamplesNet(nn.Module):
    """pytorch/examples' MNIST network in small: dropout on the pooled images, log-probabilities out."""

    def __init__(self, n_classes=10):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, 1), nn.Conv2d(4, 8, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(8 * 2 * 2, 16), nn.Linear(16, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        return F.log_softmax(self.fc2(self.dropout2(F.relu(self.fc1(x)))), dim=1)


def test_dropout_on_images_and_log_probabilities_train_on_the_kernels_under_rules_4():
    """pytorch/examples' MNIST network (dropout on images, log_softmax out) is lowered; its
    loop step written out equals reverse mode through the kernels, dropout included, bit for
    bit, and a cohort's batched step agrees with the loop's. An nn.Sequential with those layers
    started under rules 3 stays on torch.func."""
    from fedsim.training.kernels import autograd_step
    from fedsim.training.losses import weighted_cross_entropy

    name = _registered("user-examples", lambda s, n, cfg: _ExamplesNet(n))
    try:
        model = build_model(ModelConfig(name=name), (1, 8, 8), 10, "tiny", seed=2)
    finally:
        del MODELS[name]
    assert isinstance(model, KernelModel) and model.dropout_features == 8 * 2 * 2 + 16
    g = torch.Generator().manual_seed(3)
    params = model.init(2)[None].expand(3, -1) + 0.05 * torch.randn(3, model.dim, generator=g)
    x, y = torch.rand(3, 8, 1, 8, 8, generator=g), torch.randint(0, 10, (3, 8), generator=g)
    weight, u = torch.full((3, 8), 1 / 8), torch.rand(3, 8, model.dropout_features, generator=g)
    written = model.step_fn(weighted_cross_entropy, batched=False)
    reverse = autograd_step(lambda ps, x, u: model.forward(ps, x, u), weighted_cross_entropy)
    for k in range(3):
        a, b = written(model.split(params[k]), x[k], y[k], weight[k], u[k]), \
            reverse(model.split(params[k]), x[k], y[k], weight[k], u[k])
        assert torch.equal(a[1], b[1]) and all(torch.equal(s, t) for s, t in zip(a[0], b[0]))
    cohort, _ = model.step_fn(weighted_cross_entropy, batched=True)(model.split(params), x, y, weight, u)
    for k in range(3):
        one, _ = written(model.split(params[k]), x[k], y[k], weight[k], u[k])
        for s, t in zip(cohort, one):
            torch.testing.assert_close(s[k], t, rtol=1e-4, atol=1e-6)
    sequential = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Dropout(0.25), nn.Flatten(), nn.Linear(144, 10),
                               nn.LogSoftmax(dim=1))
    assert lower("x", sequential, (1, 8, 8), rules=3) is None and lower("x", sequential, (1, 8, 8)) is not None


@pytest.mark.parametrize("shape, window", [((4, 8, 15, 13), dict(kernel_size=3, stride=2, padding=1)),
                                           ((4, 8, 15, 13), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
                                           ((2, 3, 9, 9), dict(kernel_size=(3, 2), stride=(1, 2))),
                                           ((2, 3, 12, 12), dict(kernel_size=3, stride=1, dilation=2))])
def test_a_modules_own_pooling_on_channels_last_is_torchs_for_any_window(shape, window):
    """The loop's stand-in for a module's `F.max_pool2d` (overlapping windows, padding, ceil
    mode, dilation): torch's output and input gradient, ties included."""
    from fedsim.training.kernels import max_pool2d_channels_last

    g = torch.Generator().manual_seed(7)
    x = torch.relu(torch.randn(*shape, generator=g))
    x[:, :, :3] = 0.5
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = max_pool2d_channels_last(ours, **window), F.max_pool2d(theirs, **window)
    grad = torch.randn(expected.shape, generator=g)
    out.backward(grad)
    expected.backward(grad)
    assert torch.equal(out, expected) and torch.equal(ours.grad, theirs.grad)


def kernels_run_both_ways(cli_run, tmp_path, monkeypatch, file: str, text: str, **model) -> tuple[dict, dict, Path]:
    """`fedsim run` of the module factory `file:make` (written from `text`) on digits for 4
    rounds: batched and on the loop, both on fedsim's kernels (each path as the manifest says);
    and stopped after 2 rounds and resumed to 4, which ends bit for bit as the uninterrupted run.
    The batched and loop runs' model.pt, the config, and the uninterrupted run's directory."""
    from conftest import same_results
    from fedsim.cli import main

    (tmp_path / f"{file}.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    config = {"run": {"rounds": 4, "eval_every": 2}, "data": {"dataset": "digits", "clients": 6},
              "model": {"name": f"{file}:make", **model}, "server": {"timing": "ideal", "clients_per_round": 3},
              "client": {"local_steps": 3, "batch_size": 8}}
    runs = {trainer: cli_run({**config, "client": {**config["client"], "trainer": trainer}}, name=trainer)
            for trainer in ("batched", "loop")}
    for trainer, run in runs.items():
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["trainer"]["code"] == "fedsim's kernels" and manifest["trainer"]["path"] == trainer
    stopped = cli_run({**config, "run": {**config["run"], "rounds": 2}}, name="stopped")
    assert main(["run", "--resume", str(stopped), "--set", "run.rounds=4", "--quiet"]) == 0
    whole = cli_run(config, name="whole")
    same_results(stopped, whole)
    return {t: torch.load(run / "model.pt") for t, run in runs.items()}, config, whole


def users_module(tmp_path, file: str, cls: str, *args) -> nn.Module:
    """`cls(*args)` of the user's file `file`.py in `tmp_path`."""
    sys_path = __import__("sys").path
    sys_path.insert(0, str(tmp_path))
    try:
        return getattr(__import__(file), cls)(*args)
    finally:
        sys_path.remove(str(tmp_path))


def test_a_run_of_a_users_residual_network_trains_on_the_kernels_batched_as_on_the_loop(
        cli_run, tmp_path, monkeypatch):
    """Through the CLI (training rules 9), docs/extending.md's `residual_net.py`: a class with a
    residual block and dropout in it trains on fedsim's kernels, batched and on the loop to float
    rounding (the same dropout draws); a run stopped and resumed ends bit for bit as the
    uninterrupted one; model.pt loads (strict) into the class, which scores the run's final test
    accuracy."""
    from test_plugins import doc_blocks

    saved, _, whole = kernels_run_both_ways(cli_run, tmp_path, monkeypatch, "residual_net",
                                            doc_blocks("residual_net.py")[0])
    a, b = saved["batched"], saved["loop"]
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a) and not all(torch.equal(a[k], b[k]) for k in a)
    scores_the_runs_final_accuracy(users_module(tmp_path, "residual_net", "ResidualMLP", 64, 10), whole)


BATCH_NORM_FILE = """import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 32), nn.Linear(32, 32), nn.Linear(32, n_classes)
        self.bn1, self.bn2 = nn.BatchNorm1d(32), nn.BatchNorm1d(32)

    def forward(self, x):
        h = F.relu(self.bn1(self.fc1(x.flatten(1))))
        return self.fc3(h + F.relu(self.bn2(self.fc2(h))))


def make(in_shape, n_classes, cfg):
    return Net(n_classes)
"""


def test_a_run_of_a_users_batch_norm_network_trains_on_the_kernels_with_its_buffers(cli_run, tmp_path, monkeypatch):
    """Through the CLI (training rules 10): a class with BatchNorm in a residual block and after a
    dense layer trains on fedsim's kernels, batched and on the loop to float rounding; a run
    stopped and resumed ends bit for bit as the uninterrupted one; with `[model] local_buffers =
    true` (FedBN) each device keeps its own running statistics; model.pt is the module's
    state_dict (the step counts integers) and scores the run's final test accuracy."""
    saved, config, whole = kernels_run_both_ways(cli_run, tmp_path, monkeypatch, "bndef", BATCH_NORM_FILE)
    a, b = saved["batched"], saved["loop"]
    assert list(a) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias",
                       "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
                       "bn2.weight", "bn2.bias", "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked"]
    assert a["bn1.num_batches_tracked"].dtype == torch.int64 and int(a["bn1.num_batches_tracked"]) == 4 * 3
    assert all(torch.allclose(a[k].float(), b[k].float(), atol=1e-5) for k in a)
    fedbn = cli_run({**config, "model": {**config["model"], "local_buffers": True}}, name="fedbn")
    assert json.loads((fedbn / "manifest.json").read_text())["trainer"]["code"] == "fedsim's kernels"
    assert not torch.equal(torch.load(fedbn / "model.pt")["bn1.running_mean"], a["bn1.running_mean"])
    scores_the_runs_final_accuracy(users_module(tmp_path, "bndef", "Net", 10), whole)


def test_a_studys_batch_norm_points_on_the_kernels_equal_their_runs_alone(cli_run, tmp_path, monkeypatch):
    """A study of a BatchNorm MLP on fedsim's kernels (its devices' running statistics in the
    state rows that lockstep stacks run after run), FedBN's `local_buffers` off and on: each
    point equals its `fedsim run` bit for bit."""
    from fedsim.cli import main
    from fedsim.config import dump_toml

    (tmp_path / "bnmlp.py").write_text(
        "from torch import nn\n\n\ndef make(in_shape, n_classes, cfg):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), "
        "nn.Linear(32, n_classes))\n")
    monkeypatch.chdir(tmp_path)
    base = {"run": {"rounds": 3, "eval_every": 3, "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 12, "partition": "dirichlet", "alpha": 0.3},
            "model": {"name": "bnmlp:make"}, "server": {"timing": "ideal", "clients_per_round": 4},
            "client": {"local_steps": 3, "batch_size": 8}}
    study = {**base, "run": {**base["run"], "name": "bn", "out": str(tmp_path / "runs")},
             "sweep": {"model.local_buffers": [False, True]}}
    (tmp_path / "bn.toml").write_text(dump_toml(study))
    assert main(["sweep", "bn.toml", "--quiet"]) == 0
    for local in (False, True):
        point = tmp_path / "runs" / "bn" / f"local_buffers-{local}"
        alone = cli_run({**base, "model": {**base["model"], "local_buffers": local}}, name=f"alone-{local}")
        assert json.loads((point / "manifest.json").read_text())["trainer"]["code"] == "fedsim's kernels"
        a, b = torch.load(point / "model.pt"), torch.load(alone / "model.pt")
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), local
        assert pl.read_parquet(point / "rounds.parquet").drop("wall_s").equals(
            pl.read_parquet(alone / "rounds.parquet").drop("wall_s"))
