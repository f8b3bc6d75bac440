"""Runs a config: one algorithm, or several side by side (``[run] algorithms``) on the same
trace, data and seed, each in a sub-folder named after it, followed by ``summary.parquet`` and
comparison plots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

import polars as pl

from fedsim.callbacks import Callback
from fedsim.config import Config, dump_toml
from fedsim.errors import FedsimError
from fedsim.experiment import Experiment, RunResult, fresh_run_dir
from fedsim.files import atomic_write, claim_directory
from fedsim.results.plot_worker import PlotWorker
from fedsim.results.plots import draw_plots
from fedsim.results.recorder import write_text


def run(config: Config, *, progress: bool = True, run_dir: Path | None = None,
        on_ready: Callable[[Path], None] = lambda run_dir: None,
        plotter: PlotWorker | None = None, callbacks: Sequence[Callback] = ()) -> RunResult:
    """Run `config` (one algorithm or several side by side); returns the RunResult.

    `on_ready(run_dir)` is called once the first simulation is set up (config, data and trace
    are valid), before anything is written. `plotter`: a PlotWorker to draw the plots (the CLI
    starts one first thing); without one they are drawn in this process; either way they are
    drawn when this returns. `callbacks`: the user's own (fedsim/callbacks.py), given to every
    algorithm's run.
    """
    if not isinstance(config, Config):
        raise FedsimError(f"fedsim.run: expected a Config (from fedsim.load_config), got {config!r}")
    claim = run_dir is None  # a directory of its own, taken once the config proved valid
    run_dir = Path(run_dir) if run_dir else fresh_run_dir(config.run.out, config.run.name)
    try:
        return _run(config, run_dir, claim, progress, on_ready, plotter, callbacks)
    finally:
        if plotter is not None:
            plotter.finish()


def _run(config, run_dir, claim, progress, on_ready, plotter, callbacks) -> RunResult:
    if not config.run.algorithms:
        experiment = Experiment(config, run_dir, progress, plotter=plotter, callbacks=callbacks)
        if claim:
            experiment.run_dir = run_dir = claim_directory(run_dir)
        on_ready(run_dir)
        return experiment.run()
    results = []
    for name in config.run.algorithms:
        experiment = Experiment(config.with_algorithm(name), run_dir / name, progress, plotter=plotter,
                                callbacks=callbacks)
        if not results:
            for other in config.run.algorithms[1:]:
                experiment.set_up_strategy(config.with_algorithm(other))
            if claim:
                run_dir = claim_directory(run_dir)
                experiment.run_dir = run_dir / name
            on_ready(run_dir)
        results.append(experiment.run())
        if results[-1].status == "interrupted":  # Ctrl-C stops the comparison, not one member
            break
    write_text(run_dir / "config.toml", dump_toml(config.to_dict()))
    summary = summarize(results)
    atomic_write(run_dir / "summary.parquet", summary.write_parquet)
    if config.run.plots:
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


