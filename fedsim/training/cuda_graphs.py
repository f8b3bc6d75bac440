"""`[client] cuda_graphs`: the batched path's local steps replayed from CUDA graphs.

On a GPU a round of a small model is bound by kernel launches, not arithmetic: a LeNet-5 or
LSTM step of a cohort is a few hundred small kernels, each launched from Python. Here one
local step of the whole cohort (forward, backward, the SGD update) is captured once per static
shape into a CUDA graph and replayed: a step then costs one launch plus the copies of its
inputs into the graph's static buffers.

Static shapes: the cohort is padded to a bucket (a quarter of an octave: 10 stays 10, 11 -> 12,
100 -> 112), so a run varying its cohort size captures a handful of graphs; the padding rows
train on nothing (weight 0) at learning rate 0. Step counts are masked: a device whose local
steps are done keeps its parameters exactly (its step's learning rate is 0) and its buffers
(BatchNorm statistics are restored). So each device's arithmetic is the eager path's, and the
results equal it to float rounding (the kernels may block a padded batch differently).

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


class _Graph:
    """One captured step: static inputs, the cohort's parameters and the graph that updates them."""

    def __init__(self, like: tuple[Tensor, ...], rows: int, width: int, dim: int, device, uses_start: bool):
        def static(t: Tensor) -> Tensor:
            shape = (rows, *(t.shape[1:] if t.dim() < 2 else (width, *t.shape[2:])))  # dim 1: the batch
            return torch.zeros(shape, dtype=t.dtype, device=device)

        self.inputs = tuple(static(t) for t in like)  # x, y, weight, dropout draws / keys
        self.params = torch.zeros(rows, dim, device=device)
        self.start = torch.zeros(rows, dim, device=device) if uses_start else None
        self.lr = torch.zeros(rows, device=device)  # this step's: 0 where a device's steps are done
        self.active = torch.zeros(rows, device=device)
        self.loss_sum = torch.zeros(rows, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None


class CudaGraphSteps:
    """The local steps of a batched trainer's cohorts, replayed from graphs keyed by shape."""

    def __init__(self, trainer):
        self.trainer = trainer
        task = trainer.task
        self.buffers = slice(getattr(task.model, "param_dim", task.dim), task.dim) \
            if hasattr(task, "model") else slice(task.dim, task.dim)
        # fedsim's own layers treat samples independently: a padded batch (weight 0) changes
        # nothing, so widths share buckets; an nn.Module may mix a batch's samples (BatchNorm)
        self.pad_width = not hasattr(getattr(task, "model", None), "module")
        self.graphs: dict[tuple, _Graph] = {}
        self.capture = task.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.off = ""  # why graphs are off for this run ('' while they are on)

    def local_sgd(self, start: Tensor, steps: np.ndarray, lr: Tensor, objective, inputs: list,
                  sizes: list[int]) -> tuple[Tensor, Tensor] | None:
        """(end parameters, summed step losses) as `cohort.local_sgd` gives them, or None when
        this cohort cannot be captured (the caller trains it eagerly)."""
        if self.off:
            return None
        k, most = len(steps), int(steps.max(initial=0))
        if most == 0:
            return None
        first = [at(0, slice(None)) for at in inputs]
        width = max(p[0].shape[1] for p in first)
        key = (bucket(k), bucket(width) if self.pad_width else width,
               tuple((t.dtype, tuple(t.shape[2:])) for t in first[0]), objective)
        graph = self.graphs.get(key)
        if graph is None:
            try:
                graph = self._capture(key, first, objective)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as err:  # noqa: BLE001 - any failure to capture means: train eagerly
                self.release(f"the model cannot be captured in a CUDA graph: {first_line(err)}")
                self.warn()
                return None
            self.graphs[key] = graph
        return self._replay(graph, start, steps, lr, objective, inputs, sizes, first)

    def release(self, reason: str) -> None:
        """Turn graphs off for the rest of the run and free their memory."""
        self.off = reason
        self.graphs.clear()
        if self.capture:
            torch.cuda.empty_cache()

    def warn(self) -> None:
        """Say once why the run trains eagerly."""
        print(f"warning: [client] cuda_graphs: {self.off}; training eagerly (set cuda_graphs = false to silence "
              f"this)", file=sys.stderr)

    def summary(self) -> dict:
        """For the manifest: the graphs captured (cohort rows, batch width), or why they are off."""
        return {"captured": [list(key[:2]) for key in self.graphs], "off": self.off or None}

    def _body(self, g: _Graph, objective) -> None:
        """One local step of every row of `g`, in place on its static tensors."""
        task, trainer = self.trainer.task, self.trainer
        kept = g.params[:, self.buffers].clone() if self.buffers.stop > self.buffers.start else None
        ws = task.split(g.params)
        grads, loss = trainer.step_fn(ws, *g.inputs)
        starts = task.split(g.start) if objective.uses_start else ()
        sgd_update_(ws, grads, starts, g.lr, trainer.client, objective)
        if kept is not None:  # a device whose steps are done keeps its buffers
            g.params[:, self.buffers] = torch.where(g.active[:, None] > 0, g.params[:, self.buffers], kept)
        g.loss_sum += loss * g.active

    def _capture(self, key, first: list, objective) -> _Graph:
        rows, width = key[0], key[1]
        task = self.trainer.task
        g = _Graph(first[0], rows, width, task.dim, task.device, objective.uses_start)
        if not self.capture:  # on a CPU (tests): the same padded, masked steps, run eagerly
            return g
        self._fill(g, first, [len(p[0]) for p in first])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: autograd and the libraries set up outside the capture
            for _ in range(2):
                self._body(g, objective)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._body(g, objective)
        g.graph = graph
        return g

    def _fill(self, g: _Graph, parts: list, sizes: list[int]) -> None:
        """Copy one step's inputs of the blocks into the static buffers (the padding: weight 0)."""
        g.inputs[2].zero_()
        lo = 0
        for part, k in zip(parts, sizes):
            for static, t in zip(g.inputs, part):
                static[lo:lo + k, :t.shape[1]].copy_(t) if t.dim() >= 2 else static[lo:lo + k].copy_(t)
            lo += k

    def _replay(self, g: _Graph, start, steps, lr, objective, inputs, sizes, first) -> tuple[Tensor, Tensor]:
        k, device = len(steps), start.device
        g.params.zero_()
        g.params[:k].copy_(start)
        if g.start is not None:
            g.start[:k].copy_(start)
        g.loss_sum.zero_()
        active = np.zeros((int(steps.max()), len(g.lr)), dtype=np.float32)
        active[:, :k] = np.arange(active.shape[0])[:, None] < steps[None, :]
        active = torch.as_tensor(active, device=device)
        lr_rows = torch.zeros(len(g.lr), device=device)
        lr_rows[:k] = lr
        lr_steps = active * lr_rows
        for s in range(len(active)):
            self._fill(g, first if s == 0 else [at(s, slice(None)) for at in inputs], sizes)
            g.active.copy_(active[s])
            g.lr.copy_(lr_steps[s])
            g.graph.replay() if g.graph is not None else self._body(g, objective)
        return g.params[:k].clone(), g.loss_sum[:k].clone()
