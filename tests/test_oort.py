"""Oort's selection (docs/algorithms.md, "oort") through the whole engine (config -> `fedsim run`
-> events.parquet, checkpoint.pt): on the quadratic task with one exact local step the reported
loss of device i in round r is 0.5 ||x_r - u_i||^2 (one sample: its utility), and a device
table of dyadic speeds makes each task exactly 2 + seconds_per_sample s, so the utilities, the
durations and hence every round's selection are computed here by hand from the documented
rule, with the round's seeded generator for its two draws."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import final_x, quadratic_config, rounds  # noqa: E402
from test_server_rules import always  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.traces.io import write_device_table  # noqa: E402

SPS = np.array([0.5, 4.0, 1.25, 2.0, 0.75, 3.5, 1.0, 2.75])
TASK = 2.0 + SPS  # 1 s download + 1 sample x seconds_per_sample + 1 s upload
TARGETS = [[float(i), 1.0] for i in range(len(SPS))]
LR, K, SEED = 0.5, 3, 5
OPTIONS = {"oort_pacer_step": 2}  # the pacer moves T from round 4 on


def oort_config(tmp: Path, n_rounds: int, **server) -> dict:
    n = len(SPS)
    write_device_table({"device_id": np.arange(n), "seconds_per_sample": SPS, "bandwidth_bps": np.full(n, 64.0),
                        "latency_s": np.zeros(n)}, tmp / "speeds.parquet")
    config = quadratic_config(TARGETS, lr=LR, steps=1, rounds=n_rounds,
                              server={"timing": "model", "clients_per_round": K, "deadline": 1e6, **server},
                              devices={"model": "table"}, trace={"devices_table": str(tmp / "speeds.parquet")})
    config["algorithm"].update(selection="oort", **OPTIONS)
    config["run"]["seed"] = SEED
    return config


def by_hand(n_rounds: int, deadline: float = math.inf):
    """The documented rule, device by device: the invitations of each round, and the
    utilities, durations and rounds last heard from after the last one. FedScale's defaults but
    pacer_step = 2; every device online, all data sizes 1."""
    n, u = len(SPS), np.array(TARGETS)
    x = np.zeros(2)
    util, dur, last = np.zeros(n), np.full(n, np.nan), np.zeros(n, dtype=int)
    eps, thr, history, exploited, fresh = 0.9, 30.0, [], set(), set()
    invited = []
    for rnd in range(n_rounds):
        r = rnd + 1
        eps = max(eps * 0.98, 0.3)
        told = exploited & fresh
        history.append(np.mean([util[i] for i in sorted(told)]) if told else 0.0)
        fresh, exploited = set(), set()
        if r >= 4 and r % 2 == 0:
            before, now = sum(history[-4:-2]), sum(history[-2:])
            if abs(now - before) <= 0.1 * before:
                thr = min(100.0, thr + 5.0)
            elif abs(now - before) >= 5 * before:
                thr = max(5.0, thr - 5.0)
        known = sorted(d for d in dur if not np.isnan(d))
        T = known[min(int(len(known) * thr / 100), len(known) - 1)] if known else math.inf
        seen = [i for i in range(n) if last[i] > 0]
        unseen = [i for i in range(n) if last[i] == 0]
        n_explore = min(int(K * eps), len(unseen))
        n_exploit = min(K - n_explore, len(seen))
        n_explore = min(K - n_exploit, len(unseen))
        rng = np.random.default_rng([SEED, rnd, 0x5E1])  # the server's generator of the round
        picks = []
        if n_exploit:
            positive = sorted(util[i] for i in seen if util[i] > 0)
            clip = positive[min(int(len(positive) * 0.9), len(positive) - 1)]
            low = positive[0] * 0.999
            span = max(positive[-1] - low, 1e-4)
            score = {}
            for i in seen:
                s = (min(util[i], clip) - low) / span + math.sqrt(0.1 * math.log(r) / last[i])
                if dur[i] > T:
                    s *= (T / dur[i]) ** 2
                score[i] = abs(s)
            ranked = sorted(seen, key=lambda i: (-score[i], i))
            cut = score[ranked[min(n_exploit, len(ranked) - 1)]] * 0.05
            size = max(sum(score[i] >= cut for i in ranked), min(len(ranked), 10 * n_exploit + 1))
            pool = ranked[:size]
            weight = np.array([score[i] for i in pool])
            picks += list(rng.choice(pool, size=n_exploit, replace=False, p=weight / weight.sum()))
            exploited = set(picks)
        if n_explore:  # equal data sizes: the sample_window x n lowest ids, equally likely
            window = unseen[:min(int(5.0 * n_explore), len(unseen))]
            picks += list(rng.choice(window, size=n_explore, replace=False, p=np.full(len(window), 1 / len(window))))
        picks = sorted(int(i) for i in picks)
        invited.append(picks)
        arrived = [i for i in picks if TASK[i] <= deadline]
        late = [i for i in picks if TASK[i] > deadline]
        for i in arrived:
            util[i], dur[i] = 0.5 * float(((x - u[i]) ** 2).sum()), TASK[i]
        for i in late:  # FedScale's stragglers: the round's mean utility, at least the seconds waited
            util[i] = np.mean([util[j] for j in arrived]) if arrived else util[i]
            dur[i] = np.fmax(dur[i], deadline)
        for i in picks:
            last[i] = r
        fresh = set(picks)
        if arrived:
            x = x + np.mean([LR * (u[i] - x) for i in arrived], axis=0)
    return invited, util, dur, last


def invited_per_round(run_dir: Path) -> list[list[int]]:
    ev = pl.read_parquet(run_dir / "events.parquet").sort("round", "device_id")
    return [g["device_id"].to_list() for _, g in ev.group_by("round", maintain_order=True)]


def selector_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["strategy"]["selector"]


def test_the_first_rounds_invite_whom_the_documented_rule_computes_by_hand(cli_run):
    """12 rounds of 3 of 8 devices: round 0 explores 3 (nobody explored yet), rounds 1-2 explore
    2 and exploit 1, round 3 explores the last unexplored device, then exploitation takes every
    slot; the 30th percentile of the durations heard is T and slower devices are penalised."""
    run_dir = cli_run(oort_config(cli_run.tmp, 12), always(len(SPS)))
    invited, util, dur, last = by_hand(12)
    assert invited_per_round(run_dir) == invited
    seen = [len(set().union(*invited[:r + 1])) for r in range(12)]
    assert seen[:4] == [3, 5, 7, 8]  # the explored set, whatever the draws
    state = selector_state(run_dir)
    np.testing.assert_allclose(state["utility"], util, rtol=1e-5)
    np.testing.assert_array_equal(state["duration"], dur)  # what arrived, from invitation to arrival
    np.testing.assert_array_equal(state["last"], last)


def test_a_device_missing_the_deadline_counts_as_explored_with_the_seconds_waited(cli_run):
    """Deadline 4 s: devices 1, 3, 5, 7 (tasks of 4.75 to 6 s) never arrive; each is explored
    once with duration 4 s (what the server waited) and the round's mean utility."""
    config = oort_config(cli_run.tmp, 8, deadline=4.0)
    run_dir = cli_run(config, always(len(SPS)))
    invited, util, dur, last = by_hand(8, deadline=4.0)
    assert invited_per_round(run_dir) == invited
    state = selector_state(run_dir)
    np.testing.assert_allclose(state["utility"], util, rtol=1e-5)
    np.testing.assert_array_equal(state["duration"], dur)
    assert set(np.flatnonzero(dur == 4.0)) <= {1, 3, 5, 7} and (dur == 4.0).any()


def test_under_ideal_timing_every_duration_is_the_round_and_nobody_is_penalised(cli_run):
    config = quadratic_config(TARGETS, lr=LR, rounds=10, server={"clients_per_round": K, "round_duration": 2.0})
    config["algorithm"]["selection"] = "oort"
    run_dir = cli_run(config, always(len(SPS)))
    state = selector_state(run_dir)
    heard = state["last"] > 0
    assert heard.sum() == len(SPS) and (state["duration"][heard] == 2.0).all()
    assert (rounds(run_dir)["invited"] == K).all()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resumed_run_selects_as_the_whole_run(cli_run, mode):
    """Stopped after 7 rounds (the pacer's window and the explored set mid-way) and resumed to
    14 through the CLI: the same invitations, rounds and model."""
    server = {"deadline": 4.5} if mode == "sync" else {"mode": "async", "concurrency": 3, "buffer": 2,
                                                        "deadline": 4.5}
    config = oort_config(cli_run.tmp, 14, **server)
    config["run"]["eval_every"] = 7
    whole = cli_run(config, always(len(SPS)), name="whole")
    config["run"]["rounds"] = 7
    half = cli_run(config, always(len(SPS)), name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=14", "--quiet"]) == 0
    assert rounds(whole).drop("wall_s").equals(rounds(half).drop("wall_s"))
    assert invited_per_round(whole) == invited_per_round(half)
    assert np.array_equal(final_x(whole), final_x(half))
    for key, value in selector_state(whole).items():
        assert np.array_equal(value, selector_state(half)[key], equal_nan=True), key
