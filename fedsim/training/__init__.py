"""Training: tasks (data + partition + model on the run's device) and cohort trainers."""

from __future__ import annotations

import torch

from fedsim.config.catalog import TRAINERS
from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.data.datasets import load_dataset
from fedsim.errors import FedsimError
from fedsim.training.quadratic import QuadraticTask
from fedsim.training.task import Task, classification_task
from fedsim.training.threads import ThreadPolicy
from fedsim.training.trainer import Trainer, TrainResult


def build_task(data: DataConfig, model: ModelConfig, *, seed: int, device: torch.device) -> Task:
    """The task of `[data]` and `[model]`, with everything on `device`."""
    if data.dataset == "quadratic":
        return QuadraticTask(data, model, seed=seed, device=device)
    return classification_task(load_dataset(data, seed), data, model, seed=seed, device=device)


def model_summary(data: DataConfig, model: ModelConfig, *, seed: int) -> str:
    """The model's size and the training cost the device clock uses (`fedsim config show`)."""
    task = build_task(data, model, seed=seed, device=torch.device("cpu"))
    given = " (as [model] train_flops_per_sample says)" if model.train_flops_per_sample else ""
    return (f"{task.dim:,} parameters sent and averaged, {task.train_flops_per_sample():,.0f} training "
            f"FLOPs per sample{given}")


def build_trainer(task: Task, client: ClientConfig, *, seed: int, threads: ThreadPolicy | None = None) -> Trainer:
    """The trainer path named by `[client] trainer` (auto | batched | loop)."""
    trainer_class = TRAINERS.lookup(client.trainer, "[client] trainer")
    if client.batch_size < 0:
        raise FedsimError(f"[client] batch_size = {client.batch_size} must be >= 0 (0 = full local data)")
    if task.device.type == "cuda":
        # float32 means float32 (as on the CPU and in the loop path; TF32 convolutions are
        # also the slower ones for a cohort's grouped convolutions), and a seed gives
        # the same run bit for bit (cuDNN's default backward kernels sum in a racy order)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return trainer_class(task, client, seed=seed, threads=threads)


__all__ = ["build_task", "build_trainer", "model_summary", "Task", "ThreadPolicy", "TrainResult", "Trainer"]
