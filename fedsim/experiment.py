"""Wires a Config into one simulation (or several, side by side) and writes the run directory.

config -> trace + index, task (data, partition, model), trainer, strategy, timing, engine,
recorder. With ``run.algorithms`` every algorithm runs on the same trace, data and seed, each
in a sub-folder named after it, followed by ``summary.parquet`` and comparison plots.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from fedsim.algorithms import Context, Strategy, make_strategy
from fedsim.algorithms.server_optimizer import ServerOptimizerConfig
from fedsim.config import (RESUME_KEYS, AlgorithmConfig, Config, ServerConfig, config_from_dict, dump_toml,
                           read_toml)
from fedsim.errors import FedsimError
from fedsim.files import atomic_write
from fedsim.results.plot_worker import PlotWorker
from fedsim.results.plots import draw_plots
from fedsim.results.recorder import Recorder, save_torch, write_json, write_text
from fedsim.sim.engine import new_environment, run_engine
from fedsim.sim.buffered import BufferedServer
from fedsim.sim.server import Server, invite_budget
from fedsim.sim.timing import DeviceTiming
from fedsim.traces import AvailabilityIndex, Trace, generate, read_trace, write_trace
from fedsim.catalog import GENERATORS
from fedsim.traces.generators import known_probability_at
from fedsim.traces.io import read_device_table
from fedsim.training import ThreadPolicy, build_task, build_trainer
from fedsim.training.schedules import learning_rate


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


def fresh_run_dir(out: str, name: str) -> Path:
    """runs/NAME, or runs/NAME-2, -3, ... : an earlier run is never overwritten."""
    base = Path(out) / name
    candidate, k = base, 1
    while candidate.exists():
        k += 1
        candidate = base.with_name(f"{name}-{k}")
    return candidate


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def resolve_trace_path(config: Config) -> Config:
    """A relative trace path is looked up in the working directory, then beside the config
    file; the run's config.toml records the absolute path so that a resume finds it too."""
    if config.trace.source != "file":
        return config
    path = Path(config.trace.path)
    beside_config = Path(config.source).parent / path
    if not path.is_absolute() and not path.exists() and beside_config.exists():
        path = beside_config
    trace = dataclasses.replace(config.trace, path=str(path.resolve()))
    return dataclasses.replace(config, trace=trace)


def load_trace(config: Config, n_devices: int, label_dist: np.ndarray | None) -> Trace:
    """The run's availability: a Parquet file or a generator with the run's sizes and seed."""
    tc = config.trace
    if tc.source == "file":
        path = Path(tc.path)
        trace = read_trace(path)
        if trace.n_devices != n_devices:
            raise FedsimError(
                f"trace {path}: has {trace.n_devices} devices but [data] clients = {n_devices}; "
                f"set data.clients = {trace.n_devices} (or use a trace with {n_devices} devices)"
            )
        return trace
    spec = GENERATORS.lookup(tc.source, f"{config.source}: [trace] source")
    days = tc.days or None
    if days is None and not spec.round_indexed:  # wall-clock models: cover max_time, or a week
        days = config.run.max_time / 86400 if config.run.max_time else 7.0
    trace = generate(
        tc.source, n_devices, seed=config.run.seed, rounds=trace_rounds(config),
        round_duration=config.server.round_duration, days=days,
        label_dist=label_dist if spec.needs_labels else None, **tc.options,
    )
    # A generated trace repeats, so that a run is never cut short by the trace's length.
    return dataclasses.replace(trace, wrap="loop")


def trace_rounds(config: Config) -> int:
    """Rounds of `round_duration` seconds a round-indexed generator makes for this run: one per
    server round under ideal timing; under model timing enough for rounds that last up to the
    deadline, but no more than max_time needs."""
    run, server = config.run, config.server
    if server.timing == "ideal":
        return run.rounds
    seconds = run.rounds * max(server.round_duration, server.deadline)
    if run.max_time:
        seconds = min(seconds, run.max_time)
    return max(1, math.ceil(seconds / server.round_duration - 1e-9))


def agrees_with(new: Trace, old: Trace) -> bool:
    """Whether `new` has exactly `old`'s intervals over old's horizon (a longer generation of
    the same trace: round-indexed generators draw round by round, so they are prefix-stable)."""
    if new.n_devices != old.n_devices or new.horizon < old.horizon:
        return False
    keep = new.start < old.horizon
    return (np.array_equal(new.device_id[keep], old.device_id)
            and np.array_equal(new.start[keep], old.start)
            and np.array_equal(np.minimum(new.end[keep], old.horizon), old.end))


def server_optimizer_config(algorithm: AlgorithmConfig) -> ServerOptimizerConfig:
    a = algorithm
    return ServerOptimizerConfig(a.server_optimizer, a.server_lr, a.server_momentum, a.server_beta1,
                                 a.server_beta2, a.server_eps)


def check_cohort_size(server: ServerConfig, n_devices: int) -> None:
    if server.clients_per_round > n_devices:
        raise FedsimError(
            f"[server] clients_per_round = {server.clients_per_round} is more than the {n_devices} "
            f"devices of the run ([data] clients); give at most {n_devices}, or 0 for every online device")


class Experiment:
    """One algorithm on one trace/task: builds the parts once, then `run()`s the engine."""

    def __init__(self, config: Config, run_dir: Path, progress: bool = True,
                 saved_trace: Trace | None = None, plotter: PlotWorker | None = None):
        """`saved_trace`: the generated trace of the run being resumed. A resume generates the
        trace again for its (maybe longer) extent and keeps that when it agrees with the saved
        one; otherwise it replays the saved trace, repeating it."""
        self.config = config = resolve_trace_path(config)
        self.run_dir = Path(run_dir)
        self.progress = progress and config.run.progress
        self.plotter = plotter
        self.device = resolve_device(config.run.device)
        cfg = config
        self.task = build_task(cfg.data, cfg.model, seed=cfg.run.seed, device=self.device)
        check_cohort_size(cfg.server, self.task.n_clients)
        self.trace = load_trace(cfg, self.task.n_clients, self.task.label_distribution())
        if saved_trace is not None and not agrees_with(self.trace, saved_trace):
            self.trace = saved_trace
        self.index = AvailabilityIndex(self.trace)
        self.threads = ThreadPolicy(cfg.run.threads, self.device)
        self.trainer = build_trainer(self.task, cfg.client, seed=cfg.run.seed, threads=self.threads)
        table = read_device_table(cfg.trace.devices_table) if cfg.trace.devices_table else None
        self.timing = DeviceTiming.build(cfg.devices, self.task.n_clients, cfg.run.seed, table)
        self.strategy = self.set_up_strategy(cfg)

    def set_up_strategy(self, cfg: Config) -> Strategy:
        """The strategy of `cfg` on this experiment's task and trace; a comparison calls this for
        every algorithm first, so that one that cannot run here fails before any has run."""
        strategy = make_strategy(cfg.algorithm.name, origin=cfg.source)
        strategy.setup(self.task.n_clients, self.task.init_params(), self._context(cfg))
        return strategy

    def _context(self, cfg: Config) -> Context:
        trace = self.trace
        def known_p(t: float) -> np.ndarray:
            return known_probability_at(trace, t)

        return Context(
            n_devices=self.task.n_clients, dim=self.task.dim, device=self.device,
            seed=cfg.run.seed, server_lr=cfg.algorithm.server_lr, local_steps=cfg.client.local_steps,
            server_optimizer=server_optimizer_config(cfg.algorithm),
            clients_per_round=cfg.server.clients_per_round, invite=invite_budget(cfg.server),
            options=dict(cfg.algorithm.options),
            lr=lambda t: learning_rate(cfg.client, t),
            client_sizes=self.task.client_sizes(), known_p=known_p,
            selection=cfg.algorithm.selection,
            **self._extra_context(),
        )

    def _extra_context(self) -> dict:
        """Context fields that only some versions of the Strategy interface declare."""
        names = {f.name for f in dataclasses.fields(Context)}
        extra = {}
        if "train_pooled" in names and hasattr(self.trainer, "train_pooled"):
            extra["train_pooled"] = self.trainer.train_pooled
        return extra

    def run(self, resume: dict | None = None) -> RunResult:
        cfg = self.config
        started = time.perf_counter()
        previous_s = resume["host_s"] if resume else 0.0
        self._host_s = lambda: previous_s + time.perf_counter() - started
        recorder = Recorder(self.run_dir, self.task.n_clients)
        start_round, start_time = 0, 0.0
        if resume is not None:
            self.strategy.load_state_dict(resume["strategy"])
            recorder.load_state_dict(resume["recorder"])
            start_round, start_time = resume["round"], resume["sim_time"]
            last = recorder.rows[-1] if recorder.rows else None
            if last is not None and not self._evaluation_due(last["round"]):
                last.update(test_loss=None, test_acc=None)  # the stop's final evaluation
        write_text(self.run_dir / "config.toml", dump_toml(cfg.to_dict()))
        if cfg.trace.source != "file":  # keep the generated availability with its results
            write_trace(self.trace, self.run_dir / "trace.parquet")
        env = new_environment(start_time)
        server_class = BufferedServer if cfg.server.mode == "async" else Server
        server = server_class(
            env=env, index=self.index, strategy=self.strategy, trainer=self.trainer,
            timing=self.timing, cfg=cfg.server, batch_size=cfg.client.batch_size,
            client_sizes=self.task.client_sizes(), model_bytes=4 * self.task.dim,
            seed=cfg.run.seed, device=self.device,
        )
        bar = tqdm(total=cfg.run.rounds, initial=start_round, disable=not self.progress,
                   desc=cfg.algorithm.name, unit="round", leave=False, dynamic_ncols=True)
        last_acc = {"text": "-"}

        def on_round(outcome) -> None:
            due = self._evaluation_due(outcome.round)
            test_loss, test_acc = self.evaluate() if due else (None, None)
            recorder.add_round(outcome, test_loss, test_acc, self.strategy.metrics())
            if test_acc is not None:
                last_acc["text"] = f"{100 * test_acc:.1f}%"
            bar.set_postfix_str(f"t={outcome.t_end / 3600:.2f}h acc={last_acc['text']}", refresh=False)
            bar.update(1)
            every = cfg.run.checkpoint_every
            if every and (outcome.round + 1) % every == 0:
                self._checkpoint(recorder, outcome.round + 1, env.now)

        with self.threads.scope():
            result = run_engine(server, rounds=cfg.run.rounds, max_time=cfg.run.max_time,
                                start_round=start_round, on_round=on_round)
            bar.close()
            self._final_evaluation(recorder, result.status)
        self._checkpoint(recorder, result.rounds, result.sim_time)
        save_torch(self.run_dir / "model.pt", self.task.state_dict(self.strategy.params))
        self._manifest(result, self._host_s())
        rounds = recorder.rounds_frame()
        draw_plots(self.plotter, {cfg.algorithm.name: self.run_dir}, self.run_dir / "plots", cfg.run.name)
        return RunResult(self.run_dir, cfg.algorithm.name, result.status, result.reason, rounds,
                         self.strategy.params.detach().cpu())

    def evaluate(self) -> tuple[float, float | None]:
        """Test loss and accuracy of the current global model."""
        with self.threads.work(self.task.evaluate_flops()):
            return self.task.evaluate(self.strategy.params)

    def _evaluation_due(self, rnd: int) -> bool:
        return (rnd + 1) % self.config.run.eval_every == 0 or rnd + 1 == self.config.run.rounds

    def _final_evaluation(self, recorder: Recorder, status: str) -> None:
        """Make sure the last recorded round carries a test result (runs can stop early)."""
        if recorder.rows and recorder.rows[-1]["test_loss"] is None and status != "diverged":
            loss, acc = self.evaluate()
            recorder.rows[-1].update(test_loss=loss, test_acc=acc)

    def _checkpoint(self, recorder: Recorder, rounds_done: int, sim_time: float) -> None:
        recorder.write_tables()
        save_torch(self.run_dir / "checkpoint.pt", {
            "round": rounds_done, "sim_time": sim_time, "strategy": self.strategy.state_dict(),
            "recorder": recorder.state_dict(), "host_s": self._host_s(),
            "config": self.config.to_dict(),
        })

    def _manifest(self, result, host_s: float) -> None:
        import fedsim

        write_json(self.run_dir / "manifest.json", {
            "fedsim": fedsim.__version__, "torch": torch.__version__,
            "python": platform.python_version(), "seed": self.config.run.seed,
            "device": str(self.device), "threads": self.threads.summary(), "git_sha": _git_sha(), "status": result.status,
            "reason": result.reason, "rounds": result.rounds, "sim_time_s": result.sim_time,
            "host_s": round(host_s, 3), "algorithm": self.config.algorithm.name,
            "server_memory_bytes": self.strategy.memory_bytes(),
            "device_memory_bytes": self.strategy.device_memory_bytes(),
            "n_devices": self.task.n_clients, "model_dim": self.task.dim,
            "trace": {"n_devices": self.trace.n_devices, "horizon": self.trace.horizon,
                      "wrap": self.trace.wrap, "generator": self.trace.generator},
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })


def run(config: Config, *, progress: bool = True, run_dir: Path | None = None,
        on_ready: Callable[[Path], None] = lambda run_dir: None,
        plotter: PlotWorker | None = None) -> RunResult:
    """Run `config` (one algorithm or several side by side); returns the RunResult.

    `on_ready(run_dir)` is called once the first simulation is set up (config, data and trace
    are valid), before anything is written. `plotter`: a PlotWorker to draw the plots (the CLI
    starts one first thing); without one they are drawn in this process.
    """
    if not isinstance(config, Config):
        raise FedsimError(f"fedsim.run: expected a Config (from fedsim.load_config), got {config!r}")
    run_dir = Path(run_dir) if run_dir else fresh_run_dir(config.run.out, config.run.name)
    if not config.run.algorithms:
        experiment = Experiment(config, run_dir, progress, plotter=plotter)
        on_ready(run_dir)
        return experiment.run()
    results = []
    for name in config.run.algorithms:
        experiment = Experiment(config.with_algorithm(name), run_dir / name, progress, plotter=plotter)
        if not results:
            for other in config.run.algorithms[1:]:
                experiment.set_up_strategy(config.with_algorithm(other))
            on_ready(run_dir)
        results.append(experiment.run())
        if results[-1].status == "interrupted":  # Ctrl-C stops the comparison, not one member
            break
    write_text(run_dir / "config.toml", dump_toml(config.to_dict()))
    summary = summarize(results)
    atomic_write(run_dir / "summary.parquet", summary.write_parquet)
    draw_plots(plotter, {r.algorithm: r.run_dir for r in results}, run_dir / "plots", config.run.name)
    worst = max((r.status for r in results), key=STATUS_SEVERITY.index)
    return RunResult(run_dir, ",".join(config.run.algorithms), worst, "", summary, runs=results)


STATUS_SEVERITY = ["completed", "interrupted", "diverged"]


def summarize(results: list[RunResult]) -> pl.DataFrame:
    """One row per algorithm: status, rounds, simulated time, final and best test metrics."""
    rows = []
    for r in results:
        manifest = json.loads((r.run_dir / "manifest.json").read_text())
        accs = r.rounds["test_acc"].drop_nulls()
        rows.append({
            "algorithm": r.algorithm, "status": r.status, "rounds": manifest["rounds"],
            "sim_time_s": manifest["sim_time_s"], "final_test_acc": r.final_accuracy,
            "best_test_acc": float(accs.max()) if len(accs) else None,
            "final_test_loss": r.final_loss, "server_memory_bytes": manifest["server_memory_bytes"],
            "host_s": manifest["host_s"],
        })
    return pl.DataFrame(rows, schema={
        "algorithm": pl.String, "status": pl.String, "rounds": pl.Int64, "sim_time_s": pl.Float64,
        "final_test_acc": pl.Float64, "best_test_acc": pl.Float64, "final_test_loss": pl.Float64,
        "server_memory_bytes": pl.Int64, "host_s": pl.Float64,
    })


def check_unchanged(started: dict, now: dict, where: Path) -> None:
    """FedsimError naming the first key of a resumed run's config.toml (edited by hand, say)
    that differs from the config its checkpoint was written with, RESUME_KEYS aside."""
    started, now = json.loads(json.dumps(started)), json.loads(json.dumps(now))  # tuples -> lists
    for section in sorted(set(started) | set(now)):
        for key in sorted(set(started.get(section, {})) | set(now.get(section, {}))):
            old, new = started.get(section, {}).get(key), now.get(section, {}).get(key)
            if old != new and f"{section}.{key}" not in RESUME_KEYS:
                raise FedsimError(
                    f"{where}: [{section}] {key} = {new!r}, but the run started with {old!r}; a "
                    f"resumed run keeps its config (only {', '.join(RESUME_KEYS)} may change), "
                    "so put it back or start a new run")


def resume(run_dir: Path, overrides: list[str] = (), progress: bool = True,
           plotter: PlotWorker | None = None) -> RunResult:
    """Continue an interrupted (or shorter) run from its checkpoint, in the same directory."""
    run_dir = Path(run_dir)
    checkpoint = run_dir / "checkpoint.pt"
    if not checkpoint.exists():
        raise FedsimError(f"{run_dir}: no checkpoint.pt; resume needs the directory of a single-algorithm run")
    from fedsim.config import parse_override
    from fedsim.sim.buffered import refuse_resume

    raw = read_toml(run_dir / "config.toml")
    for text in overrides:
        section, key, value = parse_override(text)
        raw.setdefault(section, {})[key] = value
    config = config_from_dict(raw, origin=str(run_dir / "config.toml"))
    refuse_resume(config)
    saved = run_dir / "trace.parquet"  # the availability a generated-trace run started with
    saved_trace = read_trace(saved) if config.trace.source != "file" and saved.exists() else None
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)  # the Strategy moves it
    except Exception as err:  # torch raises many kinds for a damaged file
        raise FedsimError(f"{checkpoint}: not a readable checkpoint ({type(err).__name__}); "
                          "the run cannot be resumed from it, start it again") from None
    if "config" in state:  # (checkpoints of fedsim before 0.1 kept no config)
        check_unchanged(state["config"], config.to_dict(), run_dir / "config.toml")
    if config.run.rounds < state["round"]:
        raise FedsimError(f"--set run.rounds={config.run.rounds}: the run already has "
                          f"{state['round']} rounds; resume can only add rounds")
    return Experiment(config, run_dir, progress, saved_trace, plotter).run(resume=state)

