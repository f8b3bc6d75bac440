"""A fedsim round against a plain one-thread PyTorch loop doing the same local steps (issue 38).

For each model -- the built-ins (logreg, mlp, lenet5, cnn-fmnist) and models a user brings as
nn.Modules (an MLP, LeNet-5 as an nn.Sequential and as a class with its own forward, a small
GroupNorm ResNet, a 2-layer transformer encoder with dropout 0.1 reading digits' rows as 8
tokens, a 2-layer LSTM of 128 units reading them as 8 steps, a CNN with BatchNorm (local steps
only: local epochs end on one-sample minibatches, which fedsim refuses for BatchNorm) and with
GroupNorm, pytorch/examples' MNIST network, a small vision transformer on 7x7 patches of
Fashion-MNIST; wider dense models: a GELU MLP 784-200-10, a ReLU MLP 784-400-10, an 806 k-parameter
padded GELU network through torch.func, a convolution before a 2704 x 256 dense layer, an MLP with
LayerNorm and GELU, a tanh MLP 784-256-128-10, an MLP with ELUs (fedsim's kernels from training
rules 8), an MLP with a residual block (fedsim's kernels from rules 9), an MLP with BatchNorm
(local steps only; fedsim's kernels from rules 10)) -- two timings of one round's training, alternated
in one process (A B B A A B ..., after one warm-up round of one step per device):

* fedsim: one `Trainer.train` call on the cohort, built as `fedsim run` builds it (the task of
  `[data]` and `[model]`, `[client] trainer = "auto"` (or `--trainer`), `[run] threads =
  "auto"`, inside the run's thread scope); that call is all a round trains, so the round's training is timed
  without the run's startup, evaluation and files (the server's own bookkeeping is measured
  by bench_plane.py).
* plain: what a user would write on one thread (torch.set_num_threads(1), no vmap): for each
  device, load the global weights into a working copy of the module, take its local steps of
  torch.optim.SGD on its own minibatches, keep the delta.

Both train the same devices on the same data for the same steps: "steps" is 10 devices x 10
local steps x minibatches of 16 (drawn with replacement), "epochs" 20 devices of unequal data
(sizes spread +-50 %) x 2 local epochs of minibatches of 16 (each sample once an epoch).
Each row prints the medians and the spread (min-max) of a round's seconds and the ratio
fedsim / plain; `!` flags a ratio above 1.0 (the promise: <= 1.0x everywhere, <= 0.5x -- a 2x
cohort speedup -- at 10+ devices for the small models). `--busy N` runs N busy processes beside
it (a shared machine). The machine's load average is recorded before and after.

On a GPU (`--device cuda`) both sides train there: fedsim as a run on the GPU builds it, the plain
loop as a user would write it for a GPU (the module, its data and the minibatches' rows on the
device; each side's round timed to the GPU's last kernel). `--devices 10,100,1000` measures the
table at those cohort sizes (the datasets then have at least as many clients).

    python benchmarks/bench_modules.py [--quick] [--models a,b] [--settings steps,epochs]
        [--trainer auto|batched|loop] [--repeats 5] [--busy N] [--busy-kind spin|matmul]
        [--device cpu|cuda] [--devices N,N] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from bench_cohort import _lenet5_module, _logreg_module, _mlp_module, machine  # noqa: E402

from fedsim.config import ClientConfig, DataConfig, ModelConfig  # noqa: E402
from fedsim.config.catalog import MODELS as REGISTRY  # noqa: E402
from fedsim.data.datasets import Dataset, load_dataset  # noqa: E402
from fedsim.training import ThreadPolicy, build_trainer  # noqa: E402
from fedsim.training.task import classification_task  # noqa: E402

FMNIST = Path("/usr/share/datasets/fashion-mnist")
LR = 0.05


def _cnn_fmnist_module(in_shape, n_classes, cfg):
    """The built-in cnn-fmnist as a module: 5x5 convs of 32 and 32 channels, padding 2, a dense 128."""
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 32, 5, padding=2),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                         nn.Linear(128, n_classes))


class LeNet5(nn.Module):
    """LeNet-5 as a class with its own forward, as users usually write it (functional ReLUs and
    pools, `x.view(x.size(0), -1)`)."""

    def __init__(self, n_classes: int):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 6, 5, padding=2), nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.view(x.size(0), -1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class NormCNN(nn.Module):
    """Two 3x3 convolutions (16, 32 channels) with BatchNorm or GroupNorm, 2x2 pools: a
    convolutional module that stays on torch.func (its normalisation has no kernel)."""

    def __init__(self, n_classes: int, norm: str):
        super().__init__()
        make = (lambda c: nn.BatchNorm2d(c)) if norm == "batch" else (lambda c: nn.GroupNorm(4, c))
        self.conv1, self.norm1 = nn.Conv2d(1, 16, 3, padding=1), make(16)
        self.conv2, self.norm2 = nn.Conv2d(16, 32, 3, padding=1), make(32)
        self.fc = nn.Linear(32 * 7 * 7, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class ExamplesNet(nn.Module):
    """pytorch/examples' MNIST network (mnist/main.py): dropout on the pooled images, a 9216 x 128
    dense layer, log-probabilities out."""

    def __init__(self, n_classes: int):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


class _Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1, self.norm1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.GroupNorm(4, c)
        self.conv2, self.norm2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.GroupNorm(4, c)

    def forward(self, x):
        return torch.relu(x + self.norm2(self.conv2(torch.relu(self.norm1(self.conv1(x))))))


class GroupNormResNet(nn.Module):
    """A small residual network: a stem of 16 channels, two residual blocks with GroupNorm, pooled."""

    def __init__(self, channels: int, n_classes: int, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.GroupNorm(4, width),
                                  nn.ReLU())
        self.blocks = nn.Sequential(_Block(width), _Block(width))
        self.fc = nn.Linear(width, n_classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class RowTransformer(nn.Module):
    """Digits' 8 rows as 8 tokens: a linear read-in with learned positions, 2 encoder layers
    (d_model 32, 4 heads, dropout 0.1), mean-pooled."""

    def __init__(self, n_classes: int, dim: int = 32, layers: int = 2):
        super().__init__()
        self.read_in = nn.Linear(8, dim)
        self.position = nn.Parameter(torch.zeros(8, dim))
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True)
                                    for _ in range(layers))
        self.fc = nn.Linear(dim, n_classes)

    def forward(self, x):
        h = self.read_in(x[:, 0]) + self.position
        for layer in self.layers:
            h = layer(h)
        return self.fc(h.mean(dim=1))


class PatchTransformer(nn.Module):
    """A small vision transformer on 28x28 images: 7x7 patches (16 tokens) embedded by a strided
    convolution, a class token and learned positions, 2 pre-norm encoder layers (d_model 32, 4
    heads, GELU, dropout 0.1). Its convolution is 7 % of its forward's multiply-adds."""

    def __init__(self, n_classes: int, dim: int = 32, layers: int = 2, patch: int = 7):
        super().__init__()
        self.patch = nn.Conv2d(1, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.zeros(1, (28 // patch) ** 2 + 1, dim))
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, activation="gelu",
                                                               batch_first=True, norm_first=True)
                                    for _ in range(layers))
        self.norm, self.fc = nn.LayerNorm(dim), nn.Linear(dim, n_classes)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(len(h), -1, -1), h], dim=1) + self.position
        for layer in self.layers:
            h = layer(h)
        return self.fc(self.norm(h[:, 0]))


class RowLSTM(nn.Module):
    """Digits' 8 rows as 8 steps of 8 pixels through a 2-layer LSTM of 128 units."""

    def __init__(self, n_classes: int, hidden: int = 128):
        super().__init__()
        self.lstm = nn.LSTM(8, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.fc(self.lstm(x[:, 0])[0][:, -1])


class PaddedWide(nn.Module):
    """Grey images padded to 4 channels, a GELU, a wide dense layer (3136 -> 256, GELU) and the
    head: 806 k parameters through torch.func (the padding has no kernel)."""

    def __init__(self, n_classes: int):
        super().__init__()
        self.hidden, self.fc = nn.Linear(4 * 28 * 28, 256), nn.Linear(256, n_classes)

    def forward(self, x):
        x = F.gelu(F.pad(x, (0, 0, 0, 0, 0, 3)))
        return self.fc(F.gelu(self.hidden(x.flatten(1))))


class ResidualMLP(nn.Module):
    """A dense layer 784 -> 128, a residual block of 128 (`h + relu(fc(h))`) and the head: on
    fedsim's kernels from training rules 9 (through torch.func before)."""

    def __init__(self, n_classes: int):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 128), nn.Linear(128, 128), nn.Linear(128, n_classes)

    def forward(self, x):
        h = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(h + F.relu(self.fc2(h)))


def _elu_mlp(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ELU(), nn.Linear(200, n_classes))


def _batch_norm_mlp(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.BatchNorm1d(200), nn.ReLU(), nn.Linear(200, n_classes))


def _gelu_mlp(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.GELU(), nn.Linear(200, n_classes))


def _wide_mlp(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 400), nn.ReLU(), nn.Linear(400, n_classes))


def _layer_norm_mlp(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, n_classes))


def _tanh_mlp(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.Tanh(), nn.Linear(256, 128), nn.Tanh(),
                         nn.Linear(128, n_classes))


def _conv_wide(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.GELU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 256), nn.GELU(),
                         nn.Linear(256, n_classes))


@dataclass(frozen=True)
class Model:
    fedsim_name: str  # what [model] name says
    module: Callable[..., nn.Module]  # (in_shape, n_classes, cfg) -> the same network, for the plain loop
    dataset: str
    kind: str  # built-in | module
    settings: tuple[str, ...] = ("steps", "epochs")  # where it can train (BatchNorm: not on epochs' one-sample tails)


# user modules are registered under names of their own (a user would write "file:factory")
USER = {"user-mlp": _mlp_module, "user-lenet5": _lenet5_module, "user-lenet5-class": lambda s, n, cfg: LeNet5(n),
        "user-resnet-gn": lambda s, n, cfg: GroupNormResNet(s[0], n),
        "user-transformer": lambda s, n, cfg: RowTransformer(n),
        "user-bn-cnn": lambda s, n, cfg: NormCNN(n, "batch"), "user-gn-cnn": lambda s, n, cfg: NormCNN(n, "group"),
        "user-mnist-example": lambda s, n, cfg: ExamplesNet(n), "user-lstm": lambda s, n, cfg: RowLSTM(n),
        "user-vit": lambda s, n, cfg: PatchTransformer(n), "user-gelu-mlp": _gelu_mlp, "user-wide-mlp": _wide_mlp,
        "user-padded-wide": lambda s, n, cfg: PaddedWide(n), "user-conv-wide": _conv_wide,
        "user-layer-norm-mlp": _layer_norm_mlp, "user-tanh-mlp": _tanh_mlp,
        "user-residual-mlp": lambda s, n, cfg: ResidualMLP(n), "user-elu-mlp": _elu_mlp,
        "user-bn-mlp": _batch_norm_mlp}
for _name, _factory in USER.items():
    if _name not in REGISTRY:
        REGISTRY.register(_name, _factory)

MODELS = {
    "logreg": Model("logreg", _logreg_module, "fashion-mnist", "built-in"),
    "mlp": Model("mlp", _mlp_module, "fashion-mnist", "built-in"),
    "lenet5": Model("lenet5", _lenet5_module, "fashion-mnist", "built-in"),
    "cnn-fmnist": Model("cnn-fmnist", _cnn_fmnist_module, "fashion-mnist", "built-in"),
    "user-mlp": Model("user-mlp", _mlp_module, "fashion-mnist", "module"),
    "user-lenet5": Model("user-lenet5", _lenet5_module, "fashion-mnist", "module"),
    "user-lenet5-class": Model("user-lenet5-class", USER["user-lenet5-class"], "fashion-mnist", "module"),
    "user-resnet-gn": Model("user-resnet-gn", USER["user-resnet-gn"], "digits", "module"),
    "user-transformer": Model("user-transformer", USER["user-transformer"], "digits", "module"),
    "user-bn-cnn": Model("user-bn-cnn", USER["user-bn-cnn"], "fashion-mnist", "module", ("steps",)),
    "user-gn-cnn": Model("user-gn-cnn", USER["user-gn-cnn"], "fashion-mnist", "module"),
    "user-mnist-example": Model("user-mnist-example", USER["user-mnist-example"], "fashion-mnist", "module"),
    "user-lstm": Model("user-lstm", USER["user-lstm"], "digits", "module"),
    "user-vit": Model("user-vit", USER["user-vit"], "fashion-mnist", "module"),
    "user-gelu-mlp": Model("user-gelu-mlp", _gelu_mlp, "fashion-mnist", "module"),
    "user-wide-mlp": Model("user-wide-mlp", _wide_mlp, "fashion-mnist", "module"),
    "user-padded-wide": Model("user-padded-wide", USER["user-padded-wide"], "fashion-mnist", "module"),
    "user-conv-wide": Model("user-conv-wide", _conv_wide, "fashion-mnist", "module"),
    "user-layer-norm-mlp": Model("user-layer-norm-mlp", _layer_norm_mlp, "fashion-mnist", "module"),
    "user-tanh-mlp": Model("user-tanh-mlp", _tanh_mlp, "fashion-mnist", "module"),
    "user-residual-mlp": Model("user-residual-mlp", USER["user-residual-mlp"], "fashion-mnist", "module"),
    "user-elu-mlp": Model("user-elu-mlp", _elu_mlp, "fashion-mnist", "module"),
    "user-bn-mlp": Model("user-bn-mlp", _batch_norm_mlp, "fashion-mnist", "module", ("steps",)),
}


@dataclass(frozen=True)
class Setting:
    devices: int
    batch: int
    local_steps: int = 0  # every device this many steps ...
    local_epochs: int = 0  # ... or this many epochs of its own data

    def data(self, dataset: str) -> DataConfig:
        """Clients of ~600 (Fashion-MNIST) or ~67 (digits) samples, iid for local steps; of
        unequal sizes for local epochs (the one-class partition's normal sizes, spread 0.5,
        mean ~100 or ~67); at least one client per device of the cohort."""
        if self.local_epochs:
            return DataConfig(dataset=dataset, clients=max(600 if dataset == "fashion-mnist" else 20, self.devices),
                              partition="one-class", size_sigma=0.5)
        return DataConfig(dataset=dataset, clients=max(100 if dataset == "fashion-mnist" else 20, self.devices))


SETTINGS = {"steps": Setting(10, 16, local_steps=10), "epochs": Setting(20, 16, local_epochs=2)}
QUICK = {"steps": Setting(3, 8, local_steps=2), "epochs": Setting(3, 8, local_epochs=1)}


def dataset_of(data: DataConfig) -> Dataset:
    """The dataset; Fashion-MNIST-shaped random images (the cost does not depend on the pixels)
    where Fashion-MNIST is not installed."""
    if data.dataset != "fashion-mnist" or (FMNIST / "train-images-idx3-ubyte.gz").exists():
        return load_dataset(data, 0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(60_000, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=60_000)
    return Dataset("fmnist-shaped", x, y, x[:100], y[:100], 10, scale=1 / 255)


class Pair:
    """One model under one setting: the fedsim trainer and the plain loop on the same cohort."""

    def __init__(self, model: Model, setting: Setting, trainer: str = "auto", device: str = "cpu"):
        data = setting.data(model.dataset)
        dataset = dataset_of(data)
        self.dataset, self.device = dataset.name, torch.device(device)
        self.task = classification_task(dataset, data, ModelConfig(name=model.fedsim_name), seed=0,
                                        device=self.device)
        client = ClientConfig(batch_size=setting.batch, local_steps=setting.local_steps or 1,
                              local_epochs=setting.local_epochs, trainer=trainer)
        self.threads = ThreadPolicy("auto", self.device)
        self.trainer = build_trainer(self.task, client, seed=0, threads=self.threads)
        self.ids = np.sort(np.random.default_rng(0).choice(self.task.n_clients, setting.devices, replace=False))
        epoch_steps = self.trainer.epoch_steps()
        self.steps = epoch_steps[self.ids] if epoch_steps is not None else np.full(setting.devices, setting.local_steps)
        self.start = self.task.init_params()[None].expand(setting.devices, -1).contiguous()
        self.setting = setting
        # the plain loop's data: each device's samples as tensors of its own, prepared once
        d = self.task.data
        rows = [d.indices[d.starts[i]:d.starts[i] + d.sizes[i]] for i in self.ids]
        self.local = [(d.x[r], d.y[r]) for r in rows]
        self.net = model.module(tuple(d.shape), d.n_classes, ModelConfig(name=model.fedsim_name)).to(self.device)
        self.work = copy.deepcopy(self.net)  # each device trains this copy of the global model
        self.generator = torch.Generator().manual_seed(0)

    def fedsim_round(self, rnd: int, warm_up: bool = False) -> float:
        steps = np.minimum(self.steps, 1) if warm_up else self.steps
        with self.threads.scope():
            t0 = time.perf_counter()
            self.trainer.train(rnd, self.ids, self.start, steps, LR)
            self.synchronize()
            return time.perf_counter() - t0

    def synchronize(self) -> None:
        """Wait for the GPU's last kernel (a round's time is its kernels', not their launches')."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def plain_round(self, warm_up: bool = False) -> float:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            t0 = time.perf_counter()
            self._plain(warm_up)
            self.synchronize()
            return time.perf_counter() - t0
        finally:
            torch.set_num_threads(before)

    def _plain(self, warm_up: bool) -> torch.Tensor:
        """The user's loop: each device from the global weights, SGD on its minibatches, its delta."""
        glob = self.net.state_dict()
        flat = nn.utils.parameters_to_vector(self.net.parameters())
        batch, work, deltas = self.setting.batch, self.work, []
        work.train()
        for (x, y), steps in zip(self.local, self.steps):
            work.load_state_dict(glob)
            opt = torch.optim.SGD(work.parameters(), lr=LR)
            for idx in self._minibatches(len(y), int(steps), batch)[:1 if warm_up else None]:
                loss = F.cross_entropy(work(x[idx]), y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            deltas.append(nn.utils.parameters_to_vector(work.parameters()).detach() - flat)
        return torch.stack(deltas)

    def _minibatches(self, n: int, steps: int, batch: int) -> list[torch.Tensor]:
        """Local steps: `steps` minibatches drawn with replacement; local epochs: a shuffle an
        epoch, cut into minibatches (the last one smaller)."""
        if not self.setting.local_epochs:
            return list(torch.randint(n, (steps, batch), generator=self.generator).to(self.device))
        per_epoch = -(-n // batch)
        chunks = [c for _ in range(-(-steps // per_epoch))
                  for c in torch.randperm(n, generator=self.generator).to(self.device).split(batch)]
        return chunks[:steps]


def measure(name: str, setting_name: str, setting: Setting, repeats: int, trainer: str = "auto",
            device: str = "cpu") -> dict:
    pair = Pair(MODELS[name], setting, trainer, device)
    pair.fedsim_round(0, warm_up=True)
    pair.plain_round(warm_up=True)
    times: dict[str, list[float]] = {"fedsim": [], "plain": []}
    for r in range(repeats):  # A B B A A B ...: a drift of the machine's load hits both alike
        order = ("fedsim", "plain") if r % 2 == 0 else ("plain", "fedsim")
        for side in order:
            times[side].append(pair.fedsim_round(r + 1) if side == "fedsim" else pair.plain_round())
    summary = pair.trainer.summary()
    # (rounded as recorded, so that the flag agrees with the medians the record shows)
    fed, plain = round(statistics.median(times["fedsim"]), 4), round(statistics.median(times["plain"]), 4)
    return {"model": name, "kind": MODELS[name].kind, "dataset": pair.dataset,
            "setting": setting_name, "trainer": trainer, "device": device, "devices": setting.devices,
            "batch": setting.batch,
            "local_steps": setting.local_steps, "local_epochs": setting.local_epochs,
            "steps_per_round": int(pair.steps.sum()), "dim": pair.task.dim,
            "fedsim_path": summary["path"], "fedsim_threads": summary["threads"],
            "fedsim_s": [round(t, 4) for t in times["fedsim"]], "plain_s": [round(t, 4) for t in times["plain"]],
            "fedsim_median_s": fed, "plain_median_s": plain,
            "ratio": round(fed / plain, 3), "over_promise": fed > plain}


def busy_processes(n: int, kind: str) -> list[subprocess.Popen]:
    """N processes that keep a core busy: a pure Python spin or a one-thread torch matmul loop."""
    code = ("while True: pass" if kind == "spin" else
            "import torch\ntorch.set_num_threads(1)\na = torch.randn(256, 256)\nwhile True: a @ a")
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def row_text(rec: dict) -> str:
    spread = lambda xs: f"{min(xs):.3f}-{max(xs):.3f}"  # noqa: E731
    flag = "!" if rec["over_promise"] else ""
    return (f"{rec['model']:<17} {rec['setting']:<7} {rec['devices']:>4} {rec['steps_per_round']:>5} "
            f"{rec['fedsim_path'] or '':<8} {rec['fedsim_threads'] or '':>2} {rec['fedsim_median_s']:>8.3f} "
            f"{spread(rec['fedsim_s']):>13} {rec['plain_median_s']:>8.3f} {spread(rec['plain_s']):>13} "
            f"{rec['ratio']:>6.2f}x{flag}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny cohorts, one repeat (a smoke test)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    parser.add_argument("--settings", default=",".join(SETTINGS), help="steps, epochs or both")
    parser.add_argument("--repeats", type=int, default=0, help="timed rounds per side (default 5; --quick 1)")
    parser.add_argument("--trainer", choices=["auto", "batched", "loop"], default="auto",
                        help="fedsim's [client] trainer (default auto, what a run chooses)")
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the measurement")
    parser.add_argument("--busy-kind", choices=["spin", "matmul"], default="spin")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both sides train")
    parser.add_argument("--devices", default="", help="comma-separated cohort sizes (default: each setting's)")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    args = parser.parse_args(argv)
    models, settings = args.models.split(","), args.settings.split(",")
    table = QUICK if args.quick else SETTINGS
    for flag, names, known in [("models", models, MODELS), ("settings", settings, table)]:
        for name in names:
            if name not in known:
                parser.exit(2, f"error: --{flag}: unknown name '{name}'; choose from {', '.join(known)}\n")
    if args.repeats < 0:
        parser.exit(2, f"error: --repeats {args.repeats}: give a number of timed rounds >= 1 (0: the default)\n")
    repeats = args.repeats or (1 if args.quick else 5)
    try:
        sizes = [int(n) for n in args.devices.split(",")] if args.devices else []
    except ValueError:
        sizes = [0]
    if any(n < 1 for n in sizes):
        parser.exit(2, f"error: --devices {args.devices}: give cohort sizes >= 1, comma-separated (10,100,1000)\n")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "error: --device cuda: torch sees no GPU here; leave --device out to measure on the CPU\n")
    load_before = os.getloadavg()
    busy = busy_processes(args.busy, args.busy_kind)
    records: list[dict] = []
    result = {"machine": machine(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "trainer": args.trainer, "device": args.device, "busy": args.busy, "busy_kind": args.busy_kind, "repeats": repeats,
              "quick": args.quick,
              "loadavg_before": [round(x, 2) for x in load_before], "records": records}
    try:
        print(f"machine: {machine()}; busy processes: {args.busy} ({args.busy_kind}); "
              f"load before: {' '.join(f'{x:.2f}' for x in load_before)}")
        print(f"{'model':<17} {'setting':<7} {'dev':>4} {'steps':>5} {'path':<8} {'th':>2} {'fedsim s':>8} "
              f"{'fedsim spread':>13} {'plain s':>8} {'plain spread':>13} {'ratio':>7}")
        for setting_name in settings:
            base = table[setting_name]
            for setting in [dataclasses.replace(base, devices=n) for n in sizes] or [base]:
                for name in (m for m in models if setting_name in MODELS[m].settings):
                    rec = measure(name, setting_name, setting, repeats, args.trainer, args.device)
                    records.append(rec)
                    print(row_text(rec), flush=True)
                    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
                    if args.out:  # after every row: a long run stopped early keeps what it measured
                        args.out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    over = [f"{r['model']}/{r['setting']}" for r in records if r["over_promise"]]
    print(f"load after: {' '.join(f'{x:.2f}' for x in result['loadavg_after'])}; "
          f"fedsim slower than the plain loop (!): {', '.join(over) or 'none'}")
    return result


if __name__ == "__main__":
    main()
