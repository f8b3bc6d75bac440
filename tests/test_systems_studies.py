"""The systems studies (fedsim/scenarios/systems-*.toml): wall-clock claims of the systems
papers over fedsim's clock. Each loads with its arms and claims, and a tiny version runs from
its name through `fedsim sweep` and `fedsim report --claims`, its arms differing in time as
the rules say."""

from __future__ import annotations

import math
import re

import polars as pl
import pytest

from fedsim.cli import main
from fedsim.studies.study import load_study

ASYNC = {"server.mode": ["sync", "async"], "algorithm.name": ["fedavg", "fedbuff"]}
STUDIES = {
    "systems-overcommit": {"server.overcommit": [0.0, 0.3], "data.partition": ["iid", "dirichlet"]},
    "systems-flash": {"devices.model": ["constant", "lognormal"]},
    "systems-fedbuff": ASYNC,
    "systems-fedscale-async": ASYNC,
    "systems-oort": {"algorithm.selection": ["uniform", "oort"]},
}
# each study's switch: the arm claimed faster, the other
ARMS = {"systems-overcommit": ("server.overcommit", 0.3, 0.0), "systems-flash": ("devices.model", "constant", "lognormal"),
        "systems-fedbuff": ("server.mode", "async", "sync"), "systems-fedscale-async": ("server.mode", "async", "sync"),
        "systems-oort": ("algorithm.selection", "oort", "uniform")}
COMMON = ["data.dataset=digits", "data.clients=60", "sweep.run.seed=[0, 1]", "run.plots=false"]
TINY = {"systems-overcommit": ["run.rounds=6", "run.eval_every=3"],
        "systems-flash": ["run.rounds=6", "run.eval_every=3", "server.min_selected=6", "server.clients_per_round=8"],
        # time to accuracy: long enough, and a learning rate high enough, for digits to reach the targets
        "systems-fedbuff": ["run.max_time=100", "run.eval_every=1", "client.lr=0.5"],
        "systems-fedscale-async": ["run.max_time=100", "run.eval_every=1", "client.lr=0.5"],
        "systems-oort": ["run.max_time=100", "run.eval_every=1", "client.lr=0.5"]}


@pytest.mark.parametrize("name", STUDIES)
def test_each_systems_study_has_its_arms_seeds_and_claims(name):
    study = load_study(name)
    for axis, values in STUDIES[name].items():
        assert study.axes[axis] == values
    assert study.axes["run.seed"][:3] == [0, 1, 2] and len(study.claims) >= 2
    assert all(p.config.server.timing == "model" and p.config.data.dataset == "fashion-mnist" for p in study.points)


def test_the_flash_study_runs_under_flashs_round_rules():
    server = load_study("systems-flash").points[0].config.server
    assert (server.min_selected, server.deadline_sigma, server.update_frac) == (12, 0.0, 0.8)


def test_the_async_studies_compare_sync_fedavg_with_fedbuff_at_the_same_concurrency():
    for name, (concurrency, buffer, devices) in {"systems-fedbuff": (20, 10, "halfnormal"),
                                                  "systems-fedscale-async": (10, 5, "lognormal")}.items():
        sync, fedbuff = (next(p.config for p in load_study(name).points if p.config.server.mode == mode)
                         for mode in ("sync", "async"))
        assert (sync.server.mode, sync.algorithm.name, fedbuff.server.mode, fedbuff.algorithm.name) == (
            "sync", "fedavg", "async", "fedbuff")
        assert (fedbuff.server.concurrency, fedbuff.server.buffer, fedbuff.devices.model) == (concurrency, buffer, devices)
        invited = sync.server.clients_per_round * (1 + sync.server.overcommit)
        assert math.ceil(invited) == {"systems-fedbuff": 20, "systems-fedscale-async": 7}[name]
        assert sync.run.max_time == fedbuff.run.max_time > 0  # the same simulated time for both arms
        assert next(c for c in load_study(name).claims if c["metric"] == "time_to_acc")["target"] > 0.5


@pytest.mark.parametrize("name", STUDIES)
def test_a_tiny_version_runs_from_its_name_to_a_claims_report(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", name, "--quiet", *(f"--set={s}" for s in COMMON + TINY[name])]) == 0
    folder = tmp_path / "runs" / name
    capsys.readouterr()
    assert main(["report", str(folder), "--claims"]) == 0
    out = capsys.readouterr().out
    for claim in load_study(name).claims:
        assert claim["claim"] in out
    study = pl.read_parquet(folder / "study.parquet")
    arm, fast, slow = ARMS[name]
    mean_round = dict(study.group_by(arm).agg(pl.col("duration").mean()).iter_rows())
    assert mean_round[fast] < mean_round[slow], mean_round
    timed = next(c["claim"] for c in load_study(name).claims if c["metric"] in ("round_s", "sim_time", "time_to_acc"))
    line = next(line for line in out.splitlines() if line.startswith(timed))
    # simulated time, each in the unit its size calls for, and the ratio, with CIs
    assert re.search(r"  [+-][\d.]+(s|min|h) ± [\d.]+(s|min|h) \(x[\d.]+ ± [\d.]+\)  ", line), line


def test_the_documented_cnn_variant_of_fedscale_async_is_a_valid_study():
    """docs/reproductions.md runs `fedsim sweep systems-fedscale-async --set model.name=lenet5`."""
    study = load_study("systems-fedscale-async", ["model.name=lenet5"])
    assert len(study.points) == 16 and {p.config.model.name for p in study.points} == {"lenet5"}


def test_an_oort_key_set_on_the_oort_study_reaches_only_its_oort_points():
    """docs/reproductions.md runs `fedsim sweep systems-oort --set algorithm.oort_round_penalty=0`:
    the uniform points, which do not take the key, run without it."""
    study = load_study("systems-oort", ["algorithm.oort_round_penalty=0"])
    options = {p.config.algorithm.selection: p.config.algorithm.options for p in study.points}
    assert options == {"uniform": {}, "oort": {"oort_round_penalty": 0.0}}
