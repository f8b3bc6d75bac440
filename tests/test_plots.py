"""The plots draw exactly the numbers of the run's tables, and a missing column skips only its plot."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from fedsim.errors import FedsimError
from fedsim.results.plots import build_figures, load_run, plot_dirs, plot_run_dir

# 12 rounds of 2 hours from trace t = 1 h: the run starts at 07:30 (UTC+02:00) and crosses midnight
N = 12
T_START = 3600.0 * (1 + 2 * np.arange(N))
INVITED = np.array([10, 12, 9, 10, 11, 10, 12, 8, 10, 10, 9, 11])
ARRIVED = np.array([6, 8, 5, 7, 9, 4, 10, 5, 6, 7, 6, 8])
DROPPED = np.array([2, 1, 2, 1, 0, 3, 1, 2, 2, 1, 1, 2])
LATE = np.array([1, 2, 1, 0, 1, 2, 0, 0, 1, 1, 1, 0])
SURPLUS = INVITED - ARRIVED - DROPPED - LATE
ACC = {3: 0.4, 7: 0.625, 11: 0.75}  # evaluated rounds (0-based)
LOSS = {3: 1.5, 7: 1.0, 11: 0.5}
ORIGIN = "2024-01-01T06:30:00+02:00"
TZ = [-5.0, -5.0, 0.0, 5.5, 5.5, 5.5]
ARRIVALS = [3, 1, 0, 4, 4, 1]


def write_run(run_dir, *, rounds_drop=(), devices=True, devices_drop=(), manifest=True, acc=True,
              origin=ORIGIN, algorithm="fedavg"):
    """A run directory with every table and manifest entry the plots read, less those dropped."""
    run_dir.mkdir(parents=True)
    frame = pl.DataFrame({
        "round": np.arange(N), "t_start": T_START, "t_end": T_START + 7200.0,
        "online": INVITED + 5, "invited": INVITED, "arrived": ARRIVED, "dropped": DROPPED,
        "late": LATE, "surplus": SURPLUS, "close_reason": ["deadline"] * N,
        "duration": np.full(N, 600.0) + np.arange(N),  # less than t_end - t_start: it is read as is
        "train_loss": np.linspace(2.0, 0.4, N),
        "test_loss": [LOSS.get(r) for r in range(N)],
        "test_acc": [ACC.get(r) if acc else None for r in range(N)],
    }, schema_overrides={"test_acc": pl.Float64})
    frame.drop(rounds_drop).write_parquet(run_dir / "rounds.parquet")
    if devices:
        pl.DataFrame({"device_id": np.arange(6), "invitations": np.array(ARRIVALS) + 1,
                      "arrivals": ARRIVALS, "drops": [1] * 6, "late": [0] * 6,
                      "last_round": [11] * 6, "tz_offset": TZ, "online_fraction": [0.5] * 6},
                     ).drop(devices_drop).write_parquet(run_dir / "devices.parquet")
    if manifest:
        (run_dir / "manifest.json").write_text(json.dumps({
            "algorithm": algorithm, "initial": {"test_loss": 2.5, "test_acc": 0.1 if acc else None,
                                                "t": 3600.0},
            "trace": {"origin": origin}}))
    return run_dir


def figures(tmp_path, title="t", **kwargs):
    return build_figures({"fedavg": load_run(write_run(tmp_path / "run", **kwargs))}, title)


def lines(ax):
    return {line.get_label(): (line.get_xdata(), line.get_ydata()) for line in ax.get_lines()}


def upper_edge(collection):
    """The top of a fill_between polygon, in x order (matplotlib lists it reversed after the base)."""
    vertices = collection.get_paths()[0].vertices
    n = (len(vertices) - 3) // 2
    return vertices[n + 2:2 * n + 2][::-1]


def test_a_run_gets_every_plot(tmp_path):
    run_dir = write_run(tmp_path / "run")
    written = plot_dirs({"fedavg": run_dir}, tmp_path / "plots", title="t")
    assert sorted(p.name for p in written) == sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "accuracy_vs_rounds.png", "accuracy_vs_time.png", "participation_fedavg.png",
        "participation_per_device.png", "round_duration_vs_time_of_day.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size < 120_000


def test_accuracy_is_in_percent_from_the_initial_evaluation_on(tmp_path):
    fig = figures(tmp_path)["accuracy_vs_rounds"]
    acc, loss = fig.axes[:2]
    x, y = lines(acc)["fedavg"]
    # rounds completed; the initial model at 0; each value held until the next round ends (the
    # model changes only then), so the line crosses a target where `fedsim report` says
    assert list(x) == [0, 1, 4, 5, 8, 9, 12]
    assert list(y) == pytest.approx([10.0, 10.0, 40.0, 40.0, 62.5, 62.5, 75.0])
    (line,) = [line for line in acc.get_lines() if line.get_label() == "fedavg"]
    assert line.get_markevery() == [0, 2, 4, 6]  # markers on the evaluations only
    assert acc.get_ylim() == (0, 100) and acc.get_ylabel() == "test accuracy (%)"
    assert list(lines(loss)["fedavg"][1]) == [2.5, 2.5, 1.5, 1.5, 1.0, 1.0, 0.5] and loss.get_yscale() == "log"
    assert loss.get_xlabel() == "rounds completed" and fig.get_suptitle() == "t: test metrics by round"


def test_time_is_in_hours_since_the_start_with_the_clock_on_top(tmp_path):
    fig = figures(tmp_path)["accuracy_vs_time"]
    acc = fig.axes[0]
    x, y = lines(acc)["fedavg"]
    assert list(x) == [0, 2, 8, 10, 16, 18, 24]  # the initial model's 10 % holds until round 1 ends (2 h)
    assert list(y) == pytest.approx([10.0, 10.0, 40.0, 40.0, 62.5, 62.5, 75.0])
    assert fig.axes[1].get_xlabel() == "simulated time since the start (h)"
    (clock,) = acc.child_axes
    assert clock.get_xlabel() == "clock time (UTC+02:00)"
    fig.draw_without_rendering()
    low, high = clock.get_xlim()
    labels = {t.label1.get_text(): t.get_loc() for t in clock.xaxis.get_major_ticks()
              if low <= t.get_loc() <= high}
    # trace t = 0 is Monday 06:30 and the run starts at t = 1 h: 07:30 is x = 0; a tick every 6 h
    assert list(labels) == ["Mon 12:00", "Mon 18:00", "Tue 00:00", "Tue 06:00"]
    for label, hours in (("Mon 12:00", 4.5), ("Tue 00:00", 16.5), ("Tue 06:00", 22.5)):
        assert clock.transData.transform((labels[label], 0))[0] == pytest.approx(
            acc.transData.transform((hours, 0))[0])


@pytest.mark.parametrize("span_h, unit, shown", [
    (0.205 / 3600, "s", ["0", "0.04", "0.08", "0.12", "0.16", "0.2"]),  # a run of a fifth of a second
    (57 / 3600, "s", ["0", "10", "20", "30", "40", "50"]),  # a short run's 57 s, not 0.016 h
    (1.5, "min", ["0", "15", "30", "45", "60", "75", "90"]),
    (24.0, "h", ["0", "3", "6", "9", "12", "15", "18", "21", "24"]),
])
def test_simulated_time_is_labelled_in_the_unit_its_span_calls_for(span_h, unit, shown):
    import matplotlib.pyplot as plt

    from fedsim.results.plots import _time_axis

    fig, ax = plt.subplots()
    ax.plot([0, span_h], [0, 1])
    ax.set_xlim(0, span_h)
    _time_axis(ax)
    fig.draw_without_rendering()
    assert ax.get_xlabel() == f"simulated time since the start ({unit})"
    labels = [t.label1.get_text() for t in ax.xaxis.get_major_ticks() if 0 <= t.get_loc() <= span_h * (1 + 1e-9)]
    assert labels == shown
    plt.close(fig)


def test_round_durations_are_placed_at_the_clock_time_of_day(tmp_path):
    ax = figures(tmp_path)["round_duration_vs_time_of_day"].axes[0]
    x, y = lines(ax)["fedavg"]
    assert list(x) == pytest.approx([7.5, 9.5, 11.5, 13.5, 15.5, 17.5, 19.5, 21.5, 23.5, 1.5, 3.5, 5.5])
    assert list(y) == list(600.0 + np.arange(N))
    assert ax.get_xlim() == (0, 24) and ax.get_xlabel() == "time of day at the round's start (h, UTC+02:00)"
    assert ax.get_ylabel() == "round duration (s)"


def test_runs_of_different_clock_origins_get_no_shared_clock(tmp_path):
    """`fedsim plot runs` over runs whose traces start at other times of day: no clock on top
    of their common axis (it was the first run's, wrong for the others)."""
    runs = {"a": load_run(write_run(tmp_path / "a")),
            "b": load_run(write_run(tmp_path / "b", origin="2024-03-04T13:53:20+00:00", algorithm="mifa"))}
    figs = build_figures(runs, "t")
    assert not figs["accuracy_vs_time"].axes[0].child_axes
    assert figs["round_duration_vs_time_of_day"].axes[0].get_xlabel() == (
        "hours since the start, modulo 24 (the runs' clock origins differ)")
    same = {"a": runs["a"], "c": load_run(write_run(tmp_path / "c", algorithm="mifa"))}
    assert len(build_figures(same, "t")["accuracy_vs_time"].axes[0].child_axes) == 1


def test_without_an_origin_durations_go_by_hours_since_the_start_and_without_duration_by_the_span(tmp_path):
    ax = figures(tmp_path, origin=None, rounds_drop=["duration"])["round_duration_vs_time_of_day"].axes[0]
    x, y = lines(ax)["fedavg"]
    assert list(x) == list(2.0 * np.arange(N) % 24) and list(y) == [7200.0] * N
    assert ax.get_xlabel() == "hours since the start, modulo 24 (the trace has no clock origin)"


def test_the_stack_of_outcomes_adds_up_to_the_invitations_of_each_round(tmp_path):
    ax = figures(tmp_path)["participation_fedavg"].axes[0]
    layers = {c.get_label(): upper_edge(c) for c in ax.collections}
    assert list(layers) == ["arrived", "dropped", "late", "surplus"]
    hours = np.column_stack([2.0 * np.arange(N), 2.0 * np.arange(N) + 2]).ravel()
    for name, expected in (("arrived", ARRIVED), ("dropped", ARRIVED + DROPPED),
                           ("late", ARRIVED + DROPPED + LATE), ("surplus", INVITED)):
        assert list(layers[name][:, 0]) == list(hours)
        assert list(layers[name][:, 1]) == list(np.repeat(expected, 2)), name
    drawn = lines(ax)
    assert list(drawn["invited"][1]) == list(np.repeat(INVITED, 2))
    assert list(drawn["online"][1]) == list(np.repeat(INVITED + 5, 2))
    assert list(drawn["online"][0]) == list(hours)


def test_without_surplus_the_stack_is_the_other_three(tmp_path):
    ax = figures(tmp_path, rounds_drop=["surplus"])["participation_fedavg"].axes[0]
    top = upper_edge(ax.collections[-1])
    assert list(top[:, 1]) == list(np.repeat(ARRIVED + DROPPED + LATE, 2))


def test_devices_by_arrivals_and_mean_arrivals_by_time_zone(tmp_path):
    hist, zones = figures(tmp_path)["participation_per_device"].axes
    (stairs,) = hist.patches
    counts, edges, _ = stairs.get_data()
    assert list(counts) == [1, 2, 0, 1, 2] and list(edges) == [-0.5, 0.5, 1.5, 2.5, 3.5, 4.5]
    assert [b.get_height() for b in zones.patches] == pytest.approx([2.0, 0.0, 3.0])
    assert [t.get_text() for t in zones.get_xticklabels()] == ["-5", "+0", "+5.5"]
    assert zones.get_xlabel() == "time zone (UTC offset, h)"


def test_groups_replace_time_zones_and_neither_leaves_the_histogram_alone(tmp_path):
    run_dir = write_run(tmp_path / "run")
    devices = pl.read_parquet(run_dir / "devices.parquet")
    devices.drop("tz_offset").with_columns(group=pl.Series([0, 1, 1, 0, 1, 0])).write_parquet(
        run_dir / "devices.parquet")
    _, groups = build_figures({"a": load_run(run_dir)})["participation_per_device"].axes
    assert [b.get_height() for b in groups.patches] == pytest.approx([8 / 3, 5 / 3])
    assert [t.get_text() for t in groups.get_xticklabels()] == ["0", "1"]
    devices.drop("tz_offset").write_parquet(run_dir / "devices.parquet")
    assert len(build_figures({"a": load_run(run_dir)})["participation_per_device"].axes) == 1


def test_a_missing_column_or_file_skips_only_its_plot(tmp_path):
    assert set(figures(tmp_path / "1", devices=False)) == {
        "accuracy_vs_rounds", "accuracy_vs_time", "round_duration_vs_time_of_day", "participation_fedavg"}
    assert set(figures(tmp_path / "2", rounds_drop=["online"])) == {
        "accuracy_vs_rounds", "accuracy_vs_time", "round_duration_vs_time_of_day",
        "participation_per_device"}
    old = figures(tmp_path / "3", rounds_drop=["t_start", "duration"], devices=False, manifest=False)
    assert set(old) == {"accuracy_vs_rounds", "accuracy_vs_time"}
    x, y = lines(old["accuracy_vs_rounds"].axes[0])["fedavg"]
    assert list(x) == [4, 5, 8, 9, 12] and not old["accuracy_vs_time"].axes[0].child_axes  # no initial, no clock
    assert list(lines(old["accuracy_vs_time"].axes[0])["fedavg"][0]) == [9, 11, 17, 19, 25]  # start: t = 0


def test_a_task_without_accuracy_plots_the_loss_alone(tmp_path):
    fig = figures(tmp_path, acc=False)["accuracy_vs_rounds"]
    (ax,) = fig.axes
    assert ax.get_yscale() == "log" and list(lines(ax)["fedavg"][1]) == [2.5, 2.5, 1.5, 1.5, 1.0, 1.0, 0.5]


def test_a_comparison_draws_one_participation_plot_per_algorithm(tmp_path):
    runs = {name: write_run(tmp_path / name, algorithm=name) for name in ("fedavg", "mifa")}
    plot_dirs(runs, tmp_path / "plots", title="both")
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "accuracy_vs_rounds.png", "accuracy_vs_time.png", "participation_fedavg.png",
        "participation_mifa.png", "participation_per_device.png", "round_duration_vs_time_of_day.png"]
    figures = build_figures({name: load_run(path) for name, path in runs.items()})
    fig = figures["participation_per_device"]
    # the two runs' arrivals are the same: one series named by both, not one hidden under the other
    assert [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes] == [
        ["fedavg = mifa"], ["fedavg = mifa"]]
    assert len(fig.axes[1].patches) == 3  # a bar per time zone, for both
    durations = figures["round_duration_vs_time_of_day"].axes[0]
    assert [t.get_text() for t in durations.get_legend().get_texts()] == ["fedavg = mifa"]


def test_different_series_keep_their_own_line_style_and_marker(tmp_path):
    runs = {"fedavg": load_run(write_run(tmp_path / "a")), "mifa": load_run(write_run(tmp_path / "b"))}
    runs["mifa"].devices = runs["mifa"].devices.with_columns(pl.col("arrivals") + 1)
    runs["mifa"].rounds = runs["mifa"].rounds.with_columns(pl.col("duration") * 2)
    figures = build_figures(runs)
    stairs = [p for p in figures["participation_per_device"].axes[0].patches]
    assert [s.get_label() for s in stairs] == ["fedavg", "mifa"] and stairs[0].get_linestyle() != stairs[1].get_linestyle()
    points = figures["round_duration_vs_time_of_day"].axes[0].get_lines()
    assert [line.get_label() for line in points] == ["fedavg", "mifa"]
    assert points[0].get_marker() != points[1].get_marker()
    for name in ("accuracy_vs_rounds", "accuracy_vs_time"):  # equal curves (the same accuracy) stay apart
        lines = [line for line in figures[name].axes[0].get_lines() if line.get_label() in runs]
        assert [line.get_label() for line in lines] == ["fedavg", "mifa"], name
        assert lines[0].get_linestyle() != lines[1].get_linestyle() and lines[0].get_marker() != lines[1].get_marker()


def test_fedsim_plot_redraws_under_the_names_the_run_used(tmp_path):
    run_dir = write_run(tmp_path / "my-run", algorithm="mifa")
    assert "participation_mifa.png" in {p.name for p in plot_run_dir(run_dir)[0]}
    both = tmp_path / "cmp"
    for name in ("fedavg", "mifa"):
        write_run(both / name, algorithm=name)
    assert {"participation_fedavg.png", "participation_mifa.png"} <= {p.name for p in plot_run_dir(both)[0]}
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedsimError) as err:
        plot_run_dir(tmp_path / "empty")
    assert str(err.value) == (f"{tmp_path / 'empty'}: not a run directory (no rounds.parquet and devices.parquet "
                              "here or in its sub-folders); pass the folder that `fedsim run` printed after 'results:'")


def test_an_origin_that_is_no_date_time_is_one_error_line(tmp_path):
    run_dir = write_run(tmp_path / "run", origin="monday")
    with pytest.raises(FedsimError) as err:
        load_run(run_dir)
    assert str(err.value) == (f"{run_dir / 'manifest.json'}: trace.origin = 'monday' is not an ISO 8601 "
                              f"date-time; write one such as '2024-01-01T00:00:00+00:00', or null")


def test_a_real_comparison_run_writes_every_plot_from_its_tables(cli_run):
    run_dir = cli_run({"run": {"rounds": 4, "eval_every": 2, "algorithms": ["fedavg", "mifa"],
                               "plots": True},
                       "data": {"dataset": "digits", "clients": 10},
                       "client": {"local_steps": 1, "batch_size": 8},
                       "trace": {"source": "bernoulli", "p": 0.7}})
    common = {"accuracy_vs_rounds.png", "accuracy_vs_time.png", "round_duration_vs_time_of_day.png",
              "participation_per_device.png", "arrival_rate_vs_speed.png"}
    for name in ("fedavg", "mifa"):  # the comparison's plots show each member's; fedsim plot draws one's own
        assert not (run_dir / name / "plots").exists()
    assert {p.name for p in (run_dir / "plots").iterdir()} == common | {
        "participation_fedavg.png", "participation_mifa.png", "latency_fedavg.png", "latency_mifa.png"}
    run = load_run(run_dir / "fedavg")
    fig = build_figures({"fedavg": run})["participation_fedavg"]
    top = upper_edge(fig.axes[0].collections[-1])
    assert list(top[:, 1]) == list(np.repeat(run.rounds["invited"].to_numpy(), 2))
    assert fig.get_suptitle() == "devices per round (fedavg)"


def test_plots_false_draws_none_and_fedsim_plot_draws_them_later(cli_run, capsys):
    from fedsim.cli import main

    run_dir = cli_run({"run": {"rounds": 2, "plots": False}, "data": {"dataset": "digits", "clients": 10},
                       "client": {"local_steps": 1, "batch_size": 8}})
    assert not (run_dir / "plots").exists()
    assert main(["plot", str(run_dir)]) == 0
    assert "accuracy_vs_rounds.png" in {p.name for p in (run_dir / "plots").iterdir()}


def shown_labels(fig, axis):
    """The non-empty tick labels of `axis` within its limits, with their extents on the drawn figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    low, high = sorted(axis.get_view_interval())
    shown = [t.label1 if t.label1.get_visible() else t.label2 for t in axis.get_major_ticks()
             if low <= t.get_loc() <= high]  # label2: a clock axis on top
    return [(label.get_text(), label.get_window_extent(renderer)) for label in shown if label.get_text()]


def assert_apart(labels):
    boxes = sorted((box for _, box in labels), key=lambda b: b.x0)
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), [text for text, _ in labels]


@pytest.mark.parametrize("speed, column, expected", [
    (1.0 / np.geomspace(2.6, 90.0, 40), "seconds_per_sample", ["5", "10", "20", "50", "100"]),  # the trial's axis
    (np.geomspace(1e9, 3e12, 40), "flops", ["1G", "10G", "100G", "1T"]),
    (1.0 / np.linspace(5.0, 9.0, 40), "seconds_per_sample", ["5", "6", "7", "8", "9"]),
])
def test_speed_ticks_are_plain_numbers_that_do_not_overlap(tmp_path, speed, column, expected):
    run = load_run(write_run(tmp_path / "run"))
    n = len(speed)
    run.devices = pl.DataFrame({"device_id": np.arange(n), "invitations": [10] * n,
                                "arrivals": np.arange(n) % 11, column: speed})
    fig = build_figures({"fedavg": run, "mifa": run})["arrival_rate_vs_speed"]
    for ax in fig.axes:
        labels = shown_labels(fig, ax.xaxis)
        assert [text for text, _ in labels] == expected
        assert_apart(labels)


@pytest.mark.parametrize("rounds, seconds", [(3, 60.0), (5, 2.0), (12, 7200.0), (40, 7200.0)])
def test_the_clock_axis_has_ticks_on_a_short_run_and_a_long_one(tmp_path, rounds, seconds):
    run = load_run(write_run(tmp_path / "run"))
    t = 3600.0 + seconds * np.arange(rounds)
    run.rounds = pl.DataFrame({"round": np.arange(rounds), "t_start": t, "t_end": t + seconds,
                               "test_loss": np.linspace(2.0, 1.0, rounds), "test_acc": np.linspace(0.1, 0.5, rounds)})
    fig = build_figures({"fedavg": run})["accuracy_vs_time"]
    (clock,) = fig.axes[0].child_axes
    labels = shown_labels(fig, clock.xaxis)
    assert 2 <= len(labels) <= 8, [text for text, _ in labels]
    assert_apart(labels)
    texts = [text for text, _ in labels]
    if rounds * seconds < 60:  # ticks seconds apart read in seconds
        assert all(len(text) == 8 for text in texts)
    assert len(set(texts)) == len(texts)


def test_ideal_timing_draws_only_the_plots_it_gives_meaning_to(cli_run):
    from fedsim.cli import main

    config = {"run": {"rounds": 4, "eval_every": 2, "algorithms": ["fedavg", "mifa"], "plots": True},
              "data": {"dataset": "digits", "clients": 10}, "client": {"local_steps": 1, "batch_size": 8},
              "trace": {"source": "bernoulli", "p": 0.7}}
    ideal = cli_run({**config, "server": {"timing": "ideal", "round_duration": 60.0}}, name="ideal")
    # no latency, rounds of one length: nothing to draw by time or speed
    assert sorted(p.name for p in (ideal / "plots").iterdir()) == [
        "accuracy_vs_rounds.png", "participation_fedavg.png", "participation_mifa.png",
        "participation_per_device.png"]
    assert main(["plot", str(ideal / "fedavg")]) == 0  # a member's own, on demand
    assert sorted(p.name for p in (ideal / "fedavg" / "plots").iterdir()) == [
        "accuracy_vs_rounds.png", "participation_fedavg.png", "participation_per_device.png"]
    model = cli_run({**config, "server": {"timing": "model", "deadline": 60.0}}, name="model")
    assert {"accuracy_vs_time.png", "round_duration_vs_time_of_day.png", "latency_fedavg.png",
            "arrival_rate_vs_speed.png"} <= {p.name for p in (model / "plots").iterdir()}


def test_a_study_groups_band_ends_where_its_first_seed_ended():
    """Seeds that max_time stopped after different rounds (3 and 5): the mean is over both seeds
    up to round 3 only, never over the one still running (its time would step back)."""
    from fedsim.results.plots import study_bands

    rows = [{"point": p, "algorithm.name": "fedavg", "round": r, "t_end": 10.0 * (r + 1) * (1 + k),
             "test_acc": 0.1 * r} for k, (p, last) in enumerate((("seed-0", 3), ("seed-1", 5))) for r in range(last)]
    bands = study_bands(pl.DataFrame(rows), ["algorithm.name"], "t_end")
    assert bands["round"].max() == 2 and (bands["n"] == 2).all()


def test_a_cohort_small_beside_its_population_gets_the_online_line_on_an_axis_of_its_own(tmp_path):
    """4,000 devices online, 120 invited: the online line on the right axis, the stacked fates
    of the invitations readable on the left; a cohort near its population keeps one axis."""
    run = load_run(write_run(tmp_path / "run"))
    near = build_figures({"fedavg": run})["participation_fedavg"]
    assert len(near.axes) == 1 and near.axes[0].get_ylabel() == "devices per round"
    run.rounds = run.rounds.with_columns(online=pl.lit(4000))
    fig = build_figures({"fedavg": run})["participation_fedavg"]
    left, right = fig.axes
    assert left.get_ylabel() == "devices per round (invited)" and right.get_ylabel() == "devices online"
    assert left.get_ylim()[1] < 100 and right.get_ylim()[1] >= 4000
    assert [t.get_text() for t in left.get_legend().get_texts()][-2:] == ["invited", "online (right axis)"]
