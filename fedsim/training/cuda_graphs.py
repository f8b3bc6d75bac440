"""`[client] cuda_graphs`: the batched path's local steps replayed from CUDA graphs.

On a GPU a round of a small model is bound by kernel launches, not arithmetic: a LeNet-5 or
LSTM step of a cohort is a few hundred small kernels, each launched from Python. Here one
local step of the whole cohort (forward, backward, the SGD update) is captured once per static
shape into a CUDA graph and replayed: a step then costs one launch plus the copies of its
inputs into the graph's static buffers.

Static shapes: the cohort's rows are sorted by their step counts, longest first, so that the
devices still training at a step are a prefix of the rows; a step trains that prefix padded to a
bucket (a quarter of an octave: 10 stays 10, 11 -> 12, 100 -> 112), so devices that take fewer
steps (local epochs over unequal data) stop costing work as they finish, and a run captures a
handful of graphs. A padding row trains on nothing (weight 0) at learning rate 0; a device
whose steps are done keeps its parameters exactly and its buffers (BatchNorm statistics are
restored). So each device's arithmetic is the eager path's, and the results equal it to float
rounding (the kernels may block a padded batch differently).

A model that cannot be captured (a host sync such as `.item()`, a shape that depends on the
data) is trained eagerly with one warning naming the reason.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch
from torch import Tensor

from fedsim.errors import first_line
from fedsim.training.trainer import sgd_update_


def bucket(n: int) -> int:
    """n rounded up to a quarter of an octave (1..8 stay; 10 -> 10, 11 -> 12, 100 -> 112)."""
    if n <= 8:
        return max(n, 1)
    step = 2 ** (int(math.log2(n)) - 2)
    return -(-n // step) * step


class _Buffers:
    """The static tensors of one cohort shape: every row's inputs, parameters and step state,
    and the graphs captured on their leading rows (one per bucket of devices still training)."""

    def __init__(self, like: list[tuple[Tensor, ...]], rows: int, width: int | None, dim: int, device,
                 uses_start: bool, per_device: bool):
        def static(ts: tuple[Tensor, ...]) -> Tensor:  # one input, of every block
            shape = [rows, *ts[0].shape[1:]]
            if len(shape) >= 2:  # dim 1: the batch padded to `width`; unpadded, the widest block's
                shape[1] = width or max(t.shape[1] for t in ts)  # (or a module's dropout numbers)
            return torch.zeros(shape, dtype=ts[0].dtype, device=device)

        self.inputs = tuple(static(ts) for ts in zip(*like))  # x, y, weight, dropout draws
        self.params = torch.zeros(rows, dim, device=device)
        self.start = torch.zeros(rows, dim, device=device) if uses_start else None
        self.linear = torch.zeros(rows, dim, device=device) if per_device else None  # the objective's g_i
        self.lr = torch.zeros(rows, device=device)  # this step's: 0 where a device's steps are done
        self.active = torch.zeros(rows, device=device)
        self.loss_sum = torch.zeros(rows, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph | None] = {}  # leading rows -> its graph


class CudaGraphSteps:
    """The local steps of a batched trainer's cohorts, replayed from graphs keyed by shape."""

    def __init__(self, trainer):
        self.trainer = trainer
        task = trainer.task
        self.buffers = slice(task.model.param_dim, task.dim) if hasattr(task, "model") else slice(task.dim, task.dim)
        # where samples are independent a padded batch (weight 0) changes nothing for the others,
        # so widths share buckets; a module through torch.func may mix a batch's samples (BatchNorm)
        self.pad_width = task.samples_independent
        self.shapes: dict[tuple, _Buffers] = {}
        self.capture = task.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.off = ""  # why graphs are off for this run ('' while they are on)

    def local_sgd(self, start: Tensor, steps: np.ndarray, lr: Tensor, objective, inputs: list,
                  sizes: list[int]) -> tuple[Tensor, Tensor] | None:
        """(end parameters, summed step losses) as `cohort.local_sgd` gives them, or None when
        this cohort cannot be captured (the caller trains it eagerly)."""
        if self.off or int(steps.max(initial=0)) == 0:
            return None
        first = [at(0, slice(None)) for at in inputs]
        width = max(p[0].shape[1] for p in first)
        key = (bucket(len(steps)), bucket(width) if self.pad_width else width,
               tuple((t.dtype, tuple(t.shape[2:])) for t in first[0]), objective)
        if key not in self.shapes:
            task = self.trainer.task
            self.shapes[key] = _Buffers(first, key[0], key[1] if self.pad_width else None, task.dim, task.device,
                                        objective.uses_start, objective.per_device)
        try:
            return self._replay(self.shapes[key], start, steps, lr, objective, inputs, sizes, first)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure to capture means: train eagerly
            if not self.capture:
                raise
            self.release(f"the model cannot be captured in a CUDA graph: {first_line(err)}")
            self.warn()
            return None

    def release(self, reason: str) -> None:
        """Turn graphs off for the rest of the run and free their memory."""
        self.off = reason
        self.shapes.clear()
        if self.capture:
            torch.cuda.empty_cache()

    def warn(self) -> None:
        """Say once why the run trains eagerly."""
        print(f"warning: [client] cuda_graphs: {self.off}; training eagerly (set cuda_graphs = false to silence "
              f"this)", file=sys.stderr)

    def summary(self) -> dict:
        """For the manifest: the graphs captured (leading rows, batch width), or why they are off."""
        captured = sorted([rows, key[1]] for key, g in self.shapes.items() for rows in g.graphs)
        return {"captured": captured, "off": self.off or None}

    def _body(self, g: _Buffers, rows: int, objective) -> None:
        """One local step of the leading `rows` rows of `g`, in place on its static tensors."""
        task, trainer = self.trainer.task, self.trainer
        params, active = g.params[:rows], g.active[:rows]
        kept = params[:, self.buffers].clone() if self.buffers.stop > self.buffers.start else None
        ws = task.split(params)
        grads, loss = trainer.step_fn(ws, *(t[:rows] for t in g.inputs))
        starts = task.split(g.start[:rows]) if objective.uses_start else ()
        linear = task.split(g.linear[:rows]) if g.linear is not None else ()
        sgd_update_(ws, grads, starts, g.lr[:rows], trainer.client, objective, linear)
        if kept is not None:  # a device whose steps are done keeps its buffers
            params[:, self.buffers] = torch.where(active[:, None] > 0, params[:, self.buffers], kept)
        g.loss_sum[:rows] += loss * active

    def _step(self, g: _Buffers, rows: int, objective) -> None:
        """Replay the graph of the leading `rows` rows, captured the first time (on a CPU, for
        the tests: the same step, run eagerly)."""
        if not self.capture:
            return self._body(g, rows, objective)
        if rows not in g.graphs:
            g.graphs[rows] = self._captured(g, rows, objective)
        g.graphs[rows].replay()

    def _captured(self, g: _Buffers, rows: int, objective) -> torch.cuda.CUDAGraph:
        saved = g.params.clone(), g.loss_sum.clone()  # the warm-up steps must not count
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: autograd and the libraries set up outside the capture
            for _ in range(2):
                self._body(g, rows, objective)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._body(g, rows, objective)
        g.params.copy_(saved[0])
        g.loss_sum.copy_(saved[1])
        return graph

    def _replay(self, g: _Buffers, start, steps, lr, objective, inputs, sizes, first) -> tuple[Tensor, Tensor]:
        k, device = len(steps), start.device
        order = np.argsort(-steps, kind="stable")  # row r of the buffers holds device order[r]
        sorted_steps = steps[order]
        plan = _Fill(order, sizes, sorted_steps, device)
        order_t = torch.as_tensor(order, device=device)
        g.params.zero_()
        g.params[:k] = start[order_t]
        if g.start is not None:
            g.start[:k] = g.params[:k]
        if g.linear is not None:  # (padding rows: 0, and they step at lr 0 anyway)
            g.linear.zero_()
            g.linear[:k] = objective.linear[order_t]
        g.loss_sum.zero_()
        active = np.zeros((int(sorted_steps[0]), len(g.lr)), dtype=np.float32)
        active[:, :k] = np.arange(active.shape[0])[:, None] < sorted_steps[None, :]
        active = torch.as_tensor(active, device=device)
        lr_rows = torch.zeros(len(g.lr), device=device)
        lr_rows[:k] = lr[order_t]
        lr_steps = active * lr_rows
        for s in range(len(active)):
            rows = plan.fill(g, inputs, s, first if s == 0 else None)
            g.active.copy_(active[s])
            g.lr.copy_(lr_steps[s])
            self._step(g, bucket(rows), objective)
        end, loss_sum = torch.empty_like(start), torch.empty(k, device=device)
        end[order_t], loss_sum[order_t] = g.params[:k], g.loss_sum[:k]
        return end, loss_sum


class _Fill:
    """Where each step's inputs go: the devices still training at step s are the leading rows
    (sorted by steps); each block's (run's) active devices by their positions in it, and the
    rows they fill, for all steps in one transfer."""

    def __init__(self, order: np.ndarray, sizes: list[int], sorted_steps: np.ndarray, device):
        offsets = np.cumsum([0, *sizes])
        block = np.repeat(np.arange(len(sizes)), sizes)[order]  # of each row
        local = order - offsets[block]
        self.identity = len(sizes) == 1 and bool(np.all(order == np.arange(len(order))))
        self.sizes = sizes
        self.counts = (sorted_steps[None, :] > np.arange(int(sorted_steps[0]))[:, None]).sum(axis=1)
        # per (step, block): (positions in the block, rows), cut from one array on the device
        pieces, self.spans = [], {}
        at = 0
        for s, n in enumerate(self.counts):
            if n == len(order) and self.identity:
                continue
            for b in range(len(sizes)):
                rows = np.flatnonzero(block[:n] == b)
                pieces += [local[rows], rows]
                self.spans[s, b] = (at, len(rows))
                at += 2 * len(rows)
        self.index = torch.as_tensor(np.concatenate(pieces) if pieces else np.zeros(0, np.int64), device=device)

    def fill(self, g: _Buffers, inputs: list, s: int, whole: list | None = None) -> int:
        """Copy step s's inputs of the devices still training into the leading rows (the rest
        of the batch and the rows up to the bucket: weight 0); how many rows train. `whole`:
        this step's inputs of every device, where already gathered."""
        n = int(self.counts[s])
        g.inputs[2].zero_()
        if n == sum(self.sizes) and self.identity:
            for static, t in zip(g.inputs, whole[0] if whole else inputs[0](s, slice(None))):
                (static[:n, :t.shape[1]] if t.dim() >= 2 else static[:n]).copy_(t)
            return n
        for b, at in enumerate(inputs):
            lo, m = self.spans[s, b]
            if not m:
                continue
            which, rows = self.index[lo:lo + m], self.index[lo + m:lo + 2 * m]
            for static, t in zip(g.inputs, at(s, which)):
                (static[:, :t.shape[1]] if t.dim() >= 2 else static).index_copy_(0, rows, t)
        return n
