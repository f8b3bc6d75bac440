"""The systems studies (fedsim/scenarios/systems-*.toml): wall-clock claims of the systems
papers over fedsim's clock. Each loads with its arms and claims, and a tiny version runs from
its name through `fedsim sweep` and `fedsim report --claims`, its arms differing in time as
the rules say."""

from __future__ import annotations

import re

import polars as pl
import pytest

from fedsim.cli import main
from fedsim.studies.study import load_study

STUDIES = {
    "systems-overcommit": {"server.overcommit": [0.0, 0.3], "data.partition": ["iid", "dirichlet"]},
    "systems-flash": {"devices.model": ["constant", "lognormal"]},
}
TINY = ["run.rounds=6", "run.eval_every=3", "data.dataset=digits", "data.clients=60", "sweep.run.seed=[0, 1]",
        "run.plots=false"]


@pytest.mark.parametrize("name", STUDIES)
def test_each_systems_study_has_its_arms_seeds_and_claims(name):
    study = load_study(name)
    for axis, values in STUDIES[name].items():
        assert study.axes[axis] == values
    assert study.axes["run.seed"] == [0, 1, 2] and len(study.claims) >= 2
    assert all(p.config.server.timing == "model" and p.config.data.dataset == "fashion-mnist" for p in study.points)


def test_the_flash_study_runs_under_flashs_round_rules():
    server = load_study("systems-flash").points[0].config.server
    assert (server.min_selected, server.deadline_sigma, server.update_frac) == (12, 0.0, 0.8)


@pytest.mark.parametrize("name", STUDIES)
def test_a_tiny_version_runs_from_its_name_to_a_claims_report(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    tiny = TINY + (["server.min_selected=6", "server.clients_per_round=8"] if name == "systems-flash" else [])
    assert main(["sweep", name, "--quiet", *(f"--set={s}" for s in tiny)]) == 0
    folder = tmp_path / "runs" / name
    capsys.readouterr()
    assert main(["report", str(folder), "--claims"]) == 0
    out = capsys.readouterr().out
    for claim in load_study(name).claims:
        assert claim["claim"] in out
    study = pl.read_parquet(folder / "study.parquet")
    arm, fast, slow = (("server.overcommit", 0.3, 0.0) if name == "systems-overcommit"
                       else ("devices.model", "constant", "lognormal"))
    mean_round = dict(study.group_by(arm).agg(pl.col("duration").mean()).iter_rows())
    assert mean_round[fast] < mean_round[slow], mean_round
    timed = next(c["claim"] for c in load_study(name).claims if c["metric"] in ("round_s", "sim_time"))
    line = next(line for line in out.splitlines() if line.startswith(timed))
    # simulated seconds and the ratio, with CIs
    assert re.search(r"  [+-][\d.]+(e[+-]\d+)? ± [\d.e+-]+ s \(x[\d.]+ ± [\d.]+\)  ", line), line
