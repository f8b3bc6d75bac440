"""Run directories written by past releases (tests/past_runs/SHA/KIND, made by
tests/past_runs/make.sh) resume with today's fedsim, through the CLI, to the results of a run
made today: a rule added later never refuses what an earlier release wrote itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import torch

from conftest import quadratic_config
from fedsim.cli import main
from fedsim.results.run_format import RUN_FORMAT, upgrade
from fedsim.training.rules import CURRENT as CURRENT_RULES

PAST = Path(__file__).parent / "past_runs"
RELEASES = sorted(d.name for d in PAST.iterdir() if d.is_dir())
# the note a run of format 0 (0a01227 wrote every key, the quadratic task's partition too) prints
PARTITION_NOTE = ("[data] partition = 'iid' dropped, as run format 1 reads format 0 (the quadratic task "
                  "has no partition; earlier releases wrote their default there)")


def copy_of(release: str, tmp_path: Path) -> Path:
    shutil.copytree(PAST / release, tmp_path / release)
    return tmp_path / release


def rounds(run_dir: Path) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "rounds.parquet").drop("wall_s")


def members(run_dir: Path) -> list[Path]:
    return [run_dir] if (run_dir / "manifest.json").exists() else sorted(d for d in run_dir.iterdir() if d.is_dir())


def final_losses(report):
    """Every `final_loss` (a study's: `final_loss_mean`) in a `report --json` answer."""
    if isinstance(report, dict):
        for key, value in report.items():
            if key in ("final_loss", "final_loss_mean") and isinstance(value, float):
                yield value
            else:
                yield from final_losses(value)
    elif isinstance(report, list):
        for item in report:
            yield from final_losses(item)


def fresh(config_toml: Path, tmp_path: Path, rounds_: int) -> Path:
    """The same config run today, from its start, for `rounds_` rounds."""
    assert main(["run", str(config_toml), "--set", f"run.rounds={rounds_}", "--set", f"run.out={tmp_path}",
                 "--set", "run.name=fresh", "--quiet"]) == 0
    return tmp_path / "fresh"


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("kind", ["single", "comparison", "study/lr-0.2"])
def test_a_run_of_a_past_release_resumes_to_the_results_of_a_run_made_today(release, kind, tmp_path, capsys):
    run_dir = copy_of(release, tmp_path) / kind
    before = {m.name: rounds(m) for m in members(run_dir)}
    resume = ["sweep", "--resume", str(run_dir.parent)] if kind.startswith("study") else ["run", "--resume", str(run_dir)]
    assert main([*resume, "--set", "run.rounds=8", "--quiet"]) == 0  # (a study's points by their sweep)
    err = capsys.readouterr().err
    if release == "0a01227":
        assert f"note: {run_dir / 'config.toml'}: {PARTITION_NOTE}" in err.splitlines()
    else:
        assert "note:" not in err
    today = fresh(run_dir / "config.toml", tmp_path / "today", 8)
    for member in members(run_dir):
        manifest = json.loads((member / "manifest.json").read_text())
        assert (manifest["status"], manifest["rounds"], manifest["run_format"]) == ("completed", 8, RUN_FORMAT)
        assert torch.load(member / "checkpoint.pt", weights_only=False)["run_format"] == RUN_FORMAT
        resumed = rounds(member)
        assert resumed["round"].to_list() == list(range(8))
        past = before[member.name]
        assert resumed.head(4).select(past.columns).equals(past)  # what the past release wrote is kept
        added = [c for c in resumed.columns if c not in past.columns]  # columns of later releases:
        assert resumed.head(4).select(added).null_count().sum_horizontal().item() == 4 * len(added)  # null there
        made_today = rounds(today / member.name if member != run_dir else today)
        assert resumed.columns == made_today.columns and resumed.tail(4).equals(made_today.tail(4))
        assert resumed.head(4).select(past.columns).equals(made_today.head(4).select(past.columns))
    assert 'partition = "iid"' not in (run_dir / "config.toml").read_text()  # written back as format 1


@pytest.mark.parametrize("release", RELEASES)
def test_an_async_run_of_a_past_release_refuses_resume_in_one_line(release, tmp_path, capsys):
    """An async run of a release that did not checkpoint its tasks in flight cannot go on as it
    would have: one line, nothing changed (today's async runs resume: tests/test_async.py)."""
    run_dir = copy_of(release, tmp_path) / "async"
    kept = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {run_dir / 'checkpoint.pt'}: cannot resume a run with [server] mode = "
                              "'async' of an earlier release (it did not checkpoint the tasks in flight")
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == kept


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("kind", ["single", "comparison", "study", "async"])
def test_reports_and_plots_read_the_runs_of_a_past_release(release, kind, tmp_path, capsys):
    folder = copy_of(release, tmp_path) / kind
    assert main(["report", str(folder), "--json"]) == 0
    reported = set(final_losses(json.loads(capsys.readouterr().out)))
    recorded = {pl.read_parquet(f)["test_loss"].drop_nulls()[-1] for f in folder.rglob("rounds.parquet")}
    assert reported == recorded and len(recorded) == (1 if kind in ("single", "async") else 2)
    assert main(["plot", str(folder)]) == 0
    drawn = [Path(line) for line in capsys.readouterr().out.split()]
    assert drawn and all(path.suffix == ".png" and path.is_file() for path in drawn)


@pytest.mark.parametrize("release", RELEASES)
def test_a_study_of_a_past_release_resumes_by_its_folder(release, tmp_path, capsys, monkeypatch):
    study = copy_of(release, tmp_path) / "study"
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--resume", str(study), "--set", "run.rounds=8", "--quiet"]) == 0
    for point in ("lr-0.1", "lr-0.2"):
        assert json.loads((study / point / "manifest.json").read_text())["rounds"] == 8


def test_a_new_run_records_its_run_format(cli_run):
    run_dir = cli_run(quadratic_config([[1.0, 0.0], [0.0, 1.0]], rounds=2))
    assert json.loads((run_dir / "manifest.json").read_text())["run_format"] == RUN_FORMAT
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["run_format"] == RUN_FORMAT


def test_the_format_steps_drop_only_what_an_earlier_format_wrote():
    quadratic = {"data": {"dataset": "quadratic", "partition": "iid", "clients": 2}}
    assert upgrade(quadratic, 0, "c.toml") == ({"data": {"dataset": "quadratic", "clients": 2}},
                                               [f"note: c.toml: {PARTITION_NOTE}"])
    assert quadratic["data"]["partition"] == "iid"  # the caller's dict is left alone
    assert upgrade(quadratic, RUN_FORMAT, "c.toml") == (quadratic, [])  # today's rules judge it
    digits = {"data": {"dataset": "digits", "partition": "iid"}}
    assert upgrade(digits, 0, "c.toml") == (digits, [])
    assert upgrade({"data": {"dataset": "quadratic", "partition": ""}}, 0, "c.toml") == (
        {"data": {"dataset": "quadratic"}}, [])  # the default dropped: nothing to note


@pytest.mark.parametrize("release", RELEASES)
def test_a_past_run_whose_config_was_edited_is_still_refused(release, tmp_path, capsys):
    """Reading an older format maps what fedsim wrote; a change of the user's is still one."""
    run_dir = copy_of(release, tmp_path) / "single"
    config = run_dir / "config.toml"
    config.write_text(config.read_text().replace("lr = 0.1\n", "lr = 0.2\n"))
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=8", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"error: {config}: [client] lr = 0.2, but the run started with 0.1; a resumed run keeps its config")


MODULE_RUNS = Path(__file__).parent / "past_module_runs"


def resumes_under_its_own_rules(release: str, rules: int, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """Resume the run that `release` made under training `rules` (its
    3 rounds) to 5 and 6: rounds 4-5 are those the release computed uninterrupted, bit for bit,
    and the run goes on recording its rules. Returns (that run uninterrupted, the same config
    started today)."""
    shutil.copytree(MODULE_RUNS / release, tmp_path / "past")
    monkeypatch.chdir(tmp_path / "past")  # where seqnet.py is
    run_dir, whole = tmp_path / "past" / "module", tmp_path / "past" / "whole"
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=5", "--quiet"]) == 0
    assert rounds(run_dir).equals(rounds(whole))
    a, b = torch.load(run_dir / "model.pt"), torch.load(whole / "model.pt")
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((run_dir / "manifest.json").read_text())["rules"] == rules
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["rules"] == rules
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=6", "--quiet"]) == 0  # and again
    assert json.loads((run_dir / "manifest.json").read_text())["rules"] == rules
    today = fresh(whole / "config.toml", tmp_path / "today", 5)
    assert json.loads((today / "manifest.json").read_text())["rules"] == CURRENT_RULES
    assert rounds(today)["round"].to_list() == rounds(whole)["round"].to_list()
    return whole, today


def test_a_users_sequential_of_a_past_release_resumes_under_its_own_training_rules(tmp_path, monkeypatch):
    """Made under training rules 1 (9cd3e24: torch.func): the same config started today trains
    on fedsim's kernels, with other numbers (float rounding, other dropout draws)."""
    whole, today = resumes_under_its_own_rules("9cd3e24", 1, tmp_path, monkeypatch)
    assert not rounds(today)["train_loss"].equals(rounds(whole)["train_loss"])


def test_a_run_of_training_rules_2_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 2 (c977a51; mlp on digits): a call's devices' parameters lay
    4,810 floats apart (every other one 8 bytes off a 16-byte boundary) and their gradient came
    by reverse mode; today's rules put each on a 64-byte boundary and compute the MLP's gradient
    in closed form, which changes such a run's numbers by float rounding, so the resumed run
    keeps the rules it started with."""
    whole, today = resumes_under_its_own_rules("c977a51", 2, tmp_path, monkeypatch)
    assert not torch.equal(torch.load(today / "model.pt")["fc1.weight"], torch.load(whole / "model.pt")["fc1.weight"])


def test_a_run_of_training_rules_3_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 3 (f999e93; a user's network with GroupNorm, written as a class,
    on the loop trainer): one device's step came from torch.func's grad, which decomposes
    GroupNorm's backward; today's rules differentiate it by autograd, whose numbers differ by
    float rounding, so the resumed run keeps the rules it started with."""
    whole, today = resumes_under_its_own_rules("f999e93", 3, tmp_path, monkeypatch)
    assert not torch.equal(torch.load(today / "model.pt")["conv.weight"], torch.load(whole / "model.pt")["conv.weight"])


def test_a_run_of_training_rules_4_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 4 (0a75614; a user's transformer layer with dropout over 8
    tokens, batched): its attention's softmax ran along the scores' last dimension; today's rules
    take it along the other dimension of the transposed scores on a CPU, whose numbers differ by
    float rounding, so the resumed run keeps the rules it started with."""
    whole, today = resumes_under_its_own_rules("0a75614", 4, tmp_path, monkeypatch)
    assert not torch.equal(torch.load(today / "model.pt")["fc.weight"], torch.load(whole / "model.pt")["fc.weight"])


def test_a_run_of_training_rules_5_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 5 (1c5672e; a user's vision transformer whose patch embedding is
    a convolution, on 16x16 images): `auto` trained it on the loop (convolutions over images of
    16x16 pixels or more); today's rules train it batched (its convolution is 9 % of its
    multiply-adds), whose numbers differ by float rounding, so the resumed run keeps its rules."""
    whole, today = resumes_under_its_own_rules("1c5672e", 5, tmp_path, monkeypatch)

    def path(run_dir: Path) -> str:
        return json.loads((run_dir / "manifest.json").read_text())["trainer"]["path"]

    assert path(whole) == path(tmp_path / "past" / "module") == "loop" and path(today) == "batched"
    assert not torch.equal(torch.load(today / "model.pt")["fc.weight"], torch.load(whole / "model.pt")["fc.weight"])


def test_a_run_of_training_rules_6_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 6 (04db67b; a user's MLP with a GELU and dropout, an
    nn.Sequential): it trained batched through torch.func; today's rules train it on fedsim's
    kernels (a GELU kernel, the gradient in closed form, keyed dropout uniforms), whose numbers
    differ, so the resumed run keeps the rules it started with."""
    whole, today = resumes_under_its_own_rules("04db67b", 6, tmp_path, monkeypatch)

    def code(run_dir: Path) -> str:
        return json.loads((run_dir / "manifest.json").read_text())["trainer"]["code"]

    assert code(whole) == code(tmp_path / "past" / "module") == "torch.func" and code(today) == "fedsim's kernels"
    assert not torch.equal(torch.load(today / "model.pt")["1.weight"], torch.load(whole / "model.pt")["1.weight"])


def test_a_run_of_training_rules_7_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 7 (7294324; a user's MLP with a residual block and ELUs, a class
    through torch.func, on the loop trainer): its steps summed the samples' losses weighted by
    1 / the batch's size and updated `w - lr * grad` in two roundings, by autograd. Rules 8 took
    a plain PyTorch loop's step instead (the next test); from rules 9 the residual block has
    kernels, whose loop step is again autograd's kernels with that loss and update: the same
    config started today trains on them with rules 7's numbers, bit for bit."""
    whole, today = resumes_under_its_own_rules("7294324", 7, tmp_path, monkeypatch)
    assert json.loads((today / "manifest.json").read_text())["trainer"]["code"] == "fedsim's kernels"
    a, b = torch.load(today / "model.pt"), torch.load(whole / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a) and rounds(today).equals(rounds(whole))


def test_a_run_of_training_rules_8_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 8 (cde3baa; the same residual MLP on the loop trainer, through
    torch.func): its steps were a plain PyTorch loop's (the mean loss, torch's SGD update); today
    its residual block has kernels (rules 9), whose step differs by float rounding, so the
    resumed run keeps the rules it started with."""
    whole, today = resumes_under_its_own_rules("cde3baa", 8, tmp_path, monkeypatch)
    assert not torch.equal(torch.load(today / "model.pt")["fc1.weight"], torch.load(whole / "model.pt")["fc1.weight"])


def test_a_run_of_training_rules_9_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 9 (c4bbafa; a user's MLP with BatchNorm as an nn.Sequential,
    batched through torch.func): from rules 10 BatchNorm has kernels, and the same config started
    today trains on them (another batched computation of the statistics: float rounding), so the
    resumed run keeps the rules it started with; its model.pt keeps the module's buffers, the
    step count an integer."""
    whole, today = resumes_under_its_own_rules("c4bbafa", 9, tmp_path, monkeypatch)
    assert json.loads((today / "manifest.json").read_text())["trainer"]["code"] == "fedsim's kernels"
    a, b = torch.load(today / "model.pt"), torch.load(whole / "model.pt")
    assert list(a) == list(b) and a["2.num_batches_tracked"].dtype == torch.int64
    assert torch.equal(a["2.num_batches_tracked"], b["2.num_batches_tracked"])
    assert not torch.equal(a["1.weight"], b["1.weight"])


def test_a_run_of_training_rules_11_resumes_under_them(tmp_path, monkeypatch):
    """Made under training rules 11 (e25266b; a user's transformer layer with dropout, batched,
    one local epoch of minibatches of 8 over devices of 112 or 113 samples): an epoch's last
    minibatch of 1 was padded to 8, and the dropout calls after the first took the padded
    forward's numbers; from rules 12 a device's own samples take the numbers of a forward of
    them alone (as the loop's), so the same config started today has other numbers and the
    resumed run keeps the rules it started with."""
    whole, today = resumes_under_its_own_rules("e25266b", 11, tmp_path, monkeypatch)
    assert json.loads((today / "manifest.json").read_text())["trainer"]["path"] == "batched"
    assert not torch.equal(torch.load(today / "model.pt")["fc.weight"], torch.load(whole / "model.pt")["fc.weight"])


def test_a_run_that_max_time_ended_under_training_rules_10_resumes_under_them(tmp_path):
    """Made under training rules 10 (9ba4dcd; mifa on digits, devices with speeds and links,
    max_time 6 s): the round max_time cut short counted (`close_reason = "max-time"`). Resumed
    today with a later max_time it goes on by its own rules, to the numbers that release's own
    resume gave, bit for bit; the same config started today counts no cut round, and ends at the
    last round that closed by max_time."""
    shutil.copytree(MODULE_RUNS / "9ba4dcd", tmp_path / "past")
    cut, resumed = tmp_path / "past" / "cut", tmp_path / "past" / "resumed"
    assert rounds(cut)["close_reason"][-1] == "max-time"
    assert main(["run", "--resume", str(cut), "--set", "run.max_time=12", "--quiet"]) == 0
    assert rounds(cut).equals(rounds(resumed)) and rounds(cut)["close_reason"][5] == "max-time"
    a, b = torch.load(cut / "model.pt"), torch.load(resumed / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((cut / "manifest.json").read_text())["rules"] == 10
    today = fresh(resumed / "config.toml", tmp_path / "today", 100)
    df = rounds(today)
    assert "max-time" not in df["close_reason"].to_list() and df["t_end"][-1] < 12.0
    assert json.loads((today / "manifest.json").read_text())["sim_time_s"] == df["t_end"][-1]
