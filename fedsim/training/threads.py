"""`[run] threads`: how many intra-op threads each torch call of a run gets.

A call whose work is small (a few devices, a small model) runs on one thread: waking the
others costs more than they save, and on a busy machine a thread that waits for a core can
make a 1 ms step take 25 ms. A large call (a big cohort, a CNN on the CPU) keeps every thread.
The choice is a fixed rule of the call's size in multiply-adds, with the crossover measured by
benchmarks/bench_threads.py, never a timing taken during the run, so a seed still gives the
same run on the same machine.

A lockstep study's shared call (fedsim/studies/lockstep.py) of many small cohorts is large, but
all threads on one call need every core at every kernel: beside other jobs a core is often
taken, and such a call was measured 5x slower than on one thread. So, where each run alone
would have one thread, the shared call is cut into independent parts, one per thread, each
on one thread (`parts`): idle they fill the cores, loaded a part waits for a core once per
call, not once per kernel, and each run's numbers are those of its one-thread call alone. The
loop trainer cuts a cohort's devices into such parts the same way (each device's steps are its
own one-thread arithmetic), and lockstep the runs that train in calls of their own. A part
never cuts itself again (`in_part`).

Under training rules 2 (fedsim/training/rules.py) a large call takes half the cores (one on
two cores), and a user's nn.Module through torch.func one thread whatever the call's size
(`module=True`: its steps are many small kernels each). On two threads of two cores, beside busy
processes or only other sessions' tests, rounds took 2.5-50x as long as a plain one-thread
PyTorch loop's; on one thread they stayed at 0.5-0.98x of it, idle and beside 2-3 busy
processes (bench_modules.py). Runs started under rules 1 keep every thread for a large call.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Sequence

import threading

import numpy as np
import torch

from fedsim.training import rules as training_rules

# Multiply-adds of one call (forward + backward of a local step over the cohort, or an
# evaluation) from which two threads are at least 1.3x faster than one on an idle 2-core CPU
# (benchmarks/bench_threads.py: 22.6 M, e.g. a CNN's step on one device). Below it they gain
# at most 1.1-1.3x idle, while beside busy processes they were measured 5-50x slower.
CROSSOVER_FLOPS = 2.25e7


class ThreadPolicy:
    """Sets torch's thread count around each call by the call's work, and counts the choices."""

    def __init__(self, setting: str | int = "auto", device: torch.device = torch.device("cpu"),
                 rules: int = training_rules.CURRENT):
        self.setting, self.rules = setting, rules
        self.most = torch.get_num_threads() if setting == "auto" else int(setting)
        # what a large call gets under auto (rules 1: every thread)
        self.large = self.largest(self.most)
        self.active = device.type == "cpu"  # a GPU's kernels do not use them
        self.calls: Counter[int] = Counter()

    def largest(self, most: int) -> int:
        """The most threads a call gets under this setting where `most` threads are there (a
        large call's, under auto)."""
        return most if self.setting != "auto" or self.rules < 2 else max(1, most // 2)

    @contextmanager
    def scope(self):
        """A run: everything outside the sized calls (the server's gathers and aggregation,
        small by nature) runs on one thread under auto, on N when pinned; restored after."""
        before = torch.get_num_threads()
        if self.active:
            torch.set_num_threads(1 if self.setting == "auto" else self.most)
        try:
            yield self
        finally:
            torch.set_num_threads(before)

    def threads_for(self, flops: float, module: bool = False) -> int:
        """Threads of a call of `flops` multiply-adds; `module`: a user's nn.Module's (one thread)."""
        if self.setting != "auto":
            return self.most
        if self.rules < 2:
            return self.most if flops >= CROSSOVER_FLOPS else 1
        return self.large if flops >= CROSSOVER_FLOPS and not module else 1

    def choice(self, flops: float, module: bool = False) -> tuple[int | None, str]:
        """The threads of a call of `flops` multiply-adds (None: a GPU's call) and why, for the manifest."""
        if not self.active:
            return None, "torch threads do not apply on a GPU"
        if self.setting != "auto":
            return self.most, f"[run] threads = {self.most}"
        if module and self.rules >= 2:
            return 1, "[run] threads = 'auto': an nn.Module's calls (many small kernels) on one thread"
        side = "at least" if flops >= CROSSOVER_FLOPS else "under"
        large = "" if flops < CROSSOVER_FLOPS or self.rules < 2 else f" (half of {self.most} threads, at least one)"
        return self.threads_for(flops), (f"[run] threads = 'auto': a call of {flops / 1e6:.3g} M multiply-adds, "
                                         f"{side} the {CROSSOVER_FLOPS / 1e6:g} M crossover{large}")

    @contextmanager
    def work(self, flops: float, module: bool = False):
        """Run the body with the threads that a call of `flops` multiply-adds gets."""
        if not self.active:
            yield
            return
        wanted, before = self.threads_for(flops, module), torch.get_num_threads()
        self.calls[wanted] += 1
        if wanted != before:
            torch.set_num_threads(wanted)
        try:
            yield
        finally:
            if wanted != before:
                torch.set_num_threads(before)

    def parts(self, member_flops: Sequence[float], module: bool = False) -> int:
        """Independent one-thread parts for a shared call of members of these sizes (their own
        calls alone): all threads' worth when the whole reaches the crossover and no member
        alone would get more than one thread; 1 otherwise (the call then takes `work`'s rule)."""
        if not self.active or self.setting != "auto" or self.most < 2 or len(member_flops) < 2 or in_part():
            return 1
        if self.threads_for(max(member_flops), module) > 1 or sum(member_flops) < CROSSOVER_FLOPS:
            return 1
        return min(self.most, len(member_flops))

    def run_parts(self, jobs: Sequence[Callable[[], object]]) -> list:
        """`jobs` (the parts of a shared call) at once, each on one thread; their results."""
        self.calls[1] += len(jobs)
        return at_once(jobs, self.most)

    def summary(self) -> dict:
        """For the manifest: the setting, the most threads a call may get, calls per thread count."""
        return {"setting": self.setting, "max": self.most if self.active else None,
                "calls_by_threads": {str(k): v for k, v in sorted(self.calls.items())}}


_POOLS: dict[int, ThreadPoolExecutor] = {}


def balanced_parts(work: Sequence[float], parts: int) -> list[range]:
    """Items of `work` in at most `parts` runs of neighbours with about equal work each."""
    ends = np.cumsum(work)
    cuts = [0, *np.searchsorted(ends, ends[-1] * np.arange(1, parts) / parts, side="right"), len(work)]
    return [range(lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]


def at_once(jobs: Sequence[Callable[[], object]], workers: int) -> list:
    """`jobs` at once on a pool of `workers` threads, each job on one torch thread; their results."""
    if len(jobs) == 1:
        return [jobs[0]()]
    return list(_pool(workers).map(_one_thread, jobs))


def _pool(workers: int) -> ThreadPoolExecutor:
    if workers not in _POOLS:
        _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="fedsim-part")
    return _POOLS[workers]


_PART = threading.local()


def in_part() -> bool:
    """Whether this thread runs a part (whose work is not cut into parts again: the pool's
    threads would wait for each other)."""
    return getattr(_PART, "on", False)


def _one_thread(job: Callable[[], object]):
    """A part in a pool thread: torch's thread count is per OS thread for OpenMP, so set it here."""
    torch.set_num_threads(1)
    _PART.on = True
    return job()
