"""Each generator's defining property, checked on the trace it writes."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from fedsim.errors import FedsimError
from fedsim.traces import GENERATORS, AvailabilityIndex, generate, known_probability
from fedsim.traces.generators import check_options


def round_matrix(trace, rounds: int, duration: float = 1.0) -> np.ndarray:
    """online[r, i] read back from the trace at each round start, as the ideal timing does."""
    index = AvailabilityIndex(trace)
    return np.stack([index.online(r * duration) for r in range(rounds)])


def one_hot(labels, classes=10) -> np.ndarray:
    return np.eye(classes)[np.asarray(labels)]


def assert_bernoulli(online: np.ndarray, p: np.ndarray) -> None:
    """online ~ Bernoulli(p) elementwise: per-device and per-round z-scores stay small."""
    var = p * (1 - p)
    for axis in (0, 1):
        z = (online - p).sum(axis) / np.sqrt(np.maximum(var.sum(axis), 1e-12))
        assert np.all(np.abs(z) < 5), z
        assert 0.6 < np.mean(z[var.sum(axis) > 0] ** 2) < 1.5


def test_always_is_online_everywhere():
    trace = generate("always", 7, seed=0, rounds=10, round_duration=2.0)
    assert trace.horizon == 20.0 and trace.availability().tolist() == [1.0] * 7
    assert known_probability(trace, 3).tolist() == [1.0] * 7


@pytest.mark.parametrize("dynamics", ["stationary", "staircase", "sine", "interleaved-sine"])
def test_bernoulli_follows_known_probability(dynamics):
    n, rounds = 300, 200
    p = np.random.default_rng(1).uniform(0.05, 0.95, n).tolist()
    trace = generate("bernoulli", n, seed=5, rounds=rounds, round_duration=3.0, p=p, dynamics=dynamics)
    pt = known_probability(trace, np.arange(rounds))
    assert pt.shape == (rounds, n)
    assert_bernoulli(round_matrix(trace, rounds, 3.0), pt)


def test_bernoulli_staircase_rates_per_half_period():
    trace = generate("bernoulli", 2000, seed=2, rounds=40, p=0.5, dynamics="staircase", period=20)
    rate = round_matrix(trace, 40).mean(axis=1)
    high = (np.arange(40) % 20) < 10
    assert np.allclose(rate[high], 0.5, atol=0.05) and np.allclose(rate[~high], 0.2, atol=0.04)
    assert np.allclose(known_probability(trace, np.arange(40))[:, 0], np.where(high, 0.5, 0.2))


def test_bernoulli_interleaved_sine_has_zero_rounds():
    p = [0.2] * 50 + [0.9] * 50
    trace = generate("bernoulli", 100, seed=3, rounds=40, p=p, dynamics="interleaved-sine")
    online = round_matrix(trace, 40)
    t = np.arange(40)
    g = 0.3 * np.sin(2 * np.pi * t / 20) + 0.7
    cut = 0.2 * g < 0.1  # the low devices' p_i g(t) falls under delta0 in the sine's trough
    assert cut.any() and not cut.all()
    pt = known_probability(trace, t)
    assert np.all(pt[cut][:, :50] == 0) and not online[cut][:, :50].any()
    assert np.all(pt[:, 50:] >= 0.9 * 0.4 - 1e-12)  # 0.9 g(t) never falls under delta0


def test_bernoulli_sine_shape():
    pt = known_probability(generate("bernoulli", 1, seed=0, rounds=20, p=0.5, dynamics="sine",
                                    gamma=0.3, period=20), np.arange(20))[:, 0]
    assert pt[5] == pytest.approx(0.5) and pt[15] == pytest.approx(0.5 * 0.4)


def test_bernoulli_label_derived_probability():
    labels = np.arange(40) % 10
    trace = generate("bernoulli", 40, seed=4, rounds=5, label_dist=one_hot(labels))
    p = known_probability(trace, 0)
    phi_max = np.array([1.0] * 5 + [0.5] * 5)
    assert np.all(p <= phi_max[labels]) and np.all(p >= 0)
    assert all(len(set(p[labels == c])) == 1 for c in range(10))  # p_i = phi of its one label
    assert not np.array_equal(p, known_probability(
        generate("bernoulli", 40, seed=5, rounds=5, label_dist=one_hot(labels)), 0))


def test_bernoulli_mifa_label_dependent_probability():
    dist = np.zeros((3, 10))
    dist[0, [3, 7]] = 0.5          # labels 3 and 7 -> min 3
    dist[1, [9, 8, 0]] = [0.6, 0.3, 0.1]  # two most frequent: 9 and 8 -> min 8
    dist[2, 5] = 1.0               # a single label counts twice
    trace = generate("bernoulli", 3, seed=0, rounds=2, label_dist=dist, p_min=0.1)
    assert known_probability(trace, 1) == pytest.approx([0.1 + 0.9 * 3 / 9, 0.1 + 0.9 * 8 / 9,
                                                         0.1 + 0.9 * 5 / 9])
    with pytest.raises(FedsimError, match=r"p_min = 'x'; give a value in \[0.0, 1.0\]"):
        generate("bernoulli", 3, seed=0, rounds=2, label_dist=dist, p_min="x")


def test_bernoulli_needs_labels_or_p():
    with pytest.raises(FedsimError, match="needs the devices' label distributions"):
        generate("bernoulli", 3, seed=0, rounds=2)
    with pytest.raises(FedsimError, match="list of 3"):
        generate("bernoulli", 3, seed=0, rounds=2, p=[0.5, 0.5])
    with pytest.raises(FedsimError, match=r"p = 1.5 for device 1"):
        generate("bernoulli", 3, seed=0, rounds=2, p=[0.5, 1.5, 0.1])
    with pytest.raises(FedsimError, match="did you mean 'staircase'"):
        generate("bernoulli", 3, seed=0, rounds=2, p=0.5, dynamics="stairs")


def test_known_probability_outside_the_trace_and_for_wall_clock_models():
    trace = generate("bernoulli", 4, seed=0, rounds=10, p=0.5)
    assert known_probability(trace, 10).tolist() == [0.0] * 4
    assert known_probability(trace, np.array([9, 10])).tolist() == [[0.5] * 4, [0.0] * 4]
    with pytest.raises(FedsimError, match="generator 'markov' defines no per-round"):
        known_probability(generate("markov", 4, seed=0, days=1), 0)


def test_grid_two_groups_alternate():
    labels = np.arange(20) % 10
    trace = generate("grid", 20, seed=0, rounds=24, label_dist=one_hot(labels), half_period=3,
                     digits=4)
    online = round_matrix(trace, 24)
    first_half = (np.arange(24) % 6) < 3
    group0 = labels < 4
    assert np.array_equal(online, first_half[:, None] == group0[None, :])
    assert np.array_equal(known_probability(trace, np.arange(24)), online.astype(float))


def test_periodic_turns_and_offset():
    labels = np.arange(30) % 10
    trace = generate("periodic", 30, seed=7, rounds=1200, label_dist=one_hot(labels),
                     rounds_per_group=100)
    offset = trace.generator["offset"]
    assert 0 <= offset < 100
    online = round_matrix(trace, 1200)
    assert np.all(online.sum(axis=1) == 6)  # one group of two labels at a time
    turn = ((np.arange(1200) + offset) // 100) % 5
    assert np.array_equal(online, turn[:, None] == (labels // 2)[None, :])
    lengths = (trace.end - trace.start)[trace.start > 0]
    interior = trace.end[trace.start > 0] < 1200
    assert np.all(lengths[interior] == 100)
    first = trace.end[(trace.start == 0)]
    assert np.all(first == 100 - offset)
    fixed = generate("periodic", 10, seed=1, rounds=10, groups=2, rounds_per_group=5, phase=3)
    assert fixed.generator["offset"] == 3 and fixed.generator["group"][:3] == [0, 1, 0]


def test_periodic_without_labels_puts_device_i_in_group_i_mod_g():
    """3 devices in 3 groups take three turns (each online a third of the time), not one
    group of everybody that is always online."""
    trace = generate("periodic", 3, seed=0, rounds=30, groups=3, rounds_per_group=5, phase=0)
    assert trace.generator["group"] == [0, 1, 2]
    online = round_matrix(trace, 30)
    assert np.array_equal(online.sum(axis=0), [10, 10, 10]) and np.all(online.sum(axis=1) == 1)
    assert online[:5, 0].all() and online[5:10, 1].all() and online[10:15, 2].all()


def local_hour_profile(trace, tz: float) -> np.ndarray:
    """Fraction online per local hour of day, sampled every 10 minutes."""
    index = AvailabilityIndex(trace)
    t = np.arange(0, trace.horizon, 600.0)
    frac = np.array([index.online(x).mean() for x in t])
    hour = ((t / 3600 + tz) % 24).astype(int)
    return np.bincount(hour, weights=frac, minlength=24) / np.bincount(hour, minlength=24)


def test_diurnal_peaks_at_night_local_time():
    trace = generate("diurnal", 400, seed=1, days=7, tz_offsets=[5.5], tz_weights=[1.0])
    profile = local_hour_profile(trace, 5.5)
    assert int(np.argmax(profile)) in {23, 0, 1, 2, 3, 4, 5}
    assert profile[[1, 2, 3]].min() > 0.5 and profile[14:20].max() < 0.05  # empty afternoons
    assert trace.availability().mean() == pytest.approx(0.3, abs=0.04)
    assert trace.generator["tz_offset_h"] == [5.5] * 400 and trace.origin.startswith("2024-01-01")


def test_diurnal_mean_spread_and_interruptions():
    calm = generate("diurnal", 600, seed=2, days=7, availability=0.4, availability_spread=0.0,
                    interruptions_per_hour=0.0, skip_prob=0.0, jitter_h=0.0)
    busy = generate("diurnal", 600, seed=2, days=7, availability=0.4, availability_spread=0.15)
    assert calm.availability().mean() == pytest.approx(0.4, abs=0.02)
    assert calm.availability().std() < 0.03 and busy.availability().std() > 0.1
    assert busy.n_intervals > 2 * calm.n_intervals  # interruptions split the nights


def zone_shares(trace, offsets) -> np.ndarray:
    tz = np.asarray(trace.generator["tz_offset_h"])
    return np.array([np.mean(tz == offset) for offset in offsets])


def test_diurnal_tz_weights_default_to_uniform_over_the_offsets_given():
    offsets = [-5.0, 0.0, 5.5, 9.0]
    trace = generate("diurnal", 20000, seed=3, days=1, tz_offsets=offsets)
    shares = zone_shares(trace, offsets)
    # binomial std of a share: sqrt(0.25 * 0.75 / 20000) = 0.003; 5 sigma
    assert shares.sum() == pytest.approx(1.0) and np.all(np.abs(shares - 0.25) < 0.015), shares
    assert trace.generator["options"]["tz_weights"] == []


def test_diurnal_without_tz_offsets_keeps_the_built_in_mixture():
    from fedsim.traces.clock_models import TZ_OFFSETS, TZ_WEIGHTS

    trace = generate("diurnal", 20000, seed=4, days=1)
    assert np.all(np.abs(zone_shares(trace, TZ_OFFSETS) - TZ_WEIGHTS) < 0.015)
    reweighted = generate("sleep-window", 20000, seed=4, days=1, tz_weights=[1.0] + [0.0] * 8)
    assert set(reweighted.generator["tz_offset_h"]) == {TZ_OFFSETS[0]}
    with pytest.raises(FedsimError, match=r"tz_offsets \(9 values \(the built-in ones: tz_offsets "
                                          r"is not set\)\) and tz_weights \(2 values\) need the same"):
        generate("diurnal", 3, seed=0, days=1, tz_weights=[1.0, 2.0])
    with pytest.raises(FedsimError, match=r"tz_offsets \(2 values\) and tz_weights \(3 values\)"):
        generate("diurnal", 3, seed=0, days=1, tz_offsets=[0, 1], tz_weights=[1, 1, 1])


def test_markov_session_and_gap_lengths():
    trace = generate("markov", 300, seed=3, days=4, mean_on=600.0, mean_off=1200.0, spread=0.0)
    inner = (trace.start > 0) & (trace.end < trace.horizon)
    assert (trace.end - trace.start)[inner].mean() == pytest.approx(600, rel=0.05)
    same = trace.device_id[1:] == trace.device_id[:-1]
    gaps = (trace.start[1:] - trace.end[:-1])[same]
    assert gaps.mean() == pytest.approx(1200, rel=0.05)
    assert trace.availability().mean() == pytest.approx(1 / 3, abs=0.02)
    spread = generate("markov", 300, seed=3, days=4, mean_on=600.0, mean_off=1200.0, spread=1.0)
    assert spread.availability().std() > 2 * trace.availability().std()


def test_sleep_window_one_window_per_local_day():
    trace = generate("sleep-window", 50, seed=4, days=5, hours=8.0, tz_offsets=[-5.0, 2.0],
                     tz_weights=[1.0, 1.0])
    assert trace.availability() == pytest.approx(np.full(50, 8 / 24), abs=8 / 24 / 5 + 1e-9)
    inner = (trace.start > 0) & (trace.end < trace.horizon)
    assert np.allclose(trace.end[inner] - trace.start[inner], 8 * 3600)
    tz = np.asarray(trace.generator["tz_offset_h"])[trace.device_id]
    local_start = (trace.start[inner] / 3600 + tz[inner]) % 24
    starts = np.asarray(trace.generator["start_h"])[trace.device_id[inner]] % 24
    assert np.allclose(local_start, starts)


def test_sleep_window_placed_where_least_active():
    activity = [5.0] * 24
    activity[2:10] = [1.0] * 8
    trace = generate("sleep-window", 20, seed=0, days=3, activity=activity, start_spread_h=0.0,
                     tz_offsets=[0.0], tz_weights=[1.0])
    inner = (trace.start > 0) & (trace.end < trace.horizon)
    assert np.all(trace.start[inner] % 86400 == 2 * 3600)


def test_generators_are_deterministic_for_a_seed():
    for kind, extent in [("bernoulli", {"rounds": 50}), ("markov", {"days": 1}),
                         ("diurnal", {"days": 2}), ("sleep-window", {"days": 2}),
                         ("periodic", {"rounds": 300})]:
        options = {"p": 0.4} if kind == "bernoulli" else {}
        a, b, c = (generate(kind, 30, seed=s, **extent, **options) for s in (1, 1, 2))
        assert np.array_equal(a.start, b.start) and np.array_equal(a.device_id, b.device_id)
        assert a.generator == b.generator
        assert not (np.array_equal(a.start, c.start) and np.array_equal(a.end, c.end)), kind


def test_option_and_kind_errors_suggest_the_closest():
    with pytest.raises(FedsimError, match="did you mean 'diurnal'"):
        generate("diurnl", 3, seed=0, days=1)
    with pytest.raises(FedsimError, match="unknown option 'availabilty'; did you mean 'availability'"):
        generate("diurnal", 3, seed=0, days=1, availabilty=0.5)
    with pytest.raises(FedsimError, match="option gamma = 'high' has the wrong type"):
        generate("bernoulli", 3, seed=0, rounds=1, p=0.5, gamma="high")
    with pytest.raises(FedsimError, match="is round-indexed: give rounds"):
        generate("grid", 3, seed=0)
    with pytest.raises(FedsimError, match="wall-clock time: give days"):
        generate("diurnal", 3, seed=0)
    assert check_options("bernoulli", {"gamma": 1})["gamma"] == 1.0


def test_registry_declares_typed_defaults():
    for name, spec in GENERATORS.items():
        assert spec.name == name and spec.doc
        assert spec.round_indexed == (spec.probability is not None)
        for key, default in spec.options.items():
            assert default is None or isinstance(default, (int, float, str, list)), (name, key)
    assert isinstance(GENERATORS["bernoulli"].options["gamma"], float)
    assert isinstance(GENERATORS["bernoulli"].options["period"], int)


def test_a_runs_periodic_trace_takes_its_phase(tmp_path):
    """`[trace] offset` is where a run starts in its trace: the periodic generator's own phase is
    `phase` (it was `offset`, which a run could not set), and the run records it."""
    import json

    from fedsim.cli import main

    (tmp_path / "run.toml").write_text(
        f'[run]\nname = "p"\nout = "{tmp_path}"\nrounds = 4\nprogress = false\nplots = false\n'
        '[data]\ndataset = "quadratic"\nclients = 4\n'
        '[server]\ntiming = "ideal"\n[trace]\nsource = "periodic"\ngroups = 2\nrounds_per_group = 5\nphase = 3\n')
    assert main(["run", str(tmp_path / "run.toml"), "--quiet"]) == 0
    generator = json.loads((tmp_path / "p" / "manifest.json").read_text())["trace"]["generator"]
    assert generator["options"]["phase"] == 3 and generator["offset"] == 3
    events = pl.read_parquet(tmp_path / "p" / "events.parquet")
    invited = [sorted(events.filter(pl.col("round") == r)["device_id"].to_list()) for r in range(4)]
    assert invited == [[0, 2], [0, 2], [1, 3], [1, 3]]  # turn floor((t + 3) / 5) mod 2: group 1 from round 2


def test_the_periodic_generators_former_offset_is_refused_naming_phase():
    with pytest.raises(FedsimError, match="unknown option 'offset'; it is 'phase' now"):
        check_options("periodic", {"offset": 2})
