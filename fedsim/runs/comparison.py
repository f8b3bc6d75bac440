"""Runs a config: one algorithm, or several side by side (``[run] algorithms``) on the same
trace, data and seed, each in a sub-folder named after it, followed by ``summary.parquet`` and
comparison plots.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from pathlib import Path
from typing import Callable, Sequence

import polars as pl

from fedsim.runs.callbacks import Callback
from fedsim.config import Config, check_resume_overrides, config_from_dict, dump_toml
from fedsim.config.schema import absolute_file_keys, absolute_out
from fedsim.errors import FedsimError, Stopped, stop_at_once
from fedsim.runs.experiment import Experiment, RunResult, check_only_adds_rounds, is_comparison
from fedsim.runs.experiment import resume as resume_run
from fedsim.files import (DirectoryLock, atomic_write, claim_directory, made_by_fedsim, plain_name,
                          remove_stale_temporaries, resume_command)
from fedsim.results.plot_worker import PlotWorker
from fedsim.results.plots import draw_plots
from fedsim.results.recorder import write_text
from fedsim.results.run_format import check_readable, read_manifest, run_config, use_recorded_plugin_folders
from fedsim.sim.engine import finish_round_on_stop_signal


def run(config: Config, *, progress: bool = True, run_dir: Path | None = None,
        on_ready: Callable[[Path], None] = lambda run_dir: None,
        plotter: PlotWorker | None = None, callbacks: Sequence[Callback] = ()) -> RunResult:
    """Run `config` (one algorithm or several side by side); returns the RunResult.

    `on_ready(run_dir)` is called once the first simulation is set up (config, data and trace
    are valid), before anything is written. `plotter`: a PlotWorker to draw the plots (the CLI
    starts one first thing); without one they are drawn in this process; either way they are
    drawn when this returns. `callbacks`: the user's own (fedsim/runs/callbacks.py), given to every
    algorithm's run.
    """
    if not isinstance(config, Config):
        raise FedsimError(f"fedsim.run: expected a Config (from fedsim.load_config), got {config!r}")
    claim = run_dir is None  # a directory of its own, taken once the config proved valid
    if claim:
        refuse_study_folder(config)
    run_dir = Path(run_dir) if run_dir else Path(config.run.out) / config.run.name
    try:
        return _run(config, run_dir, claim, progress, on_ready, plotter, callbacks)
    finally:
        if plotter is not None:
            plotter.finish()


def refuse_study_folder(config: Config) -> None:
    """A new run is never made inside the folder of a study, which only `fedsim sweep` writes
    to: the config.toml of a point, run on its own, names the study's folder as [run] out."""
    out = Path(config.run.out).absolute()
    study = next((folder for folder in (out, *out.parents) if (folder / "study.toml").is_file()
                  and made_by_fedsim(folder)), None)
    if study is not None:
        source = str(Path(config.source).absolute()) if Path(config.source).is_file() else config.source
        again = f"fedsim run {shlex.quote(source)} --set run.out={shlex.quote(str(study.parent.absolute()))}"
        raise FedsimError(f"{config.where('run', 'out')} = {config.run.out!r} is in the folder of the study {study}, "
                          f"which only its sweep writes to; run it as a new run beside the study with "
                          f"`{again}`, or finish the study with `{resume_command('sweep', study)}`")


def _run(config, run_dir, claim, progress, on_ready, plotter, callbacks) -> RunResult:
    if not config.run.algorithms:
        experiment = Experiment(config, run_dir, progress, plotter=plotter, callbacks=callbacks)
        if claim:
            experiment.run_dir = run_dir = claim_directory(run_dir)
        on_ready(run_dir)
        return experiment.run()
    first = Experiment(config.with_algorithm(config.run.algorithms[0]), run_dir / plain_name(config.run.algorithms[0]),
                       progress, plotter=plotter, callbacks=callbacks)
    for other in config.run.algorithms[1:]:  # every algorithm fits before any runs
        first.set_up_strategy(config.with_algorithm(other))
    if claim:
        run_dir = claim_directory(run_dir)
        first.run_dir = run_dir / plain_name(config.run.algorithms[0])
    with comparison_lock(run_dir, "fedsim run, a comparison"):
        on_ready(run_dir)
        raw = config.to_dict()
        absolute_file_keys(raw, config.source)  # what --resume goes on with, from any directory
        absolute_out(raw)
        write_text(run_dir / "config.toml", dump_toml(raw))
        return _members(config, run_dir, progress, plotter, callbacks, first=first)


@contextlib.contextmanager
def comparison_lock(run_dir: Path, what: str):
    """A comparison's folder has one writer, as a run directory has: its lock is held for the
    whole comparison (each algorithm's sub-folder has its own too); stale temporaries go."""
    lock = DirectoryLock(run_dir)
    lock.acquire(what)
    try:
        remove_stale_temporaries(run_dir)
        yield
    finally:
        lock.release()


def _members(config, run_dir, progress, plotter, callbacks, first=None, force=False, resuming=False) -> RunResult:
    """Each algorithm of a comparison in turn: run it, resume it from its checkpoint, or (done)
    read its result; then the summary and the comparison plots. A stop signal, also between
    two algorithms, stops the comparison (status interrupted; `--resume` finishes it)."""
    from fedsim.runs.experiment import prepare_resume, resume_overrides, run_state

    results = []
    stop_signal = {"name": None}
    with finish_round_on_stop_signal(stop_signal):
        for name in config.run.algorithms:
            if stop_signal["name"]:
                break
            sub, member = run_dir / plain_name(name), config.with_algorithm(name)
            state = diverged_state(sub, run_state(sub, member), force) if resuming else run_state(sub, member)
            if state == "done":
                results.append(finished_result(sub, name))
                continue
            try:
                with stop_at_once():  # setting up an algorithm: no round there to finish
                    if state == "resume":  # with the comparison's values of the keys a resume may change
                        experiment, resume_state = prepare_resume(sub, resume_overrides(member), progress,
                                                                  plotter, callbacks, force)
                    else:
                        experiment, resume_state = first or Experiment(member, sub, progress, plotter=plotter,
                                                                       callbacks=callbacks), None
            except Stopped as stop:
                stop_signal["name"] = stop.name
                break
            first = None
            experiment.plugins_of = config.to_dict()
            results.append(experiment.run(resume_state))
            if results[-1].status == "interrupted":  # Ctrl-C stops the comparison, not one member
                break
    summary = summarize(results)
    atomic_write(run_dir / "summary.parquet", summary.write_parquet)
    if config.run.plots and results:
        draw_plots(plotter, {r.algorithm: r.run_dir for r in results}, run_dir / "plots", config.run.name)
    statuses = [r.status for r in results]
    if stop_signal["name"] or len(results) < len(config.run.algorithms) and "interrupted" not in statuses:
        statuses.append("interrupted")
    worst = max(statuses, key=STATUS_SEVERITY.index)
    reason = f"interrupted by {stop_signal['name']} between algorithms" if stop_signal["name"] else ""
    return RunResult(run_dir, ",".join(config.run.algorithms), worst, reason, summary, runs=results)


def diverged_state(run_dir: Path, state: str, force: bool) -> str:
    """A resumed comparison's member that diverged: resumed with `force` (as a single run is),
    else left as it ended, with a note saying how to resume it anyway."""
    manifest = read_manifest(run_dir, strict=False)
    if state != "done" or manifest.get("status") != "diverged" or not (run_dir / "checkpoint.pt").exists():
        return state
    if force:
        return "resume"
    print(f"note: {run_dir}: the run diverged ({manifest.get('reason')}), so it stays as it ended; resume it anyway "
          f"with `{resume_command('run', run_dir.parent)} --force`", file=sys.stderr, flush=True)
    return state


def finished_result(run_dir: Path, algorithm: str) -> RunResult:
    """The RunResult of a member that already ended, read from its directory."""
    manifest = read_manifest(run_dir)
    return RunResult(run_dir, algorithm, manifest["status"], manifest["reason"],
                     pl.read_parquet(run_dir / "rounds.parquet"))


def resume(run_dir: str | Path, overrides: Sequence[str] = (), *, progress: bool = True,
           callbacks: Sequence[Callback] = (), force: bool = False, plotter: PlotWorker | None = None) -> RunResult:
    """Continue a run or a comparison in its own directory from its checkpoint, as `fedsim run
    --resume` does: `overrides` ("run.rounds=600") may change only RESUME_KEYS (more rounds, a
    time limit, evaluation, plots, trackers); a diverged run only with `force`. The plugins the
    run imported are found where it recorded them; `callbacks` as for `fedsim.run`."""
    run_dir = Path(run_dir)
    check_resume_overrides(list(overrides))
    use_recorded_plugin_folders(run_dir)
    if run_dir.is_dir():
        check_readable(run_dir)
    if not (run_dir / "checkpoint.pt").exists() and is_comparison(run_dir):
        return resume_comparison(run_dir, list(overrides), progress, plotter, force, callbacks)
    return resume_run(run_dir, list(overrides), progress, plotter, callbacks, force)


def resume_comparison(run_dir: Path, overrides: list[str] = (), progress: bool = True, plotter=None,
                      force: bool = False, callbacks: Sequence[Callback] = ()) -> RunResult:
    """Finish a comparison: its interrupted algorithm resumed, the ones not started run, the
    summary and plots written as an uninterrupted comparison writes them. (`fedsim run --resume`
    has checked every algorithm's run format first: `check_readable`.)"""
    from fedsim.config import parse_override

    raw = run_config(run_dir)  # an earlier run format's as this one reads it (written back below)
    for text in overrides:
        section, key, value = parse_override(text)
        raw.setdefault(section, {})[key] = value
    config = config_from_dict(raw, origin=str(run_dir / "config.toml"))
    for name in config.run.algorithms:
        check_only_adds_rounds(run_dir / plain_name(name), config, f"algorithm {name}")
    try:
        with comparison_lock(run_dir, "fedsim resume, a comparison"):
            write_text(run_dir / "config.toml", dump_toml(config.to_dict()))  # with the keys it resumed with
            return _members(config, run_dir, progress, plotter, callbacks, force=force, resuming=True)
    finally:
        if plotter is not None:
            plotter.finish()


STATUS_SEVERITY = ["completed", "interrupted", "diverged"]


def summarize(results: list[RunResult]) -> pl.DataFrame:
    """One row per algorithm: status, rounds, simulated time, final and best test metrics."""
    rows = []
    for r in results:
        manifest = read_manifest(r.run_dir)
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


