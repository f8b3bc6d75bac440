"""The paper studies (fedsim/scenarios/paper-*.toml): each loads as a study of its paper's
algorithms and settings with its claims, and a tiny version of each runs from its scenario
name through `fedsim sweep` and `fedsim report --claims` to claims.md (the Sent140 one on
generated files in LEAF's layout)."""

from __future__ import annotations

import polars as pl
import pytest

from fedsim.cli import main
from fedsim.config import read_toml, scenario_path
from fedsim.studies.study import load_study

PAPERS = {
    "paper-fedlaavg": ({"algorithm.name": {"fedavg", "fedprox", "fedlaavg", "sequential-sgd"}},
                       ["sweep.run.seed=[0, 1]"]),
    "paper-mifa": ({"algorithm.name": {"fedavg", "fedavg-wait", "mifa", "fedavg-known-p"},
                    "algorithm.warmup": {False, True}, "trace.p_min": {0.5, 0.2, 0.1, 0.05}},
                   ["algorithm.S=5"]),
    "paper-fedawe": ({"algorithm.name": {"fedawe", "mifa", "fedvarp", "fedau", "fedavg", "fedavg-all",
                                         "fedavg-known-p"},
                      "trace.dynamics": {"stationary", "staircase", "sine", "interleaved-sine"}}, []),
    "paper-wangji": ({"algorithm.name": {"amplified", "fedavg", "fedavg-wait"}},
                     ["algorithm.S=10", "warm_start.run.rounds=2"]),
    "baselines-stragglers": ({"algorithm.name": {"mifa", "scaffold", "fedavg", "fedau"},
                              "trace.p_min": {0.5, 0.2, 0.1, 0.05}}, ["sweep.run.seed=[0, 1]"]),
}
TINY = ["run.rounds=4", "run.eval_every=2", "data.dataset=digits", "data.clients=10", "sweep.run.seed=[0]",
        "run.plots=false"]


@pytest.mark.parametrize("name", PAPERS)
def test_each_paper_study_has_its_algorithms_settings_seeds_and_claims(name, capsys):
    study = load_study(name)
    axes, _ = PAPERS[name]
    for axis, values in axes.items():
        assert set(study.axes[axis]) == values, axis
    assert len(study.axes["run.seed"]) >= 3
    assert study.folder.name == name and len(study.claims) >= 3
    assert len(study.claims) == len(read_toml(scenario_path(name))["claims"])
    assert all(p.config.data.dataset == "fashion-mnist" for p in study.points)
    assert main(["scenarios"]) == 0
    listed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(name))
    assert f"study (fedsim sweep {name})" in listed


def test_wang_and_ji_start_every_point_from_a_fedavg_phase_of_its_seed():
    study = load_study("paper-wangji")
    assert [p.name for p in study.warm] == ["warm-start/seed-0", "warm-start/seed-1", "warm-start/seed-2"]
    assert {(p.config.algorithm.name, p.config.client.lr) for p in study.warm} == {("fedavg", 0.1)}
    for point in study.points:
        assert point.config.model.init_from == str(study.folder.absolute() / "warm-start" / f"seed-{point.values['run.seed']}")


@pytest.mark.parametrize("name", PAPERS)
def test_a_tiny_version_runs_from_its_name_to_a_claims_report(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", name, "--quiet", *(f"--set={s}" for s in TINY + PAPERS[name][1])]) == 0
    folder = tmp_path / "runs" / name
    capsys.readouterr()
    assert main(["report", str(folder), "--claims"]) == 0
    out = capsys.readouterr().out
    claims = load_study(name).claims
    for claim in claims:
        assert claim["claim"] in out
    table = [line for line in (folder / "claims.md").read_text().split("\n## ")[0].splitlines()
             if line.startswith("| ") and not line.startswith(("| claim", "| ---"))]
    assert len(table) == len(claims)
    verdicts = [row.rstrip(" |").rsplit("| ", 1)[-1] for row in table]
    assert all(v.startswith(("holds", "does not hold", "inconclusive")) for v in verdicts)
    if not any(s.startswith("sweep.run.seed") for s in PAPERS[name][1]):  # one seed: no CI decides
        assert set(verdicts) == {"inconclusive (needs 2 or more seeds)"}
    assert (folder / "plots" / "claims.png").stat().st_size > 0


def test_fedlaavg_sent140_study_runs_on_leaf_files_one_device_per_user(tmp_path, monkeypatch, capsys):
    from leaf_files import write_leaf

    study = load_study("paper-fedlaavg-sent140")
    assert set(study.axes["algorithm.name"]) == {"fedavg", "fedprox", "fedlaavg"} and len(study.claims) == 3
    config = study.points[0].config
    assert (config.data.dataset, config.model.name, config.trace.source) == ("sent140", "lstm", "sleep-window")
    root = write_leaf(tmp_path / "sent140", "sent140", [[45, 50, 60], [41, 70, 44]], test_size=5)
    monkeypatch.chdir(tmp_path)
    tiny = ["run.rounds=6", "run.eval_every=2", "data.clients=4", "server.clients_per_round=2",
            "sweep.run.seed=[0, 1]", "run.plots=false", f"data.root={root}", "trace.days=1"]
    assert main(["sweep", "paper-fedlaavg-sent140", "--quiet", *(f"--set={s}" for s in tiny)]) == 0
    folder = tmp_path / "runs" / "paper-fedlaavg-sent140"
    devices = pl.read_parquet(next(folder.glob("algorithm-fedlaavg_seed-0*")) / "devices.parquet")
    assert devices["n_samples"].to_list() == [45, 50, 60, 70] and devices["user"].to_list() == ["u0", "u1", "u2", "u4"]
    capsys.readouterr()
    assert main(["report", str(folder), "--claims"]) == 0
    out = capsys.readouterr().out
    assert all(c["claim"] in out for c in study.claims)


def test_a_study_is_not_a_run_and_a_run_has_no_claims(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "paper-mifa"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a study" in err and "fedsim sweep paper-mifa" in err
    assert main(["sweep", "paper-mifa", "--set", "run.seed=4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run.seed is an axis of the sweep" in err and "sweep.run.seed=[...]" in err
    assert main(["report", str(tmp_path), "--claims"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a study folder" in err


def test_the_papers_scale_commands_of_the_docs_load(tmp_path):
    """Every `fedsim sweep` line of docs/reproductions.md's "At the papers' scale" loads as a
    study (its --set lines valid, its claims' values still on the axes)."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "reproductions.md").read_text()
    block = text[text.index("## At the papers' scale"):].replace("\\\n", " ")
    commands = re.findall(r"^fedsim sweep (.*)$", block, re.M)
    assert {shlex.split(c)[0] for c in commands} >= {*PAPERS, "paper-fedlaavg-sent140"}
    for command in commands:
        words = shlex.split(command.split("#")[0])
        sets = [words[k + 1].replace("DIR", str(tmp_path)) for k, w in enumerate(words) if w == "--set"]
        assert load_study(words[0], sets).points, command


def test_the_scenarios_table_keeps_its_column_past_a_long_name(tmp_path, monkeypatch, capsys):
    import fedsim.config

    long = "a-scenario-with-a-name-longer-than-the-usual-twenty"
    (tmp_path / f"{long}.toml").write_text("# Mine.\n[run]\nrounds = 1\n")
    names = [*fedsim.config.scenario_names(), long]
    monkeypatch.setattr(fedsim.config, "scenario_names", lambda: names)
    monkeypatch.setattr(fedsim.config, "scenario_path",
                        lambda name: tmp_path / f"{name}.toml" if name == long else scenario_path(name))
    capsys.readouterr()
    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if not line.startswith(" ")]
    assert [line.split()[0] for line in lines] == names
    columns = {len(line) - len(line[len(name):].lstrip()) for line, name in zip(lines, names)}
    assert columns == {len(long) + 2}
    assert lines[-1] == f"{long}  Mine."

    block = {}
    for line in out.splitlines():
        if not line.startswith(" "):
            block[line.split()[0]] = line[len(long) + 2:]
        else:
            block[list(block)[-1]] += " " + line.strip()
    assert block["quickstart"] == "Digits on 100 devices whose availability depends on their labels (MIFA paper): " \
        "FedAvg vs MIFA."
    assert block["systems-fedbuff"].endswith("each update discounted by its staleness, 1/sqrt(1 + s).")  # not cut
    assert all(len(line) <= 92 for line in out.splitlines())  # (at least 40 columns beside the names)
