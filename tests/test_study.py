"""Studies (`fedsim sweep`): grids of points, standalone-equal points, resumption, summaries
over seeds with confidence intervals, best-by, bands, and one-line errors."""

from __future__ import annotations

import json
import math
import shutil
import signal
import sys
import tomllib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import rounds  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.config import dump_toml, read_toml  # noqa: E402

BASE = {"run": {"rounds": 10, "eval_every": 5, "progress": False, "plots": False},
        "data": {"dataset": "digits", "clients": 20},
        "server": {"clients_per_round": 5, "timing": "ideal"},
        "client": {"local_steps": 2, "lr": 0.3}}


def write_study(folder: Path, sweep: dict, name: str = "s", **sections) -> Path:
    study = {section: dict(body) for section, body in BASE.items()}
    for section, body in sections.items():
        study.setdefault(section, {}).update(body)
    study["run"].update(name=name, out=str(folder / "runs"))
    study["sweep"] = sweep
    path = folder / f"{name}.toml"
    path.write_text(dump_toml(study))
    return path


def sweep(path: Path, *extra: str, expect: int = 0) -> None:
    assert main(["sweep", str(path), "--quiet", *extra]) == expect


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """3 algorithms x 3 seeds, run once for the module."""
    folder = tmp_path_factory.mktemp("study")
    path = write_study(folder, {"algorithm.name": ["fedavg", "mifa", "fedau"], "run.seed": [0, 1, 2]})
    sweep(path)
    return folder / "runs" / "s"


def test_a_grid_runs_every_point_and_summarises_over_seeds(grid):
    names = sorted(p.name for p in grid.iterdir() if p.is_dir())
    assert names == sorted(f"algorithm-{a}_seed-{s}" for a in ("fedavg", "mifa", "fedau") for s in range(3))
    summary = pl.read_parquet(grid / "summary.parquet")
    assert summary["algorithm.name"].to_list() == ["fedavg", "mifa", "fedau"]
    assert summary["seeds"].to_list() == [3, 3, 3]
    for row in summary.iter_rows(named=True):
        finals = [rounds(grid / f"algorithm-{row['algorithm.name']}_seed-{s}")["test_acc"].drop_nulls()[-1]
                  for s in range(3)]
        assert row["final_acc_mean"] == pytest.approx(np.mean(finals))
        assert row["final_acc_ci95"] == pytest.approx(4.303 * np.std(finals, ddof=1) / math.sqrt(3))
    study = pl.read_parquet(grid / "study.parquet")
    assert len(study) == 9 * 10 and set(study["run.seed"]) == {0, 1, 2}
    per_point = study.group_by("point").agg(pl.len())["len"].to_list()
    assert per_point == [10] * 9


def test_a_point_equals_its_standalone_run(grid, tmp_path):
    point = grid / "algorithm-mifa_seed-1"
    raw = (point / "config.toml").read_text().replace(f'out = "{grid}"', f'out = "{tmp_path}"')
    (tmp_path / "alone.toml").write_text(raw)
    assert main(["run", str(tmp_path / "alone.toml"), "--quiet"]) == 0
    alone = tmp_path / "algorithm-mifa_seed-1"
    columns = ["round", "arrived", "train_loss", "test_loss", "test_acc"]
    assert rounds(alone)[columns].equals(rounds(point)[columns])
    a, b = torch.load(alone / "model.pt"), torch.load(point / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_study_resumes_after_sigterm_and_ends_like_an_uninterrupted_one(grid, tmp_path, monkeypatch, capsys):
    from fedsim.results.recorder import Recorder

    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa", "fedau"], "run.seed": [0, 1, 2]})
    add_round, calls = Recorder.add_round, {"n": 0}

    def term_in_round_4(self, outcome, *args):
        row = add_round(self, outcome, *args)
        calls["n"] += 1
        if calls["n"] == 9 * 4 + 3:  # the points step together: round 4 of the fourth point
            signal.raise_signal(signal.SIGTERM)
        return row

    monkeypatch.setattr(Recorder, "add_round", term_in_round_4)
    sweep(path, expect=143)
    folder = tmp_path / "runs" / "s"
    assert (f"study interrupted by SIGTERM (0 of 9 runs finished); run `fedsim sweep --resume {folder}` to "
            "finish it") in capsys.readouterr().out
    assert not (folder / "summary.parquet").exists()
    manifests = [json.loads((p / "manifest.json").read_text()) for p in folder.glob("algorithm-*")]
    assert len(manifests) == 9 and {m["status"] for m in manifests} == {"interrupted"}
    assert {m["rounds"] for m in manifests} <= {5, 6}  # each finished the round it was in
    monkeypatch.setattr(Recorder, "add_round", add_round)
    sweep(path)
    out = capsys.readouterr().out
    assert out.count("resuming") == 9
    mine, theirs = pl.read_parquet(folder / "summary.parquet"), pl.read_parquet(grid / "summary.parquet")
    assert mine.equals(theirs)
    sweep(path)
    assert capsys.readouterr().out.count("done, skipped") == 9


def test_report_prints_mean_and_ci_and_picks_the_best_learning_rate(tmp_path, capsys):
    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"], "client.lr": [0.01, 0.3],
                                  "run.seed": [0, 1]})
    sweep(path)
    folder = tmp_path / "runs" / "s"
    capsys.readouterr()
    assert main(["report", str(folder), "--target", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "algorithm.name" in text and "client.lr" in text and "±" in text and "time to 50%" in text and "rounds to 50%" in text
    assert main(["report", str(folder), "--best-by", "final_acc", "--over", "client.lr", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["groups"]
    summary = pl.read_parquet(folder / "summary.parquet")
    for entry in best:
        rows = summary.filter(pl.col("algorithm.name") == entry["values"]["algorithm.name"])
        assert entry["values"]["client.lr"] == rows.sort("final_acc_mean")["client.lr"][-1]
        assert entry["final_acc"]["mean"] == rows.sort("final_acc_mean")["final_acc_mean"][-1]
    assert [e["values"]["algorithm.name"] for e in best] == ["fedavg", "mifa"]
    assert main(["report", str(folder), "--best-by", "final_acc", "--over", "client.momentum"]) == 2
    assert "not an axis of the study" in capsys.readouterr().err
    assert main(["report", str(folder), "--best-by", "final_acc", "--over", "run.seed"]) == 2
    assert capsys.readouterr().err == ("error: --over 'run.seed': the seeds are what the study's means and intervals are "
                                       "over, not a setting to choose the best of; give one of its axes: "
                                       "algorithm.name, client.lr\n")
    assert main(["report", str(folder), "--target", "0.999", "--best-by", "time_to_0.999_s", "--over", "client.lr"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--best-by")]
    assert notes == [f"--best-by time_to_0.999_s: no value of client.lr has it for algorithm.name = {name} (no seed "
                     "reached the target), so its row above (client.lr = 0.01) is not a best" for name in ("fedavg", "mifa")]


def test_zipped_axes_vary_together_and_plots_show_bands(tmp_path):
    from fedsim.results.plots import study_bands

    path = write_study(tmp_path, {"client.lr": [0.1, 0.3], "client.local_steps": [1, 3], "run.seed": [0, 1],
                                  "zip": [["client.lr", "client.local_steps"]]},
                       run={"plots": True})
    sweep(path)
    folder = tmp_path / "runs" / "s"
    assert sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != "plots") == [
        "lr-0.1_local_steps-1_seed-0", "lr-0.1_local_steps-1_seed-1",
        "lr-0.3_local_steps-3_seed-0", "lr-0.3_local_steps-3_seed-1"]
    assert {p.name for p in (folder / "plots").iterdir()} == {"study_accuracy_vs_rounds.png",
                                                               "study_accuracy_vs_time.png"}
    bands = study_bands(pl.read_parquet(folder / "study.parquet"), ["client.lr", "client.local_steps"], "round")
    first = bands.filter((pl.col("client.lr") == 0.1) & (pl.col("x_value") == 5) & ~pl.col("held"))
    accs = [rounds(folder / f"lr-0.1_local_steps-1_seed-{s}")["test_acc"][4] for s in (0, 1)]
    assert first["mean"][0] == pytest.approx(np.mean(accs))
    assert first["ci95"][0] == pytest.approx(12.706 * np.std(accs, ddof=1) / math.sqrt(2))


@pytest.mark.parametrize("sweep_table, says", [
    ({"client.lrr": [0.1]}, "unknown key [client] lrr; did you mean 'lr'?"),
    ({"client.lr": []}, "[sweep] 'client.lr' = [] must be a non-empty list of values"),
    ({"lr": [0.1]}, "[sweep] 'lr' is not a config key"),
    ({"client.lr": [0.1, -1.0]}, "axis client.lr of [sweep] in"),
    ({"client.lr": [0.1, 0.2], "client.local_steps": [1], "zip": [["client.lr", "client.local_steps"]]},
     "zip ['client.lr', 'client.local_steps'] has axes of different lengths"),
    ({"run.seed": list(range(101)), "client.batch_size": list(range(1, 101))},
     "the sweep has 10,100 points (over 10,000); pass --yes"),
    ({}, "[sweep] has no axes"),
])
def test_bad_studies_are_one_line_and_run_nothing(tmp_path, capsys, sweep_table, says):
    path = write_study(tmp_path, sweep_table)
    sweep(path, expect=2)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "runs").exists()


def test_an_algorithm_key_no_algorithm_of_the_study_takes_is_suggested_from_all_of_them(tmp_path, capsys):
    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"]})
    sweep(path, "--set", "algorithm.wramup=true", expect=2)
    assert capsys.readouterr().err == ("error: --set algorithm.wramup=true: unknown key [algorithm] wramup (none of "
                                       "the study's algorithms fedavg, mifa takes it); did you mean 'warmup'?\n")
    assert not (tmp_path / "runs").exists()


def test_another_study_in_the_same_folder_is_refused(grid, tmp_path, capsys):
    path = write_study(tmp_path, {"run.seed": [0, 1]})
    raw = path.read_text().replace(f'out = "{tmp_path / "runs"}"', f'out = "{grid.parent}"')
    path.write_text(raw)
    sweep(path, expect=2)
    assert "holds a different study" in capsys.readouterr().err


def test_points_stepped_together_equal_their_runs_alone(tmp_path):
    """Model timing, a proximal objective beside a plain one (two shared calls), an async
    point (trains on its own): each point as `fedsim run` would make it."""
    from fedsim.config import config_from_dict
    from fedsim.runs.experiment import Experiment
    from fedsim.studies.lockstep import run_together

    def config(name, algorithm, seed, **server):
        return config_from_dict({
            "run": {"rounds": 8, "eval_every": 4, "seed": seed, "name": name, "out": str(tmp_path),
                    "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 20}, "client": {"local_steps": 3, "batch_size": 8},
            "algorithm": {"name": algorithm},
            "server": {"clients_per_round": 6, "deadline": 30.0, **server},
            "devices": {"model": "lognormal", "seconds_per_sample": 0.5}, "trace": {"source": "markov", "mean_on": 60.0,
                                                           "mean_off": 30.0, "days": 1.0}})

    configs = [config(f"{a}-{s}", a, s) for a in ("fedavg", "fedprox", "mifa") for s in (0, 1)]
    configs.append(config("async", "fedavg", 0, mode="async", buffer=3, concurrency=6))
    together = run_together([Experiment(c, tmp_path / "together" / c.run.name) for c in configs])
    for c, result in zip(configs, together):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        assert result.status == alone.status == "completed"
        assert torch.equal(result.params, alone.params), c.run.name  # bit for bit (training rules 3)
        assert result.rounds.drop("wall_s").equals(alone.rounds.drop("wall_s")), c.run.name


def test_per_device_objectives_stepped_together_equal_their_runs_alone(tmp_path):
    """scaffold and feddyn (a per-device linear term: stacked with their own kind, rows and
    all) beside fedavg (plain: a call of its own), each point as `fedsim run` would make it."""
    from fedsim.config import config_from_dict
    from fedsim.runs.experiment import Experiment
    from fedsim.studies.lockstep import run_together

    def config(algorithm, seed):
        return config_from_dict({
            "run": {"rounds": 6, "eval_every": 3, "seed": seed, "name": f"{algorithm}-{seed}", "out": str(tmp_path),
                    "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 12}, "model": {"name": "logreg"},
            "client": {"local_steps": 3, "batch_size": 8, "trainer": "batched"},
            "algorithm": {"name": algorithm, "selection": "all"},
            "server": {"timing": "ideal"}, "trace": {"source": "bernoulli", "p": 0.5}})

    configs = [config(a, s) for a in ("fedavg", "scaffold", "feddyn") for s in (0, 1)]
    together = run_together([Experiment(c, tmp_path / "together" / c.run.name) for c in configs])
    for c, result in zip(configs, together):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        assert result.status == alone.status == "completed"
        assert torch.equal(result.params, alone.params), c.run.name  # bit for bit (training rules 3)
    moved = [float((r.params - together[k % 2].params).norm()) for k, r in enumerate(together) if k >= 2]
    assert min(moved) > 1e-4  # the terms made a difference (against fedavg of the same seed)


def test_runs_that_replay_one_trace_share_its_index_and_numbers_are_unchanged(tmp_path, monkeypatch):
    """A lockstep group's runs of one seed replay one generated trace and share its index (who
    is online is looked up once a round for all of them); another seed's trace, or another
    generator's, is another index. Round-indexed bits under ideal timing and intervals under
    model timing with drops: every point equals the same group stepped without sharing bit
    for bit, and its run alone (who was online, invited, arrived, dropped; the model)."""
    from fedsim.config import config_from_dict
    from fedsim.runs.experiment import Experiment
    from fedsim.studies import lockstep

    def config(algorithm, seed, trace, **server):
        return config_from_dict({
            "run": {"rounds": 6, "eval_every": 3, "seed": seed, "name": f"{algorithm}-{seed}-{trace}",
                    "out": str(tmp_path), "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 12}, "model": {"name": "logreg"},
            "client": {"local_steps": 2, "batch_size": 8}, "algorithm": {"name": algorithm},
            "server": {"clients_per_round": 4, **server}, "devices": {"model": "lognormal", "seconds_per_sample": 0.5},
            "trace": {"source": "bernoulli", "p": 0.5} if trace == "bits" else
                     {"source": "markov", "mean_on": 60.0, "mean_off": 30.0, "days": 1.0}})

    configs = [config(a, s, "bits", timing="ideal") for a in ("fedavg", "mifa", "fedau") for s in (0, 1)]
    configs += [config(a, 0, "intervals", deadline=20.0) for a in ("fedavg", "fedvarp")]
    experiments = [Experiment(c, tmp_path / "shared" / c.run.name) for c in configs]
    shared = lockstep.run_together(experiments)
    index = {c.run.name: e.index for c, e in zip(configs, experiments)}
    assert index["fedavg-0-bits"] is index["mifa-0-bits"] is index["fedau-0-bits"]
    assert index["fedavg-1-bits"] is index["mifa-1-bits"] is index["fedau-1-bits"]
    assert index["fedavg-0-intervals"] is index["fedvarp-0-intervals"]
    assert len({id(i) for i in index.values()}) == 3
    monkeypatch.setattr(lockstep, "share_indexes", lambda experiments: None)
    apart = lockstep.run_together([Experiment(c, tmp_path / "apart" / c.run.name) for c in configs])
    for c, one, other in zip(configs, shared, apart):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        assert one.status == other.status == alone.status == "completed"
        assert torch.equal(one.params, other.params), c.run.name
        assert one.rounds.drop("wall_s").equals(other.rounds.drop("wall_s")), c.run.name
        assert torch.equal(one.params, alone.params), c.run.name
        columns = ["round", "t_start", "t_end", "online", "invited", "arrived", "dropped", "late"]
        assert one.rounds[columns].equals(alone.rounds[columns]), c.run.name
    assert sum(int(r.rounds["dropped"].sum()) for r in shared[6:]) > 0  # the intervals took devices away mid-task


def test_a_warm_start_phase_runs_once_per_seed_and_starts_every_point(tmp_path, capsys):
    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"], "client.lr": [0.01, 0.1], "run.seed": [0, 1]},
                       warm_start={"algorithm.name": "fedavg", "client.lr": 0.3, "run.rounds": 6})
    sweep(path, "--set", "warm_start.run.rounds=4")
    assert "8 points after 2 warm-start runs" in capsys.readouterr().out
    folder = tmp_path / "runs" / "s"
    assert sorted(p.name for p in (folder / "warm-start").iterdir()) == ["seed-0", "seed-1"]
    for seed in (0, 1):
        warm = folder / "warm-start" / f"seed-{seed}"
        assert len(rounds(warm)) == 4 and json.loads((warm / "manifest.json").read_text())["seed"] == seed
        final = rounds(warm)["test_acc"].drop_nulls()[-1]
        for point in folder.glob(f"algorithm-*_seed-{seed}"):
            manifest = json.loads((point / "manifest.json").read_text())
            assert manifest["initial"]["test_acc"] == final  # it starts where its warm start ended
            assert f'init_from = "{warm}"' in (point / "config.toml").read_text()
    assert pl.read_parquet(folder / "summary.parquet")["seeds"].to_list() == [2] * 4
    sweep(path, "--set", "warm_start.run.rounds=4")
    assert capsys.readouterr().out.count("done, skipped") == 10


def test_algorithm_keys_of_the_other_algorithms_are_dropped_per_point(tmp_path, capsys):
    """A study of the `compare` scenario: FedLaAvg's `beta` does not reach the FedAvg points."""
    path = tmp_path / "c.toml"
    path.write_text(dump_toml({"base": "compare", "run": {"name": "c", "out": str(tmp_path / "runs"), "rounds": 2,
                                                           "plots": False, "progress": False},
                               "sweep": {"run.seed": [0]}}))
    sweep(path)
    folder = tmp_path / "runs" / "c"
    assert "\nbeta = 0.1\n" in (folder / "algorithm-fedlaavg_seed-0" / "config.toml").read_text()
    assert "\nbeta = " not in (folder / "algorithm-fedavg_seed-0" / "config.toml").read_text()
    typo = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"]}, algorithm={"warmpu": True})
    sweep(typo, expect=2)
    assert "unknown key [algorithm] warmpu (none of the study's algorithms fedavg, mifa takes it); did you mean " \
           "'warmup'?" in capsys.readouterr().err


def test_a_study_is_not_the_base_of_another(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(dump_toml({"base": "paper-mifa", "sweep": {"run.seed": [5]}}))
    sweep(path, expect=2)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "base = 'paper-mifa' is a study, and a base is a config" in err


def test_a_study_interrupted_with_set_resumes_by_its_folder_to_the_same_numbers(tmp_path, monkeypatch, capsys):
    """The interrupt message prints the command that finishes the study; run as printed (from
    another directory, without the --set it started with) it ends like an uninterrupted run."""
    from fedsim.results.recorder import Recorder

    sets = ["--set", "run.name=int-study", "--set", "client.lr=0.2", "--set", "sweep.run.seed=[0, 1]"]
    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"], "run.seed": [0, 1, 2]})
    sweep(path, *sets)  # the uninterrupted study, for reference
    reference = tmp_path / "runs" / "int-study"
    reference.rename(tmp_path / "runs" / "reference")
    add_round, calls = Recorder.add_round, {"n": 0}

    def term_in_round_3(self, outcome, *args):
        row = add_round(self, outcome, *args)
        calls["n"] += 1
        if calls["n"] == 4 * 2 + 1:
            signal.raise_signal(signal.SIGINT)
        return row

    monkeypatch.setattr(Recorder, "add_round", term_in_round_3)
    sweep(path, *sets, expect=130)
    out = capsys.readouterr().out
    folder = tmp_path / "runs" / "int-study"
    assert f"run `fedsim sweep --resume {folder}` to finish it" in out
    monkeypatch.setattr(Recorder, "add_round", add_round)
    monkeypatch.chdir(tmp_path / "runs")  # elsewhere, as a user may be
    assert main(["sweep", "--resume", str(folder), "--quiet"]) == 0
    assert capsys.readouterr().out.count("resuming") == 4
    mine = pl.read_parquet(folder / "summary.parquet")
    theirs = pl.read_parquet(tmp_path / "runs" / "reference" / "summary.parquet")
    assert mine.equals(theirs) and mine["seeds"].to_list() == [2, 2]


def test_sweep_takes_a_study_or_a_folder_to_resume(tmp_path, capsys):
    assert main(["sweep", "--quiet"]) == 2
    assert capsys.readouterr().err == ("error: fedsim sweep: give a study file (or scenario), or --resume "
                                       "STUDY_FOLDER to finish one that was interrupted\n")
    assert main(["sweep", "--resume", str(tmp_path)]) == 2
    assert "not a study folder (no study.toml)" in capsys.readouterr().err


def test_a_sweep_shows_its_progress_a_line_per_point_off_a_terminal_and_nothing_quiet(tmp_path, capsys):
    path = write_study(tmp_path, {"run.seed": [0, 1, 2]}, name="p")
    assert main(["sweep", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " s)" in line]
    assert [line.split(":")[0].strip() for line in lines] == ["seed-0", "seed-1", "seed-2"]
    assert [line.split("(")[1].split(",")[0] for line in lines] == ["1/3", "2/3", "3/3"]
    path = write_study(tmp_path, {"run.seed": [0, 1, 2]}, name="q")
    assert main(["sweep", str(path), "--quiet"]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if " s)" in line]


def test_on_a_terminal_the_bar_counts_rounds_and_points(tmp_path, monkeypatch):
    import io

    from fedsim.studies.progress import StudyProgress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    shown = StudyProgress([10, 10, 5], points=4, done=1)
    shown.bar.fp = io.StringIO()
    drawn = []
    monkeypatch.setattr(shown.bar, "refresh", lambda *args, **kwargs: drawn.append(shown.bar.postfix))
    shown.rounds_done(7)
    shown.point_finished("seed-1", "completed")
    assert (shown.bar.n, shown.bar.total, shown.done) == (7, 25, 2)
    # drawn at once: the last point's end comes after the bar's last round, with no round to redraw it
    assert shown.bar.postfix == "points 2/4" and drawn[-1] == "points 2/4"
    shown.close()


def study_figure(folder: Path, monkeypatch, group_axes, targets=()):
    """The figure plot_study draws for the rounds axis (kept instead of only saved)."""
    import matplotlib.figure

    import fedsim.results.plots as plots

    figs = []
    original = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figs.append(self) or original(self, *a, **k))
    plots.plot_study(folder, "s", group_axes, list(targets))
    return figs[0]


def test_study_plots_start_at_the_initial_model_clip_their_bands_and_mark_the_targets(grid, monkeypatch):
    fig = study_figure(grid, monkeypatch, ["algorithm.name"], targets=[0.5, 0.9])
    accuracy, loss = fig.axes[0], fig.axes[1]
    assert accuracy.get_ylabel() == "test accuracy (%)" and loss.get_ylabel() == "test loss (log scale)"
    assert loss.get_yscale() == "log"
    curves = [line for line in accuracy.get_lines() if line.get_label() in ("fedavg", "mifa", "fedau")]
    fedavg = curves[0]
    assert [c.get_label() for c in curves] == ["fedavg", "mifa", "fedau"]  # groups in the study's order
    initial = json.loads((grid / "algorithm-fedavg_seed-0" / "manifest.json").read_text())["initial"]
    assert fedavg.get_xdata()[0] == 0  # rounds completed: the initial model first
    seeds = [json.loads((grid / f"algorithm-fedavg_seed-{s}" / "manifest.json").read_text())["initial"]["test_acc"]
             for s in range(3)]
    assert fedavg.get_ydata()[0] == pytest.approx(100 * np.mean(seeds)) and initial["test_acc"] is not None
    for band in accuracy.collections:  # bands within [0, 100] %
        ys = band.get_paths()[0].vertices[:, 1]
        assert ys.min() >= 0 and ys.max() <= 100
    dashed = sorted(line.get_ydata()[0] for line in accuracy.get_lines() if line.get_linestyle() == "--")
    assert dashed == [50.0, 90.0]


def test_more_than_four_groups_get_a_panel_each(grid, monkeypatch):
    fig = study_figure(grid, monkeypatch, ["algorithm.name", "run.seed"])  # 9 groups of one point
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 9 * 2  # accuracy and loss per group
    titles = [ax.get_title() for ax in visible if ax.get_title()]
    assert titles[0] == "algorithm.name = fedavg, run.seed = 0" and len(titles) == 9  # (the study's order)


@pytest.mark.parametrize("backend", ["inprocess", "ray"])
def test_a_second_sweep_of_a_study_that_runs_is_refused_and_changes_nothing(tmp_path, capsys, backend):
    """On either backend: the lock is taken before any point is touched (or Ray started)."""
    from fedsim.files import DirectoryLock

    path = write_study(tmp_path, {"run.seed": [0, 1]}, name="busy")
    folder = tmp_path / "runs" / "busy"
    holder = DirectoryLock(folder)
    holder.acquire("fedsim sweep")  # another sweep of the study, running
    try:
        assert main(["sweep", str(path), "--quiet", "--backend", backend]) == 2
        out, err = capsys.readouterr()
        assert err.startswith(f"error: {folder}: in use by process ") and "(fedsim sweep)" in err
        assert "points" not in out  # (no "study busy: 2 points" before it)
        assert sorted(p.name for p in folder.iterdir()) == [".lock"]  # no point, no study.toml
    finally:
        holder.release()
    assert main(["sweep", str(path), "--quiet"]) == 0


def test_a_finished_study_grows_to_more_rounds_by_set(tmp_path, capsys):
    path = write_study(tmp_path, {"run.seed": [0, 1]}, name="grow")
    sweep(path)
    sweep(path, "--set", "run.rounds=14", "--set", "run.eval_every=7")
    out = capsys.readouterr().out
    assert out.count("resuming") == 2
    for seed in (0, 1):
        assert rounds(tmp_path / "runs" / "grow" / f"seed-{seed}")["round"].to_list() == list(range(14))
    sweep(path, "--set", "client.lr=0.1", expect=2)  # another study, not a grown one
    assert "holds a different study" in capsys.readouterr().err


def test_a_set_of_several_values_for_a_key_of_one_says_how_to_sweep_them_and_that_runs(tmp_path, capsys):
    import shlex

    path = write_study(tmp_path, {"run.seed": [0, 1]}, name="lrs", run={"rounds": 2, "eval_every": 2})
    sweep(path, "--set", "client.lr=[0.1, 0.2]", expect=2)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[client] lr takes one value; to sweep over these, give an axis: " in err, err
    suggested = shlex.split(err.split("give an axis: ")[1])
    assert suggested == ["--set", "sweep.client.lr=[0.1, 0.2]"]
    sweep(path, *suggested)
    points = sorted(p.parent.name for p in (tmp_path / "runs" / "lrs").glob("*/rounds.parquet"))
    assert len(points) == 4 and {p.split("_")[-1] for p in points} == {"lr-0.1", "lr-0.2"}, points


def test_a_study_that_stopped_before_any_run_is_run_again_with_a_fixed_set(tmp_path, capsys):
    """Missing data stops the sweep before its first point: the same study with --set
    data.root (or another fix) runs, not refused as another study; once a point ran, it is."""
    path = write_study(tmp_path, {"run.seed": [0, 1]}, name="nodata",
                       data={"dataset": "mnist", "root": str(tmp_path / "nowhere")})
    sweep(path, expect=2)
    assert "files not found" in capsys.readouterr().err
    sweep(path, "--set", "data.dataset=digits")
    sweep(path, "--set", "data.dataset=digits", "--set", "client.lr=0.05", expect=2)
    assert "holds a different study" in capsys.readouterr().err


def test_a_study_reported_with_other_folders_says_to_report_it_alone(grid, capsys):
    point = next(p for p in sorted(grid.iterdir()) if (p / "rounds.parquet").exists())
    assert main(["report", str(grid), str(point)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: fedsim report {grid} {point}: {grid} is a study's folder, which is reported alone (mean "
                   "and CI over its seeds); give it alone, and the run directories in another `fedsim report`\n")


def test_a_studys_json_report_has_the_keys_of_a_runs(grid, capsys):
    capsys.readouterr()
    assert main(["report", str(grid), "--json", "--target", "0.3"]) == 0
    study = json.loads(capsys.readouterr().out)
    assert main(["report", str(grid / "algorithm-fedavg_seed-0"), "--json", "--target", "0.3"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert set(run) <= set(study) and study["targets"] == run["targets"] == [0.3]
    assert study["axes"] == ["algorithm.name"] and len(study["runs"]) == 9
    point = next(r for r in study["runs"] if r["name"] == "algorithm-fedavg_seed-0")
    assert set(point) == set(run["runs"][0]) | {"values"}
    assert point["values"] == {"algorithm.name": "fedavg", "run.seed": 0}
    assert {k: point[k] for k in ("final_acc", "best_loss", "targets")} == \
        {k: run["runs"][0][k] for k in ("final_acc", "best_loss", "targets")}
    fedavg = study["groups"][0]
    assert fedavg["values"] == {"algorithm.name": "fedavg"} and fedavg["seeds"] == 3
    assert fedavg["points"] == [f"algorithm-fedavg_seed-{s}" for s in range(3)]
    finals = [r["final_acc"] for r in study["runs"] if r["name"] in fedavg["points"]]
    assert fedavg["final_acc"]["mean"] == pytest.approx(np.mean(finals))
    assert fedavg["final_acc"]["std"] == pytest.approx(np.std(finals, ddof=1))
    assert set(fedavg) - {"values", "seeds", "points"} == {"final_acc", "best_acc", "final_loss", "best_loss",
                                                          "targets"} <= set(run["runs"][0])
    (target,) = fedavg["targets"]
    assert set(target) - {"reached"} == {"target", "rounds", "time_s"} <= set(run["runs"][0]["targets"][0])
    reached = [r["targets"][0]["time_s"] is not None for r in study["runs"] if r["name"] in fedavg["points"]]
    assert target["reached"] == sum(reached)
    assert set(target["time_s"]) == {"mean", "std", "ci95"}


def test_a_group_evaluated_together_equals_its_runs_alone(tmp_path, monkeypatch):
    """Where lockstep evaluates a group's due evaluations in one call (on a GPU; forced here):
    every evaluation happens, in one call per round for the runs of one model, and each run's
    test metrics equal its run alone (to float rounding)."""
    from fedsim.config import config_from_dict
    from fedsim.runs.experiment import Experiment
    from fedsim.studies import lockstep

    calls = []
    real = lockstep.evaluate_together
    monkeypatch.setattr(lockstep, "rounding_allowed", lambda device: True)
    monkeypatch.setattr(lockstep, "evaluate_together", lambda runs, threads: calls.append(len(runs)) or real(runs, threads))

    def config(algorithm, seed):
        return config_from_dict({
            "run": {"rounds": 6, "eval_every": 2, "seed": seed, "name": f"{algorithm}-{seed}", "out": str(tmp_path),
                    "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 20}, "model": {"name": "mlp", "hidden": 16},
            "client": {"local_steps": 2, "batch_size": 8}, "algorithm": {"name": algorithm},
            "server": {"timing": "ideal", "clients_per_round": 5}})

    configs = [config(a, s) for a in ("fedavg", "mifa") for s in (0, 1)]
    together = lockstep.run_together([Experiment(c, tmp_path / "together" / c.run.name) for c in configs])
    assert calls == [4, 4, 4]  # rounds 2, 4 and 6: the four runs in one call each
    for c, result in zip(configs, together):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        assert result.rounds["test_acc"].equals(alone.rounds["test_acc"])
        np.testing.assert_allclose(result.rounds["test_loss"].drop_nulls().to_numpy(),
                                   alone.rounds["test_loss"].drop_nulls().to_numpy(), rtol=1e-6)
        assert result.rounds["test_loss"].null_count() == alone.rounds["test_loss"].null_count() == 3


def test_a_points_config_run_on_its_own_is_refused_and_both_printed_commands_work(tmp_path, capsys, monkeypatch):
    """`fedsim run STUDY/POINT/config.toml` would write into the study's folder: refused, with
    the command that runs it as a new run beside the study (its numbers: the point's) and the one
    that finishes the study; both run as printed."""
    import re
    import shlex

    from conftest import quadratic_config

    from fedsim.config import dump_toml

    monkeypatch.chdir(tmp_path)
    study = quadratic_config([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]], rounds=3)
    study["run"].update(name="s", out="runs", progress=False, plots=False)
    (tmp_path / "s.toml").write_text(dump_toml({**study, "sweep": {"client.lr": [0.1, 0.2]}}))
    sweep(tmp_path / "s.toml")
    folder = tmp_path / "runs" / "s"
    point = folder / "lr-0.2"
    def files(under: Path) -> dict:
        return {p: p.read_bytes() for p in under.rglob("*") if p.is_file() and p.name != ".lock"}

    kept, points = files(folder), files(point.parent / "lr-0.1") | files(point)
    capsys.readouterr()
    assert main(["run", str(point / "config.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is in the folder of the study {folder.absolute()}, which only its sweep" in err
    alone, finish = re.findall(r"`(fedsim [^`]+)`", err)
    assert files(folder) == kept
    assert main(shlex.split(alone)[1:]) == 0
    columns = ["round", "arrived", "train_loss", "test_loss"]
    assert rounds(tmp_path / "runs" / "lr-0.2")[columns].equals(rounds(point)[columns])
    assert main(shlex.split(finish)[1:]) == 0
    assert "lr-0.2: done, skipped" in capsys.readouterr().out
    assert files(point.parent / "lr-0.1") | files(point) == points


def quadratic_study(folder: Path, name: str = "q", **client) -> Path:
    """A small study of the quadratic task (seeds 0 and 1), into folder/runs/NAME."""
    study = {"run": {"name": name, "out": str(folder / "runs"), "rounds": 3, "progress": False, "plots": False},
             "data": {"dataset": "quadratic", "clients": 3, "targets": [[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]},
             "client": {"batch_size": 0, "local_steps": 1, "lr": 0.1, **client},
             "server": {"timing": "ideal", "round_duration": 1.0}, "sweep": {"run.seed": [0, 1]}}
    path = folder / f"{name}.toml"
    path.write_text(dump_toml(study))
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_a_study_folder_whose_study_toml_is_another_studys_is_refused_naming_a_run_and_the_key(tmp_path, capsys):
    import shutil

    sweep(quadratic_study(tmp_path, "q"))
    sweep(quadratic_study(tmp_path, "other", lr=0.05))
    folder = tmp_path / "runs" / "q"
    shutil.copy(tmp_path / "runs" / "other" / "study.toml", folder / "study.toml")
    before = snapshot(tmp_path / "runs")
    assert main(["sweep", "--resume", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {folder}: holds a different study (its run seed-0 ran with [client] lr = 0.1, the study in "
                   f"{folder / 'study.toml'} gives 0.05); its study.toml is not the one these runs ran with: put that "
                   "one back, or run this study from its file with another [run] name\n")
    assert snapshot(tmp_path / "runs") == before
    (folder / "study.toml").unlink()  # without one, the other study's file is refused the same way
    assert main(["sweep", str(tmp_path / "other.toml"), "--quiet", "--set", "run.name=q"]) == 2
    assert ("holds a different study (its run seed-0 ran with [client] lr = 0.1, the study in "
            f"{tmp_path / 'other.toml'} gives 0.05); give this one another [run] name") in capsys.readouterr().err


def test_a_resume_that_changes_an_axis_prints_the_new_study_that_runs_as_printed(tmp_path, capsys):
    import re

    from test_stop_and_resume import as_printed

    sweep(quadratic_study(tmp_path, "q"))
    folder = tmp_path / "runs" / "q"
    before = snapshot(folder)
    assert main(["sweep", "--resume", str(folder), "--set", "sweep.run.seed=[0, 1, 2]", "--set", "run.rounds=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --set 'sweep.run.seed=[0, 1, 2]': a study's axes cannot change on --resume (its "
                          "points are those it ran with); to run other values, start a new study from this one, "
                          "which runs all its points in a new folder: `") and err.count("\n") == 1
    command = re.search(r"`(fedsim sweep [^`]+)`", err).group(1)
    assert command == (f"fedsim sweep {folder / 'study.toml'} --set run.name=q-2 --set run.out={folder.parent} "
                       "--set 'sweep.run.seed=[0, 1, 2]' --set run.rounds=4")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(command, elsewhere)
    assert done.returncode == 0, done.stderr
    new = tmp_path / "runs" / "q-2"
    assert sorted(p.name for p in new.iterdir() if p.is_dir()) == ["seed-0", "seed-1", "seed-2"]
    assert pl.read_parquet(new / "summary.parquet")["seeds"].to_list() == [3]
    kept = ["round", "t_end", "arrived", "train_loss"]
    grown = rounds(new / "seed-0").select(kept)  # the same point, one round more
    assert grown.head(3).equals(rounds(folder / "seed-0").select(kept)) and grown.height == 4
    assert snapshot(folder) == before and list(elsewhere.iterdir()) == []


def test_a_second_ctrl_c_in_a_point_aborts_the_study_and_no_point_reads_as_completed(tmp_path, capsys, monkeypatch):
    """Stepped together, a point whose round raised (here the second Ctrl-C, which aborts at
    once) was left as if it had completed its rounds, and never resumed."""
    from fedsim.results.recorder import Recorder

    path = quadratic_study(tmp_path, "q")
    add_round = Recorder.add_round

    def ctrl_c_in_round_1(self, outcome, *args):  # in each point: the second one aborts
        if outcome.round == 1:
            signal.raise_signal(signal.SIGINT)
        return add_round(self, outcome, *args)

    monkeypatch.setattr(Recorder, "add_round", ctrl_c_in_round_1)
    assert main(["sweep", str(path), "--quiet"]) == 130
    assert "stopped by Ctrl-C; the runs finished are kept: run `fedsim sweep --resume" in capsys.readouterr().err
    monkeypatch.setattr(Recorder, "add_round", add_round)
    folder = tmp_path / "runs" / "q"
    for point in ("seed-0", "seed-1"):
        assert json.loads((folder / point / "manifest.json").read_text())["status"] != "completed"
    assert main(["sweep", "--resume", str(folder), "--quiet"]) == 0
    for point in ("seed-0", "seed-1"):
        assert rounds(folder / point)["round"].to_list() == [0, 1, 2]


def test_points_that_cannot_train_in_one_call_run_as_groups_with_one_note(tmp_path, capsys, monkeypatch):
    """Points of two models interleaved in the grid run as two lockstep groups, one after the
    other (here 2 points at a time): each run trains with the other run of its model, and one
    note line says how the study split and why."""
    from fedsim.studies import lockstep

    monkeypatch.setattr(lockstep, "TOGETHER", 2)
    path = write_study(tmp_path, {"run.seed": [0, 1], "model.name": ["logreg", "mlp"]})
    assert main(["sweep", str(path)]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes == ["note: the 4 points run as 2 lockstep groups (2 and 2 points): runs "
                     "that differ in model.name ('logreg', 'mlp') cannot train in one call"]
    for point in ("seed-0_name-logreg", "seed-1_name-logreg", "seed-0_name-mlp", "seed-1_name-mlp"):
        manifest = json.loads((tmp_path / "runs" / "s" / point / "manifest.json").read_text())
        assert "in one call with 1 other run(s) of the study" in manifest["trainer"]["why"], point


def test_a_study_that_shares_one_step_prints_no_note_and_async_points_are_their_own_group(tmp_path, capsys):
    path = write_study(tmp_path, {"run.seed": [0, 1]})
    assert main(["sweep", str(path)]) == 0
    assert "note:" not in capsys.readouterr().err
    path = write_study(tmp_path, {"server.mode": ["sync", "async"], "run.seed": [0, 1]}, name="modes",
                       server={"timing": "model"})
    assert main(["sweep", str(path)]) == 0
    assert ("note: the 4 points run as 2 lockstep groups (2 and 2 points): runs that differ "
            "in server.mode ('sync', 'async') cannot train in one call") in capsys.readouterr().err.splitlines()


def test_a_study_on_a_scenario_that_replays_a_file_drops_the_scenarios_generator_keys(tmp_path, capsys):
    """As `fedsim run quickstart --set trace.source=file` does: the quick start's diurnal keys
    (p_min, ...) are dropped where the study replays a file; written in the study, they stay an
    error."""
    from fedsim.studies.study import load_study

    assert main(["trace", "generate", "diurnal", "--devices", "12", "--days", "2",
                 "--out", str(tmp_path / "t.parquet")]) == 0
    study = tmp_path / "s.toml"
    body = ('base = "quickstart"\n[run]\nname = "s"\nrounds = 2\n[data]\nclients = 12\n'
            '[trace]\nsource = "file"\npath = "t.parquet"\n[sweep]\n"run.seed" = [0, 1]\n')
    study.write_text(body)
    points = load_study(str(study)).points
    assert len(points) >= 2 and {p.config.trace.source for p in points} == {"file"}
    assert main(["sweep", str(study), "--quiet"]) == 0
    study.write_text(body.replace('path = "t.parquet"\n', 'path = "t.parquet"\np_min = 0.1\n'))
    capsys.readouterr()
    assert main(["sweep", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: base config {study}: unknown key [trace] p_min for 'file'") and err.count("\n") == 1, err


def test_a_study_with_the_trace_source_as_an_axis_drops_each_generators_keys_where_another_runs(tmp_path, capsys,
                                                                                            monkeypatch):
    """The quick start's `p_min` (its base) and one written in the study reach the bernoulli
    points only; the file points replay the file. The recorded study resumes from another
    directory the same way; a key that no generator of the study takes stays an error."""
    from fedsim.studies.study import load_study

    assert main(["trace", "generate", "bernoulli", "--devices", "100", "--rounds", "30", "--round-duration", "60",
                 "--out", str(tmp_path / "t.parquet"), "--set", "p=0.3"]) == 0
    study = tmp_path / "s.toml"
    body = ('base = "quickstart"\n[run]\nname = "s"\nrounds = 2\n[trace]\npath = "t.parquet"\n'
            '[sweep]\n"trace.source" = ["bernoulli", "file"]\n')
    study.write_text(body)
    points = {p.config.trace.source: p.config.trace for p in load_study(str(study)).points}
    assert points["bernoulli"].options == {"p_min": 0.05} and points["file"].options == {}
    study.write_text(body.replace('path = "t.parquet"\n', 'path = "t.parquet"\np_min = 0.2\n'))
    points = {p.config.trace.source: p.config.trace for p in load_study(str(study)).points}
    assert points["bernoulli"].options == {"p_min": 0.2} and points["file"].options == {}
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(study), "--quiet"]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["sweep", "--resume", str(tmp_path / "runs" / "s"), "--set", "run.rounds=3", "--quiet"]) == 0
    for point, p_min in (("algorithm-mifa_source-bernoulli", 0.2), ("algorithm-mifa_source-file", None)):
        config = tomllib.loads((tmp_path / "runs" / "s" / point / "config.toml").read_text())
        assert config["trace"].get("p_min") == p_min and config["run"]["rounds"] == 3, config
    study.write_text(body.replace('path = "t.parquet"\n', 'path = "t.parquet"\np_mni = 0.2\n'))
    capsys.readouterr()
    assert main(["sweep", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown key [trace] p_mni" in err and err.count("\n") == 1, err


def test_a_group_whose_points_do_not_fit_in_memory_together_runs_in_batches_that_do(tmp_path, capsys, monkeypatch):
    """Each point fits alone, but a lockstep batch holds its points' cohorts and algorithm state
    at once: the group runs as many at a time as fit (in a worker process, in its share of the
    memory), says so in one note, and every point's numbers are those of the group run at once."""
    from fedsim.studies import lockstep
    from fedsim.training import memory

    path = write_study(tmp_path, {"algorithm.name": ["mifa"], "run.seed": [0, 1, 2]})
    needs = []
    run_together = lockstep.run_together
    monkeypatch.setattr(lockstep, "run_together",
                        lambda experiments, *a: needs.extend(e.memory_needs for e in experiments) or
                        run_together(experiments, *a))
    sweep(path)  # the machine's own memory: one batch of the three
    reference = tmp_path / "runs" / "s"
    alone, held = sum(needs[0].values()), memory.held_in_lockstep(needs[0])
    assert len(needs) == 3 and held > 0
    fits_two = (alone + 1.5 * held) / memory.SHARE  # two points beside each other, not three
    for share, total in ((1.0, fits_two), (0.5, 2 * fits_two)):
        monkeypatch.setattr(memory, "device_memory", lambda device, total=total: int(total))
        monkeypatch.setattr(memory, "PROCESS_SHARE", [share])  # (a worker process's, set from its job)
        out = tmp_path / f"share-{share}"
        assert main(["sweep", str(path), "--set", f"run.out={out}"]) == 0
        notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
        where = "this machine's" if share == 1 else "this worker process's share (0.5) of 90% of this machine's"
        assert len(notes) == 1 and notes[0].startswith(
            "note: the 3 points of a lockstep group run in batches that fit in memory (2 in the first): beside each "
            "other their cohorts' parameters and algorithms' state (up to "), notes
        assert f"a point) must fit in {'90% of ' if share == 1 else ''}{where}" in notes[0]
        for seed, others in ((0, 1), (1, 1), (2, 0)):
            point = f"algorithm-mifa_seed-{seed}"
            why = json.loads((out / "s" / point / "manifest.json").read_text())["trainer"]["why"]
            assert (f"in one call with {others} other run(s)" in why) if others else ("other run(s)" not in why), why
            for table in ("rounds.parquet", "devices.parquet"):
                assert pl.read_parquet(out / "s" / point / table).drop("wall_s", strict=False).equals(
                    pl.read_parquet(reference / point / table).drop("wall_s", strict=False)), (point, table)
            assert all(torch.equal(a, b) for a, b in zip(
                torch.load(out / "s" / point / "model.pt").values(),
                torch.load(reference / point / "model.pt").values()))


def test_a_studys_trace_and_warm_starts_are_found_from_any_directory(tmp_path, capsys, monkeypatch):
    """A trace file given relative to the directory the study ran in, and the warm-start runs the
    points start from, are recorded as absolute paths: the new study that a changed axis prints
    and the new run that a point's config.toml prints both run as printed from elsewhere."""
    import re

    from test_stop_and_resume import as_printed

    monkeypatch.chdir(tmp_path)
    assert main(["trace", "generate", "diurnal", "--devices", "3", "--days", "1", "--seed", "0",
                 "--out", "t.parquet"]) == 0
    from fedsim.traces.io import write_device_table

    write_device_table({"device_id": [0, 1, 2], "tz_offset": [0.0, 3.0, -5.0]}, tmp_path / "t.devices.parquet")
    path = quadratic_study(tmp_path, "q")
    study = read_toml(path)
    study["trace"] = {"source": "file", "path": "t.parquet", "devices_table": "t.devices.parquet"}
    study["server"] = {"timing": "ideal", "round_duration": 3600.0}
    study["warm_start"] = {"run.rounds": 2}
    path.write_text(dump_toml(study))
    sweep(path)
    folder = tmp_path / "runs" / "q"
    assert read_toml(folder / "study.toml")["base"]["trace"]["path"] == str(tmp_path / "t.parquet")
    assert read_toml(folder / "seed-0" / "config.toml")["trace"]["devices_table"] == str(tmp_path / "t.devices.parquet")
    assert read_toml(folder / "seed-0" / "config.toml")["model"]["init_from"] == str(folder / "warm-start" / "seed-0")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    capsys.readouterr()
    assert main(["sweep", "--resume", str(folder), "--set", "sweep.run.seed=[0, 1, 2]"]) == 2
    done = as_printed(re.search(r"`(fedsim sweep [^`]+)`", capsys.readouterr().err).group(1), elsewhere)
    assert done.returncode == 0, done.stderr
    assert main(["run", str(folder / "seed-1" / "config.toml")]) == 2
    done = as_printed(re.search(r"`(fedsim run [^`]+)`", capsys.readouterr().err).group(1), elsewhere)
    assert done.returncode == 0, done.stderr
    done = as_printed(f"fedsim sweep --resume {folder} --set run.rounds=4", elsewhere)  # (the trace's device table too)
    assert done.returncode == 0, done.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_studys_diverged_points_are_named_and_their_best_is_the_initial_models(tmp_path, capsys):
    """A point that diverged has no final accuracy: the report names it under the table (the
    group's means are over the other seeds); its best accuracy counts the initial model's
    evaluation, as its time to target does."""
    path = write_study(tmp_path, {"client.lr": [0.3, 5000.0], "run.seed": [0, 1]})
    sweep(path, expect=3)
    folder = tmp_path / "runs" / "s"
    capsys.readouterr()
    assert main(["report", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    diverged = [r for r in report["runs"] if r["status"] == "diverged"]
    assert [r["name"] for r in diverged] == ["lr-5000.0_seed-0", "lr-5000.0_seed-1"]
    for r in diverged:
        initial = json.loads((folder / r["name"] / "manifest.json").read_text())["initial"]
        assert r["final_acc"] is None and r["best_acc"] == initial["test_acc"]
    assert main(["report", str(folder)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(
        "diverged: 2 of 4 points (lr-5000.0_seed-0, lr-5000.0_seed-1); a diverged point has no final accuracy or "
        "loss, so its group's means are over its other seeds ('-' where all diverged)")


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_resume_that_fails_changes_nothing_of_the_study_and_says_why(tmp_path, capsys, processes):
    """Its trace file replaced after the study ran: the resume's error is the points' one (also
    from worker processes, which stop each other; not "stopped by SIGTERM"), and its --set is not
    kept in study.toml for a later resume to apply."""
    from fedsim.traces import Trace
    from fedsim.traces.io import write_trace

    trace = tmp_path / "t.parquet"
    write_trace(Trace.from_intervals([0, 1, 2], [0.0] * 3, [9.0, 9.0, 9.0], n_devices=3, horizon=9.0), trace)
    path = quadratic_study(tmp_path, "q")
    study = read_toml(path)
    study["trace"] = {"source": "file", "path": str(trace)}
    study["sweep"] = {"run.seed": [0, 1, 2, 3]}
    path.write_text(dump_toml(study))
    sweep(path)
    folder = tmp_path / "runs" / "q"
    recorded = (folder / "study.toml").read_text()
    write_trace(Trace.from_intervals([0, 1, 2], [0.0] * 3, [9.0, 8.0, 9.0], n_devices=3, horizon=9.0), trace)
    capsys.readouterr()
    assert main(["sweep", "--resume", str(folder), "--quiet", "--set", "run.rounds=5", "--processes", processes]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: point seed-") and "the trace file changed since the run started" in err, err
    assert (folder / "study.toml").read_text() == recorded


FRAGILE = """
from pathlib import Path

from fedsim.algorithms.fedavg import FedAvg


class Fragile(FedAvg):
    def aggregate(self, rnd, arrivals):
        if rnd == 6 and Path(__file__).with_name("fail").exists():
            raise ValueError(f"boom in round {rnd}")
        super().aggregate(rnd, arrivals)
"""


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_point_whose_plugin_raises_fails_alone_and_the_printed_resume_finishes_it(tmp_path, monkeypatch, capsys,
                                                                                   processes):
    """A plugin's bug in one algorithm's points: the others finish, the failed points keep their
    last checkpoint and their traceback (error.txt), one error line names the first; fixed, the
    printed resume (from another directory) ends the study as an undisturbed one."""
    from test_stop_and_resume import as_printed

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fragile.py").write_text(FRAGILE)
    (tmp_path / "fail").touch()
    axes = {"algorithm.name": ["fedavg", "fragile:Fragile"], "run.seed": [0, 1]}
    path = write_study(tmp_path, axes, run={"checkpoint_every": 4})
    sweep(path, "--processes", processes, expect=2)
    err = capsys.readouterr().err
    folder = (tmp_path / "runs" / "s").absolute()
    log = folder / "algorithm-fragile-Fragile_seed-0" / "error.txt"
    assert err == (f"error: point algorithm-fragile-Fragile_seed-0: its run failed with ValueError: boom in round 6 "
                   f"(traceback: {log}); fix that, then run `fedsim sweep --resume {folder}` to go on from its last "
                   "checkpoint (1 more points failed)\n"), err
    assert "Traceback" in log.read_text() and "boom in round 6" in log.read_text()
    statuses = {p.name: json.loads((p / "manifest.json").read_text())["status"] for p in folder.iterdir() if p.is_dir()}
    assert statuses == {"algorithm-fedavg_seed-0": "completed", "algorithm-fedavg_seed-1": "completed",
                        "algorithm-fragile-Fragile_seed-0": "running", "algorithm-fragile-Fragile_seed-1": "running"}
    (tmp_path / "fail").unlink()  # the fix
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = as_printed(f"fedsim sweep --resume {folder}", elsewhere)
    assert done.returncode == 0, done.stderr
    assert not log.exists()
    sweep(write_study(tmp_path, axes, name="whole", run={"checkpoint_every": 4}))
    same = pl.read_parquet(folder / "study.parquet").drop("wall_s")
    assert same.equals(pl.read_parquet(tmp_path / "runs" / "whole" / "study.parquet").drop("wall_s"))


def test_an_axis_that_makes_some_points_the_same_run_is_refused_and_its_zip_runs(tmp_path, capsys):
    """MIFA's `warmup` crossed with fedavg and mifa: fedavg's two points would be one run twice."""
    crossed = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"], "algorithm.warmup": [True, False]})
    sweep(crossed, expect=2)
    assert capsys.readouterr().err == (
        f"error: {crossed}: points algorithm-fedavg_warmup-True and algorithm-fedavg_warmup-False are the same run: "
        "algorithm.warmup does not apply where algorithm.name = 'fedavg'; zip algorithm.warmup with the axis that "
        "chooses it (zip = [[...]]: docs/studies.md), so that each run is a point once\n")
    assert not (tmp_path / "runs").exists()
    zipped = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa", "mifa"], "algorithm.warmup": [True, True, False],
                                    "zip": [["algorithm.name", "algorithm.warmup"]]}, name="zipped")
    sweep(zipped)
    assert len(pl.read_parquet(tmp_path / "runs" / "zipped" / "summary.parquet")) == 3


def test_resuming_one_point_alone_is_refused_with_the_sweep_that_resumes_the_study(tmp_path, capsys):
    from test_stop_and_resume import as_printed

    sweep(write_study(tmp_path, {"run.seed": [0, 1]}, run={"rounds": 3}))
    folder = tmp_path / "runs" / "s"
    point = folder / "seed-1"
    before = (point / "manifest.json").read_bytes()
    assert main(["run", "--resume", str(point), "--set", "run.rounds=5", "--quiet"]) == 2
    command = f"fedsim sweep --resume {folder.absolute()} --set run.rounds=5"
    assert capsys.readouterr().err == (
        f"error: {point}: a point of the study {folder.absolute()}, which only its sweep writes to (resumed alone, it "
        f"would end unlike the study's other points): run `{command}`\n")
    assert (point / "manifest.json").read_bytes() == before
    done = as_printed(command, Path("/"))
    assert done.returncode == 0, done.stderr
    assert {json.loads(m.read_text())["rounds"] for m in folder.glob("*/manifest.json")} == {5}


def test_a_study_folders_study_toml_given_to_run_says_to_sweep_it(grid, capsys):
    recorded = grid / "study.toml"
    for command in (["run", str(recorded)], ["config", "show", str(recorded)]):
        assert main(command) == 2
        assert capsys.readouterr().err == (f"error: {recorded}: is a study (it has axes to sweep); run it with "
                                           f"`fedsim sweep {recorded}`\n")
    assert main(["sweep", str(recorded), "--quiet"]) == 0  # as printed: the study is done, nothing runs again
    assert "done, skipped" in capsys.readouterr().out


def test_the_report_of_a_study_with_a_point_not_run_prints_the_sweep_that_runs_it(tmp_path, capsys):
    from test_stop_and_resume import as_printed

    sweep(write_study(tmp_path, {"run.seed": [0, 1]}, run={"rounds": 3}))
    folder = tmp_path / "runs" / "s"
    shutil.rmtree(folder / "seed-1")
    assert main(["report", str(folder)]) == 2
    command = f"fedsim sweep --resume {folder.absolute()}"
    assert capsys.readouterr().err == (f"error: {folder}: point seed-1 has not run yet (1 of 2 missing); run "
                                       f"`{command}` to finish it\n")
    assert as_printed(command, Path("/")).returncode == 0
    assert main(["report", str(folder)]) == 0


def test_a_value_given_by_set_that_breaks_some_points_blames_the_set(tmp_path, capsys):
    """FedAU's cutoff = 0 from --set breaks the fedau points only: the line names the --set (not
    the study file, which does not hold it) and how many points it breaks."""
    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "fedau"], "run.seed": [0, 1]})
    sweep(path, "--set", "algorithm.cutoff=0", expect=2)
    assert capsys.readouterr().err == (
        "error: --set algorithm.cutoff=0: [algorithm] cutoff = 0 for 'fedau' must be >= 1 (K, the longest interval "
        "recorded, in rounds) (2 of the 4 points, the first algorithm-fedau_seed-0 (algorithm.name = 'fedau', "
        "run.seed = 0))\n")
    sweep(path, "--set", "algorithm.cutoff=0", "--set", "sweep.algorithm.name=['fedau']", expect=2)
    assert capsys.readouterr().err.endswith("must be >= 1 (K, the longest interval recorded, in rounds) (every point)\n")
    assert not (tmp_path / "runs").exists()


def test_best_by_a_time_to_target_prefers_the_group_where_more_seeds_reached_it():
    """lr 0.1 reached the target with one seed of three (its mean: that seed's 100 s), lr 0.05
    with all three (200 s): 0.05 is the best; among groups that all reached it, the fastest."""
    from fedsim.studies.tables import best_by

    summary = pl.DataFrame({"algorithm.name": ["fedavg"] * 3, "client.lr": [0.1, 0.05, 0.01],
                            "time_to_0.8_s_mean": [100.0, 200.0, 300.0], "time_to_0.8_s_n": [1, 3, 3],
                            "time_to_0.8_s_std": [None, 10.0, 10.0]})
    best = best_by(summary, "time_to_0.8_s", "client.lr", ["algorithm.name", "client.lr"])
    assert best["client.lr"].to_list() == [0.05]


def test_a_moved_two_phase_studys_point_runs_on_its_own_with_the_warm_start_fedsim_names(tmp_path, capsys,
                                                                                         monkeypatch):
    """A study with a warm start, moved: a point's config.toml still names its warm start where it
    was; run on its own, that is one line naming where the warm start is now, and the run with the
    `--set` it gives, typed from another directory, is the point's run."""
    import re
    import shlex

    path = write_study(tmp_path, {"algorithm.name": ["fedavg", "mifa"]}, warm_start={"run.rounds": 2})
    sweep(path)
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    (tmp_path / "runs" / "s").rename(moved)
    point = moved / "algorithm-mifa"
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    capsys.readouterr()
    command = ["run", str(point / "config.toml"), "--set", f"run.out={tmp_path / 'alone'}"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has moved since, and its warm start with it: add `--set" in err, err
    added = re.search(r"add `(--set [^`]+)`", err)[1]
    assert added.startswith(f"--set model.init_from={moved / 'warm-start'}/")
    assert main([*command, *shlex.split(added)]) == 0
    columns = ["round", "arrived", "train_loss", "test_loss"]
    assert rounds(tmp_path / "alone" / "algorithm-mifa")[columns].equals(rounds(point)[columns])
