"""What every trainer path shares: the call contract, the SGD update, the result.

A path (batched or loop) only decides how the per-device gradients of one local step are
computed; the update applied to them is this module's `sgd_update_` in both, so the two paths
differ by float rounding in the gradient and nothing else (from training rules 8 a module's
loop step is a plain PyTorch loop's instead: its mean loss and torch.optim.SGD's fused update).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedsim.config import ClientConfig
from fedsim.training.objective import PLAIN, LocalObjective
from fedsim.training.task import Task
from fedsim.training.threads import CROSSOVER_FLOPS, ThreadPolicy


@dataclass
class TrainResult:
    deltas: Tensor  # [k, d] end minus start parameters
    loss: Tensor  # [k] mean training loss over the steps taken (nan for 0 steps)
    samples: Tensor  # [k] int64 samples used
    # a cohort trained in one call with other runs' (a lockstep group): that call's result, whose
    # rows from `first_row` on are this one's, so that the runs' arrivals are gathered in one go
    call: TrainResult | None = None
    first_row: int = 0


def sgd_update_(ws: tuple[Tensor, ...], grads: tuple[Tensor, ...], starts: tuple[Tensor, ...],
                lr: Tensor, client: ClientConfig, objective: LocalObjective,
                linear: tuple[Tensor, ...] = (), fused_lr: float | None = None) -> None:
    """One SGD step, in place, of m devices' parameter tensors ws (each [m, ...]; one device's
    without that dimension where no term below is on); the loss gradients `grads` are overwritten.

    Order as in torch: the objective's proximal term (mu/2)||w - start||^2 and its
    per-device linear term <g_i, w> are part of the local loss (`starts` are read only when
    `objective.uses_start`; `linear` holds the m devices' rows of `objective.linear`, split
    like ws, empty when it is off), the per-device clipping (clip_grad_norm_, L2 over all
    tensors) acts on that loss gradient, weight decay is added by the optimizer after. Terms that are off are skipped, so that with
    all of them off a step is exactly w - lr * grad in float32. In place, on views of the
    flat parameters, because fresh [m, d] buffers every step cost more than the arithmetic
    on a CPU (page faults). `fused_lr` (one device's lr, the loop's from training rules 8): the
    step torch.optim.SGD takes, `w.add_(grad, alpha=-lr)`: one fused multiply-add, other roundings.
    """
    def per_device(v: Tensor, like: Tensor) -> Tensor:  # [m] -> [m, 1, ...] to broadcast
        return v.view(-1, *[1] * (like.dim() - 1))

    if objective.prox_mu:
        for g, w, s in zip(grads, ws, starts):
            g += objective.prox_mu * (w - s)
    for g, c in zip(grads, linear):
        g += c
    if client.clip > 0:
        norm = torch.stack([g.flatten(1).square().sum(dim=1) for g in grads]).sum(dim=0).sqrt()
        scale = (client.clip / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g *= per_device(scale, g)
    if client.weight_decay:
        for g, w in zip(grads, ws):
            g += client.weight_decay * w  # (its own product first, as torch's SGD adds it)
    # one fused call per operation over all tensors (as torch.optim.SGD's foreach step):
    # elementwise, so each number is what a loop over the tensors computes; `ws` may end with
    # buffers after the trained tensors (a module's running statistics): not stepped
    if fused_lr is not None:
        torch._foreach_add_(list(ws[:len(grads)]), grads, alpha=-fused_lr)
        return
    one = lr.numel() == 1 and lr.device.type == "cpu"  # the loop's device: lr as a number, the same products
    torch._foreach_mul_(grads, float(lr) if one else [per_device(lr, g) for g in grads])
    torch._foreach_sub_(list(ws[:len(grads)]), grads)


class Trainer:
    """Runs the local SGD of a cohort; subclasses implement `_run` (the path)."""

    path = ""
    parts = 1  # one-thread parts that the last call's devices trained in side by side (the loop's)

    def __init__(self, task: Task, client: ClientConfig, *, seed: int, threads: ThreadPolicy | None = None):
        self.task, self.client, self.seed = task, client, seed
        self.batch_size = client.batch_size
        self.threads = threads or ThreadPolicy(device=task.device)
        self.sizes = task.sizes.cpu().numpy()  # on the host: widths are decided without a device sync
        self.ran: Counter[tuple[str, int | None, int]] = Counter()  # training calls by (path, threads, parts)
        self.why: dict[tuple[str, int | None], str] = {}  # the latest reason of each

    def train(self, rnd: int, ids: np.ndarray, start: Tensor, steps: np.ndarray, lr: float | Tensor,
              objective: LocalObjective = PLAIN, company: str = "") -> TrainResult:
        """Local SGD of devices `ids` from `start` [k, d] for `steps` [k] steps at `lr` (scalar or
        [k]) on the task's loss plus the algorithm's `objective` terms. `company`: how it trained
        beside other runs of a study, for the manifest's reason."""
        task = self.task
        ids = np.asarray(ids, dtype=np.int64)
        steps = np.asarray(steps, dtype=np.int64)
        k = len(ids)
        if start.shape != (k, task.dim) or steps.shape != (k,) or (k and steps.min() < 0):
            raise ValueError(f"train: need start [{k}, {task.dim}] and steps [{k}] >= 0, "
                             f"got {tuple(start.shape)} and {steps.shape}")
        objective = objective.on(task.device)
        if objective.per_device and objective.linear.shape != (k, task.dim):
            raise ValueError(f"train: need the objective's linear term [{k}, {task.dim}], "
                             f"got {tuple(objective.linear.shape)}")
        lr_t = torch.as_tensor(lr, dtype=torch.float32, device=task.device).expand(k)
        start = start.to(task.device, torch.float32)
        if k == 0:
            return TrainResult(torch.zeros_like(start), lr_t.clone(), torch.zeros(0, dtype=torch.int64, device=task.device))
        kept = task.device_buffers
        if kept is not None:
            ids_t = torch.as_tensor(ids, device=task.device)
            start = kept.start(ids_t, start)
        flops = self.call_flops(ids) if self.threads.active else 0.0
        with self.threads.work(flops, task.func_steps):
            end, loss_sum = self._run(rnd, ids, start, steps, lr_t, objective)
        path, reason = self.choice(ids)
        threads, threads_why = self.threads.choice(flops, task.func_steps)
        if path.parts > 1:
            threads_why += (f"; the {k} devices' calls together reach the {CROSSOVER_FLOPS / 1e6:g} M crossover: "
                            f"{path.parts} one-thread parts side by side, {path.parts} cores in all")
        self.count(path.ran_as(), threads, threads_why, reason + company, path.parts)
        result = self.result(ids, end - start, loss_sum, steps)
        if kept is not None:
            kept.keep(ids_t, end, result.deltas)
        return result

    def choice(self, ids: np.ndarray) -> tuple["Trainer", str]:
        """The path that trains devices `ids`, and why (auto chooses; any other trainer is its own path)."""
        return self, f"[client] trainer = '{self.path}'"

    def path_for(self, ids: np.ndarray) -> "Trainer":
        return self.choice(ids)[0]

    def ran_as(self) -> str:
        """The name of this path as the manifest records it."""
        return self.path

    def count(self, path: str, threads: int | None, threads_why: str, why: str, parts: int = 1) -> None:
        """One training call of this run: on `path` (chosen for `why`) with `threads` torch threads
        (None on a GPU, chosen for `threads_why`), in `parts` one-thread parts side by side."""
        self.ran[path, threads, parts] += 1
        self.why[path, threads, parts] = f"{why}; {threads_why}"

    def summary(self) -> dict:
        """For the manifest: what trained this process's rounds (a resume counts its own part): the
        path and threads of most calls with why, every (path, threads) with its calls, and the
        code that computes that path's step (fedsim's kernels, torch.func, torch's autograd)."""
        calls = [{"path": path, "threads": threads, **({"parts": parts} if parts > 1 else {}), "calls": n,
                  "why": self.why[path, threads, parts]} for (path, threads, parts), n in self.ran.most_common()]
        main = calls[0] if calls else {"path": None, "threads": None, "why": None}
        model = getattr(self.task, "model", None)  # (the quadratic task has none)
        return {"setting": self.client.trainer, "chosen_by": "auto" if self.client.trainer == "auto" else "config",
                "path": main["path"], "threads": main["threads"], "why": main["why"], "calls": calls,
                "code": None if model is None else model.loop_code if main["path"] == "loop" else model.code}

    def result(self, ids: np.ndarray, deltas: Tensor, loss_sum: Tensor, steps: np.ndarray,
               samples: np.ndarray | None = None) -> TrainResult:
        """Deltas (end minus start), mean step loss and samples used of devices `ids` (`samples`:
        as `self.samples` gives them, where the caller has them already)."""
        device = self.task.device
        return TrainResult(deltas, loss_sum / torch.as_tensor(steps, device=device),
                           torch.as_tensor(self.samples(ids, steps) if samples is None else samples, device=device))

    def samples(self, ids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Training samples of each device's `steps` local steps (int64): steps x batch size, the
        full local data each step at batch size 0, and under `local_epochs` each sample once an
        epoch (an epoch's last minibatch is smaller)."""
        sizes = self.sizes[ids]
        if self.batch_size == 0:
            return steps * sizes
        if not self.client.local_epochs:
            return steps * self.batch_size
        per_epoch = np.maximum(-(-sizes // self.batch_size), 1)
        return steps // per_epoch * sizes + steps % per_epoch * self.batch_size

    def epoch_steps(self) -> np.ndarray | None:
        """Each device's local steps under `[client] local_epochs`: epochs x its ceil(n_i / batch
        size) minibatches an epoch, rounded up (None without: every device takes `local_steps`)."""
        if not self.client.local_epochs:
            return None
        per_epoch = -(-self.sizes[:-1] // self.batch_size)
        # rounded first: 0.1 x 30 is 3.0000000000000004 in floats, three steps, not four
        steps = np.ceil(np.round(self.client.local_epochs * per_epoch, 9))
        return np.maximum(steps, 1).astype(np.int64)

    def train_pooled(self, rnd: int, params: Tensor, steps: int, lr: float) -> Tensor:
        """`steps` plain SGD steps over the pooled data of all devices from params [d]; the delta [d]."""
        result = self.train(rnd, np.array([self.task.pooled]), params[None], np.array([steps]), lr)
        return result.deltas[0]

    def call_flops(self, ids: np.ndarray) -> float:
        """Multiply-adds of one local step of the devices that one gradient call holds."""
        return self.task.step_flops(self.batch_width(ids)) * self.devices_per_call(ids)

    distinct_rows = False  # whether this path computes a minibatch on the distinct samples drawn

    def batch_width(self, ids: np.ndarray) -> int:
        """Samples per device in one step: the batch size, or the largest local data set (full
        batches; also minibatches larger than every device's data on a path with
        `distinct_rows`, which weights each sample by its draws instead of repeating it)."""
        if self.client.local_epochs:  # an epoch's minibatch never holds more than the device's data
            return min(int(self.sizes[ids].max(initial=1)), self.batch_size)
        if self.batch_size and not (self.distinct_rows and self.task.distinct_rows()):
            return self.batch_size
        largest = int(self.sizes[ids].max(initial=0))
        return min(largest, self.batch_size) if self.batch_size else largest

    def devices_per_call(self, ids: np.ndarray) -> int:
        raise NotImplementedError

    def _run(self, rnd: int, ids: np.ndarray, start: Tensor, steps: np.ndarray, lr: Tensor,
             objective: LocalObjective) -> tuple[Tensor, Tensor]:
        """(end parameters [k, d], summed step losses [k])."""
        raise NotImplementedError
