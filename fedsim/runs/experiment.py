"""Wires a Config into one simulation and runs it: trace + index, task (data, partition,
model), trainer, strategy, round timing, engine, and the callbacks around it (evaluation,
recorder, progress bar, checkpoints, the user's own). Several algorithms side by side:
fedsim/runs/comparison.py; which trace is replayed: fedsim/runs/replay.py; manifest.json:
fedsim/results/manifest.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import polars as pl
import torch

from fedsim.algorithms import Context, Strategy, make_strategy, planned_state
from fedsim.algorithms.server_optimizer import ServerOptimizerConfig
from fedsim.runs.callbacks import Callback, Checkpoints, Evaluation, ProgressBar, RecordRounds
from fedsim.config.schema import absolute_file_keys, absolute_out, blamed, model_options
from fedsim.config import (RESUME_KEYS, AlgorithmConfig, Config, check_cohort_size, config_from_dict, dump_toml,
                           read_toml)
from fedsim.config.catalog import GENERATORS
from fedsim.config.registry import plugin_files
from fedsim.data.cache import source_digest
from fedsim.errors import FedsimError
from fedsim.files import DirectoryLock, file_fingerprint, human_duration, plain_name, remove_stale_temporaries
from fedsim.runs.replay import (TraceRecord, check_trace_file, load_trace, recorded_trace, resolve_trace_path,
                                hashes, trace_fingerprint)
from fedsim.results.manifest import incomplete_outputs, session, write_manifest
from fedsim.results.plot_worker import PlotWorker
from fedsim.results.plots import draw_plots
from fedsim.results.recorder import Recorder, save_torch, write_text
from fedsim.results.run_format import RUN_FORMAT, read_checkpoint, read_manifest, run_config, upgrade
from fedsim.sim.buffered import BufferedServer
from fedsim.sim.engine import Engine, EngineResult, finish_round_on_stop_signal, new_environment
from fedsim.sim.round_timing import invite_budget
from fedsim.sim.server import Server
from fedsim.sim.timing import SPEED_COLUMNS, DeviceTiming, device_rows
from fedsim.traces.index import availability_index
from fedsim.traces.generators import known_probability_at
from fedsim.traces.io import read_device_table
from fedsim.traces.stats import device_online_fraction
from fedsim.training import ThreadPolicy, build_task, build_trainer
from fedsim.training.rules import CURRENT as CURRENT_RULES
from fedsim.training.memory import State, check_memory
from fedsim.training.work import check_task_steps
from fedsim.training.schedules import learning_rate
from fedsim.runs.trackers import check_trackers, tracker_callbacks
from fedsim.training.warm_start import check_resumable, initial_params, model_file, model_layout


@dataclass
class RunResult:
    """What a run produced; for several algorithms, `runs` holds one result per algorithm."""

    run_dir: Path
    algorithm: str
    status: str
    reason: str
    rounds: pl.DataFrame
    params: torch.Tensor | None = None
    runs: list["RunResult"] = field(default_factory=list)

    def __repr__(self) -> str:  # (not the model's numbers nor the whole table)
        runs = f", runs=[{', '.join(r.algorithm for r in self.runs)}]" if self.runs else ""
        return (f"RunResult(run_dir={str(self.run_dir)!r}, algorithm={self.algorithm!r}, status={self.status!r}, "
                f"reason={self.reason!r}, rounds=<{len(self.rounds)} rows>{runs})")

    @property
    def final_accuracy(self) -> float | None:
        accs = self.rounds["test_acc"].drop_nulls()
        return float(accs[-1]) if len(accs) else None

    @property
    def final_loss(self) -> float | None:
        losses = self.rounds["test_loss"].drop_nulls()
        return float(losses[-1]) if len(losses) else None


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise FedsimError("[run] device = 'cuda' but torch sees no CUDA GPU; use 'auto' or 'cpu'")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def server_optimizer_config(algorithm: AlgorithmConfig) -> ServerOptimizerConfig:
    a = algorithm
    return ServerOptimizerConfig(a.server_optimizer, a.server_lr, a.server_momentum, a.server_beta1,
                                 a.server_beta2, a.server_eps)


def check_min_selected(config: Config, index) -> None:
    """FLASH's min_selected waits for that many devices online at once: a trace that never has
    them would end the run before its first round."""
    count = config.server.min_selected
    if count and math.isinf(index.next_online_count(count, 0.0)):
        raise FedsimError(
            f"{config.origins.get(('server', 'min_selected'), config.source)}: [server] min_selected = {count}: the "
            f"trace never has {count} devices online at once (at most {index.most_online()}, over its "
            f"{human_duration(index.horizon)}), so no round could start; lower it, or replay a trace where that many "
            "are online together")


def check_async_deadline(config: Config, task_s: np.ndarray, ever_online: np.ndarray) -> None:
    """Buffered aggregation waits for `buffer` arrivals: where no device that is ever online can
    finish its first task (`task_s`, per device) within the deadline, none ever arrives and
    the run would invite devices forever."""
    deadline = config.server.deadline
    where = f"{config.origins.get(('server', 'deadline'), config.source)}: [server] deadline = {deadline:g} s"
    fix = "raise the deadline, lower [client] local_steps, or speed up [devices] (docs/timing.md)"
    if task_s.min() > deadline:
        raise FedsimError(
            f"{where} is shorter than any device's quickest task ({human_duration(float(task_s.min()))}: download, "
            f"its local steps, upload), so in mode = 'async' no update would ever arrive and the buffer never "
            f"fills; {fix}")
    quick = np.flatnonzero(task_s <= deadline)
    if not ever_online[quick].any():
        shown = ", ".join(map(str, quick[:5])) + (f" and {len(quick) - 5} more" if len(quick) > 5 else "")
        raise FedsimError(
            f"{where}: only device{'s' * (len(quick) > 1)} {shown} finish{'' if len(quick) > 1 else 'es'} a task "
            f"within it, and the trace never has {'them' if len(quick) > 1 else 'it'} online, so in mode = 'async' "
            f"no update would ever arrive and the buffer never fills; {fix}")


def callback_metrics(callback, method: str, metrics) -> dict:
    """What a user's callback method returned as metrics: a dict, or None for none."""
    if metrics is None:
        return {}
    if not isinstance(metrics, dict):
        raise FedsimError(f"callback {type(callback).__name__}: {method} returned {metrics!r}, not a dict of metrics; "
                          "return {} (or None) for none (docs/extending.md, \"Callbacks\")")
    return metrics


class Experiment:
    """One algorithm on one trace/task: builds the parts once, then `run()`s the engine.

    Callbacks see it as `run`: `config`, `run_dir`, `task`, `strategy`, `recorder`,
    `evaluate()`, `start_round`, `start_time`, `resumed`."""

    def __init__(self, config: Config, run_dir: Path, progress: bool = True,
                 trace_record: TraceRecord | None = None, plotter: PlotWorker | None = None,
                 callbacks: Sequence[Callback] = (), resuming: bool = False, rules: int = CURRENT_RULES,
                 started_options: dict | None = None):
        """`trace_record`: the generated trace of the run being resumed. A resume generates the
        trace again for its (maybe longer) extent and keeps that when it agrees with the
        recorded one; otherwise it replays the recorded trace, repeating it. `callbacks`: the user's own,
        called after the evaluation and before the recorder. `resuming`: the checkpoint holds
        the model, so a warm start's `[model] init_from` is not read again (it may be gone).
        `rules`: the training rules the run started under (fedsim/training/rules.py).
        `started_options`: the options the resumed run started with, defaults included
        (`options_in_use`): those the config does not give keep their values, whatever this
        release's defaults."""
        check_trackers(config, Path(run_dir) / "mlflow.json")  # before anything is read or written: a tracker that cannot log stops here
        self.resuming, self.rules = resuming, rules
        self.started_options = started_options or {}
        self.lock = DirectoryLock(run_dir)
        self.config = config = resolve_trace_path(config)
        self.run_dir = Path(run_dir)
        self.progress = progress and config.run.progress
        self.plotter = plotter
        self.user_callbacks = list(callbacks)
        # the config whose plugins' folders the manifest records (a comparison's: every algorithm's,
        # so that `--resume` from another directory imports those not yet started)
        self.plugins_of = dataclasses.asdict(config)
        self.evaluated: tuple[float, float | None] | None = None  # this round's, done with other runs
        self.device = resolve_device(config.run.device)
        cfg = config
        # a model plugin's own keys, its defaults included (or the run's own, where it resumes)
        self.model_options = {**(model_options(cfg.model.name) or {}),
                              **self.started_options.get("model", {}), **cfg.model.options}
        model = dataclasses.replace(cfg.model, options=self.model_options)
        self.task = build_task(cfg.data, model, seed=cfg.run.seed, device=self.device, rules=rules,
                               fits=lambda sizes, dim: check_memory(cfg, self.device, len(sizes), dim,
                                                                    self.planned_state(cfg, sizes, dim)))
        check_cohort_size(cfg.server, self.task.n_clients)
        # the files of a dataset read from [data] root (Parquet, LEAF): a resume checks them
        self.data_sha256 = source_digest(Path(cfg.data.root)) if cfg.data.root else None
        self.threads = ThreadPolicy(cfg.run.threads, self.device, rules)
        self.trainer = build_trainer(self.task, cfg.client, seed=cfg.run.seed, threads=self.threads,
                                     deterministic=cfg.run.deterministic, tf32=cfg.run.tf32)
        check_task_steps(cfg, self.task, self.trainer)  # before a trace of the run's length is made
        self.trace, self.trace_device = load_trace(cfg, self.task.n_clients,
                                                   self.task.label_distribution(), trace_record)
        self.index = availability_index(self.trace)
        if not resuming:
            check_min_selected(cfg, self.index)
        # a resume checks that the trace is still this one: a file by its bytes, a generated
        # trace (recorded by its generator's call, in the manifest) by its intervals
        generated = cfg.trace.source != "file"
        self.trace_file = None if generated else file_fingerprint(Path(cfg.trace.path))
        self.trace_fingerprint = trace_fingerprint(self.trace) if generated else None
        self.fingerprint_of = hashes(self.trace) if generated else None
        self.device_table = self.read_device_table(cfg)
        self.train_flops = self.recorded_train_flops() if resuming else None
        if self.train_flops is None:
            self.train_flops = self.task.train_flops_per_sample()
        self.timing = DeviceTiming.build(cfg.devices, self.task.n_clients, cfg.run.seed,
                                         train_flops=self.train_flops,
                                         table=self.device_table, where=f"device table {cfg.trace.devices_table}")
        self.strategy = self.set_up_strategy(cfg)
        if cfg.server.mode == "async":
            ever_online = device_online_fraction(self.trace, self.trace.horizon) > 0
            check_async_deadline(cfg, self.first_task_s(), ever_online)

    def recorded_train_flops(self) -> float | None:
        """The training FLOPs per sample a resumed run was timed with (its manifest's): a later
        release may count the module's ops otherwise, and the run must go on at its own cost."""
        recorded = read_manifest(self.run_dir, strict=False).get("train_flops_per_sample")
        return recorded if isinstance(recorded, (int, float)) and not isinstance(recorded, bool) else None

    def set_up_strategy(self, cfg: Config) -> Strategy:
        """The strategy of `cfg` on this experiment's task and trace; a comparison calls this for
        every algorithm first, so that one that cannot run here fails before any has run."""
        task = self.task  # its state is allocated only once it is known to fit
        self.memory_needs = check_memory(cfg, self.device, task.n_clients, task.dim,
                                         self.planned_state(cfg, task.client_sizes(), task.dim), task, self.trainer)
        strategy = make_strategy(cfg.algorithm.name, origin=cfg.source)
        if cfg.model.init_from and not self.resuming:  # the run it starts from: of a format this release reads
            read_manifest(model_file(cfg).parent, strict=False)
        params = task.init_params() if self.resuming else initial_params(task, cfg)
        try:
            strategy.setup(task.n_clients, params, self._context(cfg))
        except FedsimError as err:  # its own options' checks: named with where they were set
            raise FedsimError(blamed(str(err), cfg)) from None
        return strategy

    def planned_state(self, cfg: Config, sizes: np.ndarray, dim: int) -> State:
        """The state `cfg`'s algorithm would keep for devices of `sizes` samples and a model of
        `dim` floats, measured without allocating it."""
        return planned_state(cfg.algorithm.name, self._plain_context(cfg, sizes, dim), cfg.source)

    def _plain_context(self, cfg: Config, sizes: np.ndarray, dim: int) -> Context:
        """The Context of what the config says, before the trace and the trainer are built."""
        return Context(
            n_devices=len(sizes), dim=dim, device=self.device,
            seed=cfg.run.seed, server_lr=cfg.algorithm.server_lr, local_steps=cfg.client.local_steps,
            server_optimizer=server_optimizer_config(cfg.algorithm),
            clients_per_round=cfg.server.clients_per_round, invite=invite_budget(cfg.server),
            options={**self.started_options.get("algorithm", {}), **cfg.algorithm.options},
            lr=lambda t: learning_rate(cfg.client, t),
            client_sizes=sizes, selection=cfg.algorithm.selection or self.started_options.get("selection", ""),
        )

    def _context(self, cfg: Config) -> Context:
        trace = self.trace
        def known_p(t: float) -> np.ndarray:
            return known_probability_at(trace, t)

        return dataclasses.replace(self._plain_context(cfg, self.task.client_sizes(), self.task.dim),
                                   device_steps=self.trainer.epoch_steps(), known_p=known_p,
                                   **self._extra_context())

    def _extra_context(self) -> dict:
        """Context fields that only some versions of the Strategy interface declare."""
        names = {f.name for f in dataclasses.fields(Context)}
        extra = {}
        if "train_pooled" in names and hasattr(self.trainer, "train_pooled"):
            extra["train_pooled"] = self.trainer.train_pooled
        return extra

    def callbacks(self) -> list[Callback]:
        progress = [ProgressBar()] if self.progress else []
        trackers = tracker_callbacks(self.config.run.trackers)
        # trackers before the checkpoint, so that what they flush there is kept by a resume
        return [Evaluation(), *self.user_callbacks, RecordRounds(), *progress, *trackers, Checkpoints()]

    def run(self, resume: dict | None = None) -> RunResult:
        """The whole simulation (from the checkpoint state `resume`, if given)."""
        stop_signal = {"name": None}
        try:
            with self.threads.scope():
                with finish_round_on_stop_signal(stop_signal):  # its outputs too are written whole
                    engine = self.start(resume, stop_signal)
                    engine.env.run(until=engine.process)
                    return self.end()
        except Exception as err:
            self.failed(err)
            raise
        finally:
            self.lock.release()

    def failed(self, error: Exception) -> None:
        """After the run raised: the callbacks that hold something open close it (`on_failed`:
        an MLflow run ends FAILED, not RUNNING), and the run directory is free again; its
        files are as its last checkpoint left them."""
        for callback in getattr(self, "chain", ()):
            try:
                callback.on_failed(self, error)
            except Exception as err:  # (the run's own error is the one to report)
                print(f"warning: {self.run_dir}: {type(callback).__name__}.on_failed raised {err!r}",
                      file=sys.stderr, flush=True)
        self.lock.release()

    def start(self, resume: dict | None, stop_signal: dict) -> Engine:
        """Everything before the first round, and the engine that will run the rounds (run
        alone by `run`, or with other runs' engines by fedsim/studies/lockstep.py). The run directory is
        this process's until `end` (or the process ends)."""
        cfg = self.config
        self.model_layout = model_layout(self.task)  # what checkpoints record of the model
        if resume is not None:
            check_same_data(resume.get("data_sha256"), self.data_sha256, self.config.data.root)  # (before the
            check_resumable(resume.get("model"), self.model_layout, str(self.run_dir / "checkpoint.pt"))  # model's)
        self.lock = DirectoryLock(self.run_dir)
        study = self.run_dir.parent.parent if self.run_dir.parent.name == "warm-start" else self.run_dir.parent
        in_study = (study / "study.toml").is_file()  # a point of a study, or one of its warm-start runs
        self.lock.acquire("fedsim sweep" if in_study else "fedsim resume" if resume else "fedsim run")
        started = time.perf_counter()
        previous_s = resume["host_s"] if resume else 0.0
        self._host_s = lambda: previous_s + time.perf_counter() - started
        self.recorder = Recorder(self.run_dir, self.task.n_clients, self.device_info(), cfg.run.events)
        self.resumed = resume is not None
        self.start_round, self.start_time = (resume["round"], resume["sim_time"]) if resume else (0, 0.0)
        # outputs (a tracker's log) that lack rounds, by name: the trackers complete or add to them
        self.incomplete_outputs = incomplete_outputs(self.run_dir) if self.resumed else {}
        remove_stale_temporaries(self.run_dir)
        # config.toml and the checkpoints name files and folders absolutely: --resume goes on from any directory
        self.recorded_config = cfg.to_dict()
        absolute_file_keys(self.recorded_config, cfg.source)
        absolute_out(self.recorded_config)
        write_text(self.run_dir / "config.toml", dump_toml(self.recorded_config))
        env = new_environment(self.start_time)
        server_class = BufferedServer if cfg.server.mode == "async" else Server
        self.server = server_class(
            env=env, index=self.index, strategy=self.strategy, trainer=self.trainer,
            timing=self.timing, cfg=cfg.server,
            client_sizes=self.task.client_sizes(),
            seed=cfg.run.seed, device=self.device, work=cfg.client.work,
            counts_cut_rounds=self.rules < 11,
        )
        if resume is not None:
            self.restore(resume)
        self.plugin_files = plugin_files(dataclasses.asdict(cfg))
        before = read_manifest(self.run_dir, strict=False) if self.resumed else {}
        changed = [*changed_plugins(before.get("plugin_files") or {}, self.plugin_files, self.start_round),
                   *other_threads(before.get("threads"), self.threads, self.start_round), *self.events_lost()]
        for warning in changed:  # (the manifest keeps them too)
            print(f"warning: {self.run_dir}: {warning}", file=sys.stderr, flush=True)
        # which code ran which rounds: a resume adds its own session, the earlier ones stay
        earlier = before.get("sessions") if isinstance(before.get("sessions"), list) else []
        self.sessions = [*(s for s in earlier if isinstance(s, dict)), session(self.start_round, self.plugin_files,
                                                                               changed)]
        self.chain = self.callbacks()
        gathered: dict = {}
        for callback in self.chain:
            gathered.update(callback_metrics(callback, "on_start", callback.on_start(self, gathered)))
        self.engine = Engine(self.server, rounds=cfg.run.rounds, max_time=cfg.run.max_time,
                             start_round=self.start_round, on_round=self._on_round,
                             stop_signal=stop_signal, diverged=self._diverged,
                             before_callbacks=self._evaluate_with_others)
        if resume is None:  # every run directory that exists can be resumed
            self.checkpoint(0, self.start_time)
        else:  # no longer how it ended: a crash from here on leaves it `running`
            write_manifest(self, EngineResult("running", "", self.start_round, self.start_time), self._host_s())
        return self.engine

    def _on_round(self, outcome) -> bool | str:
        """The callbacks of a round, in order; why the run should stop now, or False."""
        metrics, stop = {}, False
        for callback in self.chain:
            answer = callback.on_round(self, outcome, metrics)
            if answer is not None and not (isinstance(answer, tuple) and len(answer) == 2):
                raise FedsimError(f"callback {type(callback).__name__}: on_round returned {answer!r}; return "
                                  "(stop, metrics), e.g. (False, {}) (docs/extending.md, \"Callbacks\")")
            wants, more = answer or (False, {})
            metrics.update(callback_metrics(callback, "on_round", more))
            if wants and not stop:
                stop = wants if isinstance(wants, str) else f"stopped by {type(callback).__name__}"
        return stop

    def _diverged(self, outcome) -> str | None:
        """Why the training loss means divergence: above `[run] diverge_loss` ("auto": 1000 x
        the initial model's loss, as evaluated before round 1), or None."""
        limit = self.config.run.diverge_loss
        if limit == "auto":
            initial = (self.recorder.initial or {}).get("test_loss")
            limit = 1000 * initial if initial and math.isfinite(initial) else 0.0
        loss = outcome.train_loss
        if limit and loss is not None and loss > limit:
            return f"training loss {loss:.4g} above [run] diverge_loss {limit:.4g}"
        return None

    def end(self, plot_interrupted: bool = True, plots: bool = True) -> RunResult:
        """Everything after the last round: final evaluation and checkpoint, the outputs; the
        plots unless the run was interrupted and not `plot_interrupted` (a study's point: it is
        drawn once resumed, and a study stopped by Ctrl-C should not wait for its drawing), or
        not `plots` (a study's point that a stop signal caught saving: the study's resume draws
        them)."""
        cfg, result = self.config, self.engine.result()
        metrics: dict = {}
        if result.status != "interrupted" and self.task.own_test_data:  # score each device on its own tests
            with self.threads.work(self.task.evaluate_flops()):
                self.recorder.device_info.update(self.task.device_metrics(self.strategy.params))
        for callback in self.chain:  # (the last checkpoint writes the tables)
            metrics.update(callback_metrics(callback, "on_end", callback.on_end(self, result, metrics)))
        self.recorder.finish()
        save_torch(self.run_dir / "model.pt", self.task.state_dict(self.strategy.params))
        write_manifest(self, result, self._host_s())
        for callback in self.chain:
            callback.on_saved(self, result)
        member = self.run_dir.name == plain_name(cfg.algorithm.name) and is_comparison(self.run_dir.parent)
        # a comparison's plots show each of its members
        if cfg.run.plots and plots and not member and (plot_interrupted or result.status != "interrupted"):
            draw_plots(self.plotter, {cfg.algorithm.name: self.run_dir}, self.run_dir / "plots", cfg.run.name)
        self.lock.release()
        return RunResult(self.run_dir, cfg.algorithm.name, result.status, result.reason,
                         self.recorder.rounds_frame(), self.strategy.params.detach().cpu())

    def read_device_table(self, cfg: Config) -> dict[str, np.ndarray] | None:
        """The rows of `[trace] devices_table` for the run's devices (the table describes the
        trace's devices: run device i is the row of the trace device it replays)."""
        if not cfg.trace.devices_table:
            return None
        where = f"device table {cfg.trace.devices_table}"
        return device_rows(read_device_table(cfg.trace.devices_table), self.trace_device, where)

    def device_info(self) -> dict[str, np.ndarray]:
        """Per-device columns of devices.parquet known before the run: the trace device it
        replays, its data (samples; user), its timing (class, FLOP/s, links, latency), its time zone or group where the
        generator has one, and every column of the device table."""
        n, generator = self.task.n_clients, self.trace.generator
        info = {"trace_device": self.trace_device, **self.task.device_columns(), **self.timing.columns()}
        for key, column, dtype in (("tz_offset_h", "tz_offset", np.float64), ("group", "group", np.int64)):
            if isinstance(generator.get(key), list) and len(generator[key]) == n:
                info[column] = np.asarray(generator[key], dtype=dtype)
        info.update({k: v for k, v in (self.device_table or {}).items() if k not in ("device_id", *SPEED_COLUMNS)})
        if "tz_offset_h" in info:  # the table's older name
            info["tz_offset"] = np.asarray(info.pop("tz_offset_h"), dtype=np.float64)
        return info

    @property
    def coverage_matters(self) -> bool:
        """Whether the trace has a span of its own that the run should see: a recorded trace or
        a wall-clock generator (round-indexed ones are generated for the run's own length)."""
        source = self.config.trace.source
        return source == "file" or not GENERATORS.lookup(source, "[trace] source").round_indexed

    def first_task_s(self) -> np.ndarray:
        """Each device's task in the first aggregation: download, the local steps the algorithm
        asks of it (one under `[client] work = "fit-deadline"`), upload."""
        ids = np.arange(self.task.n_clients)
        steps = (np.ones(len(ids), dtype=np.int64) if self.config.client.work == "fit-deadline"
                 else np.asarray(self.strategy.local_steps(0, ids), dtype=np.int64))
        down, up = self.strategy.message_bytes()
        return (self.timing.download_s(ids, down) + self.timing.upload_s(ids, up)
                + self.timing.compute_s(ids, self.trainer.samples(ids, steps), steps))

    def typical_task_s(self) -> np.ndarray:
        """Each device's download + compute + upload of a task of `[client] local_steps` steps
        (of one step under `[client] work = "fit-deadline"`: all a late device attempted)."""
        ids = np.arange(self.task.n_clients)
        if self.config.client.work == "fit-deadline":
            steps = np.ones(len(ids), dtype=np.int64)
        else:
            steps = self.trainer.epoch_steps()
            steps = np.full(len(ids), self.config.client.local_steps) if steps is None else steps
        down, up = self.strategy.message_bytes()
        return (self.timing.download_s(ids, down) + self.timing.compute_s(ids, self.trainer.samples(ids, steps), steps)
                + self.timing.upload_s(ids, up))

    def evaluate(self) -> tuple[float, float | None]:
        """Test loss and accuracy of the current global model (evaluated with other runs'
        models in one call, when a lockstep study did so this round)."""
        if self.evaluated is not None:
            done, self.evaluated = self.evaluated, None
            return done
        with self.threads.work(self.task.evaluate_flops()):
            return self.task.evaluate(self.strategy.params)

    def _evaluate_with_others(self, outcome):
        """Before the round's callbacks: in a lockstep study that evaluates its runs together
        (on a GPU), a due evaluation waits at the gate for the others' and is done in one call."""
        gate = self.server.gate
        if gate is not None and gate.rounding_allowed and self.evaluation_due(outcome.round):
            self.evaluated = yield gate.request_evaluation(self.task, self.strategy.params)

    def evaluation_due(self, rnd: int) -> bool:
        return (rnd + 1) % self.config.run.eval_every == 0 or rnd + 1 == self.config.run.rounds

    def checkpoint_due(self, rnd: int) -> bool:
        """Whether a checkpoint follows round `rnd` (every `[run] checkpoint_every` rounds)."""
        every = self.config.run.checkpoint_every
        return bool(every) and (rnd + 1) % every == 0

    def checkpoint(self, rounds_done: int, sim_time: float) -> None:
        """Tables, checkpoint.pt, then the manifest saying `running` at this round."""
        self.recorder.device_info["online_fraction"] = device_online_fraction(self.trace, sim_time)
        self.recorder.write_tables()
        save_torch(self.run_dir / "checkpoint.pt", self.checkpoint_state(rounds_done, sim_time))
        write_manifest(self, EngineResult("running", "", rounds_done, sim_time), self._host_s())

    def checkpoint_state(self, rounds_done: int, sim_time: float) -> dict:
        """What checkpoint.pt holds (`restore` reads it back): CHECKPOINT_KEYS, the server's
        state (an async run's tasks in flight), the config and run format, the model's layout,
        FedBN's per-device buffers."""
        return {
            "round": rounds_done, "sim_time": sim_time, "strategy": self.strategy.state_dict(),
            "recorder": self.recorder.state_dict(), "host_s": self._host_s(),
            "server": self.server.state_dict(),
            "config": self.recorded_config, "run_format": RUN_FORMAT, "rules": self.rules,
            "options": self.options_in_use(),
            "model": self.model_layout,
            **({"device_buffers": self.task.device_buffers.state_dict()} if self.task.device_buffers else {}),
            **({"data_sha256": self.data_sha256} if self.data_sha256 else {}),
        }

    def options_in_use(self) -> dict:
        """The algorithm's, selection policy's and model plugin's options, defaults included."""
        return {**self.strategy.options_in_use(), "model": self.model_options}

    def events_lost(self) -> list[str]:
        """A resume's warning where the events log on disk lacked rows its checkpoint counted
        (its parts behind the checkpoint: a folder copied while the run wrote); the manifest
        then lists events.parquet as incomplete."""
        missing = self.recorder.events_missing
        if not missing:
            return []
        entry = {"output": "events", "path": str((self.run_dir / "events.parquet").absolute()),
                 "cause": f"{missing:,} rows of the first {self.start_round} rounds were not on disk at the resume"}
        self.incomplete_outputs["events"] = entry
        return [f"events.parquet lacks {missing:,} rows of the run's first {self.start_round} rounds (the events log "
                "on disk was behind the checkpoint: was the folder copied while the run wrote it?); the run goes on, "
                "its other files are complete, and manifest.json lists events.parquet as incomplete"]

    def restore(self, state: dict) -> None:
        """The parts' state from a checkpoint (`checkpoint_state`; checked by `read_checkpoint`)."""
        self.strategy.load_state_dict(state["strategy"])
        self.recorder.load_state_dict(state["recorder"])
        self.server.load_state_dict(state.get("server", {}))  # (a sync run of an earlier release: none)
        if self.task.device_buffers is not None:  # [model] local_buffers: the devices' own
            self.task.device_buffers.load_state_dict(state["device_buffers"])
        last = self.recorder.rows[-1] if self.recorder.rows else None
        if last is not None and not self.evaluation_due(last["round"]):
            last.update(test_loss=None, test_acc=None)  # the stop's final evaluation


def check_same_data(recorded: str | None, now: str | None, root: str) -> None:
    """FedsimError where the files of the run's dataset (`[data] root`) changed since it began."""
    if recorded and now and recorded != now:
        raise FedsimError(f"[data] root = {root!r}: the dataset's files changed since the run started (SHA-256 of "
                          f"their names and bytes {now[:12]}..., the run's {recorded[:12]}...); put back the files it "
                          "started with, or start a new run on these")


def changed_plugins(before: dict[str, str], now: dict[str, str], rnd: int) -> list[str]:
    """A resume's warning for each plugin module whose source file differs from the one the
    run's earlier rounds ran (a fix may be meant; its numbers are then no one code's)."""
    return [f"the plugin {module} ({sys.modules[module].__file__}) changed after the run's first {rnd} rounds; "
            "the rounds from there on ran the new code"
            for module in sorted(m for m in now if m in before and before[m] != now[m])]


def other_threads(before, threads, rnd: int) -> list[str]:
    """A resume's warning where its training calls may get another number of threads than the
    run's earlier rounds had (`[run] threads = "auto"` on a machine with other cores): a CPU's
    sums over other thread counts round differently."""
    then, now = before.get("max") if isinstance(before, dict) else None, threads.summary()["max"]
    if then is None or now is None:
        return []
    then, now = threads.largest(then), threads.largest(now)  # what a call may get (auto: half, at least one)
    if then == now:
        return []
    calls = before.get("calls_by_threads")
    used = max((int(k) for k, n in calls.items() if n), default=None) if isinstance(calls, dict) else None
    if used is not None and used <= now and (used < then or now < then):
        return []  # no earlier call had more threads than now, nor was held back by the earlier limit
    return [f"the run's first {rnd} rounds trained with up to {then} threads a call, the rounds from there on with "
            f"up to {now} ([run] threads = {threads.setting!r} on this machine): sums over other thread counts "
            "round differently, so they may differ in the last bits from the run uninterrupted there"]


def first_change(started: dict, now: dict, skip: Sequence[str] = ()) -> tuple[str, str, Any, Any] | None:
    """The first `(section, key, started value, value now)` that differs between two configs
    as dicts (a key one lacks: today's default), the RESUME_KEYS and `skip` ("section.key")
    aside; None where they agree."""
    started, now = json.loads(json.dumps(started)), json.loads(json.dumps(now))  # tuples -> lists
    defaults = json.loads(json.dumps(Config().to_dict()))
    for section in sorted(set(started) | set(now)):
        for key in sorted(set(started.get(section, {})) | set(now.get(section, {}))):
            default = defaults.get(section, {}).get(key)
            old, new = started.get(section, {}).get(key, default), now.get(section, {}).get(key, default)
            if old != new and f"{section}.{key}" not in (*RESUME_KEYS, *skip):
                return section, key, old, new
    return None


def check_unchanged(started: dict, now: dict, where: Path) -> None:
    """FedsimError naming the first key of a resumed run's config.toml (edited by hand, say)
    that differs from the config its checkpoint was written with (read as today's run format; a
    key that its release did not have had today's default), RESUME_KEYS aside."""
    change = first_change(started, now)
    if change is not None:
        section, key, old, new = change
        raise FedsimError(
            f"{where}: [{section}] {key} = {new!r}, but the run started with {old!r}; a "
            f"resumed run keeps its config (only {', '.join(RESUME_KEYS)} may change), "
            "so put it back or start a new run")


def resume(run_dir: Path, overrides: list[str] = (), progress: bool = True,
           plotter: PlotWorker | None = None, callbacks: Sequence[Callback] = (),
           force: bool = False) -> RunResult:
    """Continue an interrupted (or shorter) run from its checkpoint, in the same directory; a
    diverged one only with `force`."""
    experiment, state = prepare_resume(run_dir, overrides, progress, plotter, callbacks, force)
    try:
        return experiment.run(resume=state)
    finally:
        if plotter is not None:
            plotter.finish()  # the plots are drawn when this returns


def is_comparison(run_dir: Path) -> bool:
    """Whether `run_dir` holds a comparison (its config.toml names several algorithms)."""
    config = run_dir / "config.toml"
    return config.exists() and bool(read_toml(config).get("run", {}).get("algorithms"))


def prepare_resume(run_dir: Path, overrides: list[str] = (), progress: bool = True,
                   plotter: PlotWorker | None = None, callbacks: Sequence[Callback] = (),
                   force: bool = False) -> tuple[Experiment, dict | None]:
    """The Experiment of a run to resume, and its checkpoint state (checked against its config);
    None for a run that stopped before its first checkpoint, which starts over."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "a file, not a run directory" if run_dir.exists() else "no such run directory"
        raise FedsimError(f"{run_dir}: {what}; give the folder that `fedsim run` "
                          "printed after 'run directory:'")
    ended = read_manifest(run_dir, strict=False)
    if ended.get("status") == "diverged" and not force:
        raise FedsimError(f"{run_dir}: the run diverged ({ended.get('reason')}); resuming would go on "
                          "from a broken model: start it again with other settings, or pass --force "
                          "to resume anyway")
    checkpoint = run_dir / "checkpoint.pt"
    if not checkpoint.exists() and not (run_dir / "config.toml").exists():
        raise FedsimError(f"{run_dir}: no checkpoint.pt (nor a comparison's config.toml); give a run "
                          "directory that `fedsim run` made")
    from fedsim.config import parse_override

    state = read_checkpoint(checkpoint) if checkpoint.exists() else None  # on the CPU: the Strategy moves it
    if not (run_dir / "config.toml").exists():
        raise FedsimError(f"{run_dir / 'config.toml'}: missing, so the run's settings are unknown; "
                          "restore it (a copy is in checkpoint.pt's 'config') or start the run again")
    raw = run_config(run_dir)
    for text in overrides:
        section, key, value = parse_override(text)
        raw.setdefault(section, {})[key] = value
    config = config_from_dict(raw, origin=str(run_dir / "config.toml"))
    if state is None:  # stopped before its first checkpoint, before round 1: start over
        return Experiment(config, run_dir, progress, plotter=plotter, callbacks=callbacks), None
    refuse_async_without_tasks(state, config, checkpoint)
    record = recorded_trace(run_dir, ended) if config.trace.source != "file" else None
    if "config" in state:  # (checkpoints of fedsim before 0.1 kept no config)
        started, _ = upgrade(state["config"], state.get("run_format", 0), str(checkpoint))
        check_unchanged(started, config.to_dict(), run_dir / "config.toml")
    if config.trace.source == "file":
        check_trace_file(Path(config.trace.path), (ended.get("trace") or {}).get("file"))
    if config.run.rounds < state["round"]:
        raise FedsimError(f"--set run.rounds={config.run.rounds}: the run already has "
                          f"{state['round']} rounds; resume can only add rounds")
    return Experiment(config, run_dir, progress, record, plotter, callbacks, resuming=True,
                      rules=started_rules(state, checkpoint), started_options=state.get("options")), state


def started_rules(state: dict, checkpoint: Path) -> int:
    """The training rules a checkpointed run started under (fedsim/training/rules.py; 1 where
    its release recorded none); one line for a value no release wrote."""
    rules = state.get("rules", 1)
    if type(rules) is not int or not 1 <= rules <= CURRENT_RULES:
        raise FedsimError(f"{checkpoint}: rules = {rules!r} is not training rules this release knows (1 to "
                          f"{CURRENT_RULES}); the file was edited or damaged: give it back the rules the run started "
                          "under, or start the run again")
    return rules


def refuse_async_without_tasks(state: dict, config: Config, checkpoint: Path) -> None:
    """One line for an async run's checkpoint of a release that did not keep the tasks in flight."""
    if config.server.mode == "async" and "server" not in state:
        raise FedsimError(f"{checkpoint}: cannot resume a run with [server] mode = 'async' of an earlier "
                          "release (it did not checkpoint the tasks in flight and the buffered updates); "
                          "start the run again from its config.toml, with [run] rounds set to the total you want")


def resume_overrides(config: Config) -> list[str]:
    """`--set` lines of `config`'s values of the keys a resume may change (more rounds, a time
    limit, another evaluation interval, plots, trackers): what a comparison's algorithm or a
    study's point resumes with, so that a key given to the whole reaches every run of it."""
    values = config.to_dict()
    return [f"{key}={json.dumps(values[key.split('.')[0]][key.split('.')[1]])}" for key in RESUME_KEYS]


def check_only_adds_rounds(run_dir: Path, config: Config, name: str) -> None:
    """One line when `config` gives the run in `run_dir` (a comparison's algorithm or a study's
    point, `name`) fewer rounds than it has already run: a resume only adds rounds, and the
    config recorded above its runs would no longer say what they ran."""
    done = read_manifest(run_dir, strict=False).get("rounds", 0)
    if config.run.rounds < done:
        raise FedsimError(f"run.rounds = {config.run.rounds}: {name} already has {done} rounds "
                          f"({run_dir}); resume can only add rounds: give run.rounds >= {done}")


def run_state(run_dir: Path, config: Config) -> str:
    """done (it ran its rounds, or stopped for good: diverged, trace over, max_time), resume
    (interrupted, or the study now asks for more rounds or a later max_time, or a tracker's log
    of it lacks rounds), or new. A done
    run records the `[run] targets` now asked for (they change its report, not its rounds)."""
    m = read_manifest(run_dir, strict=False)
    if m.get("status") in ("completed", "diverged"):
        reason, done = str(m.get("reason", "")), m.get("rounds", 0)
        more = m["status"] == "completed" and config.run.rounds > done and (
            reason == f"{done} rounds" or reason.startswith("max_time") and later_max_time(run_dir, config))
        # a tracker of the run whose log lacks rounds: a resume logs them (its rounds are done)
        unlogged = any(o.get("output") in config.run.trackers for o in m.get("incomplete_outputs") or [])
        if not (more or unlogged and (run_dir / "checkpoint.pt").exists()):
            record_targets(run_dir, config)
            return "done"
    return "resume" if (run_dir / "checkpoint.pt").exists() else "new"


def later_max_time(run_dir: Path, config: Config) -> bool:
    """Whether `config` lets a run that max_time ended go on: no max_time, or a later one than
    the one in its config.toml."""
    ran = read_toml(run_dir / "config.toml").get("run", {}).get("max_time", 0.0)
    return not config.run.max_time or config.run.max_time > ran


def record_targets(run_dir: Path, config: Config) -> None:
    """A finished run's config.toml takes the `[run] targets` given to its comparison or study
    on resume: the report times them."""
    path = run_dir / "config.toml"
    recorded = read_toml(path)
    if recorded.get("run", {}).get("targets") != list(config.run.targets):
        recorded.setdefault("run", {})["targets"] = list(config.run.targets)
        write_text(path, dump_toml(recorded))
