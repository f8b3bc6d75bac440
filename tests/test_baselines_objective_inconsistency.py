"""The study `baselines-objective-inconsistency` (fedsim/scenarios): FedAvg against FedNova
with the local work that fits the deadline on lognormal device speeds. It loads with its arms
and claims, and a tiny version runs from its name through `fedsim sweep` and `fedsim report
--claims`, FedNova ending nearer the optimum in every seed, and equal to FedAvg under full work."""

from __future__ import annotations

import polars as pl

from fedsim.cli import main
from fedsim.studies.study import load_study

NAME = "baselines-objective-inconsistency"
TINY = ["run.rounds=100", "run.eval_every=50", "sweep.run.seed=[0, 1]", "run.plots=false"]


def test_the_study_compares_fedavg_and_fednova_under_both_kinds_of_work():
    study = load_study(NAME)
    assert study.axes["algorithm.name"] == ["fedavg", "fednova"]
    assert study.axes["client.work"] == ["fit-deadline", "full"] and study.axes["run.seed"] == [0, 1, 2]
    config = study.points[0].config
    assert (config.data.dataset, config.server.timing, config.devices.model) == ("quadratic", "model", "lognormal")
    assert [c["metric"] for c in study.claims] == ["final_loss", "final_loss"]


def test_a_tiny_version_runs_from_its_name_to_a_claims_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", NAME, "--quiet", *(f"--set={s}" for s in TINY)]) == 0
    folder = tmp_path / "runs" / NAME
    capsys.readouterr()
    assert main(["report", str(folder), "--claims"]) == 0
    out = capsys.readouterr().out
    claims = [c["claim"] for c in load_study(NAME).claims]
    assert all(claim in out for claim in claims)
    assert "holds" in next(line for line in out.splitlines() if line.startswith(claims[1]))
    final = (pl.read_parquet(folder / "study.parquet").drop_nulls("test_loss")
             .group_by("algorithm.name", "client.work", "run.seed").agg(pl.col("test_loss").last()))
    loss = {(a, w, s): v for a, w, s, v in final.iter_rows()}
    for seed in (0, 1):
        assert loss["fednova", "fit-deadline", seed] < loss["fedavg", "fit-deadline", seed]
        assert loss["fednova", "full", seed] == loss["fedavg", "full", seed]
    for work, point in (("fit-deadline", "algorithm-fednova_work-fit-deadline_seed-0"),
                        ("full", "algorithm-fednova_work-full_seed-0")):
        steps = pl.read_parquet(folder / point / "events.parquet")["steps"]
        if work == "full":
            assert set(steps) == {20}
        else:  # from one step (the slowest devices) to the full 20 (the fastest)
            assert steps.min() == 1 and steps.max() == 20 and steps.n_unique() > 10
