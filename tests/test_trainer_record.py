"""What trained a run: the manifest's `trainer` (path, threads, why, calls per path) and the
report's `trainer:` line, for auto, batched and loop, a resumed run and a lockstep study."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fedsim.cli import main  # noqa: E402
from fedsim.config import dump_toml  # noqa: E402

SMALL = {"run": {"rounds": 4, "eval_every": 2, "device": "cpu"},  # threads are a CPU matter
         "data": {"dataset": "digits", "clients": 20},
         "model": {"name": "logreg"},
         "server": {"timing": "ideal", "clients_per_round": 5},
         "client": {"local_steps": 2, "batch_size": 8}}
UNDER = "[run] threads = 'auto': a call of"  # how a small call's one thread is explained


def with_keys(config: dict, **sections) -> dict:
    return {s: {**config.get(s, {}), **sections.get(s, {})} for s in {*config, *sections}}


def trainer_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["trainer"]


def report_text(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["report", *args]) == 0
    return capsys.readouterr().out


def test_auto_records_the_batched_path_and_one_thread_and_the_report_says_so(cli_run, capsys):
    run_dir = cli_run(SMALL)
    t = trainer_of(run_dir)
    assert (t["setting"], t["chosen_by"], t["path"], t["threads"], t["from_round"]) == ("auto", "auto", "batched", 1, 0)
    assert t["why"].startswith("auto: the cohort in one call on the CPU; " + UNDER)
    assert "under the 22.5 M crossover" in t["why"]
    assert t["calls"] == [{"path": "batched", "threads": 1, "calls": 4, "why": t["why"]}]  # one call a round
    text = report_text(capsys, str(run_dir))
    assert t["code"] == "fedsim's kernels"
    assert f"trainer: fedavg: batched on 1 thread with fedsim's kernels, 4 of 4 calls ({t['why']})\n" in text
    (entry,) = json.loads(report_text(capsys, str(run_dir), "--json"))["runs"]
    assert entry["trainer"] == t


def test_auto_takes_the_loop_for_a_built_in_cnn_on_a_cpu(cli_run):
    t = trainer_of(cli_run(with_keys(SMALL, model={"name": "cnn-svhn"}, run={"rounds": 2})))
    assert (t["chosen_by"], t["path"], t["threads"]) == ("auto", "loop", 1)
    assert t["why"].startswith("auto: convolutions on fedsim's kernels on a CPU, where a loop of them is faster "
                               "than one grouped convolution")


def test_auto_takes_the_loop_for_one_device_a_round(cli_run):
    t = trainer_of(cli_run(with_keys(SMALL, server={"clients_per_round": 1})))
    assert t["path"] == "loop" and t["why"].startswith("auto: one device a call, nothing to stack")


def test_a_named_trainer_and_pinned_threads_are_recorded_as_the_configs(cli_run, capsys):
    loop = cli_run(with_keys(SMALL, client={"trainer": "loop"}), name="loop")
    batched = cli_run(with_keys(SMALL, client={"trainer": "batched"}, run={"threads": 2}), name="batched")
    t = trainer_of(loop)
    assert (t["setting"], t["chosen_by"], t["path"], t["threads"]) == ("loop", "config", "loop", 1)
    assert t["why"].startswith("[client] trainer = 'loop'; " + UNDER)
    t = trainer_of(batched)
    assert (t["setting"], t["chosen_by"], t["path"], t["threads"]) == ("batched", "config", "batched", 2)
    assert t["why"] == "[client] trainer = 'batched'; [run] threads = 2"
    text = report_text(capsys, str(loop), str(batched))
    assert "trainer: fedavg (loop): loop on 1 thread with fedsim's kernels, 4 of 4 calls ([client] trainer = 'loop'; " in text
    assert "trainer: fedavg (batched): batched on 2 threads with fedsim's kernels, 4 of 4 calls ([client] trainer = 'batched'; " \
           "[run] threads = 2)" in text


def test_a_resumed_run_records_the_calls_of_its_resumed_part(cli_run, capsys):
    run_dir = cli_run(with_keys(SMALL, run={"rounds": 3}))
    assert trainer_of(run_dir)["calls"][0]["calls"] == 3
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=5", "--quiet"]) == 0
    t = trainer_of(run_dir)
    assert (t["path"], t["threads"], t["from_round"], t["calls"][0]["calls"]) == ("batched", 1, 3, 2)
    assert "batched on 1 thread with fedsim's kernels, 2 of 2 calls since the resume at round 3 (auto: " \
        in report_text(capsys, str(run_dir))


def test_a_lockstep_study_records_its_shared_calls(tmp_path, capsys):
    """The points of a study step together: each records its calls in the shared call."""
    study = with_keys(SMALL, run={"name": "s", "out": str(tmp_path / "runs"), "progress": False, "plots": False})
    study["sweep"] = {"run.seed": [0, 1]}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet"]) == 0
    for seed in (0, 1):
        t = trainer_of(tmp_path / "runs" / "s" / f"seed-{seed}")
        assert (t["path"], t["threads"], t["calls"][0]["calls"]) == ("batched", 1, 4)
        assert "; in one call with 1 other run(s) of the study" in t["why"]
    text = report_text(capsys, str(tmp_path / "runs" / "s"))
    assert f"trainer: 2 of 2 points: batched on 1 thread for most of their calls (seed-0: {t['why']})" in text


def test_the_batched_path_replayed_from_cuda_graphs_is_named_so():
    """A GPU run's graphs (tests/test_cuda_graphs.py runs them): while they are on, the
    manifest's path is `cuda-graphs`; once off (out of memory, a model they cannot capture), `batched`."""
    from types import SimpleNamespace

    import torch

    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import build_task, build_trainer

    task = build_task(DataConfig(dataset="digits", clients=4), ModelConfig(name="logreg"), seed=0,
                      device=torch.device("cpu"))
    trainer = build_trainer(task, ClientConfig(trainer="batched"), seed=0)
    assert trainer.ran_as() == "batched"
    trainer.graphs = SimpleNamespace(off="")
    assert trainer.ran_as() == "cuda-graphs"
    trainer.graphs.off = "out of GPU memory with the graphs' own memory"
    assert trainer.ran_as() == "batched"
