"""The in-process backend of a study: its runs in one process, stepped together so that their cohorts train in shared
batched calls (a study of many small runs fills a device the way one large cohort does).

Each run keeps its own SimPy environment, engine, strategy and outputs, exactly as alone; the
only difference is where its round's training happens. A run's server asks its gate to train
and waits on an event; the driver steps every run until each waits on its gate (or has
ended), trains all the waiting cohorts with `train_together`, hands each run its result, and
goes on. Runs whose rounds differ in length simply wait for each other at the training step.
Asynchronous runs train on their own (their server has no gate).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import simpy
import torch

from fedsim.errors import FedsimError, first_line
from fedsim.files import human_size, resume_command
from fedsim.runs.experiment import Experiment, RunResult, prepare_resume, resume_overrides
from fedsim.sim.receive import receive_together
from fedsim.sim.engine import finish_round_on_stop_signal
from fedsim.sim.server import Server
from fedsim.studies.point import clear_for_new_run
from fedsim.traces.index import same_availability
from fedsim.training.memory import NoRoomBeside, beside, budget_text, held_in_lockstep
from fedsim.training.cohort import train_together
from fedsim.training.group_eval import evaluate_together

if TYPE_CHECKING:
    from fedsim.studies.study import Point, Study


def rounding_allowed(device: torch.device) -> bool:
    """Whether a group's runs may differ from their runs alone by float rounding, so that its
    due evaluations run in one call and its runs of one algorithm aggregate in one batched step:
    on a GPU, where lockstep runs equal the runs alone to float rounding anyway (their training
    is stacked); on a CPU each run evaluates and aggregates alone, so that a study's point equals
    its run alone bit for bit."""
    return device.type == "cuda"


class TrainGate:
    """Holds a run's training (or evaluation, or receive of its arrivals) request until the
    driver does it with the others'."""

    def __init__(self, env: simpy.Environment, rounding: bool = False):
        self.env = env
        self.rounding_allowed = rounding  # (`rounding_allowed`)
        self.pending: tuple | None = None
        self.kind = ""  # what is pending: "train", "receive" or "evaluate"
        self.event: simpy.Event | None = None

    def request(self, server: Server, rnd, ids, start, steps, lr) -> simpy.Event:
        objective = server.strategy.local_objective_of(ids)
        return self._wait("train", (server.trainer, rnd, ids, start, steps, lr, objective))

    def request_receive(self, strategy, arrivals) -> simpy.Event:
        return self._wait("receive", (strategy, arrivals))

    def request_evaluation(self, task, params) -> simpy.Event:
        return self._wait("evaluate", (task, params))

    def _wait(self, kind: str, pending: tuple) -> simpy.Event:
        self.kind, self.pending = kind, pending
        self.event = self.env.event()
        return self.event

    def resolve(self, result) -> None:
        """Hand the run its result: an exception (its own plugin's, say) is raised where it waits."""
        self.pending = None
        if isinstance(result, Exception):
            self.event.fail(result)
        else:
            self.event.succeed(result)


def run_together(experiments: Sequence[Experiment], resumes: Sequence[dict | None] = (),
                 announce_stop: bool = True, stop_signal: dict | None = None) -> list[RunResult | Exception]:
    """Run `experiments` (each from its checkpoint state in `resumes`, if given) in lockstep;
    their results, in order: a run that raised (its plugin's bug, a mistake found mid-run) gives
    its exception, and the others go on. Ctrl-C or SIGTERM stops every run after its round in
    progress (`announce_stop`: with a line saying so; a worker process leaves that to the sweep),
    and sets `stop_signal`'s name (the caller's: one that came once the runs had done their
    rounds stops the study too); the runs then save without drawing their plots."""
    resumes = list(resumes) or [None] * len(experiments)
    stop_signal = {"name": None} if stop_signal is None else stop_signal
    runs = f"the {len(experiments)} running points finish" if len(experiments) > 1 else "the running point finishes"
    notice = f"stopping: {runs} their round, then save their results and checkpoint" if announce_stop else ""
    try:
        with experiments[0].threads.scope(), finish_round_on_stop_signal(stop_signal, notice):
            share_indexes(experiments)
            engines = [e.start(r, stop_signal) for e, r in zip(experiments, resumes)]
            for engine in engines:
                if type(engine.server) is Server:
                    engine.server.gate = TrainGate(engine.env, rounding_allowed(engine.server.device))
            failed = step_together(engines, experiments[0].threads)
            results = []
            for experiment, engine in zip(experiments, engines):
                if engine in failed:  # its folder keeps its last checkpoint, as a crash leaves it
                    experiment.failed(failed[engine])
                    results.append(failed[engine])
                else:
                    results.append(experiment.end(plot_interrupted=False, plots=not stop_signal["name"]))
            return results
    except BaseException:  # a run that raised: its directory is left as a crash leaves it, free to resume
        for experiment in experiments:
            experiment.lock.release()
        raise


def share_indexes(experiments: Sequence[Experiment]) -> None:
    """Runs that replay the same trace share one availability index: who is online at a
    round's start is looked up once for all of them (the index keeps its last answer, and
    lockstep runs ask at the same instants under ideal timing), and the group holds one
    index, not one per run. The index's answers depend on the trace alone, so each run's
    numbers are its own."""
    kept = []
    for experiment in experiments:
        same = next((index for index in kept if same_availability(index.trace, experiment.trace)), None)
        if same is None:
            kept.append(experiment.index)
        else:
            experiment.index = same


def step_together(engines, threads) -> dict:
    """Step each engine until it waits at its gate, serve what the gates hold in shared calls,
    until every engine is done; the exception of each engine whose run raised (by engine), which
    the others outlive. The receive steps and evaluations (a GPU's) are served first, again and
    again, until every run waits to train: a run that trained nobody in a round asks to receive
    before the others do, and would otherwise train a round apart from them from then on."""
    live, failed = engines, {}
    while live:
        waiting = _step_to_gates(live)
        while others := [g for g in waiting if g.kind != "train"]:
            receiving = [g for g in others if g.kind == "receive"]
            for gate, received in zip(receiving, receive_together([g.pending for g in receiving])):
                gate.resolve(received)
            evaluating = [g for g in others if g.kind == "evaluate"]
            if evaluating:
                for gate, result in zip(evaluating, evaluate_together([g.pending for g in evaluating], threads)):
                    gate.resolve(result)
            waiting = _step_to_gates(live)
        for gate, result in zip(waiting, train_together([g.pending for g in waiting])):
            gate.resolve(result)
        failed.update(failures(live))
        live = [e for e in live if not e.process.triggered]
    return failed


def _step_to_gates(engines) -> list[TrainGate]:
    """Step each engine until it waits at its gate (or is done); the gates that wait."""
    for engine in engines:
        gate = engine.server.gate
        while not engine.process.triggered and (gate is None or gate.pending is None):
            engine.env.step()
    return [e.server.gate for e in engines if e.server.gate is not None and e.server.gate.pending]


def failures(engines) -> dict:
    """The exception of each engine whose run raised: stepped together, an engine is left once
    its process is done, before SimPy would raise what ended it, and its run would read as
    completed. A second Ctrl-C or SIGTERM (not an Exception) stops every run at once."""
    found = {}
    for engine in engines:
        if engine.process.triggered and not engine.process.ok:
            if not isinstance(engine.process.value, Exception):
                raise engine.process.value
            engine.process.defused = True
            found[engine] = engine.process.value
    return found


TOGETHER = 64  # points stepped in lockstep at once by the in-process backend

# The config keys whose values the runs of a lockstep group share, so that their cohorts can
# train in one call (training/cohort.py `cohort_key`: the dataset, the model and its shape, the
# batch and local-update settings, the device; an asynchronous run trains on its own). Points
# that differ in one of them never share a call: a study runs them as separate groups.
SHARED_KEYS = ("data.dataset", "data.root", "data.vocab_size", "data.tokens", "data.feature_column",
               "data.label_column", "data.classes", "data.dim", "data.noise", "model.name", "model.hidden",
               "model.dropout", "model.word_vectors", "model.local_buffers", "client.batch_size",
               "client.trainer", "client.clip", "client.weight_decay", "run.device", "server.mode")


def _value(config, dotted: str):
    section, key = dotted.split(".")
    value = getattr(getattr(config, section), key)
    return tuple(value) if isinstance(value, list) else value


def lockstep_groups(points: list[Point]) -> tuple[list[list[Point]], str]:
    """`points` in groups whose runs can share a step (equal `SHARED_KEYS`), in the order of
    their first point, and one line saying how they split and why ("" for one group)."""
    groups: dict[tuple, list[Point]] = {}
    for point in points:
        groups.setdefault(tuple(_value(point.config, k) for k in SHARED_KEYS), []).append(point)
    if len(groups) < 2:
        return list(groups.values()), ""
    keys = list(groups)
    differ = [f"{name} ({', '.join(dict.fromkeys(_shown(key[i]) for key in keys))})"
              for i, name in enumerate(SHARED_KEYS) if len({key[i] for key in keys}) > 1]
    sizes = [str(len(g)) for g in groups.values()]
    return list(groups.values()), (f"note: the {len(points)} points run as {len(groups)} lockstep groups "
                                   f"({', '.join(sizes[:-1])} and {sizes[-1]} points): runs "
                                   f"that differ in {' or '.join(differ)} cannot train in one call")


def _shown(value) -> str:
    """A config value as the study file writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def run_batches(folder: Path, waiting: list[tuple[Point, str]], plotter, callbacks,
                announce_stop: bool = True, notes: bool = True) -> tuple[dict[str, str], str]:
    """`waiting` ((point, state) pairs, in their groups' order) stepped in lockstep, up to `TOGETHER`
    points of one group at a time, as many as fit in memory beside each other (`_next_batch`);
    each point's status, and the signal that stopped them ("" if none: a signal stops them
    after the batch it interrupted). `notes`: a line when a group runs in smaller batches. A
    point whose run raised keeps its last checkpoint while the others go on; the first such
    point's line is raised once they are done."""
    state_of = {p.name: s for p, s in waiting}
    statuses: dict[str, str] = {}
    failed: list[str] = []
    stop_signal = {"name": None}  # (one for all batches: a signal as a batch saves stops the next)
    for batch, experiments, resumes in _batches(lockstep_groups([p for p, _ in waiting])[0], state_of, folder,
                                                plotter, callbacks, notes):
        for point, result in zip(batch, run_together(experiments, resumes, announce_stop, stop_signal)):
            if isinstance(result, Exception):
                failed.append(point_failure(folder, point.name, result))
            else:
                statuses[point.name] = result.status
        if stop_signal["name"]:
            break
    stopped_by = f"interrupted by {stop_signal['name']}" if stop_signal["name"] else ""
    if failed:
        raise FedsimError(failed[0] + (f" ({len(failed) - 1} more points failed)" if len(failed) > 1 else ""))
    return statuses, stopped_by


def _batches(groups: list[list[Point]], state_of: dict, folder: Path, plotter, callbacks, notes: bool):
    """Each group's points in batches that step together: (points, their experiments, their
    checkpoint states), prepared as each batch comes."""
    for group in groups:
        left, noted = list(group), False
        while left:
            experiments, resumes = _next_batch(left, state_of, folder, plotter, callbacks)
            if len(experiments) < min(len(left), TOGETHER) and notes and not noted:
                print(_memory_note(len(group), experiments), file=sys.stderr, flush=True)
                noted = True
            batch, left = left[:len(experiments)], left[len(experiments):]
            yield batch, experiments, resumes


def point_failure(folder: Path, name: str, error: Exception) -> str:
    """The line of a point whose run raised, which keeps its last checkpoint: a mistake fedsim
    found, or a bug (its traceback saved in the point's error.txt)."""
    go_on = f"; fix that, then run `{resume_command('sweep', folder)}` to go on from its last checkpoint"
    if isinstance(error, FedsimError):
        return f"point {name}: {error}{go_on}"
    log = folder / name / "error.txt"
    log.write_text("".join(traceback.format_exception(error)))
    return f"point {name}: its run failed with {type(error).__name__}: {first_line(error)} (traceback: {log}){go_on}"


def _next_batch(points: list[Point], state_of: dict, folder: Path, plotter,
                callbacks) -> tuple[list[Experiment], list[dict | None]]:
    """The experiments (and checkpoint states) of the first of `points` that step together: up to
    `TOGETHER`, and no more than fit in this process's memory beside each other (their cohorts'
    parameters and their algorithms' state are held at once); the first always."""
    experiments, resumes, held = [], [], 0
    for point in points[:TOGETHER]:
        try:
            with beside(held):
                experiment, resume_state = _prepare(point, state_of[point.name], folder / point.name, plotter,
                                                    callbacks)
        except NoRoomBeside:  # it runs in the next batch
            break
        except FedsimError as err:  # a check of the run's build (memory, cohort size): name the point
            raise FedsimError(f"point {point.name}: {err}") from None
        experiments.append(experiment)
        resumes.append(resume_state)
        held += held_in_lockstep(experiment.memory_needs)
    return experiments, resumes


def _memory_note(points: int, batch: list[Experiment]) -> str:
    """One line saying that a group's points run a few at a time, and why."""
    each = human_size(max(held_in_lockstep(e.memory_needs) for e in batch))
    return (f"note: the {points} points of a lockstep group run in batches that fit in memory ({len(batch)} in the "
            f"first): beside each other their cohorts' parameters and algorithms' state (up to {each} a point) must "
            f"fit in {budget_text(batch[0].device)}; each point's numbers are the same")


def _prepare(point: Point, state: str, run_dir, plotter, callbacks) -> tuple[Experiment, dict | None]:
    """A point's experiment, fresh or resumed from its checkpoint (and that checkpoint)."""
    (run_dir / "error.txt").unlink(missing_ok=True)  # an earlier failure's traceback
    if state == "resume":
        return prepare_resume(run_dir, resume_overrides(point.config), False, plotter, callbacks)
    clear_for_new_run(run_dir)
    return Experiment(point.config, run_dir, False, plotter=plotter, callbacks=callbacks), None
