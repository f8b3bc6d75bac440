"""Test evaluation of several runs in one batched call (the runs of a lockstep study).

Runs whose models are the same architecture on fedsim's kernels (`Model.evaluation_key`) on
the same test set (the same tensor: runs of one dataset share it, fedsim/data/clients.py) are
evaluated together: their parameters stacked [m, d] through `Model.predict_together`, which
reads the test inputs once for all of them. Every other run (a module through torch.func, the
quadratic task, a run alone in its group) is evaluated on its own. Either way each run gets what `task.evaluate` gives, to float rounding.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from fedsim.training.evaluate import chunk_size, evaluate_stacked
from fedsim.training.task import ClassificationTask, Task
from fedsim.training.threads import ThreadPolicy


def evaluation_key(task: Task) -> tuple | None:
    """What runs must share to be evaluated in one call; None: evaluated on its own."""
    if not isinstance(task, ClassificationTask) or not task.model.stacks_evaluation:
        return None
    return (task.model.evaluation_key(), id(task.data.x_test), str(task.data.device))


def evaluate_together(runs: Sequence[tuple[Task, Tensor]],
                      threads: ThreadPolicy | None = None) -> list[tuple[float, float | None]]:
    """(test loss, test accuracy) of each run `(task, global parameters [d])`, in order, as
    `task.evaluate(params)` gives them; runs of one `evaluation_key` in one batched call."""
    results: list[tuple[float, float | None] | None] = [None] * len(runs)
    groups: list[tuple[tuple | None, list[int]]] = []
    for i, (task, _) in enumerate(runs):
        key = evaluation_key(task)
        # (the same images with other labels would be another test set)
        group = next((g for k, g in groups if key is not None and k == key
                      and torch.equal(runs[g[0]][0].data.y_test, task.data.y_test)), None)
        if group is None:
            groups.append((key, [i]))
        else:
            group.append(i)
    threads = threads or ThreadPolicy(device=runs[0][0].device if runs else torch.device("cpu"))
    for _, members in groups:
        task = runs[members[0]][0]
        stacked = None
        if len(members) > 1:
            params = torch.stack([runs[i][0].served(runs[i][1]) for i in members])
            flops = task.model.flops * min(len(task.data.y_test), chunk_size(task.model, task.device, len(members)))
            with threads.work(flops * len(members)):
                stacked = evaluate_stacked(task.model, params, task.data)
        for j, i in enumerate(members):
            if stacked is not None:
                results[i] = stacked[j]
            else:
                with threads.work(runs[i][0].evaluate_flops()):
                    results[i] = runs[i][0].evaluate(runs[i][1])
    return results
