"""AvailabilityIndex against a brute-force reference that unrolls the trace explicitly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.traces import AvailabilityIndex, Trace

PERIODS = 8  # the reference unrolls a loop trace over [-2H, 6H)


@st.composite
def traces(draw):
    """Small traces on integer times (so every sum is exact), either wrap mode."""
    n = draw(st.integers(1, 5))
    horizon = draw(st.integers(1, 30))
    ids, starts, ends = [], [], []
    for device in range(n):
        points = sorted(draw(st.lists(st.integers(0, horizon), max_size=8, unique=True)))
        for a, b in zip(points[0::2], points[1::2]):
            ids.append(device)
            starts.append(a)
            ends.append(b)
    wrap = draw(st.sampled_from(["none", "loop"]))
    return Trace.from_intervals(ids, starts, ends, n_devices=n, horizon=horizon, wrap=wrap)


def reference_runs(trace: Trace) -> list[list[tuple[float, float]]]:
    """Per device: merged online runs over the unrolled time line (plain Python)."""
    h = trace.horizon
    copies = range(-2, PERIODS - 2) if trace.wrap == "loop" else [0]
    runs = []
    for device in range(trace.n_devices):
        pieces = sorted((s + k * h, e + k * h) for k in copies
                        for i, s, e in zip(trace.device_id, trace.start, trace.end) if i == device)
        merged: list[list[float]] = []
        for s, e in pieces:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        runs.append([(s, e) for s, e in merged])
    return runs


def run_at(runs, device, t):
    return next(((s, e) for s, e in runs[device] if s <= t < e), None)


def brute_next_offline(trace, runs, device, t):
    run = run_at(runs, device, t)
    if run is None:
        return t
    # A run reaching the end of the unrolled window never ends (online across every wrap).
    return math.inf if trace.wrap == "loop" and run[1] >= (PERIODS - 2) * trace.horizon else run[1]


def brute_next_online(runs, t):
    candidates = [t if s <= t < e else s for device_runs in runs for s, e in device_runs if e > t]
    return min(candidates, default=math.inf)


@settings(max_examples=200, deadline=None)
@given(traces(), st.data())
def test_index_matches_brute_force(trace, data):
    h2 = int(2 * trace.horizon)  # queries on half-seconds over [-H, 3H)
    queries = data.draw(st.lists(st.integers(-h2, 3 * h2 - 1), min_size=1, max_size=6))
    queries = [k / 2 for k in queries]
    index = AvailabilityIndex(trace)
    runs = reference_runs(trace)
    ids = np.arange(trace.n_devices)
    for t in queries:
        expected_online = [run_at(runs, i, t) is not None for i in ids]
        assert index.online(t).tolist() == expected_online
        assert index.next_offline(ids, t).tolist() == [brute_next_offline(trace, runs, i, t) for i in ids]
        assert index.next_online(t) == brute_next_online(runs, t)
        for length in (0.5, 1.0, 3.0, 2 * trace.horizon):
            t1 = t + length
            whole = [all(run_at(runs, i, x) for x in [t, *np.arange(math.floor(t) + 1, t1)])
                     for i in ids]
            assert index.online_during(ids, t, t1).tolist() == whole


def test_drop_and_return_inside_window_is_not_online_during():
    trace = Trace.from_intervals([0, 0, 1], [0, 6, 0], [5, 10, 10], n_devices=2, horizon=10)
    index = AvailabilityIndex(trace)
    assert index.online(1.0).tolist() == [True, True] and index.online(8.0).tolist() == [True, True]
    assert index.online_during([0, 1], 1.0, 8.0).tolist() == [False, True]
    assert index.online_during([0, 1], 1.0, 5.0).tolist() == [True, True]  # half-open window
    assert index.next_offline([0, 1, 0], 1.0).tolist() == [5.0, 10.0, 5.0]


def test_wrap_loop_runs_across_the_horizon():
    trace = Trace.from_intervals([0, 0, 1, 2], [0, 8, 0, 3], [2, 10, 10, 4], n_devices=3,
                                 horizon=10, wrap="loop")
    index = AvailabilityIndex(trace)
    assert index.online(25.0).tolist() == [False, True, False]
    assert index.online(28.5).tolist() == [True, True, False]
    nxt = index.next_offline([0, 1, 2], 28.5)
    assert nxt.tolist() == [32.0, math.inf, 28.5]
    assert index.next_online(24.0) == 24.0
    assert AvailabilityIndex(Trace.from_intervals([0], [3], [4], n_devices=1, horizon=10,
                                                  wrap="loop")).next_online(5.0) == 13.0


def test_no_wrap_is_offline_after_the_horizon():
    index = AvailabilityIndex(Trace.from_intervals([0], [0], [10], n_devices=2, horizon=10))
    assert index.online(10.0).tolist() == [False, False]
    assert index.next_online(10.0) == math.inf and index.next_online(-3.0) == 0.0
    assert index.next_offline([0], 9.0).tolist() == [10.0]


def test_empty_trace():
    index = AvailabilityIndex(Trace.from_intervals([], [], [], n_devices=3, horizon=5, wrap="loop"))
    assert not index.online(1.0).any() and index.next_online(0.0) == math.inf
    assert index.next_offline([0, 2], 1.0).tolist() == [1.0, 1.0]


def test_random_large_trace_matches_per_device_search():
    rng = np.random.default_rng(3)
    n, per, horizon = 300, 12, 1000.0
    points = np.sort(rng.uniform(0, horizon, (n, 2 * per)), axis=1)
    trace = Trace.from_intervals(np.repeat(np.arange(n), per), points[:, 0::2].ravel(),
                                 points[:, 1::2].ravel(), n_devices=n, horizon=horizon)
    index = AvailabilityIndex(trace)
    for t in rng.uniform(-10, horizon + 10, 50):
        expected = ((points[:, 0::2] <= t) & (t < points[:, 1::2])).any(axis=1)
        assert np.array_equal(index.online(t), expected)
        ends = np.where((points[:, 0::2] <= t) & (t < points[:, 1::2]), points[:, 1::2], np.inf).min(axis=1)
        assert np.array_equal(index.next_offline(np.arange(n), t), np.where(expected, ends, t))


def test_online_answers_are_independent_of_earlier_ones():
    """The index keeps its last answer (next_online then online at a round's start): a caller
    changing the returned array must not change the next answer."""
    index = AvailabilityIndex(Trace.from_intervals([0, 1], [0, 2], [4, 3], n_devices=3, horizon=5))
    assert index.next_online(2.5) == 2.5
    first = index.online(2.5)
    first[:] = [False, False, True]
    assert index.online(2.5).tolist() == [True, True, False]
    assert index.online(3.5).tolist() == [True, False, False] and index.next_online(4.5) == math.inf


def test_touching_intervals_are_still_merged():
    trace = Trace.from_intervals([0, 0, 0, 1], [0, 2, 5, 1], [2, 3, 6, 2], n_devices=2, horizon=8)
    assert trace.start.tolist() == [0, 5, 1] and trace.end.tolist() == [3, 6, 2]


def test_rejects_ids_outside_population():
    index = AvailabilityIndex(Trace.from_intervals([0], [0], [1], n_devices=2, horizon=1))
    with pytest.raises(IndexError):
        index.next_offline([2], 0.0)


@st.composite
def decimal_traces(draw):
    """Looped traces whose boundaries and horizon are decimals (tenths, as converted traces
    have them): in later cycles, cycle start + boundary is rarely a double."""
    n = draw(st.integers(1, 4))
    horizon = draw(st.integers(2, 400)) / 10
    ids, starts, ends = [], [], []
    for device in range(n):
        points = sorted(draw(st.lists(st.integers(0, int(round(horizon * 10))), max_size=6, unique=True)))
        for a, b in zip(points[0::2], points[1::2]):
            ids.append(device)
            starts.append(a / 10)
            ends.append(b / 10)
    return Trace.from_intervals(ids, starts, ends, n_devices=n, horizon=horizon, wrap="loop")


def assert_instants_agree(index, times, n_devices: int) -> None:
    """The instants the index answers are instants at which it says what they promise: at a
    run's end the device is offline (a task started at t on a device online at t ends after
    t), where someone is next online someone is, and online_during agrees with both."""
    ids = np.arange(n_devices)
    for t in times:
        online = index.online(t)
        ends = index.next_offline(ids, t)
        assert (ends[online] > t).all() and (ends[~online] == t).all(), t
        for device in np.flatnonzero(online & np.isfinite(ends)):
            assert not index.online(float(ends[device]))[device], (t, device, ends[device])
            assert index.online(float(np.nextafter(ends[device], -math.inf)))[device], (t, device)
            assert index.online_during([device], t, float(ends[device])).tolist() == [True]
            assert index.online_during([device], t, float(np.nextafter(ends[device], math.inf))).tolist() == [False]
        nxt = index.next_online(t)
        assert nxt >= t and (math.isinf(nxt) or index.online(nxt).any()), t
        for count in range(1, n_devices + 1):
            reached = index.next_online_count(count, t)
            assert math.isinf(reached) or index.online(reached).sum() >= count, (t, count)


@settings(max_examples=150, deadline=None)
@given(decimal_traces(), st.data())
def test_a_looped_trace_of_decimals_answers_instants_it_agrees_with_in_every_cycle(trace, data):
    """(A FedScale trace of 172,800 s with a session ending at 8875.3 s: 172800 + 8875.3 rounds
    down, so the device was online at the instant its run "ended", and a run replaying it
    stopped its clock there: zero-length rounds with every device dropped, for ever.)"""
    cycles = data.draw(st.lists(st.integers(1, 10**6), min_size=1, max_size=3))
    index = AvailabilityIndex(trace)
    times = [k * trace.horizon + x for k in cycles for x in (*trace.start, *trace.end, trace.horizon / 3)]
    times += [float(e) for t in list(times) for e in index.next_offline(np.arange(trace.n_devices), t)
              if math.isfinite(e)]
    assert_instants_agree(index, times, trace.n_devices)


def test_the_fedscale_session_that_stopped_the_clock():
    trace = Trace.from_intervals([0], [6569.0], [8875.3], n_devices=1, horizon=172800.0, wrap="loop")
    index = AvailabilityIndex(trace)
    start = index.next_online(172800.0 + 100)  # the second cycle's session
    assert start == 172800.0 + 6569.0
    end = float(index.next_offline([0], start)[0])
    assert end == np.nextafter(172800.0 + 8875.3, math.inf)  # the first double at or after the real sum
    assert not index.online(end)[0] and index.online(172800.0 + 8875.3)[0]  # 8875.29999... of the cycle
