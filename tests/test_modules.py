"""Models that are torch.nn.Modules: batched == loop through the engine, model.pt is the
module's state_dict, frozen parameters stay, buffers, FLOPs counted, bad input one line."""

from __future__ import annotations

import json
import re
import shlex
import sys
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from test_plugins import plugin_module, rounds_of  # noqa: E402

from fedsim.cli import main  # noqa: E402

USER_MODELS = '''
import threading

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

    def __init__(self, n_classes, dim=8, dropout=0.2, batch_first=True):
        super().__init__()
        self.emb = nn.Embedding(17, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 2, 16, dropout=dropout, batch_first=batch_first)
        self.fc = nn.Linear(dim, n_classes)
        self.batch_first = batch_first

    def forward(self, x):
        tokens = self.emb((x[:, 0] * 16).round().long()).sum(dim=2)  # [B, 8 rows, dim]
        if self.batch_first:
            return self.fc(self.layer(tokens).mean(dim=1))
        return self.fc(self.layer(tokens.transpose(0, 1)).mean(dim=0))  # [8 rows, B, dim] through the layer


class RowLSTM(nn.Module):
    """Digits' rows as 8 steps of 8 pixels through an LSTM (one fused layer on a CPU)."""

    def __init__(self, n_classes, hidden=6):
        super().__init__()
        self.lstm = nn.LSTM(8, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.fc(self.lstm(x[:, 0])[0][:, -1])


def resnet(in_shape, n_classes, cfg):
    return TinyResNet(in_shape[0], n_classes)


def uncopyable(in_shape, n_classes, cfg):
    module = TinyResNet(in_shape[0], n_classes)
    module.lock = threading.Lock()  # (no working copy: the loop swaps each device's state into the module)
    return module


def wide_conv(in_shape, n_classes, cfg):
    """Two convolutions of 64 channels: a step of 8 samples is some 57 M multiply-adds."""
    return nn.Sequential(nn.Conv2d(in_shape[0], 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, n_classes))


def resnet_bn(in_shape, n_classes, cfg):
    return TinyResNet(in_shape[0], n_classes, "bn")


def resnet_dropout(in_shape, n_classes, cfg):
    return TinyResNet(in_shape[0], n_classes, dropout=0.5)


class ChannelDropout(nn.Module):
    """Whole channels dropped (nn.Dropout2d), then units (nn.Dropout)."""

    def __init__(self, channels, n_classes):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(channels, 6, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.3),
                                      nn.Conv2d(6, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.2))
        self.fc = nn.Linear(4 * 6 * 6, n_classes)

    def forward(self, x):
        return self.fc(self.features(x))


def conv_dropout2d(in_shape, n_classes, cfg):
    return ChannelDropout(in_shape[0], n_classes)


def alpha_dropout(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.SELU(), nn.AlphaDropout(0.1), nn.Linear(16, n_classes))


def transformer(in_shape, n_classes, cfg):
    return PixelTransformer(n_classes)


def transformer_sequence_first(in_shape, n_classes, cfg):
    return PixelTransformer(n_classes, batch_first=False)


def lstm(in_shape, n_classes, cfg):
    return RowLSTM(n_classes)


def transformer_no_dropout(in_shape, n_classes, cfg):
    return PixelTransformer(n_classes, dropout=0.0)  # CPU attention with dropout_p = 0 draws nothing


class TypedBuffers(nn.Module):
    """An index, a mask and a counter as buffers of their own dtypes."""

    def __init__(self, n_classes):
        super().__init__()
        self.register_buffer("keep", torch.arange(0, 64, 2))
        self.register_buffer("mask", torch.arange(32) % 3 != 0)
        self.register_buffer("calls", torch.tensor(0))
        self.fc = nn.Linear(32, n_classes)

    def forward(self, x):
        if self.training:
            self.calls.add_(1)
        return self.fc(x.flatten(1)[:, self.keep] * self.mask)


def typed_buffers(in_shape, n_classes, cfg):
    return TypedBuffers(n_classes)


def weight_norm(in_shape, n_classes, cfg):
    hidden = nn.utils.parametrizations.weight_norm(nn.Linear(64, 16))
    return nn.Sequential(nn.Flatten(), hidden, nn.ReLU(), nn.Linear(16, n_classes))


def frozen_stem(in_shape, n_classes, cfg):
    model = TinyResNet(in_shape[0], n_classes)
    model.stem.requires_grad_(False)
    return model


def not_a_model(in_shape, n_classes, cfg):
    return 42


def frozen_backbone(in_shape, n_classes, cfg):
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, n_classes))
    model[1].requires_grad_(False)
    return model


def in_double(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, n_classes)).double()


def flat_input(in_shape, n_classes, cfg):
    return nn.Linear(10, n_classes)  # digits are [1, 8, 8], not 10 numbers


def no_parameters(in_shape, n_classes, cfg):
    return nn.Flatten()


def zero_width(in_shape, n_classes, cfg):  # a width of 0 from a sweep's typo builds empty layers
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 0), nn.ReLU(), nn.Linear(0, n_classes))


def branchy(in_shape, n_classes, cfg):
    class Branchy(nn.Module):  # Python control flow on a value: fine on one device, not under vmap
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, n_classes)

        def forward(self, x):
            return self.fc(x.flatten(1)) * (2.0 if float(x.sum()) > 1e9 else 1.0)
    return Branchy()


def syncing(in_shape, n_classes, cfg):
    class Syncing(nn.Module):  # a host sync on a tensor of its own: fine under vmap, not in a CUDA graph
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, n_classes)

        def forward(self, x):
            return self.fc(x.flatten(1)) * torch.ones(1, device=x.device).item()
    return Syncing()


class TiedUnsaved(nn.Module):
    """Two layers that share one weight, and a constant buffer kept out of the state_dict."""

    def __init__(self, n_classes):
        super().__init__()
        self.a = nn.Linear(64, 64, bias=False)
        self.b = nn.Linear(64, 64, bias=False)
        self.b.weight = self.a.weight
        self.fc = nn.Linear(64, n_classes)
        self.register_buffer("scale", torch.full((64,), 0.5), persistent=False)

    def forward(self, x):
        return self.fc(torch.relu(self.b(torch.relu(self.a(x.flatten(1) * self.scale)))))


def tied_unsaved(in_shape, n_classes, cfg):
    return TiedUnsaved(n_classes)


class Wrapped(nn.Module):
    """A module around an nn.Sequential: not a Sequential itself, so it trains through torch.func."""

    def __init__(self, *layers):
        super().__init__()
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


class GeluNet(nn.Module):  # a chain fedsim has kernels for from training rules 7
    def __init__(self, n_classes):
        super().__init__()
        self.hidden, self.fc = nn.Linear(64, 32), nn.Linear(32, n_classes)

    def forward(self, x):
        return self.fc(nn.functional.dropout(nn.functional.gelu(self.hidden(x.flatten(1))), 0.2, self.training))


def gelu_net(in_shape, n_classes, cfg):
    return GeluNet(n_classes)


def wide_gelu(in_shape, n_classes, cfg):  # 155,658 parameters: 6 devices a batched call on a CPU (rules 7)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 2048), nn.GELU(), nn.Dropout(0.1), nn.Linear(2048, n_classes))


def mlp_dropout(in_shape, n_classes, cfg):
    return Wrapped(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 16), nn.ReLU(),
                   nn.Dropout(0.5), nn.Linear(16, n_classes))


def data_dropout(in_shape, n_classes, cfg):
    class DataDropout(nn.Module):  # drops as many numbers as its input has bright pixels
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, n_classes)

        def forward(self, x):
            bright = torch.nn.functional.dropout(x[x > 0.5], 0.5, self.training)
            return self.fc(x.flatten(1)) + bright.sum() * 0
    return DataDropout()


def noisy(in_shape, n_classes, cfg):
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, n_classes)

        def forward(self, x):
            return self.fc(x.flatten(1) + torch.randn_like(x.flatten(1)))
    return Noisy()


class Linear(nn.Module):
    """One Linear layer `fc`; its forward is `fn(self, x flattened)`."""

    def __init__(self, n_classes, fn):
        super().__init__()
        self.fc, self.fn = nn.Linear(64, n_classes), fn

    def forward(self, x):
        return self.fn(self, x.flatten(1))


def linear_of(fn):
    return lambda in_shape, n_classes, cfg: Linear(n_classes, fn)


# loop only: a shape that depends on the data, a value read on the host
masked = linear_of(lambda self, x: self.fc(x) + 0.1 * x[x > 0.5].mean().nan_to_num())
itemised = linear_of(lambda self, x: self.fc(x) / (1 + x.abs().max().item()))
# fail only past the build-time checks' 2 samples: in training, in evaluation, under vmap
trains_on_two = linear_of(lambda self, x: self.fc(x.view(2, -1) if self.training else x))
evaluates_two = linear_of(lambda self, x: self.fc(x if self.training else x.view(2, -1)))
reads_past_two = linear_of(lambda self, x: self.fc(x) * (x.max().item() if len(x) > 2 else 1.0))


class Kept(nn.Module):
    """State a forward may keep: a buffer updated in place, a Python attribute set once."""

    def __init__(self, n_classes):
        super().__init__()
        self.fc = nn.Linear(64, n_classes)
        self.register_buffer("seen", torch.zeros(()))
        self.width = None

    def forward(self, x):
        self.width = x.shape[1:].numel()
        if self.training:
            with torch.no_grad():
                self.seen.add_(len(x))
        return self.fc(x.flatten(1))


def kept(in_shape, n_classes, cfg):
    return Kept(n_classes)
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


@pytest.mark.parametrize("name", ["resnet", "resnet_bn", "resnet_dropout", "transformer", "transformer_no_dropout",
                                  "gelu_net", "conv_dropout2d"])
def test_batched_equals_loop_through_the_engine(cli_run, user_models, name):
    """Residual + GroupNorm, BatchNorm (its running statistics averaged), dropout and an
    embedding + transformer layer (dropout keyed per device; without dropout, CPU attention
    draws nothing and both trainers accept it), a GELU MLP with dropout (fedsim's kernels from
    training rules 7, its batched gradient in closed form): the same model.pt after 3
    rounds to float rounding, loadable into the user's module with plain torch."""
    batched, loop = run(cli_run, name), run(cli_run, name, "loop")
    code = json.loads((batched / "manifest.json").read_text())["trainer"]["code"]
    assert (code == "fedsim's kernels") == (name == "gelu_net")
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


PADDED = {"epochs": {"batch_size": 10, "local_epochs": 1.0},  # devices of 224 or 225 samples: last minibatches of 4, 5
          "full data": {"batch_size": 0}}  # each step all 224 or 225 samples of a device (padded to 225)


@pytest.mark.parametrize("name", ["transformer", "transformer_sequence_first"])
@pytest.mark.parametrize("setting", list(PADDED))
def test_dropout_of_devices_padded_in_a_batched_call_is_their_own_as_on_the_loop(cli_run, user_models, name,
                                                                                  setting):
    """The batched call pads devices' samples to the widest (an epoch's last, smaller minibatch;
    unequal full local data): from training rules 12 each device's dropout masks are those of a
    forward of its own samples, which the loop computes, so the two trainers agree to float
    rounding (before, every dropout call after the first took the padded forward's numbers: a
    transformer layer's model differed by 5-15 %), for a sequence-first transformer too (its
    dropout inputs are [tokens, batch, ...])."""
    config = {**BASE, "data": {**BASE["data"], "partition": "dirichlet", "alpha": 0.5},
              "client": {**BASE["client"], **PADDED[setting]}, "model": {"name": f"user_nets:{name}"}}
    batched, loop = (cli_run({**config, "client": {**config["client"], "trainer": trainer}}, name=trainer)
                     for trainer in ("batched", "loop"))
    a, b = torch.load(batched / "model.pt"), torch.load(loop / "model.pt")
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-6), key
    assert json.loads((batched / "manifest.json").read_text())["rules"] == 12


def test_a_devices_dropout_does_not_depend_on_the_devices_padded_beside_it(user_models):
    """Device 0 trained alone and beside a device of more samples (its own samples padded to
    theirs): the same update; under training rules 11, another."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import build_task, build_trainer

    def delta(rules: int, cohort: list[int]):
        task = build_task(DataConfig(dataset="digits", clients=6, partition="dirichlet", alpha=0.5),
                          ModelConfig(name="user_nets:transformer"), seed=3, device=torch.device("cpu"), rules=rules)
        assert len(set(task.data.sizes_np[cohort].tolist())) == len(cohort)
        trainer = build_trainer(task, ClientConfig(batch_size=0, local_steps=2, trainer="batched"), seed=3)
        start = task.init_params()[None].expand(len(cohort), -1).clone()
        return trainer.train(1, np.array(cohort), start, np.full(len(cohort), 2), 0.1).deltas[0]

    sizes = build_task(DataConfig(dataset="digits", clients=6, partition="dirichlet", alpha=0.5),
                       ModelConfig(name="user_nets:transformer"), seed=3, device=torch.device("cpu")).data.sizes_np
    small, large = int(np.argmin(sizes)), int(np.argmax(sizes))
    torch.testing.assert_close(delta(12, [small]), delta(12, [small, large]), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(delta(11, [small]), delta(11, [small, large]), rtol=1e-3, atol=1e-5)


def test_a_run_is_deterministic_with_dropout(cli_run, user_models):
    first, again = run(cli_run, "resnet_dropout"), cli_run(
        {**BASE, "model": {"name": "user_nets:resnet_dropout"}, "client": {**BASE["client"], "trainer": "batched"}},
        name="again")
    a, b = torch.load(first / "model.pt"), torch.load(again / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def per_call_dropout(input, p=0.5, training=True, inplace=False):
    """Dropout as earlier releases drew it: each call hashed its own numbers from the device's
    key (`ModuleModel.randomness` gave keys), after those of the calls before it."""
    from fedsim.training import modules, rng

    def srl(z, s):
        return (z >> s) & ((1 << (64 - s)) - 1)

    def mix(z):
        z = (z ^ srl(z, 30)) * rng._signed(rng._M1)
        z = (z ^ srl(z, 27)) * rng._signed(rng._M2)
        return z ^ srl(z, 31)

    if not training or p == 0:
        return input
    draws, n = modules._draws, input.numel()
    bits = mix(draws.numbers[..., None] + (torch.arange(n) + draws.used) * rng._signed(rng._GOLDEN))
    u = (srl(bits, 40).to(torch.float32) * 2.0**-24).view(input.shape)
    draws.used += n
    return input * (u >= p).to(input.dtype) / (1.0 - p) if p < 1 else input * 0.0


@pytest.mark.parametrize("name", ["transformer", "mlp_dropout"])
@pytest.mark.parametrize("trainer", ["batched", "loop"])
def test_a_steps_dropout_numbers_drawn_at_once_are_the_per_call_draws_bit_for_bit(user_models, monkeypatch, name,
                                                                                   trainer):
    """A local step's dropout numbers are drawn for the whole cohort before the forward, each
    dropout call taking its slice: the same masks as earlier releases' draws inside each call
    (attention dropout and nn.Dropout of two rates), so existing runs keep their numbers. Local
    steps and local epochs (whose last minibatch is smaller)."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import build_task, build_trainer, modules, rng

    # (training rules 3: mlp_dropout through torch.func; from rules 4 its chain trains on the kernels)
    task = build_task(DataConfig(dataset="digits", clients=8), ModelConfig(name=f"user_nets:{name}"), seed=3,
                      device=torch.device("cpu"), rules=3)
    start = task.init_params()[None].expand(5, -1).clone()
    clients = {"steps": ClientConfig(batch_size=6, local_steps=3, trainer=trainer),
               "epochs": ClientConfig(batch_size=6, local_epochs=1.5, trainer=trainer)}

    def train(client):
        t = build_trainer(task, client, seed=3)
        steps = t.epoch_steps()[:5] if client.local_epochs else np.array([3, 1, 2, 0, 3])
        return t.train(2, np.arange(5), start, steps, 0.1)

    now = {setting: train(client) for setting, client in clients.items()}
    assert task.model.dropout_numbers(6) > 0
    assert task.model.activations == {"transformer": 10138, "mlp_dropout": 1818}[name]  # as before: the same chunks
    with monkeypatch.context() as patch:
        patch.setattr(modules.ModuleModel, "randomness",
                      lambda self, seed, rnd, ids, step, batch, own=None: rng.keys(seed, rng.MODULE, rnd, ids, step))
        patch.setattr(modules, "_keyed_dropout", per_call_dropout)
        before = {setting: train(client) for setting, client in clients.items()}
    for setting in clients:
        assert torch.equal(now[setting].deltas, before[setting].deltas), setting
        torch.testing.assert_close(now[setting].loss, before[setting].loss, rtol=0, atol=0, equal_nan=True)
    assert not torch.equal(now["steps"].deltas[0], now["steps"].deltas[4])  # devices drew their own masks


@pytest.mark.parametrize("name, rules, drawn_as", [("transformer", None, torch.bool), ("mlp_dropout", 3, torch.int64),
                                                    ("mlp_dropout", None, torch.float32)])
@pytest.mark.parametrize("trainer", ["batched", "loop"])
def test_dropout_drawn_as_on_a_gpu_trains_the_cpus_numbers_bit_for_bit(user_models, monkeypatch, name, rules,
                                                                       drawn_as, trainer):
    """Off a CPU (`rng.in_blocks` false) a model's dropout numbers are drawn for several local
    steps in one call and, where a module's dropout has one rate (the transformer's), are
    keep-masks: the same masks and products as the CPU's divisors, bit for bit (the MLP's two
    rates keep the numbers through torch.func, and on fedsim's kernels it draws uniforms).
    Blocks of two steps here, so that a round's steps span blocks; local epochs (padded: a step
    at a time) too."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import build_task, build_trainer, rng, task as task_module

    task = build_task(DataConfig(dataset="digits", clients=8), ModelConfig(name=f"user_nets:{name}"), seed=3,
                      device=torch.device("cpu"), **({"rules": rules} if rules else {}))
    start = task.init_params()[None].expand(5, -1).clone()
    clients = {"steps": ClientConfig(batch_size=6, local_steps=5, trainer=trainer),
               "epochs": ClientConfig(batch_size=6, local_epochs=1.5, trainer=trainer)}

    def train(client):
        t = build_trainer(task, client, seed=3)
        steps = t.epoch_steps()[:5] if client.local_epochs else np.array([5, 5, 4, 5, 4])
        return t.train(2, np.arange(5), start, steps, 0.1)

    on_cpu = {setting: train(client) for setting, client in clients.items()}
    drawn, randomness = [], type(task.model).randomness

    def recorded(self, seed, rnd, ids, step, batch, own=None):
        numbers = randomness(self, seed, rnd, ids, step, batch, own)
        drawn.append((step, numbers.dtype))
        return numbers

    with monkeypatch.context() as patch:
        patch.setattr(rng, "in_blocks", lambda device: False)
        patch.setattr(task_module, "DRAWN_AT_ONCE", 2 * len(start) * task.model.dropout_numbers(6))
        patch.setattr(type(task.model), "randomness", recorded)
        as_on_gpu = {"steps": train(clients["steps"])}
        blocks = [step for step, _ in drawn if isinstance(step, range)]
        as_on_gpu["epochs"] = train(clients["epochs"])
    for setting in clients:
        assert torch.equal(as_on_gpu[setting].deltas, on_cpu[setting].deltas), setting
        torch.testing.assert_close(as_on_gpu[setting].loss, on_cpu[setting].loss, rtol=0, atol=0, equal_nan=True)
    assert {dtype for _, dtype in drawn} == {drawn_as}
    # local steps, batched: every device's first 4 steps in blocks of two (then the devices still going, step by step);
    # the loop: each device's steps in one block
    assert blocks == ([range(0, 2), range(2, 4)] if trainer == "batched" else [range(0, k) for k in (5, 5, 4, 5, 4)])


def test_dropout_that_depends_on_the_data_is_one_line(cli_run, user_models):
    """A step's dropout numbers are counted on a batch of zeros: a forward that drops more (as
    many numbers as its input has bright pixels) stops in one line instead of reusing numbers."""
    run(cli_run, "data_dropout", "loop", expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1, err
    assert re.fullmatch(r"error: \[model\] name = 'user_nets:data_dropout': the module's dropout in training used "
                        r"more random numbers \([\d,]+ so far\) than on a batch of zeros of the same size \(0\); "
                        r"fedsim draws a step's dropout numbers before its forward: keep the shapes that dropout "
                        r"applies to independent of the data \(nothing was kept: .+ removed\)\n", err), err


@pytest.mark.parametrize("trainer", ["batched", "loop", "auto"])
def test_randomness_fedsim_cannot_key_is_one_line_on_every_trainer(cli_run, user_models, tmp_path, trainer):
    run(cli_run, "noisy", trainer, expect=2)
    assert cli_run.last_output.err == (
        "error: [model] name = 'user_nets:noisy': the module draws random numbers other than dropout "
        "(aten.randn_like); fedsim keys only dropout (nn.Dropout, nn.Dropout1d/2d/3d, attention dropout) by (seed, "
        "round, device, step), so that runs repeat and resume exactly: use one of those, or take the draw out of the "
        "forward\n")
    assert not (tmp_path / "runs").exists()


def test_a_frozen_backbones_training_flops_are_counted_not_three_forwards(cli_run, user_models):
    """By hand, per sample: the forward 64 x 32 + 32 x 10 = 2,368 multiply-adds; the backward
    only the head's weight gradient, 320 (no gradient of the frozen weight, none of the head's
    input): 2,688 multiply-adds, 5,376 FLOPs (3 x forward would give 14,208), the device clock's."""
    run_dir = run(cli_run, "frozen_backbone")
    assert json.loads((run_dir / "manifest.json").read_text())["train_flops_per_sample"] == 2 * 2688
    assert main(["config", "show", str(run_dir / "config.toml")]) == 0
    assert cli_run.capsys.readouterr().out.rstrip().endswith(" 5,376 training FLOPs per sample")


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
    ("not_a_model", {}, "the factory returned int 42, not a torch.nn.Module; return the module it builds"),
    ("flat_input", {}, "the module's own forward raised RuntimeError (mat1 and mat2 shapes cannot be multiplied "
                       "(16x8 and 10x10)) on a batch of 2 of the dataset's inputs; fix the forward (hint: its input is "
                       "[batch, 1, 8, 8])"),
    ("no_parameters", {}, "the module has no trainable parameters"),
    ("zero_width", {}, "parameter '1.weight' has shape (0, 64), no numbers to train; check the sizes the factory "
                       "built it with (a width of 0?)"),
    ("in_double", {}, "parameter '1.weight' is torch.float64; fedsim trains, sends and averages float32 numbers "
                      "(other precisions are not simulated): build the module in float32"),
    ("resnet", {"local_buffers": True}, "local_buffers = true, but the module has no buffers"),
    ("noisy", {}, "draws random numbers other than dropout (aten.randn_like)"),
    ("alpha_dropout", {}, "draws random numbers other than dropout (aten.bernoulli_, by nn.AlphaDropout at '3'); fedsim keys "
                          "only dropout (nn.Dropout, nn.Dropout1d/2d/3d, attention dropout)"),
])
def test_bad_modules_are_one_line_before_training(cli_run, user_models, tmp_path, name, model, says):
    run(cli_run, name, expect=2, **model)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and err.startswith("error:") and says in err, err
    assert f"user_nets:{name}" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name, call", [
    ("masked", "x[mask] (indexing by a boolean mask), whose output's shape depends on the data"),
    ("itemised", "Tensor.item(), which reads a tensor's value on the host"),
    ("branchy", "float() of a tensor, which reads a tensor's value on the host"),
])
def test_auto_trains_a_module_vmap_cannot_batch_as_the_loop_and_says_why(cli_run, user_models, tmp_path, name, call):
    """The loop trains it as plain PyTorch would; `auto` takes the loop (the same numbers) and
    the manifest says why; `batched` is one line naming the call."""
    _, err = trained_on_the_loop(cli_run, {**BASE, "model": {"name": f"user_nets:{name}"}})
    assert f"(its forward calls {call};" in err
    auto, loop = tmp_path / "runs" / "auto", tmp_path / "runs" / "loop"
    trainer = json.loads((auto / "manifest.json").read_text())["trainer"]
    assert (trainer["setting"], trainer["path"]) == ("auto", "loop")
    assert trainer["why"].startswith(f"auto: the model cannot train batched under torch.func.vmap: its forward calls {call};")
    assert pl.read_parquet(auto / "rounds.parquet").drop("wall_s").equals(
        pl.read_parquet(loop / "rounds.parquet").drop("wall_s"))


@pytest.mark.parametrize("name, trainer, batch_size, says", [
    ("trains_on_two", "loop", 8, "the module cannot train on a batch of 8 samples: its forward raised RuntimeError "
                                 "(mat1 and mat2 shapes cannot be multiplied (2x256 and 64x10)) in "
                                 "torch.nn.functional.linear; fix the forward (it ran on a batch of 2 at build time)"),
    ("evaluates_two", "loop", 8, "the module's forward raised RuntimeError (mat1 and mat2 shapes cannot be multiplied "
                                 "(2x14400 and 64x10)) in evaluation (eval mode) on a batch of 450 samples; fix the "
                                 "forward"),
    ("reads_past_two", "auto", 8, "the module cannot train on 4 devices x 8 samples under torch.func.vmap: its "
                                  "forward calls Tensor.item(), which reads a tensor's value on the host; keep the "
                                  "value a tensor (tensor arithmetic, torch.where instead of an if); set [client] "
                                  "trainer = 'loop', or fix the forward"),
])
def test_a_forward_that_fails_past_the_build_time_checks_is_one_line(cli_run, user_models, name, trainer, batch_size,
                                                                     says):
    """Such a module passes the checks on 2 samples (a forward, a batched step), then fails on
    other widths: one line naming what failed, never a traceback from torch.func. The run had
    begun, but without a round its directory goes (the next run takes its name)."""
    config = {**BASE, "client": {**BASE["client"], "trainer": trainer, "batch_size": batch_size},
              "model": {"name": f"user_nets:{name}"}}
    run_dir = cli_run(config, expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and err.startswith(f"error: [model] name = 'user_nets:{name}': {says}"), err
    assert err.endswith(f" (nothing was kept: {run_dir} removed)\n") and not run_dir.exists()
    fixed = {**config, "client": {**config["client"], "trainer": "loop"}} if trainer == "auto" \
        else {**config, "model": {"name": "user_nets:kept"}}  # what the line says to set trains it
    assert cli_run(fixed) == run_dir


def test_a_mistake_found_after_some_rounds_keeps_the_checkpoint_and_says_how_to_go_on(cli_run, user_models,
                                                                                     monkeypatch, tmp_path):
    """The line ends with the resume that goes on from the last checkpoint once the cause is
    fixed, run here as printed from another directory."""
    from fedsim.errors import FedsimError
    from fedsim.results.recorder import Recorder

    add_round = Recorder.add_round

    def fails_in_round_4(self, outcome, *args):
        if outcome.round == 4:
            raise FedsimError("[model] name = 'user_nets:kept': something only round 4 shows")
        return add_round(self, outcome, *args)

    config = {**BASE, "run": {**BASE["run"], "rounds": 8, "checkpoint_every": 2}, "model": {"name": "user_nets:kept"}}
    whole = cli_run(config, name="whole")
    monkeypatch.setattr(Recorder, "add_round", fails_in_round_4)
    cut = cli_run(config, name="cut", expect=2)
    err = cli_run.last_output.err
    assert err.startswith("error: [model] name = 'user_nets:kept': something only round 4 shows; ") and \
        err.count("\n") == 1, err
    command = re.search(r"then run `(.+)` to go on\n$", err).group(1)
    assert command == f"fedsim run --resume {cut}"
    monkeypatch.setattr(Recorder, "add_round", add_round)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(shlex.split(command)[1:]) == 0
    assert pl.read_parquet(cut / "rounds.parquet").drop("wall_s").equals(
        pl.read_parquet(whole / "rounds.parquet").drop("wall_s"))


def test_the_loop_steps_a_host_read_and_a_data_dependent_shape_as_plain_pytorch():
    """A value read on the host is a constant to the gradient, as in torch's own autograd."""
    import torch.nn.functional as F

    from fedsim.training.modules import ModuleModel

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 10)

        def forward(self, x):
            x = x.flatten(1)
            return self.fc(x) * self.fc.weight.abs().max().item() + x[x > 0.5].sum() * self.fc.bias[0]

    torch.manual_seed(0)
    net = Net()
    model = ModuleModel("net", net, (1, 8, 8), 10, "net")
    x, y, weight = torch.rand(5, 1, 8, 8), torch.randint(0, 10, (5,)), torch.full((5,), 0.2)
    step = model.step_fn(lambda logits, y, w: (F.cross_entropy(logits, y, reduction="none") * w).sum(), batched=False)
    grads, loss = step(model.split(model.init(0)), x, y, weight, torch.tensor(0))
    plain = (F.cross_entropy(net.train()(x), y, reduction="none") * weight).sum()
    assert torch.allclose(loss, plain.detach())
    for got, expected in zip(grads, torch.autograd.grad(plain, [net.fc.weight, net.fc.bias])):
        assert torch.allclose(got, expected)


def test_state_a_forward_may_keep_trains_alike_on_both_trainers(cli_run, user_models):
    """A buffer updated in place (as BatchNorm's running statistics) and an attribute set to
    the same value at each call are not refused; the buffer counts the samples trained."""
    batched, loop = run(cli_run, "kept"), run(cli_run, "kept", "loop")
    a, b = torch.load(batched / "model.pt"), torch.load(loop / "model.pt")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert float(a["seen"]) == 3 * 3 * 8  # 3 rounds x 3 local steps x 8 samples, averaged over the devices


def test_init_from_a_state_dict_that_does_not_fit(cli_run, user_models, tmp_path):
    done = run(cli_run, "resnet")
    warm = run(cli_run, "resnet_dropout", init_from=str(done))  # the same parameters: it fits
    assert rounds_of(warm, "test_loss")[0] < rounds_of(done, "test_loss")[0] + 1.0
    run(cli_run, "transformer", expect=2, init_from=str(done))
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and "[model] init_from" in err and "has no parameter 'emb.weight'" in err


@pytest.mark.parametrize("name, shape", [("logreg", (1, 8, 8)), ("mlp", (1, 8, 8)), ("lenet5", (1, 28, 28)),
                                         ("cnn-fmnist", (1, 28, 28)), ("cnn-cifar", (3, 32, 32)), ("lstm", (1, 28, 28))])
def test_counted_flops_of_the_builtin_layers_equal_their_hand_figures(name, shape):
    """torch's FlopCounterMode on the hand-batched built-ins agrees with their own formulas
    (docs/timing.md's table; the LSTM's formula also counts its biases: within 5 %)."""
    from torch.utils.flop_counter import FlopCounterMode

    from fedsim.config import ModelConfig
    from fedsim.training.models import build_model

    model = build_model(ModelConfig(name=name), shape, 10, "x")
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model.forward(model.split(model.init(0)), torch.zeros(1, *shape))
    assert counter.get_total_flops() / 2 == pytest.approx(model.flops, rel=0.05 if name == "lstm" else 1e-9)


def test_resnet18_gn_is_torchvisions_resnet18_with_the_cifar_stem_and_groupnorm():
    from torch import nn

    from fedsim.config import ModelConfig
    from fedsim.training.models import build_model

    model = build_model(ModelConfig(name="resnet18-gn"), (3, 32, 32), 10, "cifar10")
    assert model.dim == 11_173_962 and not model.has_buffers
    norms = [m for m in model.module.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 20 and {m.num_groups for m in norms} == {2}
    assert model.module.conv1.kernel_size == (3, 3) and model.module.conv1.stride == (1, 1)
    assert model.flops == pytest.approx(555_422_720)  # convolutions and the dense layer, per sample


def test_flops_in_the_manifest_config_show_and_the_override(cli_run, user_models, capsys):

    import json

    counted = run(cli_run, "resnet")
    flops = json.loads((counted / "manifest.json").read_text())["train_flops_per_sample"]
    per_sample = 2 * (4 * 9 * 64 + 4 * 4 * 9 * 64 + 40)  # stem and block convolutions on 8x8, the dense layer
    assert flops == 6 * per_sample / 2
    given = run(cli_run, "resnet_dropout", train_flops_per_sample=1e6)
    assert json.loads((given / "manifest.json").read_text())["train_flops_per_sample"] == 1e6
    assert main(["config", "show", str(counted / "config.toml")]) == 0
    assert (f"# the model: 242 parameters sent and averaged, trained on torch.func (a cohort in one call) or "
            f"torch's autograd (one device at a time), {flops:,.0f} training FLOPs per sample") in capsys.readouterr().out


def test_an_op_the_counter_does_not_know_is_named_in_a_warning():
    from torch import nn

    from fedsim.training.modules import ModuleModel

    class Spectral(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5 * 2, 3)

        def forward(self, x):
            return self.fc(torch.view_as_real(torch.fft.rfft(x.flatten(1))).flatten(1))

    with pytest.warns(UserWarning, match=r"FLOPs of aten\._fft_r2c are not counted.*train_flops_per_sample"):
        ModuleModel("spectral", Spectral(), (8,), 3, "[model] name = 'x:spectral'")


def attention_layer_flops(batch: int, length: int, d: int, ff: int, heads: int) -> tuple[int, int]:
    """(forward, backward) FLOPs of one nn.TransformerEncoderLayer on [batch, length, d], by
    hand: its linear maps (q, k and v packed, out, the feed-forward pair; backward twice) and
    attention's products Q K^T and weights x V (backward: torch's five, the scores recomputed)."""
    linear = 2 * batch * length * (d * 3 * d + d * d + d * ff + ff * d)
    per_e = 2 * batch * length * length * d  # 2 B H L S E with H x E = d
    return linear + 2 * per_e, 2 * linear + 5 * per_e


def test_cpu_attention_is_counted_as_torch_counts_gpu_attention():
    """On a CPU, attention without dropout is one fused op torch has no formula for: fedsim's
    formula gives exactly the products by hand, forward and backward, the same as torch's
    formulas for the GPU's fused attention; a layer and bare F.scaled_dot_product_attention."""
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.flop_counter import flop_registry

    from fedsim.training.flops import attention_backward_flops, attention_flops, flop_counter

    aten = torch.ops.aten
    q, k, v = torch.zeros(2, 3, 5, 4), torch.zeros(2, 3, 7, 4), torch.zeros(2, 3, 7, 6)
    assert attention_flops(q, k, v) == 2 * 2 * 3 * 5 * 7 * (4 + 6) == \
        flop_registry[aten._scaled_dot_product_efficient_attention](q, k, v)
    grad = torch.zeros(2, 3, 5, 6)
    assert attention_backward_flops(grad, q, k, v) == 2 * 2 * 3 * 5 * 7 * (3 * 4 + 2 * 6) == \
        flop_registry[aten._scaled_dot_product_efficient_attention_backward](grad, q, k, v)

    class Attend(nn.Module):  # 8 tokens of 8; q, k, v [B, 2 heads, 8, 4] from one linear map
        def __init__(self):
            super().__init__()
            self.qkv, self.fc = nn.Linear(8, 24), nn.Linear(64, 10)

        def forward(self, x):
            q, k, v = self.qkv(x).view(len(x), 8, 3, 2, 4).permute(2, 0, 3, 1, 4)
            return self.fc(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(1))

    def forward_backward(module, x):
        counter = flop_counter()
        with counter:
            module(x.requires_grad_()).sum().backward()
        return counter.get_total_flops()

    linear = 2 * 3 * (8 * 8 * 24 + 64 * 10)
    attention = 2 * 3 * 2 * 8 * 8 * 4  # per E: 2 B H L S
    assert forward_backward(Attend(), torch.randn(3, 8, 8)) == 3 * linear + (2 + 5) * attention
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    assert forward_backward(layer, torch.randn(3, 8, 8)) == sum(attention_layer_flops(3, 8, 8, 16, 2))


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_transformer_layers_counted_cost_is_its_hand_count_without_a_warning(dropout):
    """The forward fedsim counts (train mode: fused attention without dropout, attention written
    out by keyed dropout with it) is the hand count; no op is left uncounted."""
    import warnings

    from torch import nn

    from fedsim.training.modules import probe_forward

    module = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, dropout=dropout, batch_first=True),
                           nn.Flatten(), nn.Linear(64, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, macs, _, _ = probe_forward(module, dict(module.state_dict()), torch.randn(3, 8, 8), "x")
    assert macs == attention_layer_flops(1, 8, 8, 16, 2)[0] / 2 + 64 * 10


def test_a_matrix_times_a_vector_is_counted():
    """Attention pooling (`h @ q`, one score per token) is a matrix-vector product torch has no
    formula for: 8 tokens x 8 features, then a linear map of the pooled features."""
    from torch import nn

    from fedsim.training.modules import probe_forward

    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.fc = nn.Parameter(torch.randn(8)), nn.Linear(8, 10)

        def forward(self, x):
            h = x[:, 0]  # [B, 8 tokens, 8]
            return self.fc((torch.softmax(h @ self.query, dim=1)[..., None] * h).sum(1))

    module = Pool()
    _, macs, _, _ = probe_forward(module, dict(module.named_parameters()), torch.randn(3, 1, 8, 8), "x")
    assert macs == 8 * 8 + 8 * 10


def test_an_lstm_layer_is_counted_as_its_matrix_products():
    """On a CPU an LSTM layer is one fused op (oneDNN) torch has no formula for: fedsim counts it
    as the products of the unfused LSTM, W_ih x and W_hh h at every step, forward and backward."""
    from torch import nn

    from fedsim.training.flops import flop_counter

    lstm, x = nn.LSTM(8, 6, num_layers=2, bidirectional=True), torch.randn(5, 3, 8)
    with torch.no_grad(), flop_counter() as counter:
        lstm(x)
    # 5 steps x 3 sequences x 2 directions x 4 gates of 6, from 8 inputs then from 2 x 6
    forward = 2 * 5 * 3 * 2 * 24 * ((8 + 6) + (12 + 6))
    assert counter.get_total_flops() == forward
    with flop_counter() as counter:
        lstm(x.requires_grad_())[0].sum().backward()
    assert counter.get_total_flops() == 3 * forward


@pytest.mark.parametrize("name, macs", [
    ("transformer", 8 * (8 * 24 + 8 * 8 + 2 * 8 * 16) + 2 * 8 * 8 * 8 + 8 * 10),  # linear maps, attention, fc
    ("lstm", 8 * 24 * (8 + 6) + 6 * 10),  # 8 steps of 4 gates of 6 from 8 pixels and 6 hidden, fc
])
def test_a_transformer_and_an_lstm_are_timed_by_their_hand_counted_flops(cli_run, user_models, name, macs):
    """Through the CLI: no warning asks for a number, the manifest's training FLOPs are 3 x the
    hand-counted forward, and every device computes its samples at those FLOPs / its FLOP/s."""
    import json
    import warnings

    import polars as pl

    config = {**BASE, "server": {"clients_per_round": 4}, "trace": {"source": "always"},
              "run": {**BASE["run"], "rounds": 2, "eval_every": 2}, "model": {"name": f"user_nets:{name}"}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_dir = cli_run(config, name=name)
    assert not [w for w in caught if "not counted" in str(w.message)]
    flops = json.loads((run_dir / "manifest.json").read_text())["train_flops_per_sample"]
    assert flops == 6 * macs
    devices, events = pl.read_parquet(run_dir / "devices.parquet"), pl.read_parquet(run_dir / "events.parquet")
    joined = events.join(devices.select("device_id", "flops"), on="device_id")
    assert len(joined) == 8 and (joined["samples"] == 3 * 8).all()
    np.testing.assert_allclose(joined["compute_s"], joined["samples"] * flops / joined["flops"], rtol=1e-12)


def test_local_buffers_stay_on_the_devices_and_resume_exactly(cli_run, user_models):
    """FedBN: the weights train exactly as with averaged buffers (running statistics do not
    enter a train-mode loss), the saved statistics are the devices' mean instead of the
    average of their deltas, batched == loop, and a resumed run equals an uninterrupted one."""

    averaged = torch.load(run(cli_run, "resnet_bn") / "model.pt")
    local = cli_run({**BASE, "model": {"name": "user_nets:resnet_bn", "local_buffers": True},
                     "client": {**BASE["client"], "trainer": "batched"}}, name="local")
    loop = cli_run({**BASE, "model": {"name": "user_nets:resnet_bn", "local_buffers": True},
                    "client": {**BASE["client"], "trainer": "loop"}}, name="local-loop")
    kept, kept_loop = torch.load(local / "model.pt"), torch.load(loop / "model.pt")
    for key in averaged:
        if key.startswith("bn.running") or key.endswith("num_batches_tracked"):
            continue
        assert torch.equal(kept[key], averaged[key]), key
    assert not torch.allclose(kept["bn.running_mean"], averaged["bn.running_mean"])
    assert all(torch.allclose(kept[k].double(), kept_loop[k].double(), rtol=1e-4, atol=1e-6) for k in kept)
    half = cli_run({**BASE, "run": {**BASE["run"], "rounds": 2, "checkpoint_every": 1},
                    "model": {"name": "user_nets:resnet_bn", "local_buffers": True},
                    "client": {**BASE["client"], "trainer": "batched"}}, name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=3", "--quiet"]) == 0
    resumed = torch.load(half / "model.pt")
    assert all(torch.equal(resumed[k], kept[k]) for k in kept)


def test_a_resume_whose_model_code_changed_is_one_line(cli_run, user_models, tmp_path):

    half = cli_run({**BASE, "run": {**BASE["run"], "rounds": 2, "checkpoint_every": 1},
                    "model": {"name": "user_nets:resnet"}}, name="half")
    before = {p.name: p.read_bytes() for p in half.iterdir() if p.is_file()}
    (tmp_path / "user_nets.py").write_text(USER_MODELS.replace("nn.Linear(4, n_classes)", "nn.Linear(4, n_classes, bias=False)"))
    sys.modules.pop("user_nets", None)
    assert main(["run", "--resume", str(half), "--set", "run.rounds=3", "--quiet"]) == 2
    err = cli_run.capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint.pt: the file has a parameter 'fc.bias', which this run's model lacks" in err
    assert "put back the model code" in err
    assert {p.name: p.read_bytes() for p in half.iterdir() if p.is_file()} == before  # nothing lost


def test_an_nn_module_mlp_trains_exactly_as_the_builtin_mlp(user_models):
    """The same flat layout (weight, bias, weight, bias) from the same start: the module path
    computes the built-in's steps (loop: bit for bit; batched: to float rounding)."""
    from torch import nn

    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import build_task, build_trainer

    import user_nets
    user_nets.mlp32 = lambda s, n, cfg: nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, n))
    cpu = torch.device("cpu")
    tasks = [build_task(DataConfig(dataset="digits", clients=10), ModelConfig(name=name, hidden=32), seed=0, device=cpu)
             for name in ("mlp", "user_nets:mlp32")]
    start = tasks[0].init_params()[None].expand(3, -1).clone()
    results = {(t.model.name, path): build_trainer(t, ClientConfig(batch_size=8, trainer=path), seed=1).train(
        2, np.arange(3), start, np.array([3, 1, 2]), 0.1) for t in tasks for path in ("loop", "batched")}
    assert torch.equal(results["mlp", "loop"].deltas, results["user_nets:mlp32", "loop"].deltas)
    assert torch.allclose(results["mlp", "batched"].deltas, results["user_nets:mlp32", "batched"].deltas, atol=1e-6)
    assert tasks[0].evaluate(start[0]) == tasks[1].evaluate(start[0])


def test_auto_batches_modules_on_a_cpu_and_keeps_the_loop_for_builtin_cnns(user_models):
    """Measured (benchmarks/RESULTS.md): a module's convolutions under vmap beat its loop on a
    CPU, the hand-batched grouped convolution does not."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import build_task, build_trainer

    def path(model):
        task = build_task(DataConfig(dataset="digits", clients=10), ModelConfig(name=model), seed=0,
                          device=torch.device("cpu"))
        return build_trainer(task, ClientConfig(trainer="auto"), seed=0).path_for(np.arange(5)).path

    assert path("user_nets:resnet") == "batched" and path("cnn-svhn") == "loop"


def test_runs_of_one_module_train_together_as_apart(user_models):
    """A study's lockstep: two runs (seeds) of one module share a batched call and get what
    their own calls give; runs whose modules hold frozen constants of their own do not share."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import build_task, build_trainer
    from fedsim.training.cohort import cohort_key, train_together
    from fedsim.training.objective import PLAIN

    def trainer(model, seed):
        task = build_task(DataConfig(dataset="digits", clients=6), ModelConfig(name=model), seed=seed,
                          device=torch.device("cpu"))
        return build_trainer(task, ClientConfig(batch_size=4, trainer="batched"), seed=seed)

    ids, steps = np.arange(3), np.array([2, 1, 2])
    calls = [(t, 1, ids, t.task.init_params()[None].expand(3, -1).clone(), steps, 0.1, PLAIN)
             for t in (trainer("user_nets:resnet_dropout", 0), trainer("user_nets:resnet_dropout", 1))]
    assert cohort_key(calls[0][0], ids, PLAIN) == cohort_key(calls[1][0], ids, PLAIN)
    together = train_together(calls)
    for call, result in zip(calls, together):
        alone = call[0].train(*call[1:])
        assert torch.allclose(result.deltas, alone.deltas, atol=1e-6)
    frozen = [trainer("user_nets:frozen_stem", seed) for seed in (0, 1)]
    assert cohort_key(frozen[0], ids, PLAIN) != cohort_key(frozen[1], ids, PLAIN)


def test_an_installed_module_factory_runs_by_its_entry_point_name(cli_run, user_models, tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "fedsim_nets-0.1.dist-info").mkdir(parents=True)
    (site / "fedsim_nets-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fedsim-nets\nVersion: 0.1\n")
    (site / "fedsim_nets-0.1.dist-info" / "entry_points.txt").write_text("[fedsim.models]\ntiny-resnet = user_nets:resnet\n")
    monkeypatch.syspath_prepend(str(site))
    by_name = cli_run({**BASE, "model": {"name": "tiny-resnet"}}, name="ep")
    by_path = run(cli_run, "resnet", "auto")
    a, b = torch.load(by_name / "model.pt"), torch.load(by_path / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def trained_on_the_loop(cli_run, config: dict) -> tuple[dict, str]:
    """(model.pt of `config` under trainer = 'loop', equal to 'auto''s; the one error line of
    'batched', which names the loop)."""
    loop = cli_run({**config, "client": {**config["client"], "trainer": "loop"}}, name="loop")
    auto = cli_run({**config, "client": {**config["client"], "trainer": "auto"}}, name="auto")
    a, b = torch.load(loop / "model.pt"), torch.load(auto / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    cli_run({**config, "client": {**config["client"], "trainer": "batched"}}, name="batched", expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and err.startswith("error: [client] trainer = 'batched'")
    assert "set trainer = 'loop' (or 'auto')" in err
    return a, err


def test_batchnorm_on_unequal_full_local_data_trains_on_the_loop(cli_run, user_models):
    """batch_size = 0 pads the cohort's full local data to the largest device; BatchNorm's
    batch statistics would take the padding in, so `auto` trains such a module on the loop
    (the same model as `loop`) and `batched` is refused in one line."""
    full = {**BASE, "client": {**BASE["client"], "batch_size": 0}, "model": {"name": "user_nets:resnet_bn"}}
    _, err = trained_on_the_loop(cli_run, full)
    assert "the model cannot train batched (its BatchNorm would count the padding of the devices' unequal full local data" in err


def test_vmaps_warning_of_an_op_it_runs_device_by_device_stays_out_of_the_output(user_models, tmp_path):
    """torch warns that vmap has no batching rule for CPU attention (SDPA); fedsim's probe records
    such ops for the manifest, so a forced batched run prints no torch warning (a process of its
    own: pytest resets warning filters per test)."""
    from fedsim.config import dump_toml
    from test_stop_and_resume import fedsim

    config = {**BASE, "run": {**BASE["run"], "rounds": 1, "plots": False, "out": str(tmp_path / "runs")},
              "client": {**BASE["client"], "trainer": "batched"}, "model": {"name": "user_nets:transformer_no_dropout"}}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    done = fedsim(["run", "c.toml", "--quiet"], tmp_path)
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr


def test_a_tied_weight_and_an_unsaved_buffer_go_through_model_pt(cli_run, user_models):
    """model.pt holds a weight tied under two names trained under both (as the module's own
    state_dict does), so that it loads into the module; a run started from it (init_from) takes
    the buffer that the state_dict leaves out (persistent=False) from the module."""
    import json

    from fedsim.config import ModelConfig
    from fedsim.training.models import build_model

    done = run(cli_run, "tied_unsaved")
    saved = torch.load(done / "model.pt")
    module = user_models.tied_unsaved((1, 8, 8), 10, None)
    initial = module.a.weight.detach().clone()
    assert list(saved) == ["a.weight", "b.weight", "fc.weight", "fc.bias"]
    module.load_state_dict(saved)
    assert torch.equal(module.a.weight, saved["a.weight"]) and not torch.equal(module.a.weight, initial)
    built = build_model(ModelConfig(name="user_nets:tied_unsaved"), (1, 8, 8), 10, "digits", seed=4)
    assert built.shared_key()[1] is None  # no constants of its own: its runs may share a call
    warm = run(cli_run, "tied_unsaved", init_from=str(done))
    initial_loss = json.loads((warm / "manifest.json").read_text())["initial"]["test_loss"]
    assert initial_loss == pytest.approx(rounds_of(done, "test_loss")[-1], rel=1e-6)
    saved["b.weight"] = torch.zeros_like(saved["b.weight"])  # the tied names disagree: no value is the file's
    torch.save(saved, done.parent / "edited.pt")
    run(cli_run, "tied_unsaved", init_from=str(done.parent / "edited.pt"), expect=2)
    assert cli_run.last_output.err.endswith(": the file gives 'b.weight' and 'a.weight', one tensor in this run's "
                                            "model (tied), different values; give them one value (or start from "
                                            "the model.pt of a run)\n")


@pytest.mark.parametrize("name", ["user_nets:resnet", "user_nets:resnet_bn", "user_nets:transformer",
                                  "user_nets:frozen_stem", "mlp", "cnn-svhn"])
def test_a_models_size_is_counted_on_the_meta_device_as_built(name, user_models):
    """The memory check's count (the factory called on the meta device, nothing allocated) is
    the flat state the run trains: trainable parameters and buffers, frozen ones aside."""
    from fedsim.config import DataConfig, ModelConfig
    from fedsim.training import build_task
    from fedsim.training.models import model_dim

    task = build_task(DataConfig(dataset="digits", clients=4), ModelConfig(name=name), seed=0,
                      device=torch.device("cpu"))
    assert model_dim(ModelConfig(name=name), (1, 8, 8), 10) == task.dim


def test_a_factory_that_reads_values_is_counted_once_built(user_models):
    """A factory that cannot build on the meta device (it reads a tensor's value) is counted
    after it is built: the count says None and the run goes on."""
    from torch import nn

    from fedsim.config import ModelConfig
    from fedsim.training.models import model_dim

    import user_nets
    user_nets.reads = lambda s, n, cfg: nn.Linear(64 * int(torch.ones(1).item()), n)
    assert model_dim(ModelConfig(name="user_nets:reads"), (1, 8, 8), 10) is None


def test_a_resumed_run_keeps_the_training_flops_it_was_timed_with(cli_run, user_models):
    """A later release may count a module's ops otherwise (fedsim's own formulas for ops torch's
    counter lacks): a run resumed across that goes on at the cost its manifest recorded, so its
    clock does not change mid-run."""
    import json

    import polars as pl


    config = {**BASE, "server": {"clients_per_round": 4}, "trace": {"source": "always"},
              "run": {**BASE["run"], "rounds": 2, "eval_every": 2}, "model": {"name": "user_nets:lstm"}}
    run_dir = cli_run(config, name="lstm")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    counted = manifest["train_flops_per_sample"]
    recorded = counted / 7  # what an earlier release counted (it left the LSTM layer out)
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "train_flops_per_sample": recorded}))
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=4", "--quiet"]) == 0
    assert json.loads((run_dir / "manifest.json").read_text())["train_flops_per_sample"] == recorded
    events = pl.read_parquet(run_dir / "events.parquet").join(
        pl.read_parquet(run_dir / "devices.parquet").select("device_id", "flops"), on="device_id")
    resumed = events.filter(pl.col("round") >= 2)
    assert len(resumed) == 8
    np.testing.assert_allclose(resumed["compute_s"], resumed["samples"] * recorded / resumed["flops"], rtol=1e-12)


def documented_models(folder: Path) -> str:
    """The `my_models.py` of docs/extending.md that initialises as the built-ins do, written
    into `folder` as it stands in the docs (plus an MLP through the same helper)."""
    docs = (Path(__file__).parents[1] / "docs" / "extending.md").read_text()
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", docs, re.S) if "def init_like_builtins" in b]
    mlp = ("\n\ndef mlp(in_shape, n_classes, cfg):\n    return init_like_builtins(nn.Sequential(nn.Flatten(), "
           "nn.Linear(64, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, n_classes)))\n")
    return plugin_module(folder, "doc_models", snippet + mlp)


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_the_documented_initialisation_starts_a_module_from_the_builtins_initial_model(tmp_path, monkeypatch, shape):
    """docs/extending.md: the LeNet-5 module initialised by its snippet starts from the built-in
    lenet5's initial values, bit for bit, under the same names, for every seed."""
    from fedsim.config import ModelConfig
    from fedsim.training.models import build_model

    monkeypatch.syspath_prepend(str(tmp_path))
    name = documented_models(tmp_path)
    try:
        for seed in (0, 3, 2**31 - 1):
            builtin, module = (build_model(ModelConfig(name=n), shape, 10, "fashion-mnist", seed=seed)
                               for n in ("lenet5", f"{name}:lenet5"))
            assert torch.equal(builtin.init(seed), module.init(seed))
            ours, theirs = (m.state_dict(m.init(seed)) for m in (builtin, module))
            assert list(ours) == list(theirs) == [f"{layer}.{kind}" for layer in ("conv1", "conv2", "fc1", "fc2", "fc3")
                                                  for kind in ("weight", "bias")]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            default = torch.nn.Conv2d(shape[0], 6, 5).weight  # torch's own: 1 / (3 fan_in), a sixth
        fan_in = shape[0] * 25
        assert default.var().item() == pytest.approx(1 / (3 * fan_in), rel=0.3)
        assert builtin.state_dict(builtin.init(0))["conv1.weight"].var().item() == pytest.approx(2 / fan_in, rel=0.3)
    finally:
        sys.modules.pop(name, None)


def test_a_module_initialised_as_documented_runs_as_the_builtin_through_the_cli(cli_run, tmp_path, monkeypatch):
    """An MLP module through docs/extending.md's `init_like_builtins`, run by `fedsim run` on the
    loop trainer, is the built-in mlp's run: the same initial evaluation, rounds and model.pt."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = documented_models(tmp_path)
    try:
        runs = [cli_run({**BASE, "client": {**BASE["client"], "trainer": "loop"},
                         "model": {"name": model, "hidden": 32}}, name=model.replace(":", "-"))
                for model in ("mlp", f"{name}:mlp")]
    finally:
        sys.modules.pop(name, None)
    builtin, module = (json.loads((r / "manifest.json").read_text()) for r in runs)
    assert builtin["initial"] == module["initial"]
    columns = ["round", "arrived", "train_loss", "test_loss", "test_acc"]
    builtin_rounds, module_rounds = (pl.read_parquet(r / "rounds.parquet")[columns] for r in runs)
    assert builtin_rounds.equals(module_rounds)
    saved = [torch.load(r / "model.pt") for r in runs]
    assert len(saved[0]) == len(saved[1]) == 4  # fc1, fc2 and the Sequential's 1, 3: weight and bias
    assert all(torch.equal(a, b) for a, b in zip(saved[0].values(), saved[1].values()))
@pytest.mark.parametrize("name", ["typed_buffers", "weight_norm", "frozen_stem"])
def test_module_semantics_through_model_pt_resume_and_init_from(cli_run, user_models, name):
    """Integer and boolean buffers (an index, a mask, a counter: read in their own dtype, saved
    in it), a weight-norm parametrization, frozen parameters (not trained, saved): batched ==
    loop to float rounding, model.pt loads into the module, a resumed run equals an
    uninterrupted one, and a run started from model.pt (init_from) starts where it ended."""
    import json

    from fedsim.config import ModelConfig
    from fedsim.training.models import build_model

    batched, loop = run(cli_run, name), run(cli_run, name, "loop")
    a, b = torch.load(batched / "model.pt"), torch.load(loop / "model.pt")
    start = build_model(ModelConfig(name=f"user_nets:{name}"), (1, 8, 8), 10, "digits", seed=4).module.state_dict()
    assert list(a) == list(start)
    getattr(user_models, name)((1, 8, 8), 10, None).load_state_dict(a)
    for key in a:
        assert a[key].dtype == b[key].dtype == start[key].dtype, key
        assert torch.allclose(a[key].double(), b[key].double(), rtol=1e-4, atol=1e-5), key
    if name == "typed_buffers":
        assert torch.equal(a["keep"], start["keep"]) and torch.equal(a["mask"], start["mask"])
        assert int(a["calls"]) == 9  # 3 rounds x 3 local steps, averaged
    if name == "weight_norm":
        assert "1.parametrizations.weight.original0" in a  # the norm g, trained with the direction v
        assert not torch.equal(a["1.parametrizations.weight.original0"], start["1.parametrizations.weight.original0"])
    if name == "frozen_stem":
        assert torch.equal(a["stem.weight"], start["stem.weight"])
    last = "3.weight" if name == "weight_norm" else "fc.weight"
    assert not torch.equal(a[last], start[last])  # it trained

    half = cli_run({**BASE, "run": {**BASE["run"], "rounds": 2, "checkpoint_every": 1},
                    "client": {**BASE["client"], "trainer": "batched"}, "model": {"name": f"user_nets:{name}"}},
                   name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=3", "--quiet"]) == 0
    resumed = torch.load(half / "model.pt")
    assert all(torch.equal(resumed[k], a[k]) for k in a)
    warm = run(cli_run, name, init_from=str(batched))
    initial_loss = json.loads((warm / "manifest.json").read_text())["initial"]["test_loss"]
    assert initial_loss == pytest.approx(rounds_of(batched, "test_loss")[-1], rel=1e-6)


def test_batchnorm_with_local_epochs_trains_on_the_loop_as_a_plain_loop(cli_run, user_models):
    """FedBN with local epochs: the loop trains each device on its own samples, an epoch's last
    minibatch as small as it is (the batched call would pad it into BatchNorm's statistics, so
    `auto` takes the loop and `batched` is one line); a resumed run equals an uninterrupted
    one; a device's local steps are those of a plain PyTorch loop over the same minibatches,
    bit for bit from training rules 8 (the mean loss, torch.optim.SGD's update)."""
    import torch.nn.functional as F

    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import build_task, build_trainer

    epochs = {**BASE, "client": {**BASE["client"], "batch_size": 10, "local_epochs": 1.0},
              "model": {"name": "user_nets:resnet_bn", "local_buffers": True}}
    a, err = trained_on_the_loop(cli_run, epochs)
    assert "an epoch's last, smaller minibatch (local_epochs = 1)" in err
    half = cli_run({**epochs, "run": {**epochs["run"], "rounds": 2, "checkpoint_every": 1},
                    "client": {**epochs["client"], "trainer": "loop"}}, name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=3", "--quiet"]) == 0
    resumed = torch.load(half / "model.pt")
    assert all(torch.equal(resumed[k], a[k]) for k in a)

    task = build_task(DataConfig(dataset="digits", clients=6), ModelConfig(name="user_nets:resnet_bn"), seed=4,
                      device=torch.device("cpu"))
    assert task.data.sizes_np[2] == 224  # an epoch: 22 minibatches of 10, then one of 4
    start = task.init_params()[None]
    deltas = build_trainer(task, ClientConfig(batch_size=10, local_epochs=1.0, trainer="loop"), seed=4).train(
        1, np.array([2]), start, np.array([23]), 0.1).deltas
    module = user_models.resnet_bn((1, 8, 8), 10, None)
    module.load_state_dict(task.model.state_dict(start[0]))
    sgd = torch.optim.SGD(module.parameters(), lr=0.1)
    inputs, sizes = task.inputs(torch.tensor([2]), 1, 23, 10, 4, epochs=1.0), []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (as the loop trains a module: a convolution's sums depend on its threads)
    try:
        for step in range(23):
            x, y, weight = (t[0] for t in inputs(step, slice(None))[:3])
            x, y = x[weight > 0], y[weight > 0]
            sizes.append(len(y))
            sgd.zero_grad()
            F.cross_entropy(module.train()(x), y).backward()
            sgd.step()
    finally:
        torch.set_num_threads(threads)
    assert sizes == [10] * 22 + [4]
    plain = module.state_dict()
    plain = torch.cat([plain[name].reshape(-1).float() for name in task.model.names])  # (fedsim's flat order)
    assert torch.equal(deltas[0], plain - start[0])


def test_an_op_that_could_draw_but_does_not_is_not_random():
    """The one rule both trainers' check uses (fedsim/training/modules.py): torch tags CPU
    attention as seeded for its dropout; with dropout_p = 0, or dropout outside training,
    nothing is drawn."""
    from fedsim.training.modules import draws_random_numbers

    aten = torch.ops.aten
    q = torch.zeros(1, 2, 3)
    assert not draws_random_numbers(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q), {})
    assert not draws_random_numbers(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q, 0.0), {})
    assert draws_random_numbers(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q), {"dropout_p": 0.1})
    assert not draws_random_numbers(aten.native_dropout.default, (q, 0.5, False), {})
    assert draws_random_numbers(aten.native_dropout.default, (q, 0.5, True), {})
    assert draws_random_numbers(aten.randn_like.default, (q,), {})
    assert not draws_random_numbers(aten.mm.default, (q[0], q[0].T), {})


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_modules_training_calls_take_one_thread_under_auto_however_large(cli_run, user_models, two_threads):
    """A call of 240 M multiply-adds (the counted cost raised by train_flops_per_sample) with 4
    threads: a built-in model's takes half of them, a module's one (benchmarks/RESULTS.md,
    bench_modules), and the manifest says why; `threads = 2` still pins it."""
    torch.set_num_threads(4)
    big = {"train_flops_per_sample": 6e7}
    config = {**BASE, "run": {**BASE["run"], "device": "cpu"}, "client": {**BASE["client"], "trainer": "auto"}}
    module = cli_run({**config, "model": {"name": "user_nets:resnet", **big}}, name="module")
    builtin = cli_run({**config, "model": {"name": "logreg", **big}}, name="builtin")
    pinned = cli_run({**config, "model": {"name": "user_nets:resnet", **big}, "run": {**config["run"], "threads": 2}},
                     name="pinned")
    t = json.loads((module / "manifest.json").read_text())["trainer"]
    assert (t["path"], t["threads"]) == ("batched", 1) and [c["threads"] for c in t["calls"]] == [1]
    assert t["why"] == ("auto: the cohort in one call on the CPU; "
                        "[run] threads = 'auto': an nn.Module's calls (many small kernels) on one thread")
    t = json.loads((builtin / "manifest.json").read_text())["trainer"]
    assert (t["path"], t["threads"]) == ("batched", 2) and "at least the 22.5 M crossover (half of 4" in t["why"]
    assert json.loads((pinned / "manifest.json").read_text())["trainer"]["threads"] == 2


def test_a_study_of_dropout_modules_trains_in_parts_each_as_alone(cli_run, user_models, two_threads, tmp_path):
    """Two points of a dropout module in one shared call, cut into two one-thread parts run at
    once: each part's dropout draws its own run's keys (the keyed draws are per thread), so
    every point is bit for bit its `fedsim run` alone."""
    from fedsim.config import dump_toml

    study = {**BASE, "run": {**BASE["run"], "name": "s", "out": str(tmp_path / "runs"), "progress": False,
                             "plots": False, "device": "cpu"},
             "model": {"name": "user_nets:resnet_dropout", "train_flops_per_sample": 6e6},
             "client": {**BASE["client"], "trainer": "batched"}, "sweep": {"run.seed": [0, 1]}}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet"]) == 0
    for seed in (0, 1):
        point = tmp_path / "runs" / "s" / f"seed-{seed}"
        t = json.loads((point / "manifest.json").read_text())["trainer"]
        assert t["why"].endswith("in one call with 1 other run(s) of the study; "
                                 "[run] threads = 'auto': a shared call in one-thread parts")
        alone = cli_run({**{k: v for k, v in study.items() if k != "sweep"},
                         "run": {**study["run"], "seed": seed, "name": f"alone-{seed}"}})
        columns = ["round", "arrived", "train_loss", "test_loss", "test_acc"]
        assert pl.read_parquet(alone / "rounds.parquet")[columns].equals(
            pl.read_parquet(point / "rounds.parquet")[columns])
        a, b = torch.load(alone / "model.pt"), torch.load(point / "model.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), seed


class _Counted(nn.Module):
    """BatchNorm (running statistics, an integer counter), a boolean mask buffer, a tied weight
    used twice, an unused layer, dropout before the head, pooling (the loop's on channels-last
    copies: fedsim's own `F.max_pool2d` while the loop's forward runs)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.a, self.b = nn.Linear(64, 32), nn.Linear(32, 32)
        self.b.weight = nn.Parameter(self.a.weight[:, :32].detach().clone())
        self.c = nn.Linear(32, 32)
        self.c.weight = self.b.weight
        self.unused, self.head, self.drop = nn.Linear(3, 3), nn.Linear(32, 10), nn.Dropout(0.3)
        self.pool = nn.MaxPool2d(3, stride=1, padding=1)  # (overlapping windows)
        self.register_buffer("mask", torch.ones(10, dtype=torch.bool))

    def forward(self, x):
        h = self.pool(nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)).flatten(1)
        h = torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(h))))))
        return self.head(self.drop(h)).masked_fill(~self.mask, -1e9)


def test_one_devices_step_by_autograd_is_torch_funcs_grad_bit_for_bit():
    """Training rules 4 differentiate one device's step of a module by autograd instead of
    torch.func's grad, on a working copy of the module (or, for a module that cannot be copied,
    swapped in by functional_call): for this module (buffers updated in the forward, ties, an
    unused layer, keyed dropout) the gradients, the loss and the new buffers are the same, bit
    for bit."""
    from fedsim.training.losses import weighted_cross_entropy
    from fedsim.training.modules import ModuleModel

    torch.manual_seed(0)
    model = ModuleModel("counted", _Counted(), (1, 8, 8), 10, "test")
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    weight, numbers = torch.rand(16, generator=g), model.randomness(0, 1, torch.tensor([3]), 0, 16)[0]
    results = []
    for rules, copied in ((3, None), (4, True), (4, False)):  # rules 4 on a working copy, or swapped in
        model.rules = rules
        if copied is False:
            model.module.lock = threading.Lock()  # (a module that cannot be deep-copied)
            model._working.clear()
        state = model.init(0)
        grads, loss = model.step_fn(weighted_cross_entropy, batched=False)(model.split(state), x, y, weight, numbers)
        assert copied is None or (model._working[threading.get_ident()] is not None) == copied
        results.append((grads, loss, state))
    (old, old_loss, old_state), *later = results
    for new, new_loss, new_state in later:
        assert not torch.equal(new_state, model.init(0))  # the running statistics moved
        assert torch.equal(old_state, new_state) and torch.equal(old_loss, new_loss)
        assert len(old) == len(new) == model.n_trainable and all(torch.equal(a, b) for a, b in zip(old, new))
        assert not new[model.names.index("unused.weight")].any()  # (an unused parameter's gradient: zeros)


class _GainHook(nn.Module):
    """A forward hook that is a closure over the module: it reads the module's own gain."""

    def __init__(self):
        super().__init__()
        self.fc, self.gain = nn.Linear(64, 10), nn.Parameter(torch.tensor(2.0))
        self.fc.register_forward_hook(lambda layer, inputs, out: out * self.gain)

    def forward(self, x):
        return self.fc(x.flatten(1))


def test_a_module_whose_hook_is_a_closure_steps_with_the_devices_state_on_the_loop():
    """A working copy's closures would read the module itself (its initial gain): such a module
    steps on the loop by functional_call, with the device's gain, as torch.func's step does."""
    from fedsim.training.losses import weighted_cross_entropy
    from fedsim.training.modules import ModuleModel

    model = ModuleModel("gain", _GainHook(), (1, 8, 8), 10, "test")
    g = torch.Generator().manual_seed(1)
    x, y, weight = torch.rand(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g), torch.full((8,), 0.125)
    state = model.init(0)
    state[model.names.index("gain")] = 3.0  # the device's gain, not the module's 2.0
    results = []
    for rules in (3, 4):
        model.rules = rules
        grads, loss = model.step_fn(weighted_cross_entropy, batched=False)(model.split(state), x, y, weight,
                                                                          torch.empty(0))
        results.append((grads, loss))
    assert model._working[threading.get_ident()] is None
    (old, old_loss), (new, new_loss) = results
    assert torch.equal(old_loss, new_loss) and all(torch.equal(a, b) for a, b in zip(old, new))


def test_auto_loops_over_a_module_whose_op_vmap_runs_device_by_device_under_rules_5(cli_run, user_models):
    """torch's CPU LSTM has no batching rule in torch.func.vmap, which then runs it device by
    device behind the cohort's call (a 2-layer LSTM's round 2.4x a plain loop's): `auto` trains
    such a module on the loop from training rules 5, and the manifest names the op and the code
    of the loop's step; rules 4 kept the batched call."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.results.report import trainer_line
    from fedsim.training import build_task, build_trainer

    run_dir = cli_run({**BASE, "client": {**BASE["client"], "trainer": "auto"}, "model": {"name": "user_nets:lstm"}},
                      name="lstm-auto")
    trainer = json.loads((run_dir / "manifest.json").read_text())["trainer"]
    assert trainer["path"] == "loop", trainer
    # the loop's step is autograd through a copy of the module (torch.func is the batched call's)
    assert trainer["code"] == "torch's autograd"
    assert re.match(r"loop on 1 thread with torch's autograd, \d+ of \d+ calls \(auto: ", trainer_line(trainer))
    assert re.search(r"^auto: aten::\S+ has no batching rule in torch.func.vmap, which runs it device by device: a "
                     r"loop of devices is faster on a CPU", trainer["why"]), trainer["why"]
    paths = {}
    for rules in (4, 5):
        task = build_task(DataConfig(dataset="digits", clients=6), ModelConfig(name="user_nets:lstm"), seed=0,
                          device=torch.device("cpu"), rules=rules)
        paths[rules] = build_trainer(task, ClientConfig(batch_size=4, local_steps=1), seed=0).choice(np.arange(3))[0]
    assert paths[4].path == "batched" and paths[5].path == "loop"


def test_auto_loops_over_a_modules_convolutions_on_images_of_16x16_or_more_under_rules_4():
    """On a CPU a module's convolutions under vmap are one grouped convolution, slower than a loop
    of them on 28x28 images (faster on 8x8 ones): `auto` takes the loop there from training rules
    4, and says why in the manifest's words; rules 3 kept the batched call."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.config.catalog import MODELS
    from fedsim.data.datasets import Dataset
    from fedsim.training import build_trainer
    from fedsim.training.task import classification_task

    def net(in_shape, n_classes, cfg):
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * in_shape[1] * in_shape[2], n_classes))

    MODELS.register("bn-conv", net)
    try:
        paths = {}
        for side, rules in ((28, 4), (28, 3), (8, 4)):
            x = np.random.default_rng(0).integers(0, 256, size=(60, 1, side, side), dtype=np.uint8)
            data = Dataset("images", x, np.arange(60) % 10, x[:10], np.arange(10), 10, scale=1 / 255)
            task = classification_task(data, DataConfig(dataset="images", clients=6), ModelConfig(name="bn-conv"),
                                       seed=0, device=torch.device("cpu"), rules=rules)
            trainer = build_trainer(task, ClientConfig(batch_size=4, local_steps=1), seed=0)
            paths[side, rules] = trainer.choice(np.arange(3))
    finally:
        del MODELS["bn-conv"]
    assert paths[28, 4][0].path == "loop" and paths[28, 4][1] == (
        "auto: convolutions on torch.func on a CPU, where a loop of them is faster than one grouped convolution")
    assert paths[28, 3][0].path == paths[8, 4][0].path == "batched"


def test_auto_batches_a_module_whose_convolutions_are_a_small_share_under_rules_6():
    """A vision transformer's patch embedding is a convolution over 16x16 images, but a small
    share of its forward's multiply-adds (the past run's PatchNet: 9 %; bench_modules' ViT: 7 %):
    from training rules 6 `auto` trains it batched (0.61-0.75x a plain loop's round, 0.81-1.01x on
    the loop), while a CNN (convolutions 86-99 %) stays on the loop; rules 5 looped over both."""
    import runpy

    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.config.catalog import MODELS
    from fedsim.data.datasets import Dataset
    from fedsim.training import build_trainer
    from fedsim.training.task import classification_task

    def cnn(in_shape, n_classes, cfg):
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.MaxPool2d(4),
                             nn.Flatten(), nn.Linear(8 * 4 * 4, n_classes))

    # the module of the past rules-5 run that tests/test_past_runs.py resumes
    MODELS.register("patch-net", runpy.run_path(str(Path(__file__).parent / "past_module_runs" / "1c5672e" /
                                                    "vitnet.py"))["make"])
    MODELS.register("gn-conv", cnn)
    x = np.random.default_rng(0).integers(0, 256, size=(60, 1, 16, 16), dtype=np.uint8)
    data = Dataset("images", x, np.arange(60) % 10, x[:10], np.arange(10), 10, scale=1 / 255)
    try:
        paths, shares = {}, {}
        for name, rules in (("patch-net", 5), ("patch-net", 6), ("gn-conv", 6)):
            task = classification_task(data, DataConfig(dataset="images", clients=6), ModelConfig(name=name),
                                       seed=0, device=torch.device("cpu"), rules=rules)
            paths[name, rules] = build_trainer(task, ClientConfig(batch_size=4, local_steps=1), seed=0).choice(
                np.arange(3))[0].path
            shares[name] = task.model._convolution_share, task.model.flops
    finally:
        del MODELS["patch-net"], MODELS["gn-conv"]
    # by hand: the convolutions' multiply-adds a sample, 16 patches x 16 channels x 4 x 4 and 16 x 16 x 8 x 9
    assert shares["patch-net"][0] * shares["patch-net"][1] == pytest.approx(16 * 16 * 16, rel=1e-12)
    assert shares["gn-conv"][0] * shares["gn-conv"][1] == pytest.approx(16 * 16 * 8 * 9, rel=1e-12)
    assert shares["patch-net"][0] < 0.5 < shares["gn-conv"][0]
    assert paths["patch-net", 5] == "loop" and paths["patch-net", 6] == "batched" and paths["gn-conv", 6] == "loop"


def test_auto_loops_over_parameters_no_cache_keeps_and_cuts_batched_calls_to_fit_under_rules_7(monkeypatch):
    """On a CPU a batched step reads and writes every device's weights: from training rules 7
    `auto` trains a model of more than 2^18 parameters a device on the loop (a dense layer
    784 x 400, fedsim's kernels or torch.func alike), and a batched call takes at most 2^20
    floats of parameters (a GELU MLP of 159,010: 6 devices a call), with the same numbers as
    one call; rules 6 batched both in one call."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.config.catalog import MODELS
    from fedsim.data.datasets import Dataset
    from fedsim.training import build_trainer
    from fedsim.training.task import classification_task
    from fedsim.training import cohort
    from fedsim.training.threads import ThreadPolicy

    class Wide(nn.Module):  # (a forward fedsim has no kernels for: through torch.func)
        def __init__(self, n_classes):
            super().__init__()
            self.hidden, self.fc = nn.Linear(784, 400), nn.Linear(400, n_classes)

        def forward(self, x):
            return self.fc(torch.cos(self.hidden(x.flatten(1))))

    MODELS.register("wide-kernels", lambda s, n, c: nn.Sequential(nn.Flatten(), nn.Linear(784, 400), nn.ReLU(),
                                                                  nn.Linear(400, n)))
    MODELS.register("wide-module", lambda s, n, c: Wide(n))
    MODELS.register("gelu-mlp", lambda s, n, c: nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.GELU(),
                                                              nn.Linear(200, n)))
    x = np.random.default_rng(0).integers(0, 256, size=(120, 1, 28, 28), dtype=np.uint8)
    data = Dataset("images", x, np.arange(120) % 10, x[:10], np.arange(10), 10, scale=1 / 255)
    client = ClientConfig(batch_size=4, local_steps=2)
    try:
        trainers = {}
        for name, rules in (("wide-kernels", 7), ("wide-module", 7), ("wide-kernels", 6), ("gelu-mlp", 7),
                            ("gelu-mlp", 6)):
            task = classification_task(data, DataConfig(dataset="images", clients=40), ModelConfig(name=name),
                                       seed=0, device=torch.device("cpu"), rules=rules)
            trainers[name, rules] = build_trainer(task, client, seed=0, threads=ThreadPolicy(1, rules=rules))
    finally:
        del MODELS["wide-kernels"], MODELS["wide-module"], MODELS["gelu-mlp"]
    ids = np.arange(30)
    for name in ("wide-kernels", "wide-module"):
        path, why = trainers[name, 7].choice(ids)
        assert path.path == "loop" and why == ("auto: 318,010 parameters a device, more than a CPU's cache keeps "
                                               "for a cohort's step")
    assert trainers["wide-kernels", 6].choice(ids)[0].path == "batched"
    new, old = (trainers["gelu-mlp", r].choice(ids)[0] for r in (7, 6))
    assert new.path == old.path == "batched" and new.task.dim == 159_010
    assert new.devices_per_call(ids) == 2**20 // 159_010 == 6 and old.devices_per_call(ids) == 30
    start = new.task.init_params()[None].expand(len(ids), -1).contiguous()
    steps, lr = np.full(len(ids), 2), torch.full((len(ids),), 0.1)
    cut = new.train(0, ids, start, steps, lr)
    monkeypatch.setattr(cohort, "CPU_CALL_PARAMETERS", 2**40)
    assert new.devices_per_call(ids) == 30
    whole = new.train(0, ids, start, steps, lr)
    assert torch.equal(cut.deltas, whole.deltas) and cut.deltas.abs().max() > 0


def auto_choices(factories: dict, cases: list[tuple[str, int, float]]) -> dict:
    """`auto`'s (path, why) for 10 devices of each (model, training rules, local epochs) in
    `cases`, its models registered from `factories` for the call, on 120 Fashion-MNIST-shaped
    images."""
    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.config.catalog import MODELS
    from fedsim.data.datasets import Dataset
    from fedsim.training import build_trainer
    from fedsim.training.task import classification_task
    from fedsim.training.threads import ThreadPolicy

    x = np.random.default_rng(0).integers(0, 256, size=(120, 1, 28, 28), dtype=np.uint8)
    data = Dataset("images", x, np.arange(120) % 10, x[:10], np.arange(10), 10, scale=1 / 255)
    for name, factory in factories.items():
        MODELS.register(name, factory)
    try:
        choices = {}
        for name, rules, epochs in cases:
            task = classification_task(data, DataConfig(dataset="images", clients=40), ModelConfig(name=name),
                                       seed=0, device=torch.device("cpu"), rules=rules)
            client = ClientConfig(batch_size=4, local_steps=2, local_epochs=epochs)
            trainer = build_trainer(task, client, seed=0, threads=ThreadPolicy(1, rules=rules))
            choices[name, rules, epochs] = trainer.choice(np.arange(10))
    finally:
        for name in factories:
            del MODELS[name]
    return choices


def dense(hidden: int, activation: type[nn.Module]):
    """A factory of an MLP 784-hidden-classes with `activation` between."""
    return lambda s, n, c: nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), activation(), nn.Linear(hidden, n))


def test_auto_loops_over_a_torch_func_module_of_more_than_2_16_parameters_under_rules_8():
    """vmap's cohort step of a module fedsim has no kernels for is slower on a CPU than a loop of
    plain steps from about 10^5 parameters (an MLP with a residual block, 118 k: 1.3-2.2x a plain
    loop's round): from training rules 8 `auto` takes the loop above 2^16 parameters a device,
    for such a module only (on fedsim's kernels an MLP of that size stays batched)."""
    paths = auto_choices({"softsign-128": dense(128, nn.Softsign), "softsign-64": dense(64, nn.Softsign),
                          "relu-128": dense(128, nn.ReLU)},  # (softsign has no kernel: torch.func)
                         [("softsign-128", 8, 0.0), ("softsign-128", 7, 0.0), ("softsign-64", 8, 0.0),
                          ("relu-128", 8, 0.0)])
    path, why = paths["softsign-128", 8, 0.0]
    assert path.path == "loop" and why == ("auto: 101,770 parameters a device through torch.func, whose cohort "
                                           "step is slower there than a loop of plain steps")
    others = (("softsign-128", 7, 0.0), ("softsign-64", 8, 0.0), ("relu-128", 8, 0.0))
    assert [paths[key][0].path for key in others] == ["batched"] * 3
    assert paths["relu-128", 8, 0.0][0].task.model.code == "fedsim's kernels"


class ResidualDense(nn.Module):
    """784 -> hidden, a residual block of `hidden` (`h + relu(fc(h))`), the head."""

    def __init__(self, hidden: int, n: int):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(784, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, n)

    def forward(self, x):
        h = F.relu(self.a(x.flatten(1)))
        return self.c(h + F.relu(self.b(h)))


def test_auto_loops_over_kernels_without_a_closed_form_of_more_than_2_16_parameters_under_rules_9():
    """From training rules 9 a residual block has kernels; a cohort's step of such a network is
    reverse mode (no closed form), slower on a CPU than a loop of steps from about 10^5
    parameters (118 k: 1.02-1.28x a plain loop's round batched, 0.81-0.97x on the loop): `auto`
    takes the loop above 2^16 parameters a device, as rules 8 do for torch.func (under which the
    same class trains under rules 8); an MLP ending in a log softmax too; a smaller one stays
    batched, and a plain MLP keeps its closed form."""
    paths = auto_choices({"residual-128": lambda s, n, c: ResidualDense(128, n),
                          "residual-64": lambda s, n, c: ResidualDense(64, n),
                          "log-softmax-128": lambda s, n, c: nn.Sequential(*dense(128, nn.ReLU)(s, n, c),
                                                                            nn.LogSoftmax(1)),
                          "relu-128": dense(128, nn.ReLU)},
                         [("residual-128", 9, 0.0), ("residual-128", 8, 0.0), ("residual-64", 9, 0.0),
                          ("log-softmax-128", 9, 0.0), ("log-softmax-128", 8, 0.0), ("relu-128", 9, 0.0)])
    path, why = paths["residual-128", 9, 0.0]
    assert path.path == "loop" and path.task.model.code == "fedsim's kernels"
    assert why == ("auto: 118,282 parameters a device whose cohort step is reverse mode (no closed form), slower "
                   "there than a loop of steps")
    old, why_old = paths["residual-128", 8, 0.0]
    assert old.path == "loop" and old.task.model.code == "torch.func" and "through torch.func" in why_old
    assert paths["log-softmax-128", 9, 0.0][0].path == "loop"
    others = (("residual-64", 9, 0.0), ("log-softmax-128", 8, 0.0), ("relu-128", 9, 0.0))
    assert [paths[key][0].path for key in others] == ["batched"] * 3
    assert paths["residual-64", 9, 0.0][0].task.model.code == "fedsim's kernels"


def test_a_batch_norm_mlp_trains_on_the_kernels_on_the_loop_under_rules_10():
    """From training rules 10 BatchNorm has kernels: an MLP with BatchNorm1d (159 k parameters)
    trains on them, and on a CPU on the loop (its cohort step is reverse mode, rules 9's rule),
    where rules 9 took torch.func; a small one stays batched."""
    def bn(hidden):
        return lambda s, n, c: nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                             nn.Linear(hidden, n))

    paths = auto_choices({"bn-200": bn(200), "bn-32": bn(32)}, [("bn-200", 10, 0.0), ("bn-200", 9, 0.0),
                                                                ("bn-32", 10, 0.0)])
    path, why = paths["bn-200", 10, 0.0]
    assert path.path == "loop" and path.task.model.code == "fedsim's kernels" and path.task.dim == 159_410 + 401
    assert why == ("auto: 159,410 parameters a device whose cohort step is reverse mode (no closed form), slower "
                   "there than a loop of steps")
    assert paths["bn-200", 9, 0.0][0].task.model.code == "torch.func"
    small = paths["bn-32", 10, 0.0][0]
    assert small.path == "batched" and small.task.model.code == "fedsim's kernels"


def test_auto_loops_over_local_epochs_of_a_model_of_more_than_2_17_parameters_under_rules_8():
    """Under local epochs devices of unequal data take unequal steps, and a cohort's call steps
    each as long as its longest: from training rules 8 `auto` takes the loop on a CPU for a model
    of more than 2^17 parameters a device there (a GELU MLP of 159 k on fedsim's kernels), not
    for local steps, not under rules 7, not for a smaller model."""
    paths = auto_choices({"gelu-200": dense(200, nn.GELU), "gelu-128": dense(128, nn.GELU)},
                         [("gelu-200", 8, 1.0), ("gelu-200", 8, 0.0), ("gelu-200", 7, 1.0), ("gelu-128", 8, 1.0)])
    path, why = paths["gelu-200", 8, 1.0]
    assert path.path == "loop" and why == ("auto: 159,010 parameters a device under local epochs, whose devices of "
                                           "unequal data a cohort's call steps as long as its longest")
    assert path.task.model.code == "fedsim's kernels"
    others = (("gelu-200", 8, 0.0), ("gelu-200", 7, 1.0), ("gelu-128", 8, 1.0))
    assert [paths[key][0].path for key in others] == ["batched"] * 3


def test_a_studys_points_on_the_loop_train_side_by_side_and_equal_their_runs_alone(cli_run, user_models, tmp_path):
    """Cohorts that cannot share a batched call (here the loop trainer's) train in one-thread
    parts side by side on the cores, not one after another on one: each point equals its
    `fedsim run` bit for bit, and its manifest says how it trained."""
    from fedsim.config import dump_toml

    client = {**BASE["client"], "trainer": "loop"}
    model = {"name": "user_nets:wide_conv"}
    study = {**BASE, "run": {**BASE["run"], "name": "side", "out": str(tmp_path / "runs"), "progress": False},
             "client": client, "model": model, "sweep": {"run.seed": [0, 1]}}
    (tmp_path / "side.toml").write_text(dump_toml(study))
    assert main(["sweep", "side.toml", "--quiet"]) == 0
    for seed in (0, 1):
        point = tmp_path / "runs" / "side" / f"seed-{seed}"
        alone = cli_run({**BASE, "run": {**BASE["run"], "seed": seed}, "client": client, "model": model},
                        name=f"alone-{seed}")
        a, b = torch.load(point / "model.pt"), torch.load(alone / "model.pt")
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), seed
        assert pl.read_parquet(point / "rounds.parquet").drop("wall_s").equals(
            pl.read_parquet(alone / "rounds.parquet").drop("wall_s"))
        why = json.loads((point / "manifest.json").read_text())["trainer"]["why"]
        if torch.get_num_threads() >= 2:  # (a machine of one core has nothing to train side by side on)
            assert "; with 1 other run(s) of the study in 2 one-thread parts side by side;" in why, why


def test_a_studys_cohorts_larger_than_a_cpu_call_train_as_their_runs_alone(cli_run, user_models, tmp_path):
    """Training rules 7 cut a CPU's batched call at 2^20 floats of parameters: a study whose
    cohorts are each larger than a call (10 devices of 155,658 parameters, 6 a call) trains
    each run's cohort in calls of its own, and every point equals its `fedsim run` bit for bit
    (a cohort over the room started an empty group that failed: IndexError in the study)."""
    from fedsim.config import dump_toml

    base = {**BASE, "data": {"dataset": "digits", "clients": 12}, "server": {"timing": "ideal", "clients_per_round": 10},
            "model": {"name": "user_nets:wide_gelu"}}
    study = {**base, "run": {**BASE["run"], "name": "wide", "out": str(tmp_path / "runs"), "progress": False},
             "sweep": {"algorithm.name": ["fedavg", "mifa"]}}
    (tmp_path / "wide.toml").write_text(dump_toml(study))
    assert main(["sweep", "wide.toml", "--quiet"]) == 0
    for name in ("fedavg", "mifa"):
        point = tmp_path / "runs" / "wide" / f"algorithm-{name}"
        alone = cli_run({**base, "algorithm": {"name": name}}, name=f"alone-{name}")
        a, b = torch.load(point / "model.pt"), torch.load(alone / "model.pt")
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), name
        assert pl.read_parquet(point / "rounds.parquet").drop("wall_s").equals(
            pl.read_parquet(alone / "rounds.parquet").drop("wall_s"))
        assert json.loads((point / "manifest.json").read_text())["trainer"]["code"] == "fedsim's kernels"


@pytest.mark.parametrize("model", ["lstm", "user_nets:resnet", "user_nets:uncopyable"])
def test_a_loop_cohort_in_parts_side_by_side_equals_one_device_after_another(cli_run, user_models, monkeypatch,
                                                                            model):
    """The loop trainer's devices in one-thread parts side by side (the thread rule's crossover
    and the least step of a module in parts set to 0 here, so that these small steps are cut
    too): fedsim's kernels through autograd (the built-in LSTM), a module on working copies and
    one without (its state swapped into the module itself, one part at a time): model.pt and the
    rounds bit for bit those of `[run] threads = 1`, which trains one device after another. A
    module's steps of fewer than 2^24 multiply-adds stay in one part (their Python holds the GIL
    between small kernels: two parts wait for each other)."""
    from fedsim.training import loop, threads

    if torch.get_num_threads() < 2:
        pytest.skip("one core: no parts to train side by side")
    monkeypatch.setattr(threads, "CROSSOVER_FLOPS", 0.0)
    least = loop.MODULE_PART_FLOPS
    monkeypatch.setattr(loop, "MODULE_PART_FLOPS", 0.0)
    config = {**BASE, "client": {**BASE["client"], "trainer": "loop"}, "model": {"name": model}}
    one = cli_run({**config, "run": {**BASE["run"], "threads": 1}}, name="one")
    parts = cli_run(config, name="parts")
    a, b = torch.load(one / "model.pt"), torch.load(parts / "model.pt")
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert pl.read_parquet(one / "rounds.parquet").drop("wall_s").equals(
        pl.read_parquet(parts / "rounds.parquet").drop("wall_s"))
    why = json.loads((parts / "manifest.json").read_text())["trainer"]["why"]
    n = min(4, torch.get_num_threads())
    assert why.endswith(f" devices' calls together reach the 22.5 M crossover: {n} one-thread parts side by side, "
                        f"{n} cores in all"), why
    assert main(["report", str(parts)]) == 0  # its headline says the parts, not "on 1 thread"
    assert f"trainer: fedavg: loop in {n} one-thread parts side by side with " in cli_run.capsys.readouterr().out
    assert "parts" not in json.loads((one / "manifest.json").read_text())["trainer"]["why"]
    if model.startswith("user_nets"):
        monkeypatch.setattr(loop, "MODULE_PART_FLOPS", least)
        whole = cli_run(config, name="whole")
        assert "parts" not in json.loads((whole / "manifest.json").read_text())["trainer"]["why"]
        assert pl.read_parquet(whole / "rounds.parquet").drop("wall_s").equals(
            pl.read_parquet(parts / "rounds.parquet").drop("wall_s"))
