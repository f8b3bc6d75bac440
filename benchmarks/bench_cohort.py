"""Training throughput: client-steps per second of each trainer path, by model and cohort size.

One call of `Trainer.train` trains a whole cohort (every device `steps` local SGD steps on
minibatches of 32) from the same model; client-steps/s = cohort x steps / seconds of the call.
The data are random 1x28x28 images (Fashion-MNIST's shape: the cost does not depend on the
pixels), 60 per client. Each number is the best of a few timed calls after a warm-up call, so
that other load on the machine disturbs it less. Prints a table; --json FILE writes the records.

    python benchmarks/bench_cohort.py [--quick] [--device all|cpu|cuda] [--json FILE]
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

from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.data.datasets import Dataset
from fedsim.training import build_trainer
from fedsim.training.task import classification_task

MODELS = ["logreg", "mlp", "lenet5", "cnn-fmnist"]
STEPS = {"logreg": 5, "mlp": 5, "lenet5": 2, "cnn-fmnist": 1}  # per call: keeps CNN calls short
TRAINERS = ["batched", "loop", "auto"]


def images_task(model: str, clients: int, device: torch.device):
    rng = np.random.default_rng(0)
    n = 60 * clients
    x = rng.integers(0, 256, size=(n, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=n)
    ds = Dataset("fmnist-shaped", x, y, x[:100], y[:100], 10, scale=1 / 255)
    return classification_task(ds, DataConfig(clients=clients), ModelConfig(name=model), seed=0, device=device)


def measure(model: str, clients: int, trainer_path: str, device: torch.device, budget_s: float) -> dict:
    task = images_task(model, clients, device)
    trainer = build_trainer(task, ClientConfig(batch_size=32, trainer=trainer_path), seed=0)
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
    while len(times) < 5 and sum(times) < budget_s:
        times.append(call(len(times) + 1))
    best = min(times)
    return {"model": model, "clients": clients, "trainer": trainer_path, "device": device.type,
            "client_steps_per_s": round(clients * STEPS[model] / best, 1),
            "client_samples_per_s": round(clients * STEPS[model] * 32 / best),
            "steps": STEPS[model], "batch_size": 32, "dim": task.dim, "call_s": round(best, 4)}


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
    args = parser.parse_args()
    models = args.models.split(",")
    cohorts = [100] if args.quick else [10, 100, 1000]
    devices = [torch.device("cpu")] if args.device in ("all", "cpu") else []
    if args.device in ("all", "cuda") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    print(f"machine: {machine()}")
    print(f"{'device':<6} {'model':<11} {'clients':>7} {'trainer':<8} {'client-steps/s':>14} {'call s':>8}")
    records = []
    for device in devices:
        for model in models:
            for clients in cohorts:
                for path in TRAINERS:
                    rec = measure(model, clients, path, device, budget_s=1.0 if args.quick else 3.0)
                    records.append(rec)
                    print(f"{rec['device']:<6} {model:<11} {clients:>7} {path:<8} "
                          f"{rec['client_steps_per_s']:>14.1f} {rec['call_s']:>8.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
