"""The reference path: one device at a time, one step at a time.

It is what the batched path is tested against, and the faster choice where the per-device
work is large and the batching rule of a layer is slow (convolutions on a CPU). A device
trains on its own samples only: a module with BatchNorm takes an epoch's last, smaller
minibatch as it is, where the batched call would pad it.
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
                step_inputs = [x[0] for x in inputs(s, slice(None))]
                if task.batch_statistics:  # the step's own samples (x, y, weight), not an epoch's padding
                    keep = step_inputs[2] > 0
                    step_inputs[:3] = (t[keep] for t in step_inputs[:3])
                grads, loss = step_fn(tuple(w[0] for w in ws), *step_inputs)
                sgd_update_(ws, tuple(g[None] for g in grads), starts, lr[one], self.client, objective)
                loss_sum[j] += loss.detach()
        return end, loss_sum
