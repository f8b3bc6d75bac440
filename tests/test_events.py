"""events.parquet, close reasons and outcome counts through whole runs; callbacks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import quadratic_config, rounds, same_results  # noqa: E402
from test_server_rules import always, targets, timed  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.traces import Trace  # noqa: E402

OUTCOMES = ["arrived", "dropped", "late", "surplus"]


def churn_config(rounds_: int = 40) -> dict:
    """Overcommit and a tight deadline on a trace of few-second sessions with lognormal speeds:
    every outcome happens."""
    return {
        "run": {"rounds": rounds_, "eval_every": 10, "checkpoint_every": 7},
        "data": {"dataset": "digits", "clients": 60},
        "client": {"local_steps": 3, "batch_size": 16},
        "server": {"timing": "model", "clients_per_round": 8, "overcommit": 0.5, "deadline": 1.2},
        "devices": {"model": "lognormal", "seconds_per_sample": 0.01, "compute_sigma": 1.0,
                    "bandwidth_bps": 2e6, "latency_s": 0.05},
        "trace": {"source": "markov", "mean_on": 4.0, "mean_off": 4.0, "days": 0.05},
    }


def outcome_counts(run_dir: Path) -> pl.DataFrame:
    events = pl.read_parquet(run_dir / "events.parquet")
    return (events.group_by("round").agg([(pl.col("outcome") == o).sum().alias(o) for o in OUTCOMES])
            .sort("round"))


def test_every_invitation_is_one_event_and_the_outcomes_add_up(cli_run):
    run_dir = cli_run(churn_config())
    df, events = rounds(run_dir), pl.read_parquet(run_dir / "events.parquet")
    assert (df["arrived"] + df["dropped"] + df["late"] + df["surplus"] == df["invited"]).all()
    assert {o: int(df[o].sum()) > 0 for o in OUTCOMES} == dict.fromkeys(OUTCOMES, True), df.sum()
    counted = outcome_counts(run_dir)
    joined = df.select("round", *OUTCOMES).join(counted, on="round", how="left", suffix="_e").fill_null(0)
    for o in OUTCOMES:
        assert (joined[o] == joined[f"{o}_e"]).all(), o
    assert set(df["close_reason"]) <= {"all-arrived", "quota", "deadline"}
    assert {"quota", "deadline"} <= set(df["close_reason"])
    np.testing.assert_allclose(df["duration"], df["t_end"] - df["t_start"])
    # times: invited at the round's start; started after the download; finished after the upload
    ev = events.join(df.select("round", "t_start", "t_end"), on="round")
    assert (ev["invited_at"] == ev["t_start"]).all()
    ok = ev.filter(pl.col("started").is_not_null())
    np.testing.assert_allclose(ok["started"], ok["invited_at"] + ok["download_s"])
    done = ev.filter(pl.col("finished").is_not_null())
    np.testing.assert_allclose(done["finished"], done["started"] + done["compute_s"] + done["upload_s"])
    arrived = ev.filter(pl.col("outcome") == "arrived")
    assert (arrived["finished"] <= arrived["t_end"]).all()
    deadline = ev["t_start"] + 1.2
    assert (ev.filter(pl.col("outcome") == "surplus")["finished"] <= deadline.filter(ev["outcome"] == "surplus")).all()
    assert ev.filter(pl.col("outcome") == "dropped")["finished"].is_null().all()
    late = ev.filter(pl.col("outcome") == "late")
    late_end = late["finished"].fill_null(np.inf)
    assert (late_end > late["t_start"] + 1.2).all()
    assert events["staleness"].is_null().all()  # synchronous rounds
    assert (events["samples"] == events["steps"] * 16).all()
    devices = pl.read_parquet(run_dir / "devices.parquet")
    for column, outcome in [("arrivals", "arrived"), ("drops", "dropped"), ("late", "late"),
                            ("surplus", "surplus")]:
        per_device = events.filter(pl.col("outcome") == outcome)["device_id"].to_numpy()
        assert np.array_equal(np.bincount(per_device, minlength=60), devices[column].to_numpy()), column


def stopped_hard_in_round_18(cli_run, monkeypatch, config: dict) -> tuple[Path, Path]:
    """(the run whole, the run a second Ctrl-C aborted in round 18): its last checkpoint is of
    round 14, its events log (parts of 5 rows) flushed beyond it."""
    import fedsim.results.events_log as events_log
    from fedsim.results.recorder import Recorder

    monkeypatch.setattr(events_log, "ROWS_PER_PART", 5)
    whole = cli_run(config, name="whole")
    add_round = Recorder.add_round

    def abort_at_18(self, outcome, *args):
        row = add_round(self, outcome, *args)
        if outcome.round == 18:
            raise KeyboardInterrupt
        return row

    monkeypatch.setattr(Recorder, "add_round", abort_at_18)
    cut = cli_run(config, name="cut", expect=130)
    monkeypatch.setattr(Recorder, "add_round", add_round)
    return whole, cut


@pytest.mark.parametrize("kept", ["all", "failures"])
def test_resume_after_a_hard_stop_gives_the_same_events_log(cli_run, monkeypatch, kept):
    """A second Ctrl-C aborts at once: the run keeps its last checkpoint (round 14) while the
    log has flushed part files beyond it (small parts); the resumed run's log equals an
    uninterrupted run's (of every invitation, or of those that did not arrive)."""
    config = churn_config(30)
    config["run"]["events"] = kept
    whole, cut = stopped_hard_in_round_18(cli_run, monkeypatch, config)
    assert len(list((cut / ".events").glob("part-*.parquet"))) > 0
    assert main(["run", "--resume", str(cut), "--quiet"]) == 0
    assert pl.read_parquet(cut / "events.parquet").equals(pl.read_parquet(whole / "events.parquet"))
    assert not (cut / ".events").exists()
    columns = ["round", "t_end", "arrived", "late", "surplus", "close_reason", "test_acc"]
    assert rounds(cut)[columns].equals(rounds(whole)[columns])


def test_the_events_log_is_written_compact_and_sorted_and_keeps_what_run_events_says(cli_run, capsys):
    """zstd, rows by (round, device_id) with device ids delta-encoded, the unique times
    byte-stream-split; `[run] events = "failures"` keeps exactly the rows whose outcome is not
    arrived, "none" writes no log; the rounds are the same, and the report says what a smaller
    log cannot show instead of showing latencies of the failures alone."""
    import pyarrow.parquet as pq

    config = churn_config(20)
    logs = {}
    for kept in ("all", "failures", "none"):
        config["run"]["events"] = kept
        logs[kept] = cli_run(config, name=kept)
    events = pl.read_parquet(logs["all"] / "events.parquet")
    assert events.equals(events.sort("round", "device_id"))
    failures = pl.read_parquet(logs["failures"] / "events.parquet")
    assert failures.equals(events.filter(pl.col("outcome") != "arrived")) and 0 < failures.height < events.height
    assert not (logs["none"] / "events.parquet").exists() and not (logs["none"] / ".events").exists()
    for run_dir in logs.values():
        assert rounds(run_dir).drop("wall_s").equals(rounds(logs["all"]).drop("wall_s"))
    meta = pq.ParquetFile(logs["all"] / "events.parquet").metadata
    columns = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert {c.compression for c in columns.values()} == {"ZSTD"}
    assert "BYTE_STREAM_SPLIT" in columns["started"].encodings and "DELTA_BINARY_PACKED" in columns["device_id"].encodings
    assert [(s.column_index, s.descending) for s in meta.row_group(0).sorting_columns] == [(0, False), (1, False)]

    def report(run_dir) -> tuple[dict, str]:
        assert main(["report", str(run_dir), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)["runs"][0]
        assert main(["report", str(run_dir)]) == 0
        return doc, capsys.readouterr().out

    full, _ = report(logs["all"])
    assert full["latency"]["tasks"] > 0 and full["events"] == "all"
    wasted = float(rounds(logs["all"])["wasted_s"].sum())
    assert full["wasted"]["wasted_s"] == pytest.approx(wasted)
    for kept, says in [("failures", 'its events log keeps only the invitations that did not arrive ([run] events = '
                                    '"failures"): no latency of the tasks that ran to their end, no share of the work wasted, '
                                    'no task times of stragglers'),
                       ("none", 'it kept no events log ([run] events = "none"): no latency of the tasks, no share of '
                                'the work wasted, no task times of stragglers')]:
        doc, text = report(logs[kept])
        assert doc["events"] == kept and doc["latency"] is None
        assert doc["wasted"]["wasted_s"] == pytest.approx(wasted) and doc["wasted"]["share"] is None
        assert f"fedavg: {says}" in text.splitlines() and "latency (tasks run to their end)" not in text
    from fedsim.results.plots import build_figures, load_run

    assert "latency_fedavg" in build_figures({"fedavg": load_run(logs["all"])})
    assert "latency_fedavg" not in build_figures({"fedavg": load_run(logs["failures"])})


def test_extending_a_finished_run_continues_its_events_log(cli_run):
    config = churn_config(20)
    whole = cli_run(config, name="whole")
    config["run"]["rounds"] = 12
    short = cli_run(config, name="short")
    assert main(["run", "--resume", str(short), "--set", "run.rounds=20", "--quiet"]) == 0
    assert pl.read_parquet(short / "events.parquet").equals(pl.read_parquet(whole / "events.parquet"))


def test_close_reasons_of_ideal_rounds_nobody_online_and_max_time(cli_run):
    trace = Trace.from_intervals([0, 1], [0.0, 0.0], [2.0, 5.0], n_devices=2, horizon=10.0)
    df = rounds(cli_run(quadratic_config(targets(2), rounds=6), trace, name="ideal"))
    assert df["close_reason"].to_list() == ["all-arrived"] * 5 + ["nobody-invited"]
    assert df["invited"].to_list() == [2, 2, 1, 1, 1, 0]
    np.testing.assert_allclose(df["t_end"], np.arange(1, 7))  # a round spans its slot
    config = timed(targets(3), 10)  # 2 s tasks
    config["server"]["deadline"] = 100.0
    config["run"]["max_time"] = 5.0  # the third round would close at 6 s: it does not count
    max_run = cli_run(config, always(3), name="max")
    df = rounds(max_run)
    assert df["close_reason"].to_list() == ["all-arrived", "all-arrived"]
    manifest = json.loads((max_run / "manifest.json").read_text())
    assert (manifest["rounds"], manifest["sim_time_s"]) == (2, df["t_end"][-1]) and 4.0 < df["t_end"][-1] < 4.01
    assert manifest["reason"] == "max_time 5 s reached before the round in progress closed (it is not counted)"
    config = timed(targets(3), 10)
    config["server"]["deadline"] = 1.0
    config["run"]["max_time"] = 2.0  # the second round's deadline is max_time itself: it counts
    df = rounds(cli_run(config, always(3), name="deadline"))
    assert df["close_reason"].to_list() == ["deadline", "deadline"] and df["late"].to_list() == [3, 3]
    assert df["t_end"].to_list() == [1.0, 2.0]


@pytest.mark.parametrize("algorithm", ["mifa", "fedavg-wait", "power-of-choice"])
def test_a_run_that_max_time_ended_resumes_with_a_later_one_as_if_given_it_from_the_start(cli_run, algorithm):
    """The round max_time cuts short does not count, nor what it changed before it closed (a
    strategy's selection state, power-of-choice's answers): the resume runs it whole."""
    config = churn_config(200)
    config["algorithm"] = {"name": "fedavg", "selection": "power-of-choice"} if algorithm == "power-of-choice" \
        else {"name": algorithm}
    config["run"]["max_time"] = 30.0
    whole = cli_run(config, name="whole")
    config["run"]["max_time"] = 12.0
    cut = cli_run(config, name="cut")
    df, manifest = rounds(cut), json.loads((cut / "manifest.json").read_text())
    assert "max-time" not in df["close_reason"].to_list()
    assert manifest["sim_time_s"] == df["t_end"][-1] < 12.0 and "before the round in progress closed" in manifest["reason"]
    assert main(["run", "--resume", str(cut), "--quiet", "--set", "run.max_time=30"]) == 0
    same_results(cut, whole)


def test_an_events_log_behind_its_checkpoint_is_a_warning_and_listed_incomplete(cli_run, monkeypatch, capsys):
    """The log's newest part gone (a folder copied while its run wrote it): the resume goes on,
    says how many rows the log lacks, and the manifest and the report list events.parquet as
    incomplete (it lost them silently, the run ending `completed` with nothing said)."""
    whole, cut = stopped_hard_in_round_18(cli_run, monkeypatch, churn_config(30))
    parts = sorted((cut / ".events").glob("part-*.parquet"))
    checkpointed = torch.load(cut / "checkpoint.pt", weights_only=False)["recorder"]["events_rows"]
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in parts]
    kept = next(k for k in range(len(parts)) if sum(sizes[:k + 1]) >= checkpointed)  # the parts a copy had
    for part in parts[kept:]:
        part.unlink()
    lost = checkpointed - sum(sizes[:kept])
    capsys.readouterr()
    assert main(["run", "--resume", str(cut), "--quiet"]) == 0
    assert lost > 0
    assert f"events.parquet lacks {lost:,} rows of the run's first 14 rounds" in capsys.readouterr().err
    manifest = json.loads((cut / "manifest.json").read_text())
    assert [o["output"] for o in manifest["incomplete_outputs"]] == ["events"] and manifest["status"] == "completed"
    assert len(pl.read_parquet(cut / "events.parquet")) == len(pl.read_parquet(whole / "events.parquet")) - lost
    assert main(["report", str(cut)]) == 0
    assert "its events log" in capsys.readouterr().out


def test_the_rounds_before_max_time_are_the_whole_runs_with_their_last_tasks_fates(cli_run):
    """A run that max_time stops records its rounds as a run without max_time does: a round
    that closed at its K-th arrival (overcommit) shortly before max_time still had tasks
    running, and their fates are those of the round's own deadline (a device that finishes
    after max_time but by the deadline is surplus, not late; its work is not cut at max_time)."""
    config = {"run": {"rounds": 12, "eval_every": 12},
              "data": {"dataset": "digits", "clients": 60},
              "client": {"local_steps": 2, "batch_size": 16},
              "server": {"timing": "model", "clients_per_round": 5, "overcommit": 0.4, "deadline": 3.0},
              "devices": {"model": "lognormal", "seconds_per_sample": 0.01, "bandwidth_bps": 1e6, "latency_s": 0.1},
              "trace": {"source": "always"}}
    whole = cli_run(config, name="whole")
    events = pl.read_parquet(whole / "events.parquet")
    rows = rounds(whole)
    # max_time just after rounds that closed by quota while a task that will be surplus still ran
    ends = events["invited_at"] + events["download_s"] + events["compute_s"] + events["upload_s"]
    running = events.with_columns(ends=ends).filter(pl.col("outcome") == "surplus").join(
        rows.select("round", "t_end"), on="round").filter(pl.col("ends") > pl.col("t_end"))
    cuts = sorted({(t_end + ends) / 2 for t_end, ends in running.select("t_end", "ends").iter_rows()})[:3]
    assert cuts
    for k, max_time in enumerate(cuts):
        cut = cli_run({**config, "run": {**config["run"], "max_time": max_time}}, name=f"cut{k}")
        done = rounds(cut)
        kept = ["wall_s", "test_loss", "test_acc"]  # (a stopped run evaluates its last model)
        assert done.drop(kept).equals(rows.head(len(done)).drop(kept))
        assert pl.read_parquet(cut / "events.parquet").equals(events.filter(pl.col("round") < len(done)))


def test_an_async_run_stops_at_max_time_and_hears_of_no_task_after_it(cli_run):
    """Buffered aggregation: a task that ends after max_time is not heard of (it neither fills
    the buffer nor closes an aggregation after max_time); the run ends at max_time exactly and
    goes on from there as a run given the later max_time from the start."""
    config = {"run": {"rounds": 12, "eval_every": 12},
              "data": {"dataset": "digits", "clients": 60},
              "client": {"local_steps": 2, "batch_size": 16},
              "algorithm": {"name": "fedbuff"},
              "server": {"timing": "model", "mode": "async", "buffer": 3, "concurrency": 6, "clients_per_round": 0,
                         "deadline": 5.0},
              "devices": {"model": "lognormal", "seconds_per_sample": 0.01, "bandwidth_bps": 1e6, "latency_s": 0.1},
              "trace": {"source": "always"}}
    whole = cli_run(config, name="whole")
    ended = rounds(whole)["t_end"].to_list()
    for k, max_time in enumerate([ended[2] + 1e-3, (ended[4] + ended[5]) / 2]):
        cut = cli_run({**config, "run": {**config["run"], "max_time": max_time}}, name=f"cut{k}")
        manifest = json.loads((cut / "manifest.json").read_text())
        assert manifest["sim_time_s"] == max_time and rounds(cut)["t_end"].max() <= max_time
        assert main(["run", "--resume", str(cut), "--quiet", "--set", "run.max_time=0"]) == 0
        same_results(cut, whole)


def test_async_events_carry_staleness(cli_run):
    config = timed(targets(6), 8, mode="async", buffer=2, concurrency=4)
    run_dir = cli_run(config, always(6))
    events = pl.read_parquet(run_dir / "events.parquet")
    arrived = events.filter(pl.col("outcome") == "arrived")
    assert len(arrived) == 16 and arrived["staleness"].is_not_null().all()
    assert (arrived["staleness"] >= 0).all() and arrived["staleness"].max() >= 1
    per_round = arrived.group_by("round").agg(pl.col("staleness").mean()).sort("round")
    np.testing.assert_allclose(per_round["staleness"], rounds(run_dir)["staleness"])


def test_a_user_callback_stops_early_and_adds_metrics(tmp_path):
    """Through the Python API: early stopping at a target accuracy, and a callback whose
    metric becomes a column of rounds.parquet; the initial model's evaluation is recorded."""
    import fedsim
    from fedsim.runs.callbacks import Callback, EarlyStopping

    class Spread(Callback):
        def on_round(self, run, outcome, metrics):
            return False, {"param_norm": float(run.strategy.params.norm())}

    config = fedsim.load_config("quickstart", [f"run.out={json.dumps(str(tmp_path))}", "run.algorithms=[]",
                                               "run.progress=false", "run.eval_every=5"])
    result = fedsim.run(config, callbacks=[Spread(), EarlyStopping(0.6)])
    df = result.rounds
    accs = df["test_acc"].drop_nulls().to_list()
    assert accs[-1] >= 0.6 and all(a < 0.6 for a in accs[:-1])
    assert result.status == "completed" and "reached the target 60%" in result.reason
    assert len(df) < config.run.rounds and len(df) % 5 == 0
    assert (df["param_norm"] > 0).all()
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    assert manifest["initial"]["test_acc"] < 0.3 and manifest["initial"]["t"] == 0.0
    assert not (result.run_dir / ".events").exists()


def test_a_diurnal_comparison_reports_each_algorithms_time_to_80_percent(cli_run, capsys):
    """The wall-clock question end to end: model timing on a diurnal trace (lognormal speeds,
    deadline 300 s, overcommit 0.3), FedAvg vs MIFA; `fedsim report` gives the time to 80 %
    computed here independently from rounds.parquet and the initial evaluation."""
    from test_report import expected_hit

    config = {
        "run": {"rounds": 40, "eval_every": 2, "algorithms": ["fedavg", "mifa"], "plots": True},
        "data": {"dataset": "digits", "clients": 40},
        "client": {"local_steps": 5, "batch_size": 16, "lr": 0.3},
        "server": {"timing": "model", "clients_per_round": 10, "overcommit": 0.3, "deadline": 300.0},
        "devices": {"model": "lognormal", "seconds_per_sample": 0.5},
        "trace": {"source": "diurnal", "days": 2.0, "availability": 0.6},
    }
    run_dir = cli_run(config)
    capsys.readouterr()
    assert main(["report", str(run_dir), "--target", "0.8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for entry in report["runs"]:
        sub = run_dir / entry["name"]
        assert (sub / "events.parquet").exists() and (run_dir / "plots" / f"latency_{entry['name']}.png").exists()
        hit = expected_hit(sub, 0.8)
        assert hit is not None, rounds(sub)["test_acc"].drop_nulls().to_list()
        (target,) = entry["targets"]
        assert (target["rounds"], target["time_s"]) == pytest.approx(hit)
        df = rounds(sub)
        assert (df["arrived"] + df["dropped"] + df["late"] + df["surplus"] == df["invited"]).all()
        assert "tz_offset" in pl.read_parquet(sub / "devices.parquet").columns
