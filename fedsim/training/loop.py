"""The reference path: one device at a time, one step at a time.

It is what the batched path is tested against, and the faster choice where the per-device
work is large and the batching rule of a layer is slow (convolutions on a CPU).
"""

from __future__ import annotations

import torch

from fedsim.training.trainer import Trainer, sgd_update


class LoopTrainer(Trainer):
    path = "loop"

    def _run(self, rnd, ids, start, steps, lr, prox_mu):
        task = self.task
        step_fn = task.step_fn()
        end = start.clone()
        loss_sum = torch.zeros(len(ids), device=task.device)
        ids_t = torch.as_tensor(ids, device=task.device)
        for j in range(len(ids)):
            w = start[j:j + 1]
            for s in range(int(steps[j])):
                inputs = task.inputs(ids_t[j:j + 1], rnd, s, self.batch_size, self.seed)
                grad, loss = step_fn(w[0], *(x[0] for x in inputs))
                w = sgd_update(w, grad[None], start[j:j + 1], lr[j:j + 1], self.client, prox_mu)
                loss_sum[j] += loss.detach()
            end[j] = w[0]
        return end, loss_sum
