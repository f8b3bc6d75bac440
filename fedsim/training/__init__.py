"""Training: tasks (data + partition + model on the run's device) and cohort trainers."""

from __future__ import annotations

import numpy as np
import torch

from fedsim.config.catalog import TRAINERS
from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.data.clients import label_distribution
from fedsim.data.datasets import load_dataset
from fedsim.data.partition import partition
from fedsim.errors import FedsimError
from fedsim.training.quadratic import QuadraticTask
from fedsim.training.rules import CURRENT as CURRENT_RULES
from fedsim.training.task import Fits, Task, classification_task
from fedsim.training.threads import ThreadPolicy
from fedsim.training.trainer import Trainer, TrainResult


def build_task(data: DataConfig, model: ModelConfig, *, seed: int, device: torch.device,
               fits: Fits | None = None, rules: int = CURRENT_RULES) -> Task:
    """The task of `[data]` and `[model]`, with everything on `device`; `fits(sizes, dim)` is
    asked before the model is allocated (a quadratic task's is its targets' dimension)."""
    if data.dataset == "quadratic":
        if fits is not None:
            fits(np.ones(data.clients, dtype=np.int64), len(data.targets[0]) if data.targets else data.dim)
        return QuadraticTask(data, model, seed=seed, device=device)
    return classification_task(load_dataset(data, seed), data, model, seed=seed, device=device, fits=fits,
                               rules=rules)


def devices_of(data: DataConfig, *, seed: int) -> tuple[int, np.ndarray | None]:
    """The devices of `[data]` and their label distributions (None: the quadratic task has no
    labels), as the task has them, without building its model: what a run's trace needs."""
    if data.dataset == "quadratic":
        return data.clients, None
    dataset = load_dataset(data, seed)
    owner = dataset.owner_train if dataset.owner_train is not None else partition(dataset.y_train, data, seed)
    return data.clients, label_distribution(owner, dataset.y_train, data.clients, dataset.n_classes)


def model_summary(data: DataConfig, model: ModelConfig, *, seed: int) -> str:
    """The model's size and the training cost the device clock uses (`fedsim config show`)."""
    task = build_task(data, model, seed=seed, device=torch.device("cpu"))
    given = " (as [model] train_flops_per_sample says)" if model.train_flops_per_sample else ""
    model = getattr(task, "model", None)
    code = "" if model is None else f", trained on {model.code}" if model.code == model.loop_code else \
        f", trained on {model.code} (a cohort in one call) or {model.loop_code} (one device at a time)"
    return (f"{task.dim:,} parameters sent and averaged{code}, {task.train_flops_per_sample():,.0f} training "
            f"FLOPs per sample{given}")


def check_epochs(task: Task, client: ClientConfig) -> None:
    """BatchNorm cannot train on a minibatch of one sample (torch raises): refused before the
    run when an epoch of some device ends on one (its size leaves 1 over by the batch size)."""
    sizes, batch = task.data.sizes_np, client.batch_size
    lonely = np.flatnonzero(sizes % batch == 1) if batch > 1 else np.arange(len(sizes))
    if len(lonely):
        fits = next((b for b in range(batch + 1, batch + 1000) if not (sizes % b == 1).any()), None)
        fix = f"set batch_size = {fits} (no device then leaves one sample) or local_steps" if fits and (sizes > 1).all() \
            else "set local_steps instead"
        raise FedsimError(f"[client] local_epochs = {client.local_epochs:g}: device {lonely[0]} has {sizes[lonely[0]]} "
                          f"samples, so its epochs end on a minibatch of one sample (batch_size = {batch}), on which the "
                          f"module's BatchNorm cannot compute batch statistics; {fix}")


def build_trainer(task: Task, client: ClientConfig, *, seed: int, threads: ThreadPolicy | None = None,
                  deterministic: bool = True, tf32: bool = False) -> Trainer:
    """The trainer path named by `[client] trainer` (auto | batched | loop); on a GPU with the
    kernels `[run] deterministic` and `tf32` ask for (process-wide torch settings)."""
    trainer_class = TRAINERS.lookup(client.trainer, "[client] trainer")
    if client.batch_size < 0:
        raise FedsimError(f"[client] batch_size = {client.batch_size} must be >= 0 (0 = full local data)")
    if client.local_epochs and task.batch_statistics:
        check_epochs(task, client)
    elif task.batch_statistics and (client.batch_size or int(task.data.sizes_np.min())) == 1:
        task.model.check_trains_on(1)  # (a minibatch of one sample: before the run writes a file)
    if task.device.type == "cuda":
        # by default float32 means float32 (as on the CPU and in the loop path), and a seed
        # gives the same run bit for bit (cuDNN's fastest backward kernels sum in a racy order)
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cudnn.benchmark = not deterministic
        if client.compile and hasattr(task, "model"):
            task.model.fuse()
    return trainer_class(task, client, seed=seed, threads=threads)


__all__ = ["build_task", "build_trainer", "devices_of", "model_summary", "Task", "ThreadPolicy", "TrainResult", "Trainer"]
