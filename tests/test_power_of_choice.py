"""Power-of-choice selection through the whole engine (config -> `fedsim run` -> Parquet): on
the quadratic task the losses f_i(x0) = ½‖x0 − u_i‖² are known, so round 1's invitations are
the K candidates of highest loss; the candidates come from the round's rng as the selector
draws them; the question's time is download + a third of a sample's compute + upload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).parent))
from conftest import quadratic_config, rounds, same_results  # noqa: E402
from test_clock_closed_forms import SPS, known_speeds  # noqa: E402
from test_server_rules import always  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.traces import Trace  # noqa: E402

N = len(SPS)
# targets whose losses at x0 = 0 are all different and not ordered by id
U = [[3.0, 1.0], [0.5, 0.0], [4.0, 2.0], [1.0, 1.0], [2.0, -3.0], [0.0, 0.25], [5.0, 0.0], [-1.5, 1.0]]


def poc_config(cli_run, rounds_: int, k: int = 2, d: int = 5, **server) -> dict:
    """Known speeds (tests/test_clock_closed_forms.py): 1 s per 8-byte model each way, seconds
    per sample SPS, no latency; power-of-choice with K = k, d candidates."""
    config = known_speeds(cli_run, rounds_, clients_per_round=k, deadline=1e6, **server)
    config["data"]["targets"] = U
    config["algorithm"].update(selection="power-of-choice", candidates=d)
    return config


def candidates_by_hand(seed: int, rnd: int, d: int, sizes=None) -> np.ndarray:
    """The selector's draw: d of the online devices (all here), without replacement, by size."""
    sizes = np.ones(N) if sizes is None else sizes
    rng = np.random.default_rng([seed, rnd, 0x5E1])
    return np.sort(rng.choice(np.arange(N), size=d, replace=False, p=sizes / sizes.sum()))


def test_round_one_invites_the_k_candidates_of_highest_loss_after_their_answers(cli_run):
    run_dir = cli_run(poc_config(cli_run, 3), always(N))
    ev = pl.read_parquet(run_dir / "events.parquet").filter(pl.col("round") == 0)
    asked = ev.filter(pl.col("outcome").is_in(["answered", "unanswered"]))
    candidates = candidates_by_hand(5, 0, 5)
    np.testing.assert_array_equal(asked["device_id"], candidates)
    loss = 0.5 * (np.asarray(U) ** 2).sum(axis=1)  # f_i(x0 = 0)
    best = np.sort(candidates[np.argsort(-loss[candidates], kind="stable")[:2]])
    trained = ev.filter(~pl.col("outcome").is_in(["answered", "unanswered"]))
    np.testing.assert_array_equal(trained["device_id"], best)

    # the question: the 8-byte model down (1 s), a forward pass over the device's one sample
    # (a third of its seconds per sample), its 4-byte loss up (0.5 s); everyone answered
    assert (asked["outcome"] == "answered").all() and (asked["steps"] == 0).all()
    np.testing.assert_array_equal(asked["samples"], 1)
    np.testing.assert_array_equal(asked["compute_s"], 1 * SPS[candidates] / 3.0)
    answers = 0.0 + (1.0 + SPS[candidates] / 3.0 + 0.5)
    np.testing.assert_array_equal(asked["finished"], answers)
    # the invitations wait for the last answer; the invited hold the model: no download
    chosen_at = answers.max()
    np.testing.assert_array_equal(trained["invited_at"], chosen_at)
    np.testing.assert_array_equal(trained["download_s"], 0.0)
    np.testing.assert_array_equal(trained["finished"], chosen_at + (0.0 + 2.0 * SPS[best] + 1.0))
    df = rounds(run_dir)
    assert df["t_start"][0] == 0.0 and df["t_end"][0] == chosen_at + (2.0 * SPS[best] + 1.0).max()
    assert df["invited"][0] == 2 and df["arrived"][0] == 2 and df["wasted_s"][0] == 0.0


def test_ideal_timing_asks_in_no_time_and_picks_by_the_loss_at_each_rounds_model(cli_run):
    """Ideal timing: the question costs nothing; round 2's candidates are asked at the model
    FedAvg made of round 1's (one exact step of lr 0.1: x1 = 0.1 * mean of the invited u_i)."""
    config = quadratic_config(U, rounds=2, server={"clients_per_round": 3}, run={"seed": 2})
    config["algorithm"].update(selection="power-of-choice")  # d = 2K = 6
    run_dir = cli_run(config, always(N))
    ev = pl.read_parquet(run_dir / "events.parquet")
    assert (ev.filter(pl.col("outcome") == "answered")["work_s"] == 0.0).all()
    u, x = np.asarray(U), np.zeros(2)
    for rnd in range(2):
        asked = ev.filter((pl.col("round") == rnd) & (pl.col("outcome") == "answered"))
        candidates = candidates_by_hand(2, rnd, 6)
        np.testing.assert_array_equal(asked["device_id"], candidates)
        assert (asked["invited_at"] == float(rnd)).all()
        loss = 0.5 * ((x - u) ** 2).sum(axis=1)
        best = np.sort(candidates[np.argsort(-loss[candidates], kind="stable")[:3]])
        arrived = ev.filter((pl.col("round") == rnd) & (pl.col("outcome") == "arrived"))
        np.testing.assert_array_equal(arrived["device_id"], best)
        x = x + 0.1 * (u[best] - x).mean(axis=0)
    np.testing.assert_allclose(rounds(run_dir)["t_end"], [1.0, 2.0])


def test_candidates_are_drawn_by_data_size():
    """Device i of n_i samples is the one candidate (d = 1) with probability n_i / sum n."""
    from fedsim.algorithms.selection import SelectPowerOfChoice

    sizes = np.array([1, 3, 0, 6])
    selector = SelectPowerOfChoice(4, 1, candidates=1, sizes=sizes)
    draws = np.concatenate([selector.candidates(r, np.arange(4), np.random.default_rng(r)) for r in range(4000)])
    share = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(share, sizes / sizes.sum(), atol=4 * np.sqrt(0.25 / 4000))  # 4 sigma
    assert share[2] == 0.0  # (no samples, no loss: never asked)
    np.testing.assert_array_equal(selector.candidates(0, np.array([1, 2]), np.random.default_rng(0)), [1])


def leaving_trace() -> Trace:
    """Every device always online, but device 6 (the highest loss) leaves at t = 1 s, before
    its answer (1 + SPS[6]/3 + 0.5 s) is uploaded."""
    ends = np.full(N, 1e6)
    ends[6] = 1.0
    return Trace.from_intervals(np.arange(N), np.zeros(N), ends, n_devices=N, horizon=1e6)


def test_a_candidate_that_goes_offline_before_answering_is_not_invited(cli_run):
    """Every device is a candidate (d = N); the device of highest loss does not answer: the
    server chooses when the others answered, among them."""
    run_dir = cli_run(poc_config(cli_run, 1, k=2, d=N), leaving_trace())
    ev = pl.read_parquet(run_dir / "events.parquet")
    asked = ev.filter(pl.col("outcome").is_in(["answered", "unanswered"]))
    assert asked.filter(pl.col("outcome") == "unanswered")["device_id"].to_list() == [6]
    assert asked.filter(pl.col("device_id") == 6)["finished"].to_list() == [None]
    others = np.delete(np.arange(N), 6)
    np.testing.assert_array_equal(ev.filter(pl.col("outcome") == "arrived")["device_id"], [2, 4])  # f = 10, 6.5
    chosen_at = (1.0 + SPS[others] / 3.0 + 0.5).max()
    assert (ev.filter(pl.col("outcome") == "arrived")["invited_at"] == chosen_at).all()


def test_a_resumed_run_equals_an_uninterrupted_one(cli_run):
    configs = [poc_config(cli_run, rounds_) for rounds_ in (6, 3)]
    for config in configs:
        config["run"]["eval_every"] = 2
    whole = cli_run(configs[0], always(N), name="whole")
    first = cli_run(configs[1], always(N), name="cut")
    assert rounds(first).height == 3
    assert main(["run", "--resume", str(first), "--set", "run.rounds=6", "--quiet"]) == 0
    same_results(first, whole)


def test_the_questions_are_no_training_tasks_for_the_report_nor_failures_for_the_log(cli_run, capsys):
    """The report's latency and wasted work are of the training tasks alone (every invited
    device arrived: nothing wasted, though a candidate did not answer); `[run] events =
    "failures"` keeps the unanswered question and no answered one."""
    logs = {}
    for kept in ("all", "failures"):
        config = poc_config(cli_run, 2, k=2, d=N)
        config["run"]["events"] = kept
        logs[kept] = cli_run(config, leaving_trace(), name=kept)
    events = pl.read_parquet(logs["all"] / "events.parquet")
    failures = pl.read_parquet(logs["failures"] / "events.parquet")
    assert failures.equals(events.filter(pl.col("outcome") == "unanswered")) and failures.height == 1  # (then offline)
    assert main(["report", str(logs["all"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["runs"][0]
    assert doc["latency"]["tasks"] == events.filter(pl.col("outcome") == "arrived").height == 4
    assert doc["wasted"]["wasted_s"] == 0.0 and doc["wasted"]["share"] == 0.0


def test_tasks_that_fit_the_deadline_but_start_after_the_question_are_named_as_such(cli_run):
    """Deadline 5 s: the K = 2 of highest loss (devices 6 and 2, tasks of 4 and 4.5 s) would
    arrive, but the question waits for its slowest candidate (2.83 s) and their tasks end at
    5.83 and 6.33 s: late every round, and the warning says why (not "too slow")."""
    config = poc_config(cli_run, 6, d=N)
    config["server"]["deadline"] = 5.0
    run_dir = cli_run(config, always(N))
    ev = pl.read_parquet(run_dir / "events.parquet")
    trained = ev.filter(~pl.col("outcome").is_in(["answered", "unanswered"]))
    assert set(trained["device_id"]) == {2, 6} and (trained["outcome"] == "late").all()
    warning = ("never arrived: 2 of 2 devices invited at least 5 times never arrived (12 late, 0 dropped, 0 surplus); mostly "
               "late although their median task (4.25 s) fits the deadline (5 s): their tasks started late, after "
               "power-of-choice's question, which waits for its slowest candidate; lower [algorithm] candidates "
               "or raise [server] deadline")
    assert warning in json.loads((run_dir / "manifest.json").read_text())["warnings"]
