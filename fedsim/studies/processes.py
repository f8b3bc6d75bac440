"""The in-process backend of `fedsim sweep`: a study's points in lockstep groups
(fedsim/studies/lockstep.py), stepped in the sweep's process or, on a machine with cores to
spare, split into shares, each stepped in lockstep by a worker process of its own.

A lockstep group trains its cohorts in shared calls, but each run's own Python of a round (its
server, strategy and recorder) runs on one core, run after run: on a machine with cores to
spare, shares stepped by processes side by side run more rounds at once (benchmarks/RESULTS.md,
"Lockstep shares in worker processes"). Each worker gets its points as plain data (config as
a dict, run directory, state) on stdin and reports on its stdout: rounds done, points ended,
and at the end their statuses, or the error that stopped it. Workers run in sessions of their
own, so that a Ctrl-C at the terminal reaches the sweep alone, which passes each stop signal on
to them: the first lets their points finish the round and checkpoint, a second aborts.
"""

from __future__ import annotations

import json
import os
import pickle
import selectors
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from fedsim.errors import FedsimError, STOP_SIGNALS, Stopped, on_stop_signals, raise_stopped, say_stopping
from fedsim.studies.lockstep import lockstep_groups, run_batches
from fedsim.studies.point import run_point
from fedsim.studies.progress import PointProgress, StudyProgress

if TYPE_CHECKING:
    from fedsim.studies.study import Point, Study

POINTS_PER_PROCESS = 8  # a share smaller than this loses more to its process's start than it gains
# asynchronous points share no call in lockstep (each simulates and trains on its own): a worker
# per 2 of them already pays (4 FedBuff points of `systems-fedbuff`: 34.5 s in one process, 20.8 s in two)
ASYNC_PER_PROCESS = 2
REPORT_EVERY_S = 0.25  # how often a worker reports the rounds its points have done


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on macOS)
        return os.cpu_count() or 1


def worker_processes(points: list, asked: int = 0) -> int:
    """How many processes step `points` (Point objects, not done): `asked` (`fedsim sweep
    --processes N`, 0: auto), at most one per point. Auto: one per POINTS_PER_PROCESS points (per
    ASYNC_PER_PROCESS asynchronous ones), at most one per core; one where a point trains on a GPU
    (one device shared by processes is not measured yet) or logs to MLflow (its study's parent
    run lives in the sweep's process)."""
    if asked:
        return max(1, min(asked, len(points)))
    import torch

    for point in points:
        run = point.config.run
        if run.device.startswith("cuda") or (run.device == "auto" and torch.cuda.is_available()) or \
                "mlflow" in run.trackers:
            return 1
    lone = sum(point.config.server.mode == "async" for point in points)
    shares = (len(points) - lone) // POINTS_PER_PROCESS + lone // ASYNC_PER_PROCESS
    return max(1, min(usable_cores(), shares))


def shares(points: list[tuple], processes: int) -> list[list[tuple]]:
    """`points` ((point, state) pairs, in their lockstep groups' order) cut into `processes` runs
    of neighbours with about equal rounds each, so that a group stays in as few shares as it can."""
    work = [p.config.run.rounds for p, _ in points]
    total, cuts, done = sum(work), [0], 0
    for i, rounds in enumerate(work):
        done += rounds
        if len(cuts) < processes and done >= total * len(cuts) / processes and i + 1 < len(points):
            cuts.append(i + 1)
    cuts.append(len(points))
    return [points[lo:hi] for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]


def run_points_together(study: Study, todo: list[tuple[Point, str]], plotter=None,
                        progress: bool = True, processes: int = 0) -> tuple[list[str], str]:
    """The in-process backend: the points not done, in the groups that can share a step
    (`lockstep_groups`, one note line when there are several), `TOGETHER` at a time, in
    lockstep with their cohorts trained in shared batched calls (fedsim/studies/lockstep.py);
    in this process, or in shares stepped by worker processes side by side (`processes`:
    `fedsim sweep --processes`, 0: `worker_processes`). Stops after a group that a signal
    interrupted. Their statuses, and what stopped them ("" if nothing did)."""
    state_of = {p.name: s for p, s in todo}
    groups, why = lockstep_groups([p for p, s in todo if s != "done"])
    if why and progress:
        print(why, file=sys.stderr, flush=True)
    waiting = [(p, state_of[p.name]) for group in groups for p in group]
    shown = StudyProgress([p.config.run.rounds for p, _ in waiting], len(todo), len(todo) - len(waiting),
                          progress and bool(waiting), label=study.name)
    statuses = {p.name: run_point(p.config, study.folder / p.name, s, plotter=plotter) for p, s in todo if s == "done"}
    workers = worker_processes([p for p, _ in waiting], processes)
    if workers > 1:
        ran, stopped_by = run_shares(study, shares(waiting, workers), shown, progress)
    else:
        ran, stopped_by = run_batches(study.folder, waiting, plotter, [shown.callback()], notes=progress)
    statuses.update(ran)
    shown.close()
    return [statuses.get(p.name, "interrupted") for p, _ in todo], stopped_by


def run_shares(study: Study, parts: list[list[tuple]], shown: StudyProgress,
               notes: bool = True) -> tuple[dict[str, str], str]:
    """Each of `parts` ((point, state) pairs) stepped by a worker process, its rounds and ends
    shown on `shown` (StudyProgress), its notes printed if `notes`; each point's status, and
    the signal that stopped them ("" if none). A worker's error (a point that failed) is raised
    once the others are done; a worker that dies stops the others after their round."""
    threads = max(1, usable_cores() // len(parts))
    workers = [_start(study, part, threads, len(parts), notes) for part in parts]
    statuses: dict[str, str] = {}
    stopped = {"name": ""}
    failure: list[str] = []

    def stop(signum, frame):
        first = not stopped["name"]
        stopped["name"] = stopped["name"] or STOP_SIGNALS[signum]
        _signal_all(workers, signum)
        if not first:
            raise Stopped(STOP_SIGNALS[signum])
        running = sum(len(part) for part in parts) - len(statuses)
        say_stopping(f"stopping: the {running} running points finish their round, then save their results and "
                     f"checkpoint ({stopped['name']} again to abort)")

    try:
        with on_stop_signals(stop):
            _gather(workers, shown, statuses, failure, stopped, study)
    finally:
        for worker in workers:
            _end(worker)
    if failure:
        others = f" (points of {len(failure) - 1} more worker process(es) failed too)" if len(failure) > 1 else ""
        raise FedsimError(failure[0] + others)
    return statuses, stopped["name"]


def _start(study: Study, part: list[tuple], threads: int, workers: int, notes: bool) -> subprocess.Popen:
    """A worker process for `part`, its points handed over on its stdin; it steps them in batches
    that fit in its share (1 / `workers`) of the machine's memory."""
    job = {"cwd": os.getcwd(), "threads": threads, "memory_share": 1 / workers, "notes": notes,
           "folder": str(study.folder.absolute()),
           "points": [(p.name, p.config.to_dict(), p.config.source, state) for p, state in part]}
    # the worker starts with the stop signals blocked (a mask survives exec): one passed on while
    # it starts waits until its handlers are in place (`serve`), instead of killing it mid-import
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, list(STOP_SIGNALS))
    try:
        worker = subprocess.Popen([sys.executable, "-m", "fedsim.studies.processes"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, start_new_session=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    worker.stdin.write(pickle.dumps(job))
    worker.stdin.close()
    worker.points = [p.name for p, _ in part]
    return worker


def _gather(workers, shown, statuses: dict, failure: list, stopped: dict, study) -> None:
    """Read every worker's reports until all have ended."""
    selector = selectors.DefaultSelector()
    for worker in workers:
        selector.register(worker.stdout, selectors.EVENT_READ, worker)
    live = len(workers)
    while live:
        for key, _ in selector.select(timeout=1.0):
            worker = key.data
            line = worker.stdout.readline()
            if not line:  # the worker ended
                selector.unregister(worker.stdout)
                live -= 1
                if not getattr(worker, "finished", False) and not failure and not stopped["name"]:
                    left = [name for name in worker.points if name not in statuses]
                    named = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
                    resume = study.resume_command()
                    failure.append(f"the worker process of points {named} ended without its results (killed, or "
                                   f"out of memory?); run `{resume}` to run them again from their last checkpoints, "
                                   f"or `{resume} --processes 1` to run the study in one process (one copy of "
                                   "its data)")
                    _signal_all(workers, signal.SIGTERM)
                continue
            report = json.loads(line)
            shown.rounds_done(report.get("rounds", 0))
            if "ended" in report:
                statuses[report["ended"]] = report["status"]
                shown.point_finished(report["ended"], report["status"])
            if "statuses" in report:
                worker.finished = True
                statuses.update(report["statuses"])
                stopped["name"] = stopped["name"] or report["stopped_by"]
            if "error" in report:  # (a point that failed: the other workers' points go on, as in one process)
                worker.finished = True
                failure.append(report["error"])
            if "aborted" in report:
                worker.finished = True
                if failure:  # our own SIGTERM after a worker died, which is raised once all end
                    continue
                raise Stopped(report["aborted"])
            if "bug" in report:
                worker.finished = True
                _signal_all(workers, signal.SIGTERM)
                raise RuntimeError(f"a worker process of the study failed:\n{report['bug']}")


def _signal_all(workers, signum: int) -> None:
    for worker in workers:
        if worker.poll() is None:
            try:
                worker.send_signal(signum)
            except ProcessLookupError:
                pass


def _end(worker: subprocess.Popen) -> None:
    """Wait for a worker that was told to stop (it finishes its round and checkpoints), then
    make sure it is gone."""
    try:
        worker.wait(timeout=600)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


# --- the worker ---------------------------------------------------------------------------------

class _Reports:
    """What a worker's points report, as `StudyProgress` takes it (`PointProgress` calls it):
    JSON lines to the sweep, the rounds at most every REPORT_EVERY_S. A sweep that is gone
    (killed) stops the worker as a SIGTERM would: its points finish their round and checkpoint,
    and `fedsim sweep --resume` goes on from there."""

    def __init__(self, out):
        self.out, self.rounds, self.last, self.orphan = out, 0, time.monotonic(), False

    def send(self, **report) -> None:
        if self.orphan:
            return
        try:
            self.out.write(json.dumps(report) + "\n")
            self.out.flush()
        except BrokenPipeError:
            self.orphan = True
            os.kill(os.getpid(), signal.SIGTERM)

    def rounds_done(self, n: int) -> None:
        self.rounds += n
        if time.monotonic() - self.last >= REPORT_EVERY_S:
            self.send(rounds=self.rounds)
            self.rounds, self.last = 0, time.monotonic()

    def point_finished(self, name: str, status: str) -> None:
        self.send(rounds=self.rounds, ended=name, status=status)
        self.rounds = 0


def serve() -> None:
    """A worker: run the points handed over on stdin in lockstep, report on stdout (the
    original one: anything else printed goes to stderr)."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    reporter = _Reports(out)
    try:
        with on_stop_signals(raise_stopped):  # (a run's rounds finish theirs: lockstep.run_together)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, list(STOP_SIGNALS))  # (blocked by `_start`)
            job = pickle.loads(sys.stdin.buffer.read())
            import torch

            from fedsim.config import config_from_dict
            from fedsim.studies.study import Point
            from fedsim.training.memory import PROCESS_SHARE

            torch.set_num_threads(job["threads"])
            PROCESS_SHARE[0] = job["memory_share"]
            os.chdir(job["cwd"])
            points = [(Point(name, {}, config_from_dict(raw, origin=origin)), state)
                      for name, raw, origin, state in job["points"]]
            folder = Path(job["folder"])
            statuses, stopped_by = run_batches(folder, points, None, [PointProgress(reporter)], announce_stop=False,
                                               notes=job["notes"])
        reporter.send(statuses=statuses, stopped_by=stopped_by)
    except Stopped as stop:
        reporter.send(aborted=stop.name)
    except FedsimError as err:
        reporter.send(error=str(err))
    except Exception:  # a bug: its traceback goes to the sweep
        reporter.send(bug=traceback.format_exc())
    try:
        out.close()
    except BrokenPipeError:
        pass
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    serve()
