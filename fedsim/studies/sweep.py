"""Running a study (`fedsim sweep`): under the study folder's lock, its warm-start runs, then
its points, on the in-process backend (fedsim/studies/lockstep.py) or on Ray
(fedsim/studies/ray_backend.py); then its tables and plots."""

from __future__ import annotations

import sys

from fedsim.config import dump_toml
from fedsim.errors import FedsimError
from fedsim.files import DirectoryLock
from fedsim.results.recorder import write_text
from fedsim.results.run_format import check_readable
from fedsim.runs.comparison import comparison_lock
from fedsim.runs.experiment import check_only_adds_rounds, run_state
from fedsim.runs.trackers import check_trackers
from fedsim.studies.processes import run_points_together
from fedsim.studies.study import WARM, Study, check_own_runs, check_same_study
from fedsim.studies.tables import write_tables


BACKENDS = ("inprocess", "ray")


def run_study(study: Study, progress: bool = True, plotter=None, on_point=None,
              backend: str = "inprocess", address: str | None = None, processes: int = 0) -> list[dict]:
    """Run (or finish) the warm-start runs, then every point; returns one record per run:
    its name, axis values, state before, status after and `stopped_by` (the Ctrl-C or SIGTERM
    that interrupted the study, "" if none). The study stops after a run that was
    interrupted. In-process, points run in lockstep (in `processes` worker processes side by
    side, 0: as many as pay; fedsim/studies/processes.py); with
    `backend = "ray"` they run as Ray tasks (fedsim/studies/ray_backend.py)."""
    if backend not in BACKENDS:
        raise FedsimError(f"--backend {backend!r} is not one of: {', '.join(BACKENDS)}")
    if processes < 0:
        raise FedsimError(f"--processes {processes}: not a number of processes; give 1 or more, or leave it out "
                          "(one per 8 points, at most one per core)")
    if processes and backend == "ray":
        raise FedsimError(f"--processes {processes}: applies to the in-process backend (Ray runs each point as a "
                          "task of its own); leave it out with --backend ray")
    if backend == "ray":
        from fedsim.studies.ray_backend import check_backend  # Ray is imported only when asked

        check_backend(address)
    check_trackers(study.points[0].config, study.folder / "mlflow.json")  # (before the folder is made: one that cannot log stops here)
    with comparison_lock(study.folder, "fedsim sweep"):  # one sweep of a study at a time
        grows = check_same_study(study)
        for point in [*study.warm, *study.points]:  # a run of it that another process writes to, or
            DirectoryLock(study.folder / point.name).refuse_if_held()  # that a later release wrote
            if (study.folder / point.name).is_dir():
                check_readable(study.folder / point.name)
        check_own_runs(study)  # (a run that another process writes to is refused as such first)
        for point in [*study.warm, *study.points]:
            check_only_adds_rounds(study.folder / point.name, point.config, f"point {point.name}")
        if grows:
            print(grows, file=sys.stderr, flush=True)
        recorded = study.folder / "study.toml"
        before = recorded.read_text() if recorded.exists() else None
        write_text(recorded, dump_toml(study.resolved))
        try:
            return _run_study_locked(study, progress, plotter, on_point, backend, address, processes)
        except FedsimError:  # a sweep that failed changes nothing of the study: a later resume runs it as it was
            if before is not None:
                write_text(recorded, before)
            raise


def _run_study_locked(study: Study, progress: bool, plotter, on_point, backend: str,
                      address: str | None, processes: int) -> list[dict]:
    if "mlflow" not in study.points[0].config.run.trackers:
        return _run_phases(study, progress, plotter, on_point, backend, address, processes)
    from fedsim.runs.trackers import study_parent

    with study_parent(study.name, study.folder) as parent:  # one MLflow experiment, one parent run
        records = _run_phases(study, progress, plotter, on_point, backend, address, processes)
        if any(r["status"] == "interrupted" or r["stopped_by"] for r in records):
            parent["status"] = "KILLED"
    return records


def _run_phases(study: Study, progress: bool, plotter, on_point, backend: str, address: str | None,
                processes: int) -> list[dict]:
    """The warm-start runs, then the points; the tables and plots once all are done."""
    records = []
    for phase in (study.warm, study.points):
        todo = [(point, run_state(study.folder / point.name, point.config)) for point in phase]
        if on_point:
            for point, state in todo:
                on_point(point, state)
        if backend == "ray":
            from fedsim.studies.ray_backend import run_points  # Ray is imported only when asked

            statuses, stopped_by = run_points(study, todo, address, progress)
        else:
            statuses, stopped_by = run_points_together(study, todo, plotter, progress, processes)
        records += [{"point": p.name, **p.values, "was": state, "status": status, "stopped_by": stopped_by}
                    for (p, state), status in zip(todo, statuses)]
        if any(r["status"] == "interrupted" or r["stopped_by"] for r in records):
            return records
        _check_warm_runs(study, records)
    write_tables(study)
    if study.points[0].config.run.plots:
        from fedsim.results.plots import plot_study

        plot_study(study.folder, study.name, study.group_axes, study.targets)
    return records


def _check_warm_runs(study: Study, records: list[dict]) -> None:
    """The points cannot start from a warm-start run that diverged."""
    for record in records[:len(study.warm)]:
        if record["status"] == "diverged":
            raise FedsimError(f"{study.folder / record['point']}: the warm-start run diverged, so the points "
                              f"cannot start from its model; lower its learning rate ([{WARM}] "
                              '"client.lr") and delete that folder')
