"""The `fedsim` command: run, resume, report, plot, scenarios, config show, and the trace tools.

User mistakes (FedsimError) print one line ``error: ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import os
import shlex
import sys
from pathlib import Path

from fedsim.config import RESUME_KEYS, check_resume_overrides
from fedsim.errors import EXIT_CODES, STOP_SIGNALS, FedsimError, Stopped, stop_at_once
from fedsim.files import resume_command
from fedsim.results.run_format import read_manifest, use_recorded_plugin_folders


def server_memory(n_bytes: int) -> str:
    """`2.5KiB`, `6.1MiB`, `1.2GiB` (binary units, named so)."""
    for unit, size in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f}{unit}"
    return f"{n_bytes / 1024:.1f}KiB"


def _summary_table(result) -> str:
    """One line per algorithm; with `[run] targets`, the simulated time each was reached at
    (`~` interpolated between evaluations, as in `fedsim report`)."""
    from fedsim.config import read_toml
    from fedsim.results.report import duration, hit_time, target_label, time_to_target

    runs = result.runs or [result]
    targets = read_toml(runs[0].run_dir / "config.toml").get("run", {}).get("targets", [])
    width = max(16, *(len(r.algorithm) + 1 for r in runs))  # a plugin's 'module:Name' may be long
    header = (f"{'algorithm':<{width}} {'status':<11} {'rounds':>6} {'sim time':>10} {'test acc':>9} "
              f"{'test loss':>10} {'server mem':>11}")
    header += "".join(f" {'to ' + target_label(t):>9}" for t in targets)
    lines = [header, "-" * len(header)]
    for r in runs:
        manifest = read_manifest(r.run_dir)
        acc = f"{100 * r.final_accuracy:.2f}%" if r.final_accuracy is not None else "-"
        loss = f"{r.final_loss:.4g}" if r.final_loss is not None else "-"
        mem = server_memory(manifest["server_memory_bytes"])
        reached = "".join(f" {hit_time(time_to_target(r.rounds, t, manifest.get('initial')), acc != '-'):>9}"
                          for t in targets)
        lines.append(f"{r.algorithm:<{width}} {r.status:<11} {manifest['rounds']:>6} {duration(manifest['sim_time_s']):>10} "
                     f"{acc:>9} {loss:>10} {mem:>11}{reached}")
    return "\n".join(lines)


def check_axes_kept(folder: Path, overrides: list[str]) -> None:
    """FedsimError for a --set of an axis (or of the warm start) of a study given by its folder
    (`--resume FOLDER`): its points are the grid it ran; other values are a new study, whose
    command it prints (the folder's study.toml as a study file, in a new folder beside it)."""
    from fedsim.config import parse_override

    for text in overrides:
        section, key, _ = parse_override(text)
        if section in ("sweep", "warm_start"):
            what = "axes" if section == "sweep" else "warm start"
            raise FedsimError(
                f"--set {text!r}: a study's {what} cannot change on --resume (its points are those it ran with); "
                f"to run other values, start a new study from this one, which runs all its points in a new "
                f"folder: `{new_study_command(folder, overrides)}`")


def new_study_command(folder: Path, overrides: list[str]) -> str:
    """`fedsim sweep FOLDER/study.toml --set run.name=NAME-2 --set run.out=PARENT --set ...`:
    the study of `folder` with `overrides`, into the first free folder NAME-k beside it, typed
    from any directory."""
    import shlex

    folder = folder.absolute()
    name = next(f"{folder.name}-{k}" for k in range(2, 10**6) if not (folder.parent / f"{folder.name}-{k}").exists())
    sets = [f"run.name={name}", f"run.out={folder.parent}", *overrides]
    return " ".join(["fedsim sweep", shlex.quote(str(folder / "study.toml")),
                     *(f"--set {shlex.quote(text)}" for text in sets)])


def early_stops(result) -> list[str]:
    """`ALGO: stopped after R of N rounds (REASON)` for each completed run that ended short of
    its [run] rounds (the trace ran out of online devices, or max_time was reached)."""
    from fedsim.config import read_toml

    lines = []
    for r in result.runs or [result]:
        if r.status != "completed":
            continue
        done = read_manifest(r.run_dir)["rounds"]
        wanted = read_toml(r.run_dir / "config.toml").get("run", {}).get("rounds", done)
        if done < wanted:
            lines.append(f"{r.algorithm}: stopped after {done} of {wanted} rounds ({r.reason})")
    return lines


# docs/running.md, "Exit codes": 0 completed, 1 a bug (a traceback), 2 a usage or config error,
# 3 a diverged run, 130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (errors.EXIT_CODES)
EXIT_DIVERGED = 3


def stop_code(reason: str) -> int:
    """The exit status of work that the stop signal named in `reason` interrupted."""
    return EXIT_CODES["SIGTERM" if "SIGTERM" in reason else "Ctrl-C"]


def exit_code(runs) -> int:
    """The exit status of runs (a comparison's or a study's): a stop signal first (the work is
    unfinished), then divergence, else 0."""
    for r in runs:
        if r.status == "interrupted":
            return stop_code(r.reason)
    return EXIT_DIVERGED if any(r.status == "diverged" for r in runs) else 0


def manifest_warnings(result) -> list[str]:
    """`warning: ALGO: ...` for each warning a run's manifest records."""
    return [f"warning: {r.algorithm}: {text}" for r in result.runs or [result]
            for text in read_manifest(r.run_dir).get("warnings", [])]


def crash_note(run_dir: Path) -> str:
    """`: it crashed (last checkpoint at round R)` for a run whose manifest says it is running
    while nobody holds its directory."""
    from fedsim.results.status import run_status

    try:
        status = run_status(run_dir, read_manifest(run_dir, strict=False))
    except (OSError, ValueError):
        return ""
    return f": it {status}" if status.startswith("crashed") else ""


class Commentary:
    """stdout of a command whose work is its files (`run`, `sweep`): a reader that goes away
    (`fedsim run | head`) ends the lines, not the work, which goes on to its end and its exit
    status (where `fedsim trace info | head` has its output and may stop)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        """Nobody reads: the rest goes to /dev/null (also what the buffer still holds)."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def commentary(command):
    """`command` with its stdout a `Commentary`."""
    import contextlib
    import functools

    @functools.wraps(command)
    def wrapped(args) -> int:
        with contextlib.redirect_stdout(Commentary(sys.stdout)):
            return command(args)
    return wrapped


@commentary
def cmd_run(args) -> int:
    ready: list[Path] = [Path(args.resume)] if args.resume else []
    try:
        return _cmd_run(args, ready)
    except (Stopped, KeyboardInterrupt) as err:
        stop = as_stopped(err)
        stop.hint = stop.hint or run_stop_hint(ready[-1] if ready else None, fresh=not args.resume)
        raise stop from None
    except FedsimError as err:  # found once a new run had begun (a module's forward on a new batch size)
        if args.resume or not ready:
            raise
        raise FedsimError(f"{err}{run_failure_hint(ready[-1], str(err))}") from None
    except Exception as err:  # a bug (a plugin's, or fedsim's): its traceback ends with what the run keeps
        if ready:
            err.add_note(f"fedsim: the run stopped{run_failure_hint(ready[-1], '', new=not args.resume)}")
        raise


def run_failure_hint(run_dir: Path, said: str, new: bool = True) -> str:
    """What a run that stopped on a mistake or a bug left: a new run's directory without a round
    is removed (so the next run takes its name); one with rounds keeps its last checkpoint, from
    which a resume goes on once the cause is fixed (unless the line `said` already says how)."""
    import shutil

    if not run_dir.is_dir():
        return ""
    manifests = [run_dir / "manifest.json", *run_dir.glob("*/manifest.json")]
    done = max((read_manifest(m.parent, strict=False).get("rounds", 0) for m in manifests if m.exists()), default=0)
    if not done and new:
        shutil.rmtree(run_dir, ignore_errors=True)
        return f" (nothing was kept: {run_dir} removed)"
    if "--resume" in said:
        return ""
    return f"; {run_dir} keeps its last checkpoint: fix that, then run `{resume_command('run', run_dir)}` to go on"


def as_stopped(err: BaseException) -> Stopped:
    """A KeyboardInterrupt (raised by code that is not fedsim's) as the Stopped of a Ctrl-C."""
    return err if isinstance(err, Stopped) else Stopped("Ctrl-C")


def run_stop_hint(run_dir: Path | None, fresh: bool) -> str:
    """What a run that a stop signal ended at once left: a directory to resume, or nothing (a
    fresh run's directory that was only just made goes again)."""
    if run_dir is not None and ((run_dir / "checkpoint.pt").exists() or (run_dir / "config.toml").exists()):
        return f"; {run_dir} keeps its last checkpoint: run `{resume_command('run', run_dir)}` to finish it"
    if fresh and run_dir is not None and {p.name for p in run_dir.iterdir()} <= {".lock"}:
        (run_dir / ".lock").unlink(missing_ok=True)
        run_dir.rmdir()
    return " before the run started; nothing was written"


def check_spaced_set(overrides: list[str], config: str | None) -> None:
    """`--set client.lr 0.1`: argparse took the value for the config file; say so, not that no
    file `0.1` exists."""
    spaced = next((text for text in overrides if "=" not in text), None)
    if spaced is not None and config is not None and not Path(config).exists():
        raise FedsimError(f"--set {spaced!r}: expected section.key=value; write --set {spaced}={config}, with '=' "
                          f"({config!r} was read as the config file)")


def refuse_a_study_folder(folder: Path, overrides: list[str]) -> None:
    """`fedsim run --resume` of a study's folder, or of one of its points (or warm-start runs),
    which only its sweep writes to (a point resumed alone would leave the study's points unlike
    each other): one line with the command that resumes the study."""
    import shlex

    from fedsim.files import made_by_fedsim

    sets = "".join(f" --set {shlex.quote(text)}" for text in overrides)
    if (folder / "study.toml").is_file() and not (folder / "config.toml").exists():
        raise FedsimError(f"{folder}: a study's folder, which `fedsim sweep` resumes: run "
                          f"`{resume_command('sweep', folder)}{sets}`")
    study = next((f for f in (folder.parent, folder.parent.parent) if (f / "study.toml").is_file()
                  and made_by_fedsim(f)), None)
    if study is not None and (folder / "config.toml").exists():
        raise FedsimError(f"{folder}: a point of the study {study.absolute()}, which only its sweep writes to (resumed "
                          f"alone, it would end unlike the study's other points): run "
                          f"`{resume_command('sweep', study)}{sets}`")


def _cmd_run(args, ready: list[Path]) -> int:
    from fedsim.config import load_config
    from fedsim.config.layers import draws_plots
    from fedsim.results.plot_worker import shared_worker

    if args.resume and args.config is not None:
        raise FedsimError(
            f"fedsim run {args.config} --resume {args.resume}: give a config or --resume "
            "RUN_DIR, not both (a resumed run uses the config.toml in its directory)"
        )
    if args.force and not args.resume:
        raise FedsimError("--force: resumes a diverged run, with --resume RUN_DIR; a new run needs no --force")
    check_spaced_set(args.set, args.config)
    use_recorded_plugin_folders(args.resume or args.config)  # (a run's own config.toml, run again)
    # the whole config is checked before torch is imported or any data is read
    config = None if args.resume else load_config(args.config, args.set)
    if args.resume:
        check_resume_overrides(args.set)
        refuse_a_study_folder(Path(args.resume), args.set)
    plots = draws_plots(Path(args.resume) / "config.toml", args.set) if args.resume else config.run.plots
    # started before torch's import, so that matplotlib's overlaps it; none for a run without plots
    plotter = shared_worker() if plots else None
    from fedsim.runs.comparison import resume, run

    if args.resume:
        if Path(args.resume).is_dir():  # a run of a newer release is refused before a word of resuming
            from fedsim.results.run_format import check_readable

            check_readable(Path(args.resume))
        if Path(args.resume).is_dir():  # (else `resume` says what it is, in one line)
            from fedsim.files import DirectoryLock

            DirectoryLock(Path(args.resume)).refuse_if_held()  # (before a word of resuming a run in use)
            print(f"resuming {args.resume}{crash_note(Path(args.resume))}", flush=True)
        result = resume(args.resume, args.set, progress=not args.quiet, plotter=plotter, force=args.force)
    else:
        def on_ready(run_dir: Path) -> None:
            ready.append(run_dir)
            print(f"run directory: {run_dir}", flush=True)

        result = run(config, progress=not args.quiet, plotter=plotter, on_ready=on_ready)
    print(_summary_table(result))
    for r in result.runs or [result]:
        if r.status != "completed":
            said = r.reason if r.reason.startswith(r.status) else f"{r.status} ({r.reason})"
            print(f"{r.algorithm}: {said}")  # ("interrupted by Ctrl-C after 4 rounds", "diverged (...)")
    ran = {r.algorithm for r in result.runs}
    waiting = [name for name in result.algorithm.split(",") if result.runs and name not in ran]
    if waiting:
        print(f"not started: {', '.join(waiting)}")
    for line in early_stops(result):
        print(line)
    for line in manifest_warnings(result):
        print(line)
    if any(r.status == "interrupted" for r in [*result.runs, result]):
        print(f"interrupted: run `{resume_command('run', result.run_dir)}` to finish it")
    print(f"results: {result.run_dir}")
    return exit_code([*result.runs, result])  # a member says which signal; the whole, between members


def cmd_plot(args) -> int:
    from fedsim.results.plots import plot_run_dir, plot_study

    folder = Path(args.run_dir)
    if (folder / "study.toml").exists():
        from fedsim.studies.study import open_study

        study = open_study(folder)
        refuse_unfinished(study.folder, "its plots are drawn from its tables")
        paths = plot_study(study.folder, study.name, study.group_axes, study.targets)
    else:
        paths, studies = plot_run_dir(folder)
        if studies:
            print(f"not drawn here: {len(studies)} stud{'y' if len(studies) == 1 else 'ies'}, each drawn alone: "
                  f"`fedsim plot {studies[0].absolute()}`", file=sys.stderr)
    for path in paths:
        print(path)
    return 0


@commentary
def cmd_sweep(args) -> int:
    loaded = []
    try:
        return _cmd_sweep(args, loaded)
    except (Stopped, KeyboardInterrupt) as err:
        stop = as_stopped(err)
        folder = loaded[0].folder if loaded else None
        if folder is not None and (folder / "study.toml").exists():
            stop.hint = f"; the runs finished are kept: run `{loaded[0].resume_command()}` to finish the study"
        else:
            stop.hint = " before the study started; nothing was written"
        raise stop from None


def _cmd_sweep(args, loaded: list) -> int:
    from fedsim.results.plot_worker import shared_worker
    from fedsim.studies.study import load_study

    if (args.study is None) == (args.resume is None):
        raise FedsimError("fedsim sweep: give a study file (or scenario), or --resume STUDY_FOLDER to finish "
                          f"one that was interrupted{', not both' if args.study else ''}")
    check_spaced_set(args.set, args.study)
    if args.processes is not None and args.processes < 1:
        raise FedsimError(f"--processes {args.processes}: not a number of processes; give 1 or more, or leave it out "
                          "(one per 8 points, at most one per core)")
    if args.address is not None and args.backend != "ray":
        raise FedsimError(f"--address {args.address}: joins a Ray cluster, for --backend ray; add --backend ray, or "
                          "leave --address out")
    folder = Path(args.resume or args.study)
    if args.resume is not None and not folder.is_dir():
        what = "a file" if folder.exists() else "no such folder"
        raise FedsimError(f"--resume {args.resume}: {what}; --resume takes the folder of a study (the one "
                          "`fedsim sweep` printed after 'results:'), while a study file runs as `fedsim "
                          "sweep STUDY.toml` again (its finished points are skipped)")
    if folder.is_dir():  # a study folder: the study it ran, on its axes
        check_axes_kept(folder, args.set)
    use_recorded_plugin_folders(folder)  # (or its study.toml: a new study from it, as fedsim prints)
    if args.resume is not None:
        check_resume_overrides(args.set)
    study = load_study(args.study or args.resume, args.set, yes=args.yes)  # checked before torch is imported
    if args.backend == "ray":  # (the printed resume commands finish it there too)
        study.backend_flags = " --backend ray" + (f" --address {shlex.quote(args.address)}" if args.address else "")
    loaded.append(study)
    plotter = shared_worker()  # started before torch's import, so that matplotlib's overlaps it
    from fedsim.studies.sweep import run_study
    from fedsim.studies.tables import format_summary

    if study.folder.is_dir():
        from fedsim.files import DirectoryLock

        DirectoryLock(study.folder).refuse_if_held()  # (before a word of a study another sweep runs)
    warm = f" after {len(study.warm)} warm-start runs" if study.warm else ""
    print(f"study {study.name}: {len(study.points)} points{warm} in {study.folder}", flush=True)

    def on_point(point, state):
        what = {"done": "done, skipped", "resume": "resuming", "new": "running"}[state]
        print(f"  {point.name}: {what}", flush=True)

    records = run_study(study, progress=not args.quiet, plotter=plotter, on_point=on_point,
                        backend=args.backend, address=args.address, processes=args.processes or 0)
    if plotter is not None:
        plotter.finish()
    stopped = [r for r in records if r["status"] == "interrupted" or r["stopped_by"]]
    if stopped:
        finished = sum(r["status"] in ("completed", "diverged") for r in records)
        signal = "SIGTERM" if "SIGTERM" in stopped[0]["stopped_by"] else "Ctrl-C"
        print(f"study interrupted by {signal} ({finished} of {len(study.warm) + len(study.points)} runs "
              f"finished); run `{study.resume_command()}` to finish it")
        return stop_code(stopped[0]["stopped_by"])
    print(format_summary(study))
    print(f"results: {study.folder}")
    return EXIT_DIVERGED if any(r["status"] == "diverged" for r in records) else 0


def cmd_report(args) -> int:
    import json

    from fedsim.results.report import format_report, parse_targets, report

    if (Path(args.runs[0]) / "study.toml").exists():
        return report_study(args)
    if args.best_by or args.over or args.claims:
        option = "--claims" if args.claims else "--best-by and --over"
        raise FedsimError(f"{args.runs[0]}: not a study folder (no study.toml); {option} report on the "
                          "folder of a study that `fedsim sweep` ran")
    doc = report([Path(p) for p in args.runs], parse_targets(args.target))
    print(json.dumps(doc, indent=2, allow_nan=False) if args.json else format_report(doc))
    return 0


def report_study(args) -> int:
    """`fedsim report STUDY`: mean ± 95 % CI over seeds per group of points."""
    import json

    from fedsim.results.report import incomplete_block, parse_targets, points_trainer_block
    from fedsim.studies.study import open_study
    from fedsim.studies.tables import (best_by, format_summary, no_best_lines, study_report, study_tables,
                                       unfinished_block)

    if len(args.runs) > 1:
        raise FedsimError(f"fedsim report {' '.join(args.runs)}: {args.runs[0]} is a study's folder, which is "
                          "reported alone (mean and CI over its seeds); give it alone, and the run directories "
                          "in another `fedsim report`")
    if bool(args.best_by) != bool(args.over):
        raise FedsimError("--best-by METRIC and --over AXIS go together, e.g. --best-by final_acc "
                          "--over client.lr")
    study = open_study(Path(args.runs[0]))
    tables = study_tables(study, parse_targets(args.target))  # read only: nothing written
    if args.claims:
        refuse_unfinished(study.folder, "its claims are judged on its tables")
        return report_claims(study, args.json)
    summary = tables.summary
    if args.best_by:
        summary = best_by(summary, args.best_by, args.over, study.group_axes)
    print(json.dumps(study_report(study, tables, summary), indent=2, allow_nan=False) if args.json
          else "\n\n".join([format_summary(study, summary),
                              *(no_best_lines(summary, args.best_by, args.over, study.group_axes) if args.best_by else []),
                              *points_trainer_block(tables.runs),
                              *incomplete_block(tables.runs), *unfinished_block(study, tables.runs)]))
    return 0


def refuse_unfinished(folder: Path, what: str) -> None:
    """One line for a study without its tables (written once every point has run), which its
    plots and claims read."""
    if not (folder / "study.parquet").exists():
        raise FedsimError(f"{folder}: the study has not finished, and {what}, written once every point has run: "
                          f"`{resume_command('sweep', folder)}` finishes it; `fedsim report {folder.absolute()}` compares its "
                          "points where they stopped")


def report_claims(study, as_json: bool) -> int:
    """`fedsim report STUDY --claims`: each claim of the study checked, as a table, and written
    to claims.md and plots/claims.png in the study folder."""
    import json

    from fedsim.results.claims import claims_table, judge_study, write_claims
    from fedsim.studies.study import study_datasets

    verdicts = judge_study(study.folder, study.axes, study.claims, study.resolved.get("zip", []), study_datasets(study))
    written = write_claims(study.folder, study.name, verdicts)
    if as_json:
        print(json.dumps([{"claim": v.claim["claim"], "verdict": v.verdict, "note": v.decisive.note or None,
                           "mean": v.decisive.mean, "ci95": v.decisive.ci, "group": v.decisive.label,
                           **({"ratio": v.decisive.ratio[0], "ratio_ci95": v.decisive.ratio[1]}
                              if v.decisive.ratio else {}), "unreached": v.unreached,
                           "groups": [{"group": g.label, "values": g.values, "verdict": g.verdict,
                                       "note": g.note or None} for g in v.groups]} for v in verdicts], indent=2))
        return 0
    print(claims_table(verdicts))
    for path in written:
        print(f"written: {path}")
    return 0


def cmd_config_show(args) -> int:
    from fedsim.config import load_config
    from fedsim.config.show import show_config

    use_recorded_plugin_folders(args.config)
    config = load_config(args.config, args.set)
    print(show_config(config), end="")
    from fedsim.training import model_summary

    try:
        print(f"\n# the model: {model_summary(config.data, config.model, seed=config.run.seed)}")
    except FedsimError as err:
        print(f"\n# the model is not built here: {err}")
    return 0


def cmd_scenarios(args) -> int:
    """The built-in scenarios with the first paragraph of their comment, wrapped to the
    terminal beside the names; a study says so."""
    import shutil
    import textwrap

    from fedsim.config import is_study, read_toml, scenario_names, scenario_path

    names = scenario_names()
    width = max(map(len, names), default=0)
    columns = max(shutil.get_terminal_size().columns, width + 40)
    for name in names:
        path = scenario_path(name)
        about = " ".join(first_comment_paragraph(path.read_text()))
        if is_study(read_toml(path)):
            about = f"study (fedsim sweep {name}): {about}"
        lines = textwrap.wrap(about, columns - width - 2, break_on_hyphens=False) or [""]
        print(f"{name:<{width}}  {lines[0]}".rstrip())
        for line in lines[1:]:
            print(" " * (width + 2) + line)
    return 0


def first_comment_paragraph(text: str) -> list[str]:
    """The lines of a file's first comment paragraph (up to a bare `#` or the first other line)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#") or (lines and not line.lstrip("# ").strip()):
            break
        if line.lstrip("# ").strip():
            lines.append(line.lstrip("# ").strip())
    return lines


def choices_listing() -> str:
    """The valid names of every choice, plugins installed as entry points included."""
    from fedsim.config import catalog
    from fedsim.config import DEVICE_MODELS
    from fedsim.sim import profiles

    rows = [("[algorithm] name", catalog.ALGORITHMS.names()), ("[model] name", catalog.MODELS.names()),
            ("[trace] source", ["file", *catalog.GENERATORS.names()]),
            ("[data] partition", catalog.PARTITIONS.names()),
            ("[client] lr_schedule", catalog.SCHEDULES.names()),
            ("[client] trainer", catalog.TRAINERS.names()),
            ("[algorithm] selection", catalog.SELECTIONS.names()),
            ("[devices] model", list(DEVICE_MODELS)),
            ("[devices] classes", list(profiles.NAMES)),
            ("fedsim trace convert --from", catalog.CONVERTERS.names())]
    lines = [f"  {where}: {', '.join(names)}" for where, names in rows]
    return ("valid names (algorithms, selection policies, models and generators also take a plugin's "
            "'module:Name'; see docs/extending.md):\n" + "\n".join(lines))


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one `error:` line like every other, pointing at the help (argparse
    would print the whole usage first)."""

    argv: list[str] = []

    def parse_args(self, args=None, namespace=None):
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(self.argv, namespace)

    def error(self, message: str):
        import re

        from fedsim.errors import did_you_mean

        parser = self._command_parser()  # (argparse reports a subcommand's unknown flags at the top)
        spaced = [(key, value) for flag, key, value in zip(self.argv, self.argv[1:], self.argv[2:])
                  if flag == "--set" and "=" not in key and not value.startswith("-")]
        unknown = [w.split("=")[0] for w in message.partition(": ")[2].split() if w.startswith("--")]
        if message.startswith("unrecognized arguments") and spaced:  # `--set client.lr 0.1`
            message += f" (write --set {spaced[0][0]}={spaced[0][1]}, with '=')"
        hint = ""
        if message.startswith("unrecognized arguments") and unknown and not spaced:  # `--availabilty 0.5`
            flags = [o.lstrip("-") for a in parser._actions for o in a.option_strings if o.startswith("--")]
            hint = did_you_mean(unknown[0].lstrip("-"), flags).replace("mean '", "mean '--")  # (not by the dashes)
        chosen = re.match(r"argument \S+: invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if chosen and "did you mean" not in message:  # `fedsim rnu`
            hint = did_you_mean(chosen[1], re.findall(r"'?([\w-]+)'?", chosen[2]))
        help_ = f"`{parser.prog} --help`"
        self.exit(2, f"error: {parser.prog}: {message}; {f'{hint} (see {help_})' if hint else f'see {help_}'}\n")

    def _command_parser(self) -> argparse.ArgumentParser:
        """The (sub)command's parser the words of argv choose."""
        parser = self
        for word in self.argv:
            commands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if commands is not None and word in commands.choices:
                parser = commands.choices[word]
        return parser


class ListingParser(OneLineParser):
    """With ``listing=True``, the help ends with `choices_listing()`, built only when the help
    is shown (it looks up the installed plugins)."""

    def __init__(self, *args, listing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.listing = listing

    def format_help(self) -> str:
        if self.listing:
            self.epilog = choices_listing()
            self.formatter_class = argparse.RawDescriptionHelpFormatter
        return super().format_help()


def version_line() -> str:
    """`fedsim 0.1.0 (fedsim-avail)`: the version, and the distribution that pip knows it by
    (`pip install fedsim` is another project)."""
    from fedsim import DISTRIBUTION, __version__

    return f"fedsim {__version__} ({DISTRIBUTION})"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="fedsim",
        description="Federated learning under intermittent device availability, simulated.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ListingParser)

    p = sub.add_parser("run", help="run a simulation (default: the built-in quickstart)", listing=True)
    p.add_argument("config", nargs="?", default=None,
                   help="a config .toml or a built-in scenario name (see `fedsim scenarios`)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config key, e.g. --set run.rounds=50 (repeatable)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a run from its checkpoint (with --set run.rounds=N to extend it; "
                        "only " + ", ".join(RESUME_KEYS) + " can be changed)")
    p.add_argument("--force", action="store_true", help="with --resume: resume a diverged run too")
    p.add_argument("--quiet", action="store_true", help="no progress bar, nor progress lines")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="run a study: a base config over axes of values (seeds, "
                                     "algorithms, settings), summarised over seeds")
    p.add_argument("study", nargs="?", help="a study .toml ([sweep] axes) or a built-in study scenario "
                                            "(`fedsim scenarios` lists them)")
    p.add_argument("--resume", metavar="STUDY_FOLDER",
                   help="finish the study recorded in this folder (its study.toml holds the base config "
                        "with every --set it ran with): runs the points not done, resumes the interrupted")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a key of the study's base config; sweep.SECTION.KEY=[...] replaces "
                        "an axis, warm_start.SECTION.KEY=VALUE a key of its warm start (repeatable)")
    p.add_argument("--yes", action="store_true", help="run a grid of more than 10,000 points")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--backend", default="inprocess", metavar="{inprocess,ray}",
                   help="inprocess (default): the points in this process, up to 64 stepped together in "
                        "lockstep (their training shares batched calls); ray: points as Ray tasks "
                        "(pip install 'fedsim-avail[ray]')")
    p.add_argument("--address", help="Ray: the cluster to join (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="inprocess: step the points in N worker processes side by side, each its share in "
                        "lockstep (default: one per 8 points, at most one per core; 1 on a GPU)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("plot", help="(re)draw the plots of a run directory, a comparison or a study")
    p.add_argument("run_dir", metavar="FOLDER", help="a run directory, a comparison's or a study's folder, or a "
                                                     "folder of runs (its plots go to FOLDER/plots; docs/plots.md)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("report", help="accuracy, time to target accuracies, round durations and "
                                      "participation of run directories")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="a run directory or a comparison folder (one row per algorithm); several "
                        "are reported side by side")
    p.add_argument("--target", action="append", metavar="ACC",
                   help="a target accuracy in (0, 1], e.g. --target 0.8 --target 0.9 or "
                        "--target 0.8,0.9 (default: the runs' [run] targets)")
    p.add_argument("--json", action="store_true", help="one JSON document (null: never reached)")
    p.add_argument("--best-by", metavar="METRIC",
                   help="a study: for each value of the other axes, the best value of --over by this "
                        "metric's mean (final_acc, best_acc, final_loss, time_to_0.8_s, ...)")
    p.add_argument("--over", metavar="AXIS", help="the axis --best-by chooses over, e.g. client.lr")
    p.add_argument("--claims", action="store_true",
                   help="a study: check its [[claims]] (the paper studies' claims), print which hold, "
                        "and write claims.md and plots/claims.png into the study folder")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("scenarios", help="list the built-in scenarios")
    p.set_defaults(func=cmd_scenarios)

    p = sub.add_parser("config", help="show a resolved config")
    show = p.add_subparsers(dest="config_command", metavar="{show}", required=True).add_parser(
        "show", help="print the resolved config as TOML, every key with a comment saying what it "
                     "means: a template to edit")
    show.add_argument("config", nargs="?", default=None,
                      help="a config .toml or a built-in scenario name (default: quickstart)")
    show.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                      help="override a config key, e.g. --set run.rounds=50 (repeatable)")
    show.set_defaults(func=cmd_config_show)

    from fedsim.traces.commands import add_trace_commands

    add_trace_commands(sub, run_trace=run_trace)
    return parser


def run_trace(run_dir: Path):
    """The trace a run directory replays (for `fedsim trace info/plot RUN_DIR`); its config may
    name a model plugin's own keys, which are checked against the plugin (found where the run
    imported it from)."""
    from fedsim.runs.replay import run_trace

    use_recorded_plugin_folders(run_dir)
    return run_trace(run_dir)


def main(argv: list[str] | None = None) -> int:
    try:
        with stop_at_once():  # at any moment; a run's rounds finish the round in progress first
            args = build_parser().parse_args(argv)
            return args.func(args)
    except (Stopped, KeyboardInterrupt) as err:  # one line, whenever it came (docs/running.md, "Ctrl-C")
        stop = as_stopped(err)
        print(f"stopped by {stop.name}{stop.hint}", file=sys.stderr)
        return stop.exit_code
    except FedsimError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except MemoryError:  # a size no check caught up front
        print("error: out of memory; lower the sizes in the config or command (data.clients, "
              "data.samples, batch_size, trace devices or days) or use a bigger machine", file=sys.stderr)
        return 2
    except RuntimeError as err:  # torch's out of GPU memory is no MemoryError
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(err, torch.cuda.OutOfMemoryError):
            raise
        print("error: out of GPU memory; lower the sizes in the config or command (data.clients, "
              "server.clients_per_round, batch_size, the model) or run on the CPU (run.device = \"cpu\")",
              file=sys.stderr)
        return 2
    except BrokenPipeError:  # `fedsim trace info X | head`
        sys.stderr.close()
        return 0
    except OSError as err:  # a path the system refuses (permissions, a folder for a file, ...)
        where = f"{err.filename}: " if err.filename else ""
        full = err.errno in (errno.ENOSPC, errno.EDQUOT)
        fix = "free some space, then run the command again" if full else "check the path and its permissions"
        print(f"error: {where}{err.strerror or err}; {fix}", file=sys.stderr)
        return 2


def entry() -> None:
    shadow = shadowing_folder()
    if shadow is not None:
        print(f"error: the folder {shadow} is imported as the package fedsim, in place of fedsim's own "
              f"({Path(__file__).parent}): its parent {shadow.parent} is on PYTHONPATH (or is the working "
              f"directory); take {shadow.parent} off PYTHONPATH, or start fedsim from another folder",
              file=sys.stderr)
        exit_now(2)
    exit_now(main())


def shadowing_folder() -> Path | None:
    """A folder named fedsim that Python took for the package instead of this one, if any: a
    clone's root (no __init__.py: a namespace package) whose parent is on PYTHONPATH, where
    fedsim is installed by a finder that Python asks after the path (`pip install -e`)."""
    import fedsim

    own = Path(__file__).resolve().parent
    if getattr(fedsim, "__file__", None):
        return None if Path(fedsim.__file__).resolve().parent == own else Path(fedsim.__file__).parent
    return next((Path(p) for p in getattr(fedsim, "__path__", []) if Path(p).is_dir() and Path(p).resolve() != own),
                None)


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown, which takes ~0.4 s once torch is loaded and
    does nothing a finished command needs: every output file is closed, the exit handlers
    (the plot worker's) run here first, and the streams are flushed. A stop signal meanwhile
    lets them finish, and sets the exit status."""
    import signal

    def note(signum, frame):
        nonlocal code
        code = EXIT_CODES[STOP_SIGNALS[signum]]

    for sig in STOP_SIGNALS:
        signal.signal(sig, note)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`fedsim trace info X | head`)
            pass
    os._exit(code)
