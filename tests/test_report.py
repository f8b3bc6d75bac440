"""`fedsim report`: time to target accuracy (interpolated, exact, never; never before the first
update), round durations, waiting and participation on hand-made frames with known answers;
durations in the unit their size calls for; the command on hand-made run directories (tables,
JSON, names, targets, errors) and study folders; and end to end on a real comparison run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fedsim.cli import _summary_table, main
from fedsim.config import dump_toml, read_toml
from fedsim.errors import FedsimError
from fedsim.results.report import (Hit, duration, gini, t_quantile, hit_time, metric_curve, participation, round_durations,
                                   time_to_target, variation, waiting)

H = 3600.0


def rounds_frame(acc, t_end=None, loss=None, **counts) -> pl.DataFrame:
    """Rounds 0..n-1 of an hour each (unless t_end is given); `acc` and `loss` None off evaluations."""
    n = len(acc)
    t_end = [H * (i + 1) for i in range(n)] if t_end is None else t_end
    t_start = [0.0, *t_end[:-1]]
    columns = {"round": list(range(n)), "t_start": t_start, "t_end": t_end,
               "invited": [10] * n, "arrived": [10] * n, "dropped": [0] * n, "late": [0] * n,
               "test_loss": loss if loss is not None else [None if a is None else 1 - a for a in acc],
               "test_acc": acc, **counts}
    return pl.DataFrame(columns, schema_overrides={"test_acc": pl.Float64, "test_loss": pl.Float64})


# evaluations after rounds 2, 4, 6 (0-based 1, 3, 5) at 2h, 4h, 6h
CURVE = rounds_frame([None, 0.4, None, 0.6, None, 0.9])


# -- time to target ---------------------------------------------------------------------------
def test_a_crossing_between_evaluations_is_interpolated_on_rounds_and_time():
    # 0.6 after round 4 holds until round 5 ends (5h); the crossing is a third of the way from
    # (5, 5h, 0.6) to the evaluation (6, 6h, 0.9)
    hit = time_to_target(CURVE, 0.7)
    assert hit.interpolated
    assert hit.rounds == pytest.approx(5 + 1 / 3) and hit.time_s == pytest.approx(5 * H + H / 3)


def test_interpolation_follows_t_end_not_the_round_number():
    uneven = rounds_frame([None, 0.4, None, 0.6, None, 0.9], t_end=[10, 20, 30, 100, 110, 400])
    hit = time_to_target(uneven, 0.7)
    assert hit.rounds == pytest.approx(5 + 1 / 3) and hit.time_s == pytest.approx(110 + 290 / 3)


def test_the_curve_holds_each_evaluation_until_the_next_round_ends():
    curve = metric_curve(CURVE, {"test_loss": 2.3, "test_acc": 0.1, "t": 0.0})
    assert curve.rows() == [(0.0, 0.0, 0.1, False), (1.0, H, 0.1, True), (2.0, 2 * H, 0.4, False),
                            (3.0, 3 * H, 0.4, True), (4.0, 4 * H, 0.6, False), (5.0, 5 * H, 0.6, True),
                            (6.0, 6 * H, 0.9, False)]
    losses = metric_curve(CURVE, metric="test_loss")["value"].to_list()
    assert losses == pytest.approx([0.6, 0.6, 0.4, 0.4, 0.1])


def test_an_evaluation_at_the_target_is_exact():
    assert time_to_target(CURVE, 0.6) == Hit(4.0, 4 * H, False)


def test_a_target_never_reached_and_a_task_without_accuracy():
    assert time_to_target(CURVE, 0.95) is None
    assert time_to_target(rounds_frame([None, None], loss=[None, 0.3]), 0.1) is None


def test_without_an_initial_evaluation_the_first_one_is_where_an_easy_target_is_met():
    assert time_to_target(CURVE, 0.3) == Hit(2.0, 2 * H, False)


def test_the_initial_evaluation_starts_the_curve():
    initial = {"test_loss": 2.3, "test_acc": 0.1, "t": 0.0}
    hit = time_to_target(CURVE, 0.3, initial)  # two thirds of the way from (1, 1h, 0.1) to (2, 2h, 0.4)
    assert hit.interpolated
    assert hit.rounds == pytest.approx(1 + 2 / 3) and hit.time_s == pytest.approx(H + 2 * H / 3)
    assert time_to_target(CURVE, 0.05, initial) == Hit(0.0, 0.0, False)
    # an initial model without accuracy (quadratic task) adds no point
    assert time_to_target(CURVE, 0.3, {"test_loss": 2.0, "test_acc": None, "t": 0.0}) == Hit(2.0, 2 * H, False)


def test_the_first_crossing_counts_and_diverged_evaluations_are_skipped():
    wavy = rounds_frame([0.5, 0.8, 0.6, 0.9])  # evaluated after every round: round 2 made it, exactly
    assert time_to_target(wavy, 0.7) == Hit(2.0, 2 * H, False)
    diverged = rounds_frame([0.5, float("nan"), 0.9])
    assert time_to_target(diverged, 0.7) == Hit(2.5, 2.5 * H, True)  # halfway from (2, 2h, 0.5) to (3, 3h, 0.9)


# -- durations and participation --------------------------------------------------------------
def test_round_duration_median_and_p90_from_t_end_minus_t_start_or_the_duration_column():
    t_end = np.cumsum([30.0, 10.0, 50.0, 20.0, 40.0]).tolist()
    frame = rounds_frame([None] * 5, t_end=t_end)
    assert round_durations(frame) == {"median_s": 30.0, "p90_s": pytest.approx(46.0)}
    with_column = frame.with_columns(duration=pl.Series([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert round_durations(with_column) == {"median_s": 3.0, "p90_s": pytest.approx(4.6)}
    assert round_durations(frame.head(0)) == {"median_s": None, "p90_s": None}


def test_gini_and_coefficient_of_variation_of_known_vectors():
    assert gini([1, 1, 1, 1]) == 0.0
    assert gini([0, 0, 0, 4]) == pytest.approx(0.75)
    assert gini([0, 5, 5, 5]) == pytest.approx(0.25)
    assert gini([0, 0]) is None
    x = np.random.default_rng(0).integers(0, 20, size=50)
    pairwise = np.abs(x[:, None] - x[None, :]).sum() / (2 * len(x) ** 2 * x.mean())
    assert gini(x) == pytest.approx(pairwise)
    assert variation([1, 1, 1, 1]) == 0.0
    assert variation([0, 0, 0, 4]) == pytest.approx(math.sqrt(3))
    assert variation([0, 0]) is None


def test_participation_rates_are_fractions_of_the_invited():
    frame = rounds_frame([None, None], invited=[10, 10], arrived=[7, 8], dropped=[2, 1], late=[1, 1])
    devices = pl.DataFrame({"device_id": [0, 1, 2, 3], "arrivals": [0, 5, 5, 5]})
    assert participation(frame, devices) == pytest.approx({
        "invited": 20, "arrived_rate": 0.75, "dropped_rate": 0.15, "late_rate": 0.1,
        "surplus_rate": 0.0, "devices": 4, "devices_arrived": 3, "arrivals_gini": 0.25,
        "arrivals_cv": 1 / math.sqrt(3)})  # std sqrt(75/4 - 3.75**2) over mean 3.75
    with_surplus = frame.with_columns(surplus=pl.Series([1, 0]))
    assert participation(with_surplus, devices)["surplus_rate"] == pytest.approx(0.05)
    nobody = participation(frame.head(0), devices.with_columns(arrivals=pl.lit(0)))
    assert nobody["arrived_rate"] is None and nobody["arrivals_gini"] is None


# -- the command on hand-made run directories -------------------------------------------------
def make_run(path: Path, algorithm: str = "fedavg", frame: pl.DataFrame = CURVE,
             targets: list | None = None, initial: dict | None = None) -> Path:
    path.mkdir(parents=True)
    frame.write_parquet(path / "rounds.parquet")
    pl.DataFrame({"device_id": [0, 1, 2, 3], "invitations": [20, 20, 10, 10],
                  "arrivals": [0, 0, 0, 60], "drops": [0] * 4, "late": [0] * 4,
                  "last_round": [-1, -1, -1, 5]}).write_parquet(path / "devices.parquet")
    manifest = {"status": "completed", "reason": "6 rounds", "rounds": len(frame),
                "sim_time_s": frame["t_end"][-1], "algorithm": algorithm}
    if initial is not None:
        manifest["initial"] = initial
    (path / "manifest.json").write_text(json.dumps(manifest))
    run = {"rounds": len(frame)} | ({"targets": targets} if targets is not None else {})
    (path / "config.toml").write_text(dump_toml({"run": run, "algorithm": {"name": algorithm}}))
    return path


def report_json(capsys, *argv) -> dict:
    assert main(["report", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def fails(capsys, *argv) -> str:
    assert main(["report", *map(str, argv)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "\n" not in out.err.strip()
    return out.err.strip()


def test_json_report_of_one_run(tmp_path, capsys):
    run = make_run(tmp_path / "a")
    doc = report_json(capsys, run, "--target", "0.7,0.6", "--target", "0.95")
    assert doc["targets"] == [0.6, 0.7, 0.95]
    (r,) = doc["runs"]
    assert r["name"] == "fedavg" and r["status"] == "completed" and r["rounds"] == 6
    assert r["final_acc"] == 0.9 and r["best_acc"] == 0.9
    assert r["final_loss"] == pytest.approx(0.1) and r["best_loss"] == pytest.approx(0.1)
    exact, between, never = r["targets"]
    assert exact == {"target": 0.6, "rounds": 4.0, "time_s": 4 * H, "interpolated": False}
    assert between["interpolated"] is True and between["time_s"] == pytest.approx(5 * H + H / 3)
    assert r["first_update_s"] == H and r["waiting_s"] == 0.0
    assert never == {"target": 0.95, "rounds": None, "time_s": None, "interpolated": None}
    assert r["round_duration"] == {"median_s": H, "p90_s": H}
    p = r["participation"]
    assert p["arrived_rate"] == 1.0 and p["devices_arrived"] == 1 and p["arrivals_gini"] == 0.75


def test_table_marks_interpolated_exact_and_never(tmp_path, capsys):
    run = make_run(tmp_path / "a", initial={"test_loss": 2.3, "test_acc": 0.1, "t": 0.0})
    assert main(["report", str(run), "--target", "0.6", "--target", "0.7", "--target", "0.95"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("fedavg") and "never" in line)
    assert line.split()[1:] == ["4", "4.00h", "~5.3", "~5.33h", "never", "never"]
    assert "60% rounds" in out and "95% time" in out
    first = next(line for line in out.splitlines() if line.startswith("fedavg"))
    assert first.split() == ["fedavg", "completed", "6", "6.00h", "1.00h", "0s", "90.00%", "90.00%", "0.1", "0.1"]


def test_targets_default_to_the_runs_config(tmp_path, capsys):
    assert report_json(capsys, make_run(tmp_path / "a", targets=[0.7]))["targets"] == [0.7]
    assert main(["report", str(make_run(tmp_path / "b"))]) == 0
    assert "time to target" not in capsys.readouterr().out


def test_a_comparison_folder_gives_one_row_per_algorithm(tmp_path, capsys):
    for algorithm in ("mifa", "fedavg"):
        make_run(tmp_path / "cmp" / algorithm, algorithm)
    (tmp_path / "cmp" / "plots").mkdir()
    doc = report_json(capsys, tmp_path / "cmp")
    assert [r["name"] for r in doc["runs"]] == ["fedavg", "mifa"]


def test_runs_side_by_side_are_named_by_algorithm_and_told_apart_by_folder(tmp_path, capsys):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    other = make_run(tmp_path / "c", "mifa")
    names = [r["name"] for r in report_json(capsys, a, b, other)["runs"]]
    assert names == ["fedavg (a)", "fedavg (b)", "mifa"]
    x, y = make_run(tmp_path / "x" / "run"), make_run(tmp_path / "y" / "run")
    assert [r["name"] for r in report_json(capsys, x, y)["runs"]] == ["fedavg (x/run)", "fedavg (y/run)"]


def test_bad_targets_are_one_error_line(tmp_path, capsys):
    run = make_run(tmp_path / "a")
    assert fails(capsys, run, "--target", "80") == (
        "error: --target '80': target accuracy 80.0 is not in (0, 1]; give a fraction such as 0.8 "
        "(not a percentage)")
    assert fails(capsys, run, "--target", "0.8,abc") == (
        "error: --target '0.8,abc': 'abc' is not a number; give accuracies in (0, 1], e.g. "
        "--target 0.8 or --target 0.8,0.9")
    assert "target accuracy 0.0 is not in (0, 1]" in fails(capsys, run, "--target", "0")
    assert "target accuracy nan is not in (0, 1]" in fails(capsys, run, "--target", "nan")
    bad = make_run(tmp_path / "b", targets=[1.5])
    assert fails(capsys, bad) == (
        f"error: {bad / 'config.toml'}: [run] targets: target accuracy 1.5 is not in (0, 1]; give "
        "a fraction such as 0.8 (not a percentage)")


def test_a_folder_that_is_not_a_run_is_one_error_line(tmp_path, capsys):
    run = make_run(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    for path, what in ((tmp_path / "empty", "not a run directory (no rounds.parquet and devices.parquet "
                                             "here or in its sub-folders)"),
                       (tmp_path / "missing", "no such folder")):
        assert fails(capsys, run, path) == (
            f"error: {path}: {what}; pass the folder that `fedsim run` printed after 'results:'")
    CURVE.drop("test_acc", "late").write_parquet(run / "rounds.parquet")
    assert fails(capsys, run) == (
        f"error: {run / 'rounds.parquet'}: no column late, test_acc; this is not the table of a "
        "fedsim run directory, pass the folder that `fedsim run` printed")
    (run / "rounds.parquet").write_text("not parquet")
    assert fails(capsys, run).startswith(f"error: {run / 'rounds.parquet'}: not a readable Parquet file")


def test_a_run_still_going_has_no_manifest_yet(tmp_path, capsys):
    run = make_run(tmp_path / "a", "mifa")
    (run / "manifest.json").unlink()
    (r,) = report_json(capsys, run)["runs"]
    assert (r["name"], r["status"], r["sim_time_s"]) == ("mifa", "unfinished", 6 * H)


# -- end to end --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    """A small real comparison run (fedavg and mifa on digits)."""
    tmp = tmp_path_factory.mktemp("report")
    config = {"run": {"rounds": 20, "eval_every": 2, "out": str(tmp / "runs"), "name": "cmp",
                      "algorithms": ["fedavg", "mifa"], "progress": False},
              "data": {"dataset": "digits", "clients": 20}, "server": {"clients_per_round": 5},
              "client": {"local_steps": 2, "lr": 0.5}}
    (tmp / "c.toml").write_text(dump_toml(config))
    assert main(["run", str(tmp / "c.toml"), "--quiet"]) == 0
    return tmp / "runs" / "cmp"


def expected_hit(run_dir: Path, target: float) -> tuple[float, float] | None:
    """(rounds, seconds) to `target` computed row by row from rounds.parquet and the manifest:
    from the end of the round after the last evaluation below the target to the first at or above."""
    initial = json.loads((run_dir / "manifest.json").read_text()).get("initial")
    rows = list(pl.read_parquet(run_dir / "rounds.parquet").iter_rows(named=True))
    ends = {row["round"] + 1: row["t_end"] for row in rows}
    points = [(0, initial["t"], initial["test_acc"])] if initial and initial.get("test_acc") is not None else []
    points += [(row["round"] + 1, row["t_end"], row["test_acc"]) for row in rows if row["test_acc"] is not None]
    for k, (n, t, acc) in enumerate(points):
        if acc >= target:
            if k == 0 or acc == target:
                return n, t
            n0, _, acc0 = points[k - 1]
            n1, t1 = n0 + 1, ends[n0 + 1]
            w = (target - acc0) / (acc - acc0)
            return n1 + w * (n - n1), t1 + w * (t - t1)
    return None


def test_report_of_a_real_run_agrees_with_its_rounds(comparison, capsys):
    run_dir = comparison / "fedavg"
    accs = pl.read_parquet(run_dir / "rounds.parquet")["test_acc"].drop_nulls()
    midway = round(float(accs[0] + accs.max()) / 2, 6)  # met between two evaluations
    doc = report_json(capsys, run_dir, "--target", "0.5", "--target", str(midway))
    (r,) = doc["runs"]
    for entry in r["targets"]:
        expected = expected_hit(run_dir, entry["target"])
        assert expected is not None, f"target {entry['target']} not reached; accuracies {accs.to_list()}"
        assert (entry["rounds"], entry["time_s"]) == pytest.approx(expected)
    assert r["targets"][[e["target"] for e in r["targets"]].index(midway)]["interpolated"] is True
    rounds = pl.read_parquet(run_dir / "rounds.parquet")
    devices = pl.read_parquet(run_dir / "devices.parquet")
    p = r["participation"]
    assert p["invited"] == rounds["invited"].sum() == devices["invitations"].sum()
    assert p["arrived_rate"] == pytest.approx(rounds["arrived"].sum() / rounds["invited"].sum())
    assert p["devices_arrived"] == (devices["arrivals"] > 0).sum()
    assert r["final_acc"] == accs[-1] and r["best_acc"] == accs.max() and r["rounds"] == 20


def test_report_of_a_real_comparison_and_the_run_table_with_targets(comparison, capsys):
    doc = report_json(capsys, comparison, "--target", "0.5")
    assert [r["name"] for r in doc["runs"]] == ["fedavg", "mifa"]
    assert main(["report", str(comparison), "--target", "0.5"]) == 0
    assert "50% rounds" in capsys.readouterr().out

    from fedsim.runs.experiment import RunResult

    raw = read_toml(comparison / "fedavg" / "config.toml")
    raw["run"]["targets"] = [0.5, 0.99]
    (comparison / "fedavg" / "config.toml").write_text(dump_toml(raw))
    rounds = pl.read_parquet(comparison / "fedavg" / "rounds.parquet")
    table = _summary_table(RunResult(comparison / "fedavg", "fedavg", "completed", "", rounds))
    header, _, line = table.splitlines()
    assert header.split()[-4:] == ["to", "50%", "to", "99%"]
    hit = doc["runs"][0]["targets"][0]
    assert line.split()[-2:] == [hit_time(Hit(hit["rounds"], hit["time_s"], hit["interpolated"])), "never"]
    from fedsim.cli import server_memory
    assert [server_memory(n) for n in (2560, 6_413_926, 3 * 1024 ** 3)] == ["2.5KiB", "6.1MiB", "3.0GiB"]


# -- waiting, and one rule wherever a time to target is told (issue 37) -------------------------
WAIT = 4.95 * H  # round 0 waited this long for min_selected devices online; then rounds of 40 s


def waited_frame() -> pl.DataFrame:
    """20 rounds evaluated after rounds 10 and 20 (0.7, 0.8); round 0 waited WAIT within it."""
    t_end = [WAIT + 40.0 * (k + 1) for k in range(20)]
    acc = [None] * 9 + [0.7] + [None] * 9 + [0.8]
    return rounds_frame(acc, t_end=t_end).with_columns(
        t_start=pl.Series([0.0, *t_end[:-1]]), wait_s=pl.Series([WAIT] + [0.0] * 19))


INITIAL = {"test_loss": 2.3, "test_acc": 0.1, "t": 0.0}


def test_a_target_is_never_met_while_the_first_round_waits_and_the_wait_is_shown(tmp_path, capsys):
    run = make_run(tmp_path / "a", frame=waited_frame(), initial=INITIAL)
    (r,) = report_json(capsys, run, "--target", "0.6")["runs"]
    first_update = WAIT + 40.0  # round 0 ends: the first time the model can change
    # by hand: 0.1 holds until round 1 ends; 0.7 is measured after round 10 (t = WAIT + 400 s)
    w = (0.6 - 0.1) / (0.7 - 0.1)
    hit = r["targets"][0]
    assert hit == {"target": 0.6, "rounds": pytest.approx(1 + w * 9), "time_s": pytest.approx(first_update + w * 360.0),
                   "interpolated": True}
    assert hit["time_s"] > first_update  # not ~4.22 h, inside the wait, as from t = 0
    assert (r["first_update_s"], r["waiting_s"]) == (first_update, WAIT)
    assert main(["report", str(run), "--target", "0.6"]) == 0
    out = capsys.readouterr().out
    head, _, row = out.splitlines()[:3]
    assert head.split()[3:9] == ["sim", "time", "first", "update", "waited", "final"]
    assert row.split()[3:6] == ["5.17h", "4.96h", "4.95h"]  # sim time WAIT + 800 s
    lines = out.splitlines()
    assert lines[lines.index(next(line for line in lines if line.startswith("time to target"))) + 2].split() == [
        "fedavg", "~8.5", "~5.04h"]


def test_the_report_claims_and_plots_tell_one_time_to_target(tmp_path, capsys):
    from fedsim.results.claims import point_metric
    from fedsim.results.plots import _metric_curves, load_run

    run = make_run(tmp_path / "a", frame=waited_frame(), initial=INITIAL)
    told = report_json(capsys, run, "--target", "0.6")["runs"][0]["targets"][0]["time_s"]
    study = waited_frame().with_columns(point=pl.lit("p"))
    claimed = point_metric(study, "time_to_acc", target=0.6, initial={"p": INITIAL})["value"].to_list()
    assert claimed == [told]
    hours, acc, evaluated = _metric_curves({"fedavg": load_run(run)}, "test_acc", "hours")["fedavg"]
    k = int(np.argmax(acc >= 60.0))  # the drawn line crosses 60 % between its points k - 1 and k
    crossing = hours[k - 1] + (60.0 - acc[k - 1]) / (acc[k] - acc[k - 1]) * (hours[k] - hours[k - 1])
    assert crossing == pytest.approx(told / H)
    assert list(evaluated) == [0, 2, 4]  # markers on the evaluations, not on the held points


def test_waiting_counts_idle_gaps_between_rounds_and_the_wait_within_them():
    frame = rounds_frame([None] * 3, t_end=[100.0, 250.0, 400.0]).with_columns(t_start=pl.Series([30.0, 180.0, 260.0]))
    assert waiting(frame) == {"first_update_s": 100.0, "waiting_s": 30.0 + 80.0 + 10.0}
    assert waiting(frame.head(0)) == {"first_update_s": None, "waiting_s": None}


@pytest.mark.parametrize("seconds, text", [
    (None, "-"), (0.0, "0s"), (0.000134, "0.000134s"), (0.0966, "0.0966s"), (9.996, "10.0s"), (14.5, "14.5s"),
    (59.4, "59.4s"), (60.0, "1.00min"), (192.0, "3.20min"), (3600.0, "1.00h"), (15192.0, "4.22h"),
    (4.5e6, "1250h")])
def test_durations_take_the_unit_their_size_calls_for(seconds, text):
    assert duration(seconds) == text


@pytest.fixture(scope="module")
def timed_study(tmp_path_factory) -> Path:
    """A real study of 3 algorithms x 2 seeds whose points' rounds are then replaced by hand-made
    curves: the fedavg points reach 70 % in seconds, mifa's in minutes, fedau's in hours (and
    fedau's seed 1 never; nobody reaches 90 %)."""
    tmp = tmp_path_factory.mktemp("timed")
    study = {"run": {"rounds": 2, "eval_every": 1, "progress": False, "plots": False, "name": "t",
                     "out": str(tmp / "runs")},
             "data": {"dataset": "digits", "clients": 4}, "server": {"clients_per_round": 2, "timing": "ideal"},
             "client": {"local_steps": 1, "lr": 0.1},
             "sweep": {"algorithm.name": ["fedavg", "mifa", "fedau"], "run.seed": [0, 1]}}
    (tmp / "t.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp / "t.toml"), "--quiet"]) == 0
    folder = tmp / "runs" / "t"
    for algorithm, unit in (("fedavg", 1.0), ("mifa", 60.0), ("fedau", H)):
        for seed in (0, 1):
            point = folder / f"algorithm-{algorithm}_seed-{seed}"
            never = algorithm == "fedau" and seed == 1
            frame = rounds_frame([0.4, 0.6 if never else 0.8], t_end=[10.0 * unit, (20.0 + 4 * seed) * unit])
            frame.write_parquet(point / "rounds.parquet")
            manifest = json.loads((point / "manifest.json").read_text())
            (point / "manifest.json").write_text(json.dumps({**manifest, "initial": INITIAL}))
    return folder


def test_a_study_report_shows_each_time_in_its_unit_as_json_says(timed_study, capsys):
    doc = report_json(capsys, timed_study, "--target", "0.7,0.9")
    assert main(["report", str(timed_study), "--target", "0.7,0.9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.split(r" {2,}", lines[0])[-4:] == ["rounds to 70%", "time to 70%", "rounds to 90%", "time to 90%"]
    for group, unit, suffix in zip(doc["groups"], (1.0, 60.0, H), ("s", "min", "h")):
        target, unreached = group["targets"]
        assert unreached["reached"] == 0 and unreached["time_s"]["mean"] is None
        # by hand: 0.4 after round 1 holds until round 2 ends, where 0.8 is measured: exactly then
        times = [(20.0 + 4 * seed) * unit for seed in (0, 1)]
        if group["values"]["algorithm.name"] == "fedau":
            times = times[:1]
        assert target["reached"] == len(times) and target["time_s"]["mean"] == pytest.approx(np.mean(times))
        line = next(line for line in lines if line.startswith(group["values"]["algorithm.name"] + " "))
        stats = target["time_s"]
        shown = duration(stats["mean"]) + (f" ± {duration(stats['ci95'])}" if stats["ci95"] is not None else "")
        cells = re.split(r" {2,}", line)
        assert [cells[-3], cells[-1]] == [shown + (" (1 of 2)" if len(times) == 1 else ""), "never"]
        assert cells[-2] == "never" and cells[-4].startswith(f"{target['rounds']['mean']:.1f}")
        assert duration(stats["mean"]).endswith(suffix)


def test_a_real_run_that_waits_for_min_selected_devices_meets_no_target_before_its_first_update(cli_run, capsys):
    """Digits on 20 devices that all come online at 5 h; every round waits for all 20."""
    from fedsim.traces import Trace

    n, online_at = 20, 5 * H
    trace = Trace.from_intervals(np.arange(n), np.full(n, online_at), np.full(n, 100 * H), n_devices=n,
                                 horizon=100 * H)
    run_dir = cli_run({"run": {"rounds": 10, "eval_every": 5}, "data": {"dataset": "digits", "clients": n},
                       "server": {"timing": "model", "deadline": 600.0, "min_selected": n, "clients_per_round": 5},
                       "client": {"local_steps": 2, "lr": 0.5}}, trace)
    initial = json.loads((run_dir / "manifest.json").read_text())["initial"]
    first = pl.read_parquet(run_dir / "rounds.parquet")["test_acc"].drop_nulls()[0]
    assert first > initial["test_acc"], "the first evaluation should be better than the initial model"
    target = round((initial["test_acc"] + first) / 2, 6)  # met between the initial and the first evaluation
    (r,) = report_json(capsys, run_dir, "--target", str(target))["runs"]
    assert r["waiting_s"] == pytest.approx(online_at) and r["first_update_s"] > online_at
    hit = r["targets"][0]
    assert (hit["rounds"], hit["time_s"]) == pytest.approx(expected_hit(run_dir, target))
    assert hit["time_s"] >= r["first_update_s"] and hit["rounds"] >= 1


def test_a_task_without_accuracy_has_no_time_to_target_rather_than_never(tmp_path, capsys):
    run = make_run(tmp_path / "q", frame=rounds_frame([None, None], loss=[None, 0.3]))
    assert report_json(capsys, run, "--target", "0.5")["runs"][0]["targets"][0]["time_s"] is None
    assert main(["report", str(run), "--target", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[lines.index(next(line for line in lines if line.startswith("time to target"))) + 2].split() == [
        "fedavg", "-", "-"]


def test_a_study_summary_tells_never_some_seeds_and_no_accuracy_apart():
    from types import SimpleNamespace

    from fedsim.studies.tables import format_summary

    summary = pl.DataFrame({
        "algorithm.name": ["a", "b", "c"], "seeds": [2, 2, 2],
        **{f"{m}_{k}": [0.5, 0.5, None] for m in ("final_acc", "best_acc") for k in ("mean", "ci95")},
        "final_loss_mean": [1.0, 1.0, 0.2], "final_loss_ci95": [0.1, 0.1, 0.01],
        "time_to_0.5_s_mean": [90.0, None, None], "time_to_0.5_s_ci95": [None, None, None],
        "time_to_0.5_s_n": [1, 0, 0]})
    lines = format_summary(SimpleNamespace(group_axes=["algorithm.name"]), summary).splitlines()
    assert [re.split(r" {2,}", line)[-1] for line in lines[2:]] == ["1.50min (1 of 2)", "never", "-"]


def test_the_output_folder_reports_and_plots_its_runs_and_comparisons_and_names_its_studies(tmp_path, capsys,
                                                                                             monkeypatch):
    """`fedsim report runs` (the `[run] out` folder): its runs and its comparisons' runs side by
    side, each labelled by its folder where algorithms repeat; its studies named with the command
    that reports one (run here as printed, from another directory); studies only: one line."""
    body = {"run": {"rounds": 4, "eval_every": 2, "progress": False, "plots": False, "out": str(tmp_path / "runs")},
            "data": {"dataset": "quadratic", "clients": 4}, "server": {"timing": "ideal", "clients_per_round": 2}}
    study = {**body, "run": {**body["run"], "name": "seeds"}, "sweep": {"run.seed": [0, 1]}}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'runs'}: holds studies only (seeds), and a study is reported alone: give its "
                   f"folder, e.g. `fedsim report {tmp_path / 'runs' / 'seeds'}`\n")
    monkeypatch.chdir(tmp_path / "runs" / "seeds")  # (another directory)
    assert main(re.search(r"`fedsim (.+)`", err).group(1).split()) == 0
    for name, extra in (("solo", {}), ("both", {"algorithms": ["fedavg", "mifa"]})):
        (tmp_path / f"{name}.toml").write_text(dump_toml({**body, "run": {**body["run"], "name": name, **extra}}))
        assert main(["run", str(tmp_path / f"{name}.toml"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    results = out.split("\n\n")[0].splitlines()[2:]
    assert [line.split("  ")[0] for line in results] == ["fedavg (both)", "mifa", "fedavg (solo)"]
    assert out.rstrip().endswith(f"not reported here: 1 study (seeds), each reported alone: "
                                 f"`fedsim report {tmp_path / 'runs' / 'seeds'}`")
    assert main(["plot", str(tmp_path / "runs")]) == 0
    drawn = capsys.readouterr()
    assert {"participation_fedavg.both.png", "participation_mifa.png", "participation_fedavg.solo.png"} <= \
        {Path(line).name for line in drawn.out.splitlines()}
    assert drawn.err == f"not drawn here: 1 study, each drawn alone: `fedsim plot {tmp_path / 'runs' / 'seeds'}`\n"
    assert main(re.search(r"`fedsim (.+)`", drawn.err).group(1).split()) == 0  # as printed (from another directory)


def test_the_python_api_pages_scoring_of_model_pt_gives_the_runs_final_accuracy(tmp_path, monkeypatch, capsys):
    """docs/python-api.md's block, run as written on a short quick start: fedsim.test_data and
    the run's model.pt in the built-in's plain torch module give its recorded accuracy."""
    import torch

    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", "--set", "run.rounds=20", "--quiet"]) == 0
    page = (Path(__file__).parent.parent / "docs" / "python-api.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "test_data" in b)
    capsys.readouterr()
    exec(block, {})
    printed = capsys.readouterr().out
    final = pl.read_parquet(tmp_path / "runs" / "quickstart" / "fedavg" / "rounds.parquet")["test_acc"].drop_nulls()[-1]
    assert float(re.search(r"tensor\(([\d.]+)\)", printed).group(1)) == pytest.approx(final, abs=1e-4)  # (torch prints 4 decimals)
    with pytest.raises(FedsimError, match="a study's folder, whose points may read different data; give one point's"):
        (tmp_path / "study").mkdir()
        (tmp_path / "study" / "study.toml").write_text("")
        __import__("fedsim").test_data(tmp_path / "study")
    x, y = __import__("fedsim").test_data("quickstart")  # a scenario: the same split
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape[1:] == (1, 8, 8) and 0 <= x.min() <= x.max() <= 1


def test_a_comparison_stopped_before_an_algorithm_reports_it_not_started(tmp_path, capsys, monkeypatch):
    import shlex

    from test_stop_and_resume import ctrl_c_in_round

    config = {"run": {"rounds": 6, "name": "c", "out": str(tmp_path / "runs"), "algorithms": ["fedavg", "mifa"],
                      "progress": False, "plots": False},
              "data": {"dataset": "quadratic", "clients": 4}, "server": {"timing": "ideal", "clients_per_round": 2}}
    (tmp_path / "c.toml").write_text(dump_toml(config))
    ctrl_c_in_round(tmp_path / "c.toml", 2, monkeypatch)
    capsys.readouterr()
    folder = tmp_path / "runs" / "c"
    assert main(["report", str(folder)]) == 0
    line = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert line == (f"not started: mifa of {folder} (the comparison stopped before it): "
                    f"`fedsim run --resume {folder.resolve()}` runs it")
    monkeypatch.chdir(tmp_path.parent)
    assert main(shlex.split(re.search(r"`fedsim (.+)`", line).group(1)) + ["--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(folder)]) == 0 and "not started" not in capsys.readouterr().out


@pytest.mark.parametrize("df, t", [(1, 12.706), (30, 2.042), (31, 2.03951), (40, 2.02108), (63, 1.99834),
                                   (1000, 1.96234)])
def test_the_95_percent_t_quantile_is_students_beyond_30_degrees_of_freedom_too(df, t):
    """A study of 32 seeds has 31 degrees of freedom: t = 2.0395, not the normal 1.96 (its
    interval was 4 % too narrow); values of Student's t to 5 digits."""
    assert t_quantile(df) == pytest.approx(t, abs=1e-5)
