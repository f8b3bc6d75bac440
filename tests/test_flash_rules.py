"""FLASH's round rules ([server] deadline_sigma, min_selected, update_frac) and the work done
before a drop, through the whole engine with tasks of known length."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import final_x, rounds  # noqa: E402
from test_server_rules import always, targets, timed  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.traces import Trace  # noqa: E402
from fedsim.traces.io import write_device_table  # noqa: E402


def events(run_dir: Path) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "events.parquet")


def leaving(n: int, gone: dict[int, float], horizon: float = 1e6) -> Trace:
    """Everyone online from 0; device i of `gone` offline for good at gone[i]."""
    end = np.array([gone.get(i, horizon) for i in range(n)])
    return Trace.from_intervals(np.arange(n), np.zeros(n), end, n_devices=n, horizon=horizon)


def flaky() -> Trace:
    """Devices 0, 1 always online; 2 and 3 online until 7 s, then for the first second of every
    2 s round (rounds of 2 s tasks start at even seconds): from round 3 on they drop in each."""
    starts = np.concatenate([[0.0, 0.0], np.r_[0.0, np.arange(8.0, 40.0, 2.0)].repeat(1)])
    ends = np.concatenate([[1e3, 1e3], np.r_[7.0, np.arange(9.0, 41.0, 2.0)]])
    one = len(starts) - 2
    ids = np.concatenate([[0, 1], np.full(one, 2)])
    return Trace.from_intervals(np.concatenate([ids, np.full(one, 3)]), np.concatenate([starts, starts[2:]]),
                                np.concatenate([ends, ends[2:]]), n_devices=4, horizon=1e3)


def test_the_deadline_is_drawn_per_round_recorded_and_closes_the_round(cli_run):
    """Tasks of 2 s, deadline N(2, 0.5): a round closes at min(its deadline, 2 s); those whose
    deadline fell short of 2 s see every device late. The draws are the seed's."""
    config = timed(targets(3), 40, deadline=2.0, deadline_sigma=0.5)
    df = rounds(cli_run(config, always(3)))
    drawn = df["deadline"].to_numpy()
    assert len(set(drawn)) == 40 and (drawn >= 0).all() and 1.7 < drawn.mean() < 2.3, drawn
    np.testing.assert_allclose(df["duration"], np.minimum(drawn, 2.0))
    short = drawn < 2.0
    assert 5 < short.sum() < 35
    assert (df["arrived"].to_numpy() == np.where(short, 0, 3)).all()
    assert (df["late"].to_numpy() == np.where(short, 3, 0)).all()
    again = rounds(cli_run(config, always(3), name="again"))
    np.testing.assert_array_equal(again["deadline"], drawn)
    other = rounds(cli_run({**config, "run": {**config["run"], "seed": 1}}, always(3), name="other"))
    assert not np.array_equal(other["deadline"], drawn)


def test_a_round_waits_for_min_selected_devices_online_and_the_wait_is_part_of_it(cli_run):
    """Device i comes online at 10 i s: with min_selected = 3 the first round starts at 0, invites
    at 20 s (3 online) and lasts 20 + 2 s; later rounds start at once."""
    n = 4
    trace = Trace.from_intervals(np.arange(n), 10.0 * np.arange(n), np.full(n, 1e6), n_devices=n, horizon=1e6)
    config = timed(targets(n), 3, min_selected=3)
    run_dir = cli_run(config, trace)
    df, ev = rounds(run_dir), events(run_dir)
    np.testing.assert_allclose(df["t_start"], [0.0, 22.0, 24.0])
    assert df["wait_s"].to_list() == [20.0, 0.0, 0.0]
    np.testing.assert_allclose(df["duration"], [22.0, 2.0, 2.0])
    assert df["invited"].to_list() == [3, 3, 3]  # device 3 comes at 30 s
    assert ev.filter(pl.col("round") == 0)["invited_at"].to_list() == [20.0] * 3


def test_min_selected_that_the_trace_no_longer_reaches_ends_the_run_with_why(cli_run):
    """Both devices online together until 5 s only: rounds of 2 s tasks at 0 and 2 s, the one at
    4 s loses device 1 at 5 s, and then no round can start."""
    trace = Trace.from_intervals([0, 1, 1], [0.0, 0.0, 50.0], [40.0, 5.0, 100.0], n_devices=2, horizon=100.0)
    run_dir = cli_run(timed(targets(2), 5, min_selected=2), trace)
    manifest = (run_dir / "manifest.json").read_text()
    assert "never has min_selected = 2 devices online at once after 6 s" in manifest
    assert rounds(run_dir)["arrived"].to_list() == [2, 2, 1]


def test_min_selected_that_the_trace_never_reaches_is_refused_before_the_run(cli_run, tmp_path):
    trace = Trace.from_intervals([0, 1], [0.0, 50.0], [40.0, 100.0], n_devices=2, horizon=100.0)
    cli_run(timed(targets(2), 5, min_selected=2), trace, expect=2)
    assert cli_run.last_output.err == (f"error: {tmp_path / 't.toml'}: [server] min_selected = 2: the trace never has 2 "
                                       "devices online at once (at most 1, over its 1.67 min), so no round could "
                                       "start; lower it, or replay a trace where that many are online together\n")
    assert not (tmp_path / "runs").exists()


def test_min_selected_above_a_round_indexed_traces_peak_names_the_peak(cli_run, tmp_path):
    """A generated round-indexed trace (Bernoulli bits): the refusal gives the most devices any
    round has online, which a user cannot see in `fedsim trace info`'s per-device figures."""
    config = timed(targets(6), 5, min_selected=6)
    config["trace"] = {"source": "bernoulli", "p": [0.2] * 6}
    cli_run(config, expect=2)
    peak = int(re.search(r"never has 6 devices online at once \(at most (\d+), over its", cli_run.last_output.err)[1])
    assert 0 < peak < 6
    config["server"]["min_selected"] = peak  # reached, so the run starts
    assert rounds(cli_run(config, name="peak"))["wait_s"].min() >= 0


def test_a_round_short_of_its_quorum_fails_and_leaves_the_model(cli_run):
    """Devices 2 and 3 go offline 1 s into every 2 s task: 2 arrivals of 4 invited. Quorum
    ceil(0.75 x 4) = 3 fails every round (model at its start, train loss null, all the work
    wasted: 2 x 2 s + 2 x 1 s); 0.5 x 4 = 2 passes (only the dropped work is wasted)."""
    trace = leaving(4, {2: 1.0, 3: 1.0})
    failed = cli_run(timed(targets(4), 1, update_frac=0.75), trace)
    df = rounds(failed)
    assert df["close_reason"].to_list() == ["quorum"] and df["arrived"].to_list() == [2]
    assert df["train_loss"].null_count() == 1
    np.testing.assert_array_equal(final_x(failed), [0.0, 0.0])
    np.testing.assert_allclose(df["wasted_s"], [6.0])
    passed = cli_run(timed(targets(4), 1, update_frac=0.5), trace, name="passed")
    df = rounds(passed)
    assert df["close_reason"].to_list() == ["all-arrived"]
    np.testing.assert_allclose(df["wasted_s"], [2.0])
    assert not np.allclose(final_x(passed), 0.0)


@pytest.mark.parametrize("algorithm", ["fedavg", "mifa", "fedlaavg", "fedawe", "fedau", "fedvarp", "fedavg-wait"])
def test_failed_rounds_do_not_move_the_model_of_any_algorithm(cli_run, algorithm):
    """Everyone arrives in the first 3 rounds (2 s each), then devices 2 and 3 drop in every
    round: under a quorum of 3 of 4 the 4 failed rounds leave each algorithm's model where
    the 3 good rounds put it, MIFA's and FedLaAvg's table steps included."""
    trace = flaky()
    good = timed(targets(4), 3, update_frac=0.75)
    good["algorithm"]["name"] = algorithm
    more = {**good, "run": {**good["run"], "rounds": 7}}
    x3 = final_x(cli_run(good, trace, name="three"))
    run_dir = cli_run(more, trace, name="seven")
    assert rounds(run_dir)["close_reason"].to_list()[3:] == ["quorum"] * 4
    np.testing.assert_array_equal(final_x(run_dir), x3)


def test_without_a_quorum_mifa_steps_with_its_table_in_those_rounds(cli_run):
    """The contrast: MIFA's own rule steps every round, also with 2 of 4 arrived."""
    trace = flaky()
    config = timed(targets(4), 3)
    config["algorithm"]["name"] = "mifa"
    x3 = final_x(cli_run(config, trace, name="three"))
    x7 = final_x(cli_run({**config, "run": {**config["run"], "rounds": 7}}, trace, name="seven"))
    assert not np.allclose(x3, x7)


def test_events_record_the_work_of_dropped_and_late_devices_and_the_report_the_waste(cli_run, capsys):
    """Tasks of 1 s download (latency), 2 s compute (2 samples), 1 s upload, deadline 5 s:
    device 1 goes offline at 2.5 s (in compute, 2.5 s of work), device 2 computes 3.8 s (late,
    stopped in its upload at 5 s), device 0 arrives at 4 s; in round 1 device 1 is offline."""
    table = {"device_id": np.arange(3), "class": ["fast", "fast", "slow"],
             "seconds_per_sample": [1.0, 1.0, 1.9], "bandwidth_bps": [1e15] * 3, "latency_s": [1.0] * 3}
    write_device_table(table, cli_run.tmp / "devices.parquet")
    config = timed(targets(3), 2, deadline=5.0)
    config["devices"] = {"model": "table"}
    config["trace"] = {"devices_table": str(cli_run.tmp / "devices.parquet")}
    run_dir = cli_run(config, leaving(3, {1: 2.5}))
    ev = events(run_dir).filter(pl.col("round") == 0).sort("device_id")
    assert ev["outcome"].to_list() == ["arrived", "dropped", "late"]
    assert ev["phase"].to_list() == ["done", "compute", "upload"]
    np.testing.assert_allclose(ev["work_s"], [4.0, 2.5, 5.0])
    np.testing.assert_allclose(rounds(run_dir)["wasted_s"], [7.5, 5.0])

    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    # 12.5 device-seconds wasted of 11.5 + 9 = 20.5 worked; 6.25 a round
    assert re.search(r"^wasted work \(device-seconds not aggregated\)\s+total\s+per round\s+share of work\n.*\n"
                     r"fedavg\s+12.5s\s+6.25s\s+60.98%$", out, re.M), out
    # by class: fast wasted 2.5 of 10.5 s, slow 10 of 10 s
    assert re.search(r"^fast\s+2.50s\s+23.81%\nslow\s+10.0s\s+100.00%$", out, re.M), out


@pytest.mark.parametrize("server, says", [
    ({"update_frac": 1.5}, "[server] update_frac = 1.5 must be in [0, 1]"),
    ({"update_frac": -0.1}, "[server] update_frac = -0.1 must be in [0, 1]"),
    ({"min_selected": 9}, "[server] min_selected = 9 is more than the 4 devices ([data] clients): no round "
                          "could ever start; lower it"),
    ({"deadline_sigma": -1.0}, "[server] deadline_sigma = -1.0 must be >= 0 (0 = the same deadline every round)"),
    ({"timing": "ideal", "update_frac": 0.5}, "[server] update_frac means nothing under timing = 'ideal' (every "
                                              "invited device arrives at the round's end); remove it or set "
                                              "timing = 'model'"),
    ({"timing": "ideal", "min_selected": 2}, "[server] min_selected means nothing under timing = 'ideal'"),
    ({"timing": "ideal", "deadline_sigma": 1.0}, "[server] deadline_sigma means nothing under timing = 'ideal'"),
    ({"mode": "async", "update_frac": 0.5}, "[server] update_frac is a rule of synchronous rounds, not of mode = "
                                            "'async'; remove it or set mode = 'sync'"),
])
def test_bad_round_rules_are_one_line(tmp_path, capsys, server, says):
    config = tmp_path / "c.toml"
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in server.items())
    config.write_text('[data]\ndataset = "quadratic"\nclients = 4\n[server]\n' + body + "\n")
    assert main(["run", str(config), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {config}: {says}") and "\n" not in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("wrap", ["none", "loop"])
def test_the_index_says_when_enough_devices_are_online_as_a_scan_would(wrap):
    from fedsim.traces.index import AvailabilityIndex

    rng = np.random.default_rng(4)
    n, horizon = 12, 100.0
    ids = np.repeat(np.arange(n), 3)
    start = np.sort(rng.integers(0, 30, size=(n, 3)) * 1.0 + np.array([0.0, 33.0, 66.0]), axis=1).ravel()
    end = start + rng.integers(1, 30, size=3 * n)
    index = AvailabilityIndex(Trace.from_intervals(ids, start, np.minimum(end, horizon), n_devices=n,
                                                   horizon=horizon, wrap=wrap))
    grid = np.arange(0.0, 2 * horizon, 0.5)  # every breakpoint is a whole second
    counts = np.array([index.online(t).sum() for t in grid])
    for need in (1, 3, 6, 9):
        for t in (0.0, 17.25, 50.0, 99.5):
            later = grid[(grid >= t) & (counts >= need)]
            if wrap == "none":
                later = later[later < horizon]
            # the count changes on whole seconds, which the grid holds
            expect = t if index.online(t).sum() >= need else float(later[0]) if len(later) else np.inf
            assert index.next_online_count(need, t) == expect, (need, t)


def test_resuming_a_run_whose_events_log_predates_the_work_columns_keeps_its_rows(tmp_path):
    """An events log of an earlier fedsim (no phase, work_s): a resume keeps its rows, the
    new columns null there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fedsim.results.events_log import SCHEMA, EventLog

    old = pa.schema([f for f in SCHEMA if f.name not in ("phase", "work_s")])
    rows = {f.name: pa.array([1, 2], f.type) if pa.types.is_integer(f.type) else
            pa.array([0.5, 1.5], f.type) if pa.types.is_floating(f.type) else pa.array(["arrived"] * 2)
            for f in old}
    pq.write_table(pa.table(rows, schema=old), tmp_path / "events.parquet")
    log = EventLog(tmp_path)
    log.resume(2)
    log.finish()
    table = pq.read_table(tmp_path / "events.parquet")
    assert table.schema == SCHEMA and table.num_rows == 2
    assert table["work_s"].null_count == 2 and table["round"].to_pylist() == [1, 2]
