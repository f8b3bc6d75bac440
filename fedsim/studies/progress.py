"""What a sweep shows while its points run: on a terminal one bar over the rounds still to
run (points done of all, elapsed and remaining time, by tqdm); elsewhere (a log file, a batch
job) a line per point that ended (`seed-0: completed (1/6, 11 s)`: points done of all, host
seconds); nothing with --quiet."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from fedsim.runs.callbacks import Callback


class StudyProgress:
    def __init__(self, rounds: list[int], points: int, done: int, enabled: bool = True, label: str = "study",
                 unit: str = "round"):
        """`rounds`: each point to run's rounds (or 1 each, `unit` "point", where a backend sees
        only whole points); `points`: all points of the phase, `done` of them finished before."""
        self.total, self.done, self.started = points, done, time.perf_counter()
        self.lines = enabled and not sys.stderr.isatty()
        self.bar = (tqdm(total=sum(rounds), unit=unit, desc=label, dynamic_ncols=True, leave=False)
                    if enabled and sys.stderr.isatty() else None)
        self._postfix()

    def callback(self) -> Callback:
        return PointProgress(self)

    def rounds_done(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def point_finished(self, name: str, status: str) -> None:
        """A point ended: it counts as done if it completed or diverged (not if it was
        interrupted or failed: it runs again)."""
        self.done += status in ("completed", "diverged")
        self._postfix(refresh=True)  # (now: the bar's next round may be another point's, or none)
        if self.lines:
            print(f"  {name}: {status} ({self.done}/{self.total}, {time.perf_counter() - self.started:.0f} s)",
                  flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _postfix(self, refresh: bool = False) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"points {self.done}/{self.total}", refresh=refresh)


class PointProgress(Callback):
    """A point's rounds and its end, reported to the study's progress (a StudyProgress, or
    anything with its `rounds_done` and `point_finished`: a worker process's reports)."""

    def __init__(self, progress: StudyProgress):
        self.progress = progress

    def on_start(self, run, metrics):
        self.progress.rounds_done(run.start_round)  # a resumed point's rounds before the checkpoint
        return {}

    def on_round(self, run, outcome, metrics):
        self.progress.rounds_done(1)
        return False, {}

    def on_end(self, run, result, metrics):
        self.progress.point_finished(run.run_dir.name, result.status)
        return {}
