"""`[run] threads`: how many intra-op threads each torch call of a run gets.

A call whose work is small (a few devices, a small model) runs on one thread: waking the
others costs more than they save, and on a busy machine a thread that waits for a core can
make a 1 ms step take 25 ms. A large call (a big cohort, a CNN on the CPU) keeps every thread.
The choice is a fixed rule of the call's size in multiply-adds, with the crossover measured by
benchmarks/bench_threads.py, never a timing taken during the run, so a seed still gives the
same run on the same machine.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch

# Multiply-adds of one call (forward + backward of a local step over the cohort, or an
# evaluation) from which two threads are at least 1.3x faster than one on an idle 2-core CPU
# (benchmarks/bench_threads.py: 22.6 M, e.g. a CNN's step on one device). Below it they gain
# at most 1.1-1.3x idle, while beside busy processes they were measured 5-50x slower.
CROSSOVER_FLOPS = 2.25e7


class ThreadPolicy:
    """Sets torch's thread count around each call by the call's work, and counts the choices."""

    def __init__(self, setting: str | int = "auto", device: torch.device = torch.device("cpu")):
        self.setting = setting
        self.most = torch.get_num_threads() if setting == "auto" else int(setting)
        self.active = device.type == "cpu"  # a GPU's kernels do not use them
        self.calls: Counter[int] = Counter()

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

    def threads_for(self, flops: float) -> int:
        if self.setting != "auto":
            return self.most
        return self.most if flops >= CROSSOVER_FLOPS else 1

    @contextmanager
    def work(self, flops: float):
        """Run the body with the threads that a call of `flops` multiply-adds gets."""
        if not self.active:
            yield
            return
        wanted, before = self.threads_for(flops), torch.get_num_threads()
        self.calls[wanted] += 1
        if wanted != before:
            torch.set_num_threads(wanted)
        try:
            yield
        finally:
            if wanted != before:
                torch.set_num_threads(before)

    def summary(self) -> dict:
        """For the manifest: the setting, the most threads a call may get, calls per thread count."""
        return {"setting": self.setting, "max": self.most if self.active else None,
                "calls_by_threads": {str(k): v for k, v in sorted(self.calls.items())}}
