"""The reference path: one device at a time, one step at a time.

It is what the batched path is tested against, and the faster choice where the per-device
work is large and the batching rule of a layer is slow (convolutions on a CPU). A device
trains on its own samples only: an epoch's last, smaller minibatch is taken as it is, where the
batched call pads it (a module with BatchNorm always, whose batch statistics must not see the
padding; any model from training rules 2, which spares the padding's arithmetic).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedsim.training.threads import at_once, balanced_parts
from fedsim.training.trainer import Trainer, sgd_update_

MODULE_PART_FLOPS = 2**24  # multiply-adds of a module's step below which its devices train in one part


class LoopTrainer(Trainer):
    path = "loop"

    def devices_per_call(self, ids):
        return 1

    def _run(self, rnd, ids, start, steps, lr, objective):
        ids_t = torch.as_tensor(ids, device=self.task.device)
        jobs = [lambda part=part: self._train_devices(part, rnd, ids, ids_t, start, steps, lr, objective)
                for part in self._parts(ids, steps)]
        if len(jobs) == 1:
            return jobs[0]()
        done = at_once(jobs, self.threads.most)  # (one call of `threads.work`'s count, in parts)
        return torch.cat([end for end, _ in done]), torch.cat([loss_sum for _, loss_sum in done])

    def _parts(self, ids, steps) -> list[range]:
        """The devices in one-thread parts side by side, where the thread rule cuts a call of
        their steps (`ThreadPolicy.parts`: each device alone would take one thread, together
        they reach the crossover), balanced by their steps; one part otherwise, and for a
        module's steps through torch.func of fewer than `MODULE_PART_FLOPS` multiply-adds: their
        Python holds the GIL between small kernels, so two parts wait for each other (an MLP's
        steps of 6-8 M: 1.01-1.07x a plain loop's round in two parts, 1.02-1.03x in one; a CNN's
        of 50 M: 0.57x against 0.82x; benchmarks/RESULTS.md, "Training rules 8")."""
        step = self.call_flops(ids[:1])
        small = self.task.func_steps and step < MODULE_PART_FLOPS
        self.parts = 1 if small else self.threads.parts([step] * len(ids), self.task.func_steps)
        return balanced_parts(steps, self.parts)

    def _train_devices(self, devices: range, rnd, ids, ids_t, start, steps, lr, objective) -> tuple[Tensor, Tensor]:
        """The local steps of `devices` (a range of indices into `ids`), one device after another:
        their end parameters and loss sums. Each part trains a tensor of its own (a tensor's
        views share one version counter: another part's in-place update of its own rows would
        read as a change to the values this part's autograd saved)."""
        task = self.task
        step_fn = task.step_fn()
        end = start[devices.start:devices.stop].clone()
        loss_sum = torch.zeros(len(devices), device=task.device)
        own_rows = self.client.local_epochs and (task.batch_statistics or self.threads.rules >= 2)
        # each device's lr as torch's SGD takes it, a number (None: the batched call's update)
        fused = lr.tolist() if task.plain_loop_step else None
        # where nothing joins the loss gradient, the update takes the tensors without the device dimension
        bare = fused is not None and not (objective.prox_mu or objective.per_device or self.client.clip > 0
                                          or self.client.weight_decay)
        # a step's inputs one per sample (x, y, weight; fedsim's kernels' dropout uniforms too: a
        # module's numbers are the forward's, drawn for the batch it is given)
        per_sample = 4 if task.samples_independent else 3
        for i, j in enumerate(devices):
            one, own = slice(j, j + 1), slice(i, i + 1)
            starts = task.split(start[one])
            linear = task.split(objective.linear[one]) if objective.per_device else ()
            inputs = task.inputs(ids_t[one], rnd, int(steps[j]), self.batch_size, self.seed,
                                 epochs=self.client.local_epochs, cut=bool(own_rows))
            rows = self.epoch_rows(int(self.sizes[ids[j]]), int(steps[j])) if own_rows else None
            device_lr, fused_lr = lr[one], None if fused is None else fused[j]
            total = torch.zeros((), device=task.device)  # (the steps' losses summed in order, as loss_sum's row)
            # the device's tensors (views of its row, or the model's own that hold it) without
            # and with the device dimension, updated in place
            with task.trained_in_place(tuple(w[0] for w in task.split(end[own]))) as device_ws:
                ws = tuple(w[None] for w in device_ws)
                for s in range(int(steps[j])):
                    step_inputs = [x[0] for x in inputs(s, slice(None))]
                    if rows is not None:  # the step's own samples: an epoch's last, smaller minibatch unpadded
                        step_inputs[:per_sample] = (t[:rows[s]] for t in step_inputs[:per_sample])
                    grads, loss = step_fn(device_ws, *step_inputs)
                    with torch.no_grad():  # (a model's own tensors are leaves that require gradients)
                        if bare:
                            sgd_update_(device_ws, grads, (), device_lr, self.client, objective, (), fused_lr)
                        else:
                            sgd_update_(ws, tuple(g[None] for g in grads), starts, device_lr, self.client, objective,
                                        linear, fused_lr)
                        total += loss
            loss_sum[i] = total
        return end, loss_sum

    def epoch_rows(self, size: int, steps: int) -> list[int]:
        """The samples of each local step of a device of `size` samples under local epochs: the
        batch size, the rest of its data in an epoch's last minibatch (the padding
        `ClientData.epoch_batches` puts after them is left out, known here without reading the
        weights back from the device)."""
        per_epoch = max(-(-size // self.batch_size), 1)
        return [min(self.batch_size, size - (s % per_epoch) * self.batch_size) for s in range(steps)]
