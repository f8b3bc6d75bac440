"""One point of a study, run the way every backend runs it: as the standalone `fedsim run` of
its config would, resumed from its checkpoint with the study's values of the keys a resume may
change, or skipped when done."""

from __future__ import annotations

import shutil
from pathlib import Path

from fedsim.config import Config
from fedsim.files import DirectoryLock
from fedsim.results.run_format import read_manifest


def run_point(config: Config, run_dir: Path, state: str, progress: bool = True, plotter=None) -> str:
    """Run, resume or (done) skip one point; its status. Every backend runs a point this way,
    so a point equals the standalone `fedsim run` of its config."""
    from fedsim.runs.experiment import Experiment, resume, resume_overrides

    if state == "done":
        if config.run.plots and not (run_dir / "plots").is_dir():  # (a stop signal caught it saving)
            from fedsim.results.plots import draw_plots

            draw_plots(plotter, {config.algorithm.name: run_dir}, run_dir / "plots", config.run.name)
        return read_manifest(run_dir)["status"]
    if state == "resume":
        return resume(run_dir, resume_overrides(config), progress, plotter).status
    clear_for_new_run(run_dir)
    return Experiment(config, run_dir, progress, plotter=plotter).run().status


def clear_for_new_run(run_dir: Path) -> None:
    """A point that starts afresh: what a start that never checkpointed left goes, unless another
    process holds the folder (then one line says which, and nothing there changes)."""
    DirectoryLock(run_dir).refuse_if_held()
    shutil.rmtree(run_dir, ignore_errors=True)
