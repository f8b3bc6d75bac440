"""What happens around the simulation, round by round: evaluation, the recorder, the progress
bar, checkpoints, and whatever a user adds (early stopping, extra metrics, outputs).

A callback gets the Experiment (``run``: its config, run_dir, task, strategy and
``evaluate()``) and the metrics gathered so far for the round; it returns ``(stop, metrics)``:
new metrics join the round's row of rounds.parquet, and a true ``stop`` (or a string saying
why) ends the run after this round, with status "completed". The run calls them in order:
evaluation, the user's callbacks, the recorder, the progress bar, the trackers, checkpoints.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from fedsim.results.report import duration

if TYPE_CHECKING:
    from fedsim.runs.experiment import Experiment
    from fedsim.sim.engine import EngineResult
    from fedsim.sim.server import RoundOutcome

Metrics = dict[str, Any]


class Callback:
    """Override what you need; every hook is optional."""

    def on_start(self, run: Experiment, metrics: Metrics) -> Metrics:
        """Before the first round (of this process: `run.resumed` says whether the run goes on
        from a checkpoint)."""
        return {}

    def on_round(self, run: Experiment, outcome: RoundOutcome, metrics: Metrics) -> tuple[bool | str, Metrics]:
        """After each round: `(stop, metrics)`; the metrics join the round's row, a true
        `stop` (or a string saying why) ends the run after this round."""
        return False, {}

    def on_end(self, run: Experiment, result: EngineResult, metrics: Metrics) -> Metrics:
        """After the last round; returned metrics complete the last round's row."""
        return {}

    def on_saved(self, run: Experiment, result: EngineResult) -> None:
        """Once the run's files are written (model.pt, manifest.json, events.parquet): for
        callbacks that copy them somewhere (the MLflow tracker's artifacts)."""

    def on_failed(self, run: Experiment, error: Exception) -> None:
        """The run raised (a bug, fedsim's or a plugin's): it keeps its last checkpoint and
        no `on_end` comes. For callbacks that hold something open (a tracker's run, which
        ends FAILED)."""


class Evaluation(Callback):
    """Test loss and accuracy of the global model: at the start (the initial model), every
    `eval_every` rounds and the last round, and at a stop that came between evaluations."""

    def on_start(self, run, metrics):
        if run.resumed:
            return {}
        loss, acc = run.evaluate()
        return {"initial": {"test_loss": loss, "test_acc": acc, "t": run.start_time}}

    def on_round(self, run, outcome, metrics):
        if not run.evaluation_due(outcome.round):
            return False, {}
        loss, acc = run.evaluate()
        return False, {"test_loss": loss, "test_acc": acc}

    def on_end(self, run, result, metrics):
        last = run.recorder.rows[-1] if run.recorder.rows else None
        if last is None or last["test_loss"] is not None or result.status == "diverged":
            return {}
        loss, acc = run.evaluate()
        return {"test_loss": loss, "test_acc": acc}


class RecordRounds(Callback):
    """The recorder: every round's row, counters and events; the initial evaluation."""

    def on_start(self, run, metrics):
        if "initial" in metrics:
            run.recorder.initial = metrics["initial"]
        return {}

    def on_round(self, run, outcome, metrics):
        run.recorder.add_round(outcome, {**run.strategy.metrics(), **metrics})
        return False, {}

    def on_end(self, run, result, metrics):
        if metrics and run.recorder.rows:
            run.recorder.rows[-1].update(metrics)
        return {}


class ProgressBar(Callback):
    """A progress bar on a terminal; elsewhere (a log file, a batch job) a line at every tenth of
    the rounds, so that a log holds no redrawn bars."""

    def __init__(self):
        self.bar, self.acc, self.every = None, "-", 0

    def on_start(self, run, metrics):
        cfg = run.config
        last = next((row["test_acc"] for row in reversed(run.recorder.rows) if row.get("test_acc") is not None), None)
        self.acc = "-" if last is None else f"{100 * last:.1f}%"  # (a resumed run's last evaluation)
        if sys.stderr.isatty():
            self.bar = tqdm(total=cfg.run.rounds, initial=run.start_round, desc=cfg.algorithm.name,
                            unit="round", leave=False, dynamic_ncols=True)
        else:
            self.every = max(1, (cfg.run.rounds - run.start_round) // 10)
        return {}

    def on_round(self, run, outcome, metrics):
        if metrics.get("test_acc") is not None:
            self.acc = f"{100 * metrics['test_acc']:.1f}%"
        if self.bar is not None:
            self.bar.set_postfix_str(f"t={duration(outcome.t_end)} acc={self.acc}", refresh=False)
            self.bar.update(1)
        elif (outcome.round + 1 - run.start_round) % self.every == 0:
            print(f"  {run.config.algorithm.name}: {outcome.round + 1}/{run.config.run.rounds} rounds "
                  f"(simulated {duration(outcome.t_end)}, test acc {self.acc})", flush=True)
        return False, {}

    def on_end(self, run, result, metrics):
        if self.bar is not None:
            self.bar.close()
        return {}


class Checkpoints(Callback):
    """A checkpoint every `[run] checkpoint_every` rounds and at the end."""

    def on_round(self, run, outcome, metrics):
        if run.checkpoint_due(outcome.round):
            run.checkpoint(outcome.round + 1, outcome.t_end)
        return False, {}

    def on_end(self, run, result, metrics):
        run.checkpoint(result.rounds, result.sim_time)
        return {}


class EarlyStopping(Callback):
    """Stop once the test accuracy reaches `target` (a fraction, e.g. 0.9)."""

    def __init__(self, target: float):
        self.target = target

    def on_round(self, run, outcome, metrics):
        acc = metrics.get("test_acc")
        if acc is not None and acc >= self.target:
            return f"test accuracy {100 * acc:.2f}% reached the target {100 * self.target:g}%", {}
        return False, {}


__all__ = ["Callback", "Checkpoints", "EarlyStopping", "Evaluation", "ProgressBar", "RecordRounds"]
