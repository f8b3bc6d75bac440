"""Engine overhead: simulated rounds per host second as the population grows, and what the
events log (events.parquet) adds to it.

The quadratic task keeps training cost negligible, so this measures the SimPy server and
device processes, the availability index, the recorder and the events log. `engine s` is the
rounds with their callbacks plus joining the events log's parts (setup and plots aside).
`--events-off` also runs each setting with the log's rows neither built nor written (patched
out here only: a run always writes its log) and prints the overhead (best of three each). Prints a table; --json FILE
writes the records.

    python benchmarks/bench_engine.py [--quick] [--events-off] [--million] [--json FILE]

`--million`: a run of 1,000,000 invitations (10,000 rounds of 100 devices, ideal timing), each
way in a process of its own: its peak memory and events.parquet's size.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from fedsim.config import config_from_dict
from fedsim.runs.comparison import run


def no_plots(*args, **kwargs) -> None:
    """The engine's cost, not the plots' (benchmarks/bench_round_profile.py times those)."""


def measure(n_devices: int, per_round: int, rounds: int, timing: str, out: Path) -> dict:
    config = config_from_dict({
        "run": {"name": f"bench-{n_devices}-{timing}", "out": str(out), "rounds": rounds,
                "eval_every": rounds, "progress": False},
        "data": {"dataset": "quadratic", "clients": n_devices, "dim": 10},
        "client": {"batch_size": 0, "local_steps": 1, "lr": 0.1, "trainer": "batched"},
        "trace": {"source": "markov", "days": 30.0},
        "server": {"timing": timing, "clients_per_round": per_round, "deadline": 300.0,
                   "round_duration": 300.0},
    })
    import fedsim.runs.experiment
    import fedsim.results.recorder

    fedsim.runs.experiment.draw_plots = no_plots
    engine_s = [0.0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                engine_s[0] += time.perf_counter() - t
        return wrapper

    import simpy

    env_run, finish = simpy.Environment.run, fedsim.results.recorder.Recorder.finish
    simpy.Environment.run = timed(env_run)  # the rounds, with the recorder's callbacks
    fedsim.results.recorder.Recorder.finish = timed(finish)  # joining the events log's parts
    t0 = time.perf_counter()
    try:
        result = run(config, progress=False)
    finally:
        simpy.Environment.run, fedsim.results.recorder.Recorder.finish = env_run, finish
    host = time.perf_counter() - t0
    df = result.rounds
    in_rounds = float(df["wall_s"].sum())
    return {"devices": n_devices, "per_round": per_round, "timing": timing, "rounds": len(df),
            "invited_mean": float(df["invited"].mean()), "host_s": round(host, 3),
            "setup_and_output_s": round(host - in_rounds, 3), "engine_s": round(engine_s[0], 3),
            "rounds_per_s": round(len(df) / in_rounds, 1),
            "round_wall_ms": round(1000 * in_rounds / len(df), 3)}


@contextmanager
def events_off():
    """No event rows built (the server) nor written (the recorder) while inside."""
    import fedsim.results.recorder as recorder
    import fedsim.sim.server as server

    build, add = server.task_events, recorder.EventLog.add
    server.task_events = lambda *args, **kwargs: {}
    recorder.EventLog.add = lambda self, events: None
    try:
        yield
    finally:
        server.task_events, recorder.EventLog.add = build, add


def million(events: bool) -> dict:
    """Peak memory of a 1,000,000-invitation run, in a fresh process."""
    import subprocess
    import sys

    code = (
        "import resource, sys, tempfile, time; from pathlib import Path\n"
        "sys.path.insert(0, 'benchmarks'); import bench_engine as b\n"
        "out = Path(tempfile.mkdtemp())\n"
        f"ctx = b.events_off() if {not events} else __import__('contextlib').nullcontext()\n"
        "with ctx: r = b.measure(1000, 100, 10000, 'ideal', out)\n"
        "log = next(out.rglob('events.parquet'), None)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, r['engine_s'],"
        " log.stat().st_size / 2**20 if log else 0)\n")
    peak, engine, size = map(float, subprocess.run([sys.executable, "-c", code], check=True,
                                                   capture_output=True, text=True).stdout.split())
    return {"events": events, "peak_rss_mib": round(peak), "engine_s": engine, "log_mib": round(size, 1)}


def machine() -> str:
    """CPU model name (from /proc/cpuinfo where there is one) and core count."""
    import os

    try:
        names = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else platform.machine()} x {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--events-off", action="store_true",
                        help="also run each setting without the events log, and print its overhead")
    parser.add_argument("--million", action="store_true",
                        help="peak memory of a run of 1,000,000 invitations, with and without the log")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.million:
        records = [million(True), million(False)]
        print(f"machine: {machine()}, python {platform.python_version()}")
        print(f"{'events log':>10} {'peak RSS MiB':>12} {'engine s':>8} {'events.parquet MiB':>18}")
        for r in records:
            print(f"{'on' if r['events'] else 'off':>10} {r['peak_rss_mib']:>12} {r['engine_s']:>8.2f} "
                  f"{r['log_mib']:>18}")
        if args.json:
            args.json.write_text(json.dumps(records, indent=2) + "\n")
        return
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    rounds = 200 if args.quick else 500
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for timing in ("model", "ideal"):
                record = measure(n, 100, rounds, timing, Path(tmp))
                if args.events_off:  # interleaved, best of three each, against machine noise
                    on, off = [record["engine_s"]], []
                    for _ in range(2 if n < 100_000 else 1):
                        with events_off():
                            off.append(measure(n, 100, rounds, timing, Path(tmp))["engine_s"])
                        on.append(measure(n, 100, rounds, timing, Path(tmp))["engine_s"])
                    with events_off():
                        off.append(measure(n, 100, rounds, timing, Path(tmp))["engine_s"])
                    record["engine_s"], record["engine_s_events_off"] = min(on), min(off)
                    record["events_overhead_pct"] = round(100 * (min(on) / min(off) - 1), 1)
                records.append(record)
    print(f"machine: {machine()}, python {platform.python_version()}")
    print(f"{'devices':>8} {'timing':>6} {'rounds':>6} {'invited':>8} {'rounds/s':>9} "
          f"{'ms/round':>9} {'setup+io s':>10} {'engine s':>8}"
          + (f" {'no log s':>8} {'log cost':>8}" if args.events_off else ""))
    for r in records:
        print(f"{r['devices']:>8} {r['timing']:>6} {r['rounds']:>6} {r['invited_mean']:>8.1f} "
              f"{r['rounds_per_s']:>9.1f} {r['round_wall_ms']:>9.2f} {r['setup_and_output_s']:>10.2f} "
              f"{r['engine_s']:>8.3f}"
              + (f" {r['engine_s_events_off']:>8.3f} {r['events_overhead_pct']:>7.1f}%" if args.events_off else ""))
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
