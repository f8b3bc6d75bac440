"""Training throughput: client-steps per second of each trainer path, by model and cohort size.

One call of `Trainer.train` trains a whole cohort (every device `steps` local SGD steps on
minibatches of 32) from the same model; client-steps/s = cohort x steps / seconds of the call.
The data are random 1x28x28 images (Fashion-MNIST's shape: the cost does not depend on the
pixels; 3x32x32 for resnet18-gn; for char-lstm rows of 80 characters, Shakespeare's), 60 per client.

Besides the built-ins, `logreg-module`, `mlp-module` and `lenet5-module` are the same networks
written as ordinary nn.Modules (trained through torch.func: fedsim/training/modules.py), to
weigh the hand-batched layers against the module path; `transformer` is one
TransformerEncoderLayer (d=64, 4 heads, 28 tokens: the image's rows) with a linear read-in and
read-out. On CUDA the batched path replays its steps from CUDA graphs; `--trainers eager`
times it without them. Each number is the best of a few timed calls after a warm-up call, so
that other load on the machine disturbs it less. Prints a table; --json FILE writes the records.

    python benchmarks/bench_cohort.py [--quick] [--device all|cpu|cuda] [--json FILE]
        [--models a,b] [--cohorts 10,100] [--batch 32] [--trainers batched,loop,auto]
    # the GPU check of resnet18-gn (FLUTE's round: 10 clients, minibatches of 50):
    python benchmarks/bench_cohort.py --device cuda --models resnet18-gn --cohorts 10 --batch 50
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from torch import nn

from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.config.catalog import MODELS as REGISTRY
from fedsim.data.datasets import Dataset
from fedsim.training import build_trainer
from fedsim.training.task import classification_task

MODELS = ["logreg", "mlp", "lenet5", "cnn-fmnist"]
STEPS = {"logreg": 5, "mlp": 5, "lenet5": 2, "cnn-fmnist": 1, "resnet18-gn": 1, "transformer": 2,
         "char-lstm": 1}  # per call
TRAINERS = ["batched", "loop", "auto"]


def _logreg_module(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, n_classes))


def _mlp_module(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, n_classes))


def _lenet5_module(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                         nn.ReLU(), nn.Linear(84, n_classes))


class _RowTransformer(nn.Module):
    def __init__(self, n_classes: int, dim: int = 64):
        super().__init__()
        self.read_in = nn.Linear(28, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True)
        self.read_out = nn.Linear(dim, n_classes)

    def forward(self, x):
        return self.read_out(self.layer(self.read_in(x[:, 0])).mean(dim=1))


for name, factory in {"logreg-module": _logreg_module, "mlp-module": _mlp_module, "lenet5-module": _lenet5_module,
                      "transformer": lambda s, n, cfg: _RowTransformer(n)}.items():
    REGISTRY.register(name, factory)
    STEPS[name] = STEPS.get(name.removesuffix("-module"), 2)


def images_task(model: str, clients: int, device: torch.device):
    rng = np.random.default_rng(0)
    n = 60 * clients
    if model == "char-lstm":  # Shakespeare's shape: rows of 80 characters of a vocabulary of 80
        x, y = rng.integers(0, 80, size=(n, 80)), rng.integers(0, 80, size=n)
        ds = Dataset("shakespeare-shaped", x, y, x[:100], y[:100], 80, vocab_size=80,
                     vocabulary=tuple(chr(33 + i) for i in range(78)))
        return classification_task(ds, DataConfig(clients=clients), ModelConfig(name=model), seed=0, device=device)
    shape = (3, 32, 32) if model == "resnet18-gn" else (1, 28, 28)
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    y = rng.integers(0, 10, size=n)
    ds = Dataset("fmnist-shaped", x, y, x[:100], y[:100], 10, scale=1 / 255)
    return classification_task(ds, DataConfig(clients=clients), ModelConfig(name=model), seed=0, device=device)


def measure(model: str, clients: int, trainer_path: str, device: torch.device, budget_s: float,
            batch: int = 32) -> dict:
    task = images_task(model, clients, device)
    eager = trainer_path == "eager"  # the batched path without CUDA graphs
    trainer = build_trainer(task, ClientConfig(batch_size=batch, trainer="batched" if eager else trainer_path,
                                               cuda_graphs=not eager), seed=0)
    steps = np.full(clients, STEPS[model])
    start = task.init_params()[None].repeat(clients, 1)
    ids = np.arange(clients)

    def call(rnd: int) -> float:
        t0 = time.perf_counter()
        trainer.train(rnd, ids, start, steps, 0.05)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    call(0)  # warm-up: one-time costs (kernel selection, allocator growth) stay out
    times = [call(1)]
    while len(times) < 5 and sum(times) + times[0] < budget_s:
        times.append(call(len(times) + 1))
    best = min(times)
    return {"model": model, "clients": clients, "trainer": trainer_path, "device": device.type,
            "client_steps_per_s": round(clients * STEPS[model] / best, 1),
            "client_samples_per_s": round(clients * STEPS[model] * batch / best),
            "steps": STEPS[model], "batch_size": batch, "dim": task.dim, "call_s": round(best, 4)}


def machine() -> str:
    try:
        names = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
    except OSError:
        names = []
    cpu = f"{names[0] if names else platform.machine()} x {os.cpu_count()} cores"
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}{gpu}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="cohort of 100 only (< 3 min on a 2-core CPU)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", choices=["all", "cpu", "cuda"], default="all",
                        help="torch devices to measure (all: the CPU, and CUDA when present)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of the models")
    parser.add_argument("--cohorts", default="", help="comma-separated cohort sizes (default: 10,100,1000)")
    parser.add_argument("--batch", type=int, default=32, help="minibatch per client and step")
    parser.add_argument("--trainers", default=",".join(TRAINERS))
    parser.add_argument("--budget", type=float, default=0.0, help="seconds of timed calls per record")
    args = parser.parse_args()
    models = args.models.split(",")
    cohorts = [int(c) for c in args.cohorts.split(",")] if args.cohorts else [100] if args.quick else [10, 100, 1000]
    devices = [torch.device("cpu")] if args.device in ("all", "cpu") else []
    if args.device in ("all", "cuda") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    print(f"machine: {machine()}")
    print(f"{'device':<6} {'model':<13} {'clients':>7} {'trainer':<8} {'client-steps/s':>14} "
          f"{'client-samples/s':>16} {'call s':>8}")
    records = []
    for device in devices:
        for model in models:
            for clients in cohorts:
                for path in args.trainers.split(","):
                    rec = measure(model, clients, path, device, args.budget or (1.0 if args.quick else 3.0), args.batch)
                    records.append(rec)
                    print(f"{rec['device']:<6} {model:<13} {clients:>7} {path:<8} {rec['client_steps_per_s']:>14.1f} "
                          f"{rec['client_samples_per_s']:>16} {rec['call_s']:>8.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
