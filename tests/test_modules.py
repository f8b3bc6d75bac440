"""Models that are torch.nn.Modules: batched == loop through the engine, model.pt is the
module's state_dict, frozen parameters stay, buffers, FLOPs counted, bad input one line."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_plugins import plugin_module, rounds_of  # noqa: E402

USER_MODELS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.norm = nn.GroupNorm(2, c)

    def forward(self, x):
        return torch.relu(x + self.norm(self.conv(x)))


class TinyResNet(nn.Module):
    def __init__(self, channels, n_classes, norm="gn", dropout=0.0):
        super().__init__()
        self.stem = nn.Conv2d(channels, 4, 3, padding=1)
        self.block = Block(4)
        self.bn = nn.BatchNorm2d(4) if norm == "bn" else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(4, n_classes)

    def forward(self, x):
        x = self.bn(self.block(self.stem(x)))
        return self.fc(self.drop(x.mean(dim=(2, 3))))


class PixelTransformer(nn.Module):
    """Digits' rows as 8 tokens: pixel intensities (0..16) through an embedding, summed per row."""

    def __init__(self, n_classes, dim=8):
        super().__init__()
        self.emb = nn.Embedding(17, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 2, 16, dropout=0.2, batch_first=True)
        self.fc = nn.Linear(dim, n_classes)

    def forward(self, x):
        tokens = self.emb((x[:, 0] * 16).round().long()).sum(dim=2)  # [B, 8 rows, dim]
        return self.fc(self.layer(tokens).mean(dim=1))


def resnet(in_shape, n_classes, cfg):
    return TinyResNet(in_shape[0], n_classes)


def resnet_bn(in_shape, n_classes, cfg):
    return TinyResNet(in_shape[0], n_classes, "bn")


def resnet_dropout(in_shape, n_classes, cfg):
    return TinyResNet(in_shape[0], n_classes, dropout=0.5)


def transformer(in_shape, n_classes, cfg):
    return PixelTransformer(n_classes)


def frozen_stem(in_shape, n_classes, cfg):
    model = TinyResNet(in_shape[0], n_classes)
    model.stem.requires_grad_(False)
    return model


def not_a_model(in_shape, n_classes, cfg):
    return 42


def flat_input(in_shape, n_classes, cfg):
    return nn.Linear(10, n_classes)  # digits are [1, 8, 8], not 10 numbers


def no_parameters(in_shape, n_classes, cfg):
    return nn.Flatten()


def noisy(in_shape, n_classes, cfg):
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, n_classes)

        def forward(self, x):
            return self.fc(x.flatten(1) + torch.randn_like(x.flatten(1)))
    return Noisy()
'''

BASE = {"run": {"rounds": 3, "eval_every": 3, "seed": 4}, "data": {"dataset": "digits", "clients": 6},
        "server": {"timing": "ideal", "clients_per_round": 4},
        "client": {"local_steps": 3, "batch_size": 8, "lr": 0.1}}


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin_module(tmp_path, "user_nets", USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield __import__("user_nets")
    sys.modules.pop("user_nets", None)


def run(cli_run, name, trainer="batched", expect=0, **model):
    return cli_run({**BASE, "client": {**BASE["client"], "trainer": trainer},
                    "model": {"name": f"user_nets:{name}", **model}}, name=f"{name}-{trainer}", expect=expect)


@pytest.mark.parametrize("name", ["resnet", "resnet_bn", "resnet_dropout", "transformer"])
def test_batched_equals_loop_through_the_engine(cli_run, user_models, name):
    """Residual + GroupNorm, BatchNorm (its running statistics averaged), dropout and an
    embedding + transformer layer (dropout keyed per device): the same model.pt after 3
    rounds to float rounding, loadable into the user's module with plain torch."""
    batched, loop = run(cli_run, name), run(cli_run, name, "loop")
    a, b = torch.load(batched / "model.pt"), torch.load(loop / "model.pt")
    module = getattr(user_models, name)((1, 8, 8), 10, None)
    assert list(a) == list(module.state_dict())
    module.load_state_dict(a)
    for key in a:
        assert a[key].dtype == b[key].dtype
        assert torch.allclose(a[key].double(), b[key].double(), rtol=1e-4, atol=1e-5), key
    np.testing.assert_allclose(rounds_of(batched, "test_loss"), rounds_of(loop, "test_loss"), rtol=1e-4)
    start = getattr(user_models, name)((1, 8, 8), 10, None).state_dict()
    assert not torch.equal(a["fc.weight"], start["fc.weight"])  # it trained
    if name == "resnet_bn":
        assert int(a["bn.num_batches_tracked"]) == 9  # 3 rounds x 3 local steps, averaged
        assert not torch.equal(a["bn.running_mean"], torch.zeros(4))


def test_a_run_is_deterministic_with_dropout(cli_run, user_models):
    first, again = run(cli_run, "resnet_dropout"), cli_run(
        {**BASE, "model": {"name": "user_nets:resnet_dropout"}, "client": {**BASE["client"], "trainer": "batched"}},
        name="again")
    a, b = torch.load(first / "model.pt"), torch.load(again / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_frozen_parameters_stay_fixed(cli_run, user_models):
    from fedsim.config import ModelConfig
    from fedsim.training.models import build_model

    saved = torch.load(run(cli_run, "frozen_stem") / "model.pt")
    built = build_model(ModelConfig(name="user_nets:frozen_stem"), (1, 8, 8), 10, "digits", seed=4)
    assert torch.equal(saved["stem.weight"], built.module.stem.weight.detach())
    assert built.dim == sum(p.numel() for p in built.module.parameters() if p.requires_grad)
    assert not torch.equal(saved["fc.weight"], built.module.fc.weight.detach())


@pytest.mark.parametrize("name, model, says", [
    ("TinyResNet", {}, "is a class whose constructor does not take fedsim's arguments"),
    ("not_a_model", {}, "the factory returned int 42, not a torch.nn.Module or a list of fedsim layers"),
    ("flat_input", {}, "the module's forward fails on a batch of the dataset's inputs [2, 1, 8, 8]"),
    ("no_parameters", {}, "the module has no trainable parameters"),
    ("resnet", {"local_buffers": True}, "local_buffers = true, but the module has no buffers"),
    ("noisy", {}, "draws random numbers other than dropout"),
])
def test_bad_modules_are_one_line_before_training(cli_run, user_models, tmp_path, name, model, says):
    run(cli_run, name, expect=2, **model)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and err.startswith("error:") and says in err, err
    assert f"user_nets:{name}" in err
    assert not (tmp_path / "runs").exists()


def test_init_from_a_state_dict_that_does_not_fit(cli_run, user_models, tmp_path):
    done = run(cli_run, "resnet")
    warm = run(cli_run, "resnet_dropout", init_from=str(done))  # the same parameters: it fits
    assert rounds_of(warm, "test_loss")[0] < rounds_of(done, "test_loss")[0] + 1.0
    run(cli_run, "transformer", expect=2, init_from=str(done))
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and "[model] init_from" in err and "has no parameter 'emb.weight'" in err
