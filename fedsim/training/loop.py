"""The reference path: one device at a time, one step at a time.

It is what the batched path is tested against, and the faster choice where the per-device
work is large and the batching rule of a layer is slow (convolutions on a CPU).
"""

from __future__ import annotations

import torch

from fedsim.training.trainer import Trainer, sgd_update_


class LoopTrainer(Trainer):
    path = "loop"

    def devices_per_call(self, ids):
        return 1

    def _run(self, rnd, ids, start, steps, lr, objective):
        task = self.task
        step_fn = task.step_fn()
        end = start.clone()
        loss_sum = torch.zeros(len(ids), device=task.device)
        ids_t = torch.as_tensor(ids, device=task.device)
        for j in range(len(ids)):
            one = slice(j, j + 1)
            ws, starts = task.split(end[one]), task.split(start[one])  # views: updated in place
            inputs = task.inputs(ids_t[one], rnd, int(steps[j]), self.batch_size, self.seed,
                                 epochs=self.client.local_epochs)
            for s in range(int(steps[j])):
                grads, loss = step_fn(tuple(w[0] for w in ws), *(x[0] for x in inputs(s, slice(None))))
                sgd_update_(ws, tuple(g[None] for g in grads), starts, lr[one], self.client, objective)
                loss_sum[j] += loss.detach()
        return end, loss_sum
