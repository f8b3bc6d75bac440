"""The plot worker draws exactly what the run would draw itself, and a dead one costs no plot."""

from __future__ import annotations

import polars as pl

from fedsim.results.plot_worker import PlotWorker
from fedsim.results.plots import draw_plots, plot_dirs


def rounds_file(tmp_path):
    """A run directory with a rounds.parquet."""
    frame = pl.DataFrame({"round": [0, 1, 2], "t_end": [60.0, 120.0, 180.0],
                          "test_acc": [0.5, None, 0.75], "test_loss": [1.0, None, 0.5]})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    frame.write_parquet(run_dir / "rounds.parquet")
    return frame, run_dir


def test_the_worker_draws_the_same_pngs_as_the_run(tmp_path):
    frame, path = rounds_file(tmp_path)
    worker = PlotWorker()
    try:
        assert worker.plot({"fedavg": path}, tmp_path / "by_worker", "t")
    finally:
        worker.close()
    plot_dirs({"fedavg": path}, tmp_path / "here", title="t")
    for name in ("accuracy_vs_rounds.png", "accuracy_vs_time.png"):
        assert (tmp_path / "by_worker" / name).read_bytes() == (tmp_path / "here" / name).read_bytes()


def test_a_dead_worker_leaves_the_plots_to_the_run(tmp_path):
    frame, path = rounds_file(tmp_path)
    worker = PlotWorker()
    worker.proc.kill()
    worker.proc.wait()
    assert not worker.plot({"fedavg": path}, tmp_path / "plots", "t")
    draw_plots(worker, {"fedavg": path}, tmp_path / "plots", "t")
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["accuracy_vs_rounds.png",
                                                                      "accuracy_vs_time.png"]


def test_a_request_the_worker_cannot_draw_is_drawn_by_the_run(tmp_path):
    frame, path = rounds_file(tmp_path)
    worker = PlotWorker()
    try:
        assert not worker.plot({"fedavg": tmp_path / "missing"}, tmp_path / "plots", "t")
        assert worker.plot({"fedavg": path}, tmp_path / "plots", "t")  # and it serves on
    finally:
        worker.close()
