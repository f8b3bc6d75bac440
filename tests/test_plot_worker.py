"""The plot worker draws exactly what the run would draw itself, and a dead one costs no plot."""

from __future__ import annotations

from test_plots import write_run

from fedsim.results.plot_worker import PlotWorker
from fedsim.results.plots import draw_plots, plot_dirs

PNGS = ["accuracy_vs_rounds.png", "accuracy_vs_time.png", "participation_fedavg.png",
        "participation_mifa.png", "participation_per_device.png", "round_duration_vs_time_of_day.png"]


def comparison(tmp_path):
    """Two run directories with every table and manifest entry the plots read."""
    return {name: write_run(tmp_path / name, algorithm=name) for name in ("fedavg", "mifa")}


def test_the_worker_draws_the_same_pngs_as_the_run(tmp_path):
    runs = comparison(tmp_path)
    worker = PlotWorker()
    try:
        assert worker.plot(runs, tmp_path / "by_worker", "t")  # queued
        assert worker.pending
    finally:
        worker.close()  # waits for it
    plot_dirs(runs, tmp_path / "here", title="t")
    assert sorted(p.name for p in (tmp_path / "by_worker").iterdir()) == PNGS
    for name in PNGS:
        assert (tmp_path / "by_worker" / name).read_bytes() == (tmp_path / "here" / name).read_bytes()


def test_a_dead_worker_leaves_the_plots_to_the_run(tmp_path):
    runs = comparison(tmp_path)
    worker = PlotWorker()
    worker.proc.kill()
    worker.proc.wait()
    assert not worker.plot(runs, tmp_path / "plots", "t")
    draw_plots(worker, runs, tmp_path / "plots", "t")
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == PNGS


def test_a_request_the_worker_could_not_draw_is_drawn_by_the_run(tmp_path):
    """A worker that fails on one request serves the next; one that dies with requests queued
    leaves them to `finish`, which draws them here."""
    import pytest


    path = write_run(tmp_path / "run")
    worker = PlotWorker()
    try:
        assert worker.plot({"fedavg": tmp_path / "missing"}, tmp_path / "nowhere", "t")
        assert worker.plot({"fedavg": path}, tmp_path / "plots", "t")
        with pytest.raises(FileNotFoundError):  # drawn here, where it fails as well
            worker.finish()
        assert not worker.pending
        assert worker.plot({"fedavg": path}, tmp_path / "later", "t")
        worker.proc.kill()
        worker.proc.wait()
        worker.finish()
        assert sorted(p.name for p in (tmp_path / "later").iterdir())  # drawn by the run
    finally:
        worker.close()


def test_a_run_without_plots_starts_no_worker_and_one_with_plots_does(tmp_path, monkeypatch):
    import fedsim.results.plot_worker as plot_worker
    from fedsim.cli import main

    started = []
    monkeypatch.setattr(plot_worker, "shared_worker", lambda: started.append(1))  # None: drawn in-process
    config = tmp_path / "c.toml"
    config.write_text('[run]\nname = "r"\nrounds = 2\nplots = false\n[data]\ndataset = "digits"\nclients = 10\n'
                      '[client]\nlocal_steps = 1\nbatch_size = 8\n')
    out = f"run.out={tmp_path / 'runs'}"
    assert main(["run", str(config), "--quiet", "--set", out]) == 0 and started == []
    assert main(["run", "--resume", str(tmp_path / "runs" / "r"), "--quiet", "--set", "run.rounds=3"]) == 0
    assert started == [] and not (tmp_path / "runs" / "r" / "plots").exists()
    assert main(["run", "--resume", str(tmp_path / "runs" / "r"), "--quiet", "--set", "run.rounds=4",
                 "--set", "run.plots=true"]) == 0
    assert started == [1] and (tmp_path / "runs" / "r" / "plots" / "accuracy_vs_rounds.png").exists()
