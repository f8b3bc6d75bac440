"""Round-indexed traces held as bits per round and device (fedsim/traces/round_bits.py): the
same availability as their interval form, device by device and round by round, the same
answers to every index query, fingerprint and online fraction, and runs through the engine
that write the same files either way; the 50 M-row guard of the interval form no longer
stops a run, so a long run can be extended."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import polars as pl
import pytest

from conftest import quadratic_config, rounds
from fedsim.cli import main
from fedsim.runs.replay import trace_fingerprint
from fedsim.traces import generate
from fedsim.traces.generators import BUILT_IN
from fedsim.traces.index import AvailabilityIndex
from fedsim.traces.round_bits import RoundBits
from fedsim.traces.round_index import RoundIndex
from fedsim.traces.stats import device_online_fraction

ROUND_INDEXED = [name for name, spec in BUILT_IN.items() if spec.round_indexed]
OPTIONS = {"always": {}, "bernoulli": {"p": 0.5, "dynamics": "sine", "period": 7},
           "grid": {"half_period": 3}, "periodic": {"groups": 3, "rounds_per_group": 4}}


def both_forms(kind: str, n: int, rounds_: int, duration: float, wrap: str):
    labels = np.random.default_rng(1).dirichlet(np.ones(10), n)
    made = [generate(kind, n, seed=4, rounds=rounds_, round_duration=duration, label_dist=labels,
                     as_bits=bits, **OPTIONS[kind]) for bits in (False, True)]
    return [dataclasses.replace(trace, wrap=wrap) for trace in made]


def test_every_round_indexed_generator_is_covered():
    assert sorted(ROUND_INDEXED) == sorted(OPTIONS)


@pytest.mark.parametrize("kind", ROUND_INDEXED)
@pytest.mark.parametrize("duration", [1.0, 0.1, 7.3])
def test_the_bits_are_the_intervals_round_by_round_device_by_device(kind, duration):
    intervals, bits = both_forms(kind, 21, 60, duration, "none")
    assert isinstance(bits, RoundBits) and bits.horizon == intervals.horizon
    assert bits.generator == intervals.generator
    t = np.arange(60) * duration  # round r is online iff the interval form is online at r*D
    online = (intervals.start[None, :] <= t[:, None]) & (t[:, None] < intervals.end[None, :])
    expected = np.zeros((60, 21), dtype=bool)
    for r in range(60):
        expected[r, intervals.device_id[online[r]]] = True
    assert np.array_equal(bits.rows(0, 60), expected)
    assert np.array_equal(bits.online_count, expected.sum(axis=1))
    again = bits.to_trace("test")
    for column in ("device_id", "start", "end"):
        assert np.array_equal(getattr(again, column), getattr(intervals, column))


@pytest.mark.parametrize("kind", ROUND_INDEXED)
@pytest.mark.parametrize("wrap", ["none", "loop"])
@pytest.mark.parametrize("duration", [1.0, 0.1])
def test_every_query_answers_as_the_interval_index(kind, wrap, duration, monkeypatch):
    import fedsim.traces.round_bits as round_bits

    monkeypatch.setattr(round_bits, "CHUNK_BYTES", 64)  # many chunks of devices
    intervals, bits = both_forms(kind, 13, 40, duration, wrap)
    a, b = AvailabilityIndex(intervals), RoundIndex(bits)
    rng = np.random.default_rng(0)
    times = np.concatenate([np.arange(-2, 95) * duration, rng.uniform(-3, 95 * duration, 200)])
    ids = np.arange(13)
    for t in times:
        assert np.array_equal(a.online(t), b.online(t)), t
        assert np.array_equal(a.next_offline(ids, t), b.next_offline(ids, t)), t
        assert np.array_equal(a.online_during(ids, t, t + 3 * duration), b.online_during(ids, t, t + 3 * duration))
        assert a.next_online(t) == b.next_online(t), t
        for count in (1, 4, 13):
            assert a.next_online_count(count, t) == b.next_online_count(count, t), (t, count)
    for horizon in (0.5 * duration, 7 * duration, 22.2 * duration, 40 * duration):  # what earlier runs recorded
        assert trace_fingerprint(bits, horizon, "intervals") == trace_fingerprint(intervals, horizon)
    for t in [*np.sort(rng.uniform(0, 100 * duration, 30)), 3.0, 1.0, 40 * duration, 90 * duration]:
        assert np.array_equal(device_online_fraction(bits, t), device_online_fraction(intervals, t)), t


def test_bits_are_drawn_in_blocks_with_the_numbers_of_one_draw():
    whole = generate("bernoulli", 3000, seed=2, rounds=900, p=0.3)  # intervals: blocks of 1,398 rounds
    bits = generate("bernoulli", 3000, seed=2, rounds=900, p=0.3, as_bits=True)  # blocks of 349
    assert trace_fingerprint(bits, of="intervals") == trace_fingerprint(whole)


def targets(n: int) -> list[list[float]]:
    return [[float(i), 1.0] for i in range(n)]


def run_files(run_dir) -> dict:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return {"rounds": pl.read_parquet(run_dir / "rounds.parquet").drop("wall_s"),
            "events": pl.read_parquet(run_dir / "events.parquet"),
            "devices": pl.read_parquet(run_dir / "devices.parquet"), "trace": manifest["trace"]}


@pytest.mark.parametrize("timing", ["ideal", "model"])
def test_a_run_writes_the_same_files_from_the_bits_as_from_the_intervals(cli_run, monkeypatch, timing):
    config = quadratic_config(targets(12), rounds=30, algorithm="mifa")
    config["run"]["checkpoint_every"] = 7
    config["trace"] = {"source": "bernoulli", "p": [0.9, 0.3, 0.6] * 4}
    if timing == "model":  # tasks of 1.5 to 3 rounds: a device may go offline before it is done
        config["server"] = {"timing": "model", "round_duration": 1.0, "deadline": 2.5, "clients_per_round": 6}
        config["devices"] = {"model": "lognormal", "seconds_per_sample": 1.5, "compute_sigma": 0.3}
    from_bits = run_files(cli_run(config, name="bits"))
    import fedsim.runs.experiment as experiment

    held = experiment.load_trace

    def as_intervals(*args, **kwargs):
        trace, chosen = held(*args, **kwargs)
        assert isinstance(trace, RoundBits)
        return trace.to_trace("test"), chosen

    monkeypatch.setattr(experiment, "load_trace", as_intervals)
    from_intervals = run_files(cli_run(config, name="intervals"))
    for name in ("rounds", "events", "devices"):
        assert from_bits[name].equals(from_intervals[name]), name
    assert from_bits["trace"]["fingerprint_of"] == "bits" and from_intervals["trace"]["fingerprint_of"] == "intervals"
    assert from_bits["trace"]["fingerprint"] == trace_fingerprint(
        generate("bernoulli", 12, seed=0, rounds=from_bits["trace"]["generator"]["rounds"], p=[0.9, 0.3, 0.6] * 4,
                 as_bits=True))
    fingerprints = ("fingerprint", "fingerprint_of")
    assert {k: v for k, v in from_bits["trace"].items() if k not in fingerprints} == \
        {k: v for k, v in from_intervals["trace"].items() if k not in fingerprints}
    outcomes = set(from_bits["events"]["outcome"].to_list())
    assert outcomes == {"arrived"} if timing == "ideal" else "dropped" in outcomes, outcomes


def test_a_run_past_the_interval_guard_runs_and_resumes_to_more_rounds(cli_run, monkeypatch, tmp_path, capsys):
    """The interval form of this trace is above the (lowered) row limit: `fedsim trace generate`
    refuses it; a run holds bits, runs, and a resume with more rounds ends as one long run."""
    import fedsim.traces.schema as schema

    monkeypatch.setattr(schema, "MAX_INTERVALS", 40)
    config = quadratic_config(targets(8), rounds=24, algorithm="fedavg")
    config["trace"] = {"source": "bernoulli", "p": 0.5}
    out = tmp_path / "t.parquet"
    assert main(["trace", "generate", "bernoulli", "--devices", "8", "--rounds", "24", "--set", "p=0.5",
                 "--out", str(out)]) == 2
    assert "above fedsim's limit of 40" in capsys.readouterr().err and not out.exists()
    whole = cli_run(config, name="whole")
    config["run"]["rounds"] = 10
    short = cli_run(config, name="short")
    assert json.loads((short / "manifest.json").read_text())["trace"]["generator"]["rounds"] == 10
    assert main(["run", "--resume", str(short), "--set", "run.rounds=24", "--quiet"]) == 0
    assert rounds(short).drop("wall_s").equals(rounds(whole).drop("wall_s"))
    assert pl.read_parquet(short / "events.parquet").equals(pl.read_parquet(whole / "events.parquet"))
    assert json.loads((short / "manifest.json").read_text())["trace"]["fingerprint"] == \
        json.loads((whole / "manifest.json").read_text())["trace"]["fingerprint"]


def test_bits_beyond_their_limit_are_one_line(cli_run, monkeypatch, capsys):
    import fedsim.traces.round_bits as round_bits

    monkeypatch.setattr(round_bits, "MAX_BIT_BYTES", 100)
    config = quadratic_config(targets(9), rounds=51)
    config["trace"] = {"source": "always"}
    cli_run(config, expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and "9 devices over 51 rounds would take 102 bytes of availability bits (one " \
        "per 8 devices and round), above fedsim's limit of 100; use fewer devices or rounds" in err, err


def test_a_run_that_recorded_the_fingerprint_of_intervals_resumes_to_more_rounds(cli_run):
    """Runs of earlier releases recorded the SHA-256 of their trace's intervals (no
    `fingerprint_of`): a resume checks that one, streamed from the bits, and goes on."""
    config = quadratic_config(targets(6), rounds=16, algorithm="mifa")
    config["trace"] = {"source": "grid", "half_period": 2}
    whole = cli_run(config, name="whole")
    config["run"]["rounds"] = 8
    short = cli_run(config, name="short")
    manifest = json.loads((short / "manifest.json").read_text())
    recorded = generate("grid", 6, seed=0, rounds=8, half_period=2)  # the interval form, as earlier runs hashed
    manifest["trace"]["fingerprint"] = trace_fingerprint(recorded)
    del manifest["trace"]["fingerprint_of"]
    (short / "manifest.json").write_text(json.dumps(manifest))
    assert main(["run", "--resume", str(short), "--set", "run.rounds=16", "--quiet"]) == 0
    assert rounds(short).drop("wall_s").equals(rounds(whole).drop("wall_s"))
    assert json.loads((short / "manifest.json").read_text())["trace"]["fingerprint_of"] == "bits"
