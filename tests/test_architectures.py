"""The built-in models are ordinary nn.Modules (issue 38): readable, loadable with plain torch,
and trained by fedsim's kernels with exactly the numbers they always had."""

from __future__ import annotations

import json

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
from fedsim.training.kernels import KernelModel, lower
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
    from fedsim.config import DataConfig
    from fedsim.data.datasets import load_dataset

    run = cli_run({"run": {"rounds": 3, "eval_every": 3},
                   "data": {"dataset": "digits", "clients": 6},
                   "model": {"name": "cnn-svhn"},
                   "server": {"timing": "ideal", "clients_per_round": 3},
                   "client": {"local_steps": 2, "batch_size": 8}}, name="cnn")
    module = architectures.cnn_svhn((1, 8, 8), 10, ModelConfig(name="cnn-svhn"))
    module.load_state_dict(torch.load(run / "model.pt"))
    data = load_dataset(DataConfig(dataset="digits", clients=6), 0)
    x = torch.as_tensor(data.x_test, dtype=torch.float32) * data.scale
    with torch.no_grad():
        logits = module.eval()(x.view(-1, 1, 8, 8))
    accuracy = float((logits.argmax(1) == torch.as_tensor(data.y_test)).double().mean())
    final = pl.read_parquet(run / "rounds.parquet").drop_nulls("test_acc")["test_acc"][-1]
    assert accuracy == pytest.approx(final, abs=1e-9)
    assert float(F.cross_entropy(logits, torch.as_tensor(data.y_test))) > 0


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
