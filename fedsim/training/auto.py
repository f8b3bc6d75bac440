"""`[client] trainer = "auto"`: the faster path for the model, cohort size and torch device.

The choice is a fixed rule (measured with benchmarks/bench_cohort.py), never a timing taken
during the run: a timing could pick differently on a rerun, and the two paths agree only to
float rounding, so runs would stop being bit-for-bit repeatable.
"""

from __future__ import annotations

from fedsim.training.cohort import BatchedTrainer, under
from fedsim.training.loop import LoopTrainer
from fedsim.training.trainer import Trainer


def prefers_batched(cohort_slow_on_cpu: str, cohort: int, device_type: str) -> bool:
    """A single device: the loop (there is nothing to stack). On a GPU: batched. On a CPU:
    batched, except for a model whose cohort form is slower there than a loop of devices
    (`cohort_slow_on_cpu` says why: one grouped convolution over the cohort, for the
    convolutional models on fedsim's kernels and from training rules 4 a module's convolutions
    over images of 16x16 pixels or more; from rules 5 a module's op that vmap runs device by
    device)."""
    if cohort <= 1:
        return False
    return device_type != "cpu" or not cohort_slow_on_cpu


class AutoTrainer(Trainer):
    path = "auto"

    def __init__(self, task, client, *, seed, threads=None):
        super().__init__(task, client, seed=seed, threads=threads)
        # batched where the rule prefers it and the model can (a module may not run under vmap)
        self.slow_on_cpu = task.cohort_slow_on_cpu(client.local_epochs)
        wanted = prefers_batched(self.slow_on_cpu, 2, task.device.type)
        self.not_batched = task.batch_problem(client.batch_size, client.local_epochs) if wanted else None
        self.batched = BatchedTrainer(task, client, seed=seed, threads=self.threads) \
            if wanted and not self.not_batched else None
        self.loop = LoopTrainer(task, client, seed=seed, threads=self.threads)

    def choice(self, ids):
        """The path of a cohort of `ids` by `prefers_batched`, and why (recorded in the manifest)."""
        where = self.task.device.type
        if self.not_batched:
            return self.loop, f"auto: the model cannot train batched{under(self.task, self.not_batched)}: {self.not_batched}"
        if len(ids) <= 1:
            return self.loop, "auto: one device a call, nothing to stack"
        if self.batched is None or not prefers_batched(self.slow_on_cpu, len(ids), where):
            return self.loop, f"auto: {self.slow_on_cpu}"
        return self.batched, f"auto: the cohort in one call on the {where.upper()}"

    def devices_per_call(self, ids):
        return self.path_for(ids).devices_per_call(ids)

    def _run(self, rnd, ids, start, steps, lr, objective):
        return self.path_for(ids)._run(rnd, ids, start, steps, lr, objective)
