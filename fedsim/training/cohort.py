"""The batched path: every device of the cohort in one gradient call per local step.

Parameters of the cohort are stacked [k, d]; the task's cohort step (the model's hand-batched
layers, or softmax regression's closed form) computes every device's gradient at once, so the
work is a few large kernels instead of k small ones. Devices with fewer steps simply drop out
of the later steps (the active rows are known on the host from `steps`, so no device sync).
Cohorts whose activations would not fit are cut into chunks of devices.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsim.training.trainer import Trainer, sgd_update_

ACTIVATION_BUDGET = 2**27  # floats of layer outputs per batched call on a CPU (512 MiB)


def activation_budget(device: torch.device) -> int:
    """Floats of layer outputs per batched call. On a GPU 1/64 of its memory (1.25 G floats on
    an H100): wider calls keep its kernels busy (a cohort of 1000 trains ~2x faster per device
    than one of 100). Fixed by the device, so the chunking of a run never varies."""
    if device.type != "cuda":
        return ACTIVATION_BUDGET
    return max(ACTIVATION_BUDGET, torch.cuda.get_device_properties(device).total_memory // 64)


class BatchedTrainer(Trainer):
    path = "batched"

    def __init__(self, task, client, *, seed, threads=None):
        super().__init__(task, client, seed=seed, threads=threads)
        self.step_fn = task.cohort_step_fn()

    def devices_per_call(self, ids):
        return min(len(ids), self.chunk_size(ids))

    def chunk_size(self, ids: np.ndarray) -> int:
        """Devices per batched call under the activation budget."""
        per_sample = self.task.activations
        if not per_sample:
            return max(len(ids), 1)
        return max(1, activation_budget(self.task.device) // (per_sample * self.batch_width(ids)))

    def _run(self, rnd, ids, start, steps, lr, objective):
        task = self.task
        end = start.clone()
        loss_sum = torch.zeros(len(ids), device=task.device)
        ids_t = torch.as_tensor(ids, device=task.device)
        size = self.chunk_size(ids)
        for lo in range(0, len(ids), size):
            part = slice(lo, lo + size)
            chunk_steps = steps[part]
            most = int(chunk_steps.max(initial=0))
            inputs = task.inputs(ids_t[part], rnd, most, self.batch_size, self.seed)
            for s in range(most):
                active = np.flatnonzero(chunk_steps > s)
                if len(active) == len(chunk_steps):
                    which, rows = slice(None), part  # every device of the chunk: views, no copies
                else:
                    which = torch.as_tensor(active, device=task.device)
                    rows = which + lo
                w = end[rows]
                ws = task.split(w)
                grads, loss = self.step_fn(ws, *inputs(s, which))
                starts = task.split(start[rows]) if objective.uses_start else ()
                sgd_update_(ws, grads, starts, lr[rows], self.client, objective)
                if isinstance(rows, torch.Tensor):
                    end[rows] = w
                loss_sum[rows] += loss
        return end, loss_sum
