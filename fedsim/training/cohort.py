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

from fedsim.data.clients import stack_clients
from fedsim.errors import FedsimError
from fedsim.training import rng
from fedsim.training.cuda_graphs import CudaGraphSteps
from fedsim.training.objective import LocalObjective
from fedsim.training.rules import row_stride
from fedsim.training.threads import at_once, balanced_parts
from fedsim.training.trainer import Trainer, TrainResult, sgd_update_

ACTIVATION_BUDGET = 2**27  # floats of layer outputs per batched call on a CPU (512 MiB)
CPU_CALL_PARAMETERS = 2**20  # floats of the devices' parameters per batched call on a CPU (4 MiB, rules 7)


def activation_budget(device: torch.device) -> int:
    """Floats of layer outputs per batched call. On a GPU 1/64 of its memory (1.25 G floats on
    an H100): wider calls keep its kernels busy (a cohort of 1000 trains ~2x faster per device
    than one of 100). Fixed by the device, so the chunking of a run never varies."""
    if device.type != "cuda":
        return ACTIVATION_BUDGET
    return max(ACTIVATION_BUDGET, torch.cuda.get_device_properties(device).total_memory // 64)


def under(task, problem: str) -> str:
    """` under torch.func.vmap` where `problem` is the module's own under vmap (not the padding
    of a batched call, which any code would count)."""
    return " under torch.func.vmap" if problem == task.model.batch_problem() else ""


class BatchedTrainer(Trainer):
    path = "batched"
    distinct_rows = True

    def __init__(self, task, client, *, seed, threads=None):
        super().__init__(task, client, seed=seed, threads=threads)
        problem = task.batch_problem(client.batch_size, client.local_epochs)
        if problem:
            raise FedsimError(f"[client] trainer = 'batched': the model cannot train batched{under(task, problem)} "
                              f"({problem}); set trainer = 'loop' (or 'auto')")
        self.step_fn = task.cohort_step_fn()
        self.graphs = CudaGraphSteps(self) if client.cuda_graphs and task.device.type == "cuda" else None

    def devices_per_call(self, ids):
        return min(len(ids), self.chunk_size(ids))

    def ran_as(self) -> str:
        return "cuda-graphs" if self.graphs is not None and not self.graphs.off else self.path

    def chunk_size(self, ids: np.ndarray) -> int:
        """Devices per batched call under the activation budget, and on a CPU from training rules
        7 under `CPU_CALL_PARAMETERS`: a step reads and writes every device's weights, and a call
        whose weights stay in the cache is faster (a 159 k-parameter MLP at 100 devices: 1.1x a
        plain loop's round in one call, 0.6-0.7x in calls of 10-50; logreg at 1,000 devices 1.8x
        faster in calls of 133; benchmarks/RESULTS.md, "Training rules 7")."""
        per_sample, size = self.task.activations, max(len(ids), 1)
        if per_sample:
            size = max(1, activation_budget(self.task.device) // (per_sample * self.batch_width(ids)))
        if self.task.device.type == "cpu" and self.threads.rules >= 7:
            size = min(size, max(1, CPU_CALL_PARAMETERS // self.task.dim))
        return size

    def _run(self, rnd, ids, start, steps, lr, objective):
        try:
            return self._run_chunks(rnd, ids, start, steps, lr, objective)
        except torch.cuda.OutOfMemoryError:
            if self.graphs is None or self.graphs.off:
                raise self.out_of_memory(ids) from None
        self.graphs.release("out of GPU memory with the graphs' own memory")  # then eagerly, once
        try:
            result = self._run_chunks(rnd, ids, start, steps, lr, objective)
        except torch.cuda.OutOfMemoryError:
            raise self.out_of_memory(ids) from None
        self.graphs.warn()  # (only once the eager call fits: else the error alone says it)
        return result

    def out_of_memory(self, ids: np.ndarray) -> FedsimError:
        torch.cuda.empty_cache()
        return FedsimError(f"out of GPU memory training {len(ids):,} devices of {self.task.dim:,} parameters on "
                           f"{self.batch_width(ids)} samples each in one call: lower [server] clients_per_round "
                           f"or [client] batch_size")

    def _run_chunks(self, rnd, ids, start, steps, lr, objective):
        end = torch.empty_like(start)
        loss_sum = torch.zeros(len(ids), device=self.task.device)
        ids_t = torch.as_tensor(ids, device=self.task.device)
        size, width = self.chunk_size(ids), self.batch_width(ids)
        for lo in range(0, len(ids), size):
            part = slice(lo, lo + size)
            most = int(steps[part].max(initial=0))
            inputs = self.task.inputs(ids_t[part], rnd, most, self.batch_size, self.seed, width,
                                      self.client.local_epochs)
            end[part], loss_sum[part] = local_sgd(self, start[part], steps[part], lr[part], objective.rows(part),
                                                  [inputs], [len(ids_t[part])])
        return end, loss_sum


def local_sgd(trainer: BatchedTrainer, start, steps: np.ndarray, lr, objective, inputs: list,
              sizes: list[int]):
    """(end parameters, summed step losses) of devices stacked in blocks of `sizes` (a chunk
    of one run, or the cohorts of several runs), one gradient call per local step. Block b's
    step inputs come from `inputs[b](step, which)` with `which` its own rows. Devices with fewer
    steps drop out of the later steps (known on the host from `steps`: no device sync)."""
    if trainer.graphs is not None:
        replayed = trainer.graphs.local_sgd(start, steps, lr, objective, inputs, sizes)
        if replayed is not None:
            return replayed
    device, dim = start.device, start.shape[1]
    offsets = np.cumsum([0, *sizes])
    end = _aligned_copy(start, row_stride(dim, trainer.threads.rules))
    loss_sum = torch.zeros(len(steps), device=device)
    stacked: dict[int, tuple] = {}  # field -> (its blocks' pieces, their cat): reused while they are the same
    for s in range(int(steps.max(initial=0))):
        active = np.flatnonzero(steps > s)
        if len(active) == len(steps):  # every device of every block: views, no copies
            parts = [at(s, slice(None)) for at in inputs]
        else:
            parts = []
            for b, at in enumerate(inputs):
                local = active[(active >= offsets[b]) & (active < offsets[b + 1])] - offsets[b]
                if len(local):
                    parts.append(at(s, slice(None) if len(local) == sizes[b] else torch.as_tensor(local, device=device)))
        batch = parts[0] if len(parts) == 1 else tuple(_cat(f, pieces, stacked) for f, pieces in enumerate(zip(*parts)))
        rows = slice(None) if len(active) == len(steps) else torch.as_tensor(active, device=device)
        w = end[rows]
        ws = trainer.task.split(w[:, :dim])
        grads, loss = trainer.step_fn(ws, *batch)
        starts = trainer.task.split(start[rows]) if objective.uses_start else ()
        linear = trainer.task.split(objective.linear[rows]) if objective.per_device else ()
        sgd_update_(ws, grads, starts, lr[rows], trainer.client, objective, linear)
        if isinstance(rows, torch.Tensor):
            end[rows] = w
        loss_sum[rows] += loss
    return end[:, :dim], loss_sum


def _aligned_copy(start: torch.Tensor, stride: int) -> torch.Tensor:
    """A copy of the devices' parameters `start` [M, d] with its rows `stride` floats apart
    (`rules.row_stride`), so that each device's numbers are the same at any row of a call."""
    if stride == start.shape[1]:
        return start.clone()
    end = start.new_zeros(len(start), stride)
    end[:, :start.shape[1]] = start
    return end


def _cat(field: int, pieces: tuple[torch.Tensor, ...], stacked: dict) -> torch.Tensor:
    """The blocks' pieces of one input field stacked; catted once while the blocks hand over
    the same tensors step after step (the samples of full batches and of distinct rows)."""
    last = stacked.get(field)
    if last is None or not _same_objects(last[0], pieces):
        last = stacked[field] = (pieces, torch.cat(pieces))
    return last[1]


def _same_objects(a: tuple, b: tuple) -> bool:
    """Whether two tuples hold the very same objects (what a cached result was made from)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def cohort_key(trainer: Trainer, ids: np.ndarray, objective) -> tuple | None:
    """What cohorts of different runs must share to be trained in one batched call: the
    batched path, the same model (architecture and size) and loss on the same device, the same
    batch size and local-update settings, the same training rules. None: this cohort trains on
    its own."""
    path = trainer.path_for(ids)
    if not isinstance(path, BatchedTrainer) or not len(ids) or path.task.device_buffers is not None:
        return None  # (buffers kept per device: each run's own `train` keeps them)
    task, client = path.task, path.client
    model = getattr(task, "model", None)
    shape = model.shared_key() if model is not None else (getattr(task, "noise", None),)
    return (type(task), task.dim, shape, str(task.device), path.batch_size, client.clip,
            client.weight_decay, objective, path.threads.rules)  # (the rules decide the step and layout)


def train_together(calls: list[tuple]) -> list[TrainResult]:
    """The cohorts of several runs, each `(trainer, rnd, ids, start, steps, lr, objective)` as
    `Trainer.train` takes them: those that can share a batched call (`cohort_key`, up to the
    activation budget) in one, the others on their own. Each device's arithmetic is the
    same as in its own run's call (the calls batch over devices, and its parameters lie on a
    64-byte boundary at any row: `rules.row_stride`), so on the CPU results equal separate calls
    bit for bit (but perhaps a model trained by reverse mode whose activations per device are
    not a multiple of 64 bytes, docs/studies.md); on a GPU to float rounding (a larger batch may
    take other kernels)."""
    results: list[TrainResult | None] = [None] * len(calls)
    groups: dict[tuple, list[list[int]]] = {}
    alone: list[int] = []  # cohorts that train in calls of their own
    for i, call in enumerate(calls):
        key = cohort_key(call[0], call[2], call[6])
        if key is None:
            alone.append(i)
            continue
        batched = call[0].path_for(call[2])
        room = batched.chunk_size(call[2])
        chunks = groups.setdefault(key, [[]])
        if chunks[-1] and sum(len(calls[j][2]) for j in chunks[-1]) + len(call[2]) > room:
            chunks.append([])  # (a cohort larger than the room alone starts no empty chunk: it trains alone)
        chunks[-1].append(i)
    for chunks in groups.values():
        for members in chunks:
            if len(members) == 1:
                alone.append(members[0])
            else:
                for i, result in zip(members, _train_group_or_split([calls[i] for i in members])):
                    results[i] = result
    for i, result in zip(alone, _train_side_by_side([calls[i] for i in alone])):
        results[i] = result
    return results


def _train_side_by_side(calls: list[tuple]) -> list[TrainResult]:
    """Cohorts that train in calls of their own (on the loop trainer, say: a module's convolutions
    on a CPU), each as alone; on a CPU where each would take one thread and together they reach
    the thread rule's crossover (`ThreadPolicy.parts`), in parts side by side, one thread each
    (a run's arithmetic is its one-thread call's either way), rather than one after another on
    one core."""
    policy = calls[0][0].threads if calls else None
    module = all(c[0].task.func_steps for c in calls)
    n_parts = policy.parts([c[0].call_flops(np.asarray(c[2])) for c in calls], module) if policy else 1
    if n_parts == 1:
        return [c[0].train(*c[1:]) for c in calls]
    company = f"; with {len(calls) - 1} other run(s) of the study in {n_parts} one-thread parts side by side"
    # (balanced by device-steps: the runs share the model)
    parts = [calls[r.start:r.stop] for r in balanced_parts([np.sum(c[4]) for c in calls], n_parts)]
    done = at_once([lambda part=part: [c[0].train(*c[1:], company=company) for c in part] for part in parts],
                   policy.most)
    return [result for part in done for result in part]


def _train_group_or_split(calls: list[tuple]) -> list[TrainResult]:
    """`_train_group`, or where the group does not fit on the GPU its halves, down to each run
    on its own (whose own call names the key to lower if even that does not fit)."""
    if len(calls) == 1:
        return [calls[0][0].train(*calls[0][1:])]
    try:
        return _train_group(calls)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
    half = len(calls) // 2
    return _train_group_or_split(calls[:half]) + _train_group_or_split(calls[half:])


def _train_group(calls: list[tuple]) -> list[TrainResult]:
    """One batched call for cohorts of the same `cohort_key`: their devices stacked run after
    run; each run draws its own inputs (its data, seed and round). Where the thread rule says
    so (`ThreadPolicy.parts`), the runs are cut into parts trained at once, one thread each."""
    trainers = [c[0].path_for(c[2]) for c in calls]
    first = trainers[0]
    width = max(t.batch_width(np.asarray(c[2])) for t, c in zip(trainers, calls))  # one width to stack
    step_flops, module = first.task.step_flops(width), first.task.func_steps
    n_parts = first.threads.parts([step_flops * len(c[2]) for c in calls], module)
    flops = step_flops * sum(len(c[2]) for c in calls)
    threads, threads_why = (first.threads.choice(flops, module) if n_parts == 1
                            else (1, "[run] threads = 'auto': a shared call in one-thread parts"))
    for (trainer, rnd, ids, *_), path in zip(calls, trainers):
        trainer.count(path.ran_as(), threads, threads_why,
                      f"{trainer.choice(ids)[1]}; in one call with {len(calls) - 1} other run(s) of the study")
    if n_parts == 1:
        with first.threads.work(flops, module):
            return _train_stacked(calls, trainers, width)
    parts = [(calls[r.start:r.stop], trainers[r.start:r.stop])
             for r in balanced_parts([len(c[2]) for c in calls], n_parts)]
    done = first.threads.run_parts([lambda c=c, t=t: _train_stacked(c, t, width) for c, t in parts])
    return [result for part in done for result in part]


def _train_stacked(calls: list[tuple], trainers: list[Trainer], width: int) -> list[TrainResult]:
    """`calls`' devices stacked in one `local_sgd` at batch width `width`."""
    device = trainers[0].task.device
    ks = [len(c[2]) for c in calls]
    offsets = np.cumsum([0, *ks])
    start = torch.cat([c[3].to(device, torch.float32) for c in calls])
    steps = np.concatenate([np.asarray(c[4], dtype=np.int64) for c in calls])
    lr = torch.cat([torch.as_tensor(c[5], dtype=torch.float32, device=device).expand(k) for c, k in zip(calls, ks)])
    ids_t = [torch.as_tensor(np.asarray(c[2], dtype=np.int64), device=device) for c in calls]
    most = [int(np.max(c[4], initial=0)) for c in calls]
    draws = _stacked_draws(trainers, calls, ids_t, max(most))
    stacked = _stacked_clients(trainers)
    if stacked is not None:  # one dataset: every cohort's inputs in one call
        data, first_ids = stacked
        every = torch.cat([i + first for i, first in zip(ids_t, first_ids)])
        t = trainers[0]
        inputs, blocks = [t.task.inputs(every, calls[0][1], max(most), t.batch_size, t.seed, width, 0.0, draws, data)], [len(every)]
    else:
        inputs = [t.task.inputs(i, c[1], s, t.batch_size, t.seed, width, t.client.local_epochs,
                                None if draws is None else draws[:s, lo:hi])
                  for t, i, c, s, lo, hi in zip(trainers, ids_t, calls, most, offsets[:-1], offsets[1:])]
        blocks = ks
    objective = LocalObjective.stacked([c[6].on(device) for c in calls])
    end, loss_sum = local_sgd(trainers[0], start, steps, lr, objective, inputs, blocks)
    # every run's deltas, mean losses and samples in one call each; each run's rows are views
    samples = np.concatenate([t.samples(np.asarray(c[2]), np.asarray(c[4], dtype=np.int64))
                              for t, c in zip(trainers, calls)])
    whole = trainers[0].result(np.empty(0), end - start, loss_sum, steps, samples)
    return [TrainResult(whole.deltas[lo:hi], whole.loss[lo:hi], whole.samples[lo:hi], call=whole, first_row=lo)
            for lo, hi in zip(offsets[:-1], offsets[1:])]


def _stacked_clients(trainers: list[Trainer]):
    """The runs' partitions stacked into one ClientData and each run's first client id in it
    (`stack_clients`), where their inputs can be one call: one dataset, a task whose inputs
    depend on the seed only through the draws, no local epochs. Kept on the first trainer
    while the same runs train together (the partitions never change); None otherwise."""
    first = trainers[0]
    if any(t.client.local_epochs for t in trainers) or not all(t.task.inputs_stack() for t in trainers):
        return None
    parts = tuple(t.task.data for t in trainers)
    kept = getattr(first, "stacked_clients", None)
    if kept is None or not _same_objects(kept[0], parts):
        kept = first.stacked_clients = (parts, stack_clients(list(parts)))
    return kept[1]


def _stacked_draws(trainers: list[Trainer], calls: list[tuple], ids: list[torch.Tensor], steps: int):
    """The minibatch uniforms [steps, M, B] of all runs' devices stacked, drawn in one call (each
    run's columns are its own `rng.uniform(seed, BATCH, round, ids, ...)`: the same numbers as
    alone), or None where the task draws none (full batches, local epochs, no minibatches)."""
    first = trainers[0]
    if not (first.task.draws_minibatches and first.batch_size > 0 and not first.client.local_epochs):
        return None
    keys = rng.stacked_keys([t.seed for t in trainers], rng.BATCH, [c[1] for c in calls], ids, range(steps))
    return rng.uniform_of_keys(keys, first.batch_size)
