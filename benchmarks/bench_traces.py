"""Trace-layer speed: generation, loading, index build and the queries the engine makes.

    python benchmarks/bench_traces.py [--json FILE] [--devices 100000] [--repeat 200]

Prints a table; with --json also writes the numbers. Query timings are the median over
``--repeat`` random times (and random cohorts).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedsim.traces import AvailabilityIndex, generate, read_trace, write_trace  # noqa: E402


def timed(fn):
    began = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - began


def median_time(fn, args_list) -> float:
    fn(*args_list[0])  # warm up
    times = []
    for args in args_list:
        began = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--devices", type=int, default=100_000, help="population for queries")
    parser.add_argument("--cohort", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "diurnal.parquet"

        def make_and_write():
            trace = generate("diurnal", 20_000, seed=0, days=7)
            write_trace(trace, path)
            return trace

        small, seconds = timed(make_and_write)
        rows.append(("generate diurnal 20000 x 7 d + write", seconds, f"{small.n_intervals} intervals"))
        _, seconds = timed(lambda: read_trace(path))
        rows.append(("read_trace (validated) of that file", seconds,
                     f"{path.stat().st_size / 2**20:.1f} MiB"))

    big, seconds = timed(lambda: generate("diurnal", args.devices, seed=1, days=7))
    rows.append((f"generate diurnal {args.devices} x 7 d", seconds, f"{big.n_intervals} intervals"))
    index, seconds = timed(lambda: AvailabilityIndex(big))
    rows.append((f"AvailabilityIndex build ({args.devices} devices)", seconds, ""))

    times = rng.uniform(0, big.horizon, args.repeat)
    cohorts = [rng.choice(args.devices, args.cohort, replace=False) for _ in range(args.repeat)]
    queries = [
        (f"online(t), {args.devices} devices", index.online, [(t,) for t in times]),
        (f"next_offline, cohort {args.cohort}", index.next_offline,
         list(zip(cohorts, times))),
        (f"online_during, cohort {args.cohort}", index.online_during,
         [(c, t, t + 600.0) for c, t in zip(cohorts, times)]),
        ("next_online(t)", index.next_online, [(t,) for t in times]),
    ]
    for name, fn, arglist in queries:
        rows.append((name, median_time(fn, arglist), f"median of {args.repeat}"))

    machine = (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
               f"numpy {np.__version__}")
    print(f"machine: {machine}")
    print(f"{'measurement':48} {'time':>12}  note")
    for name, seconds, note in rows:
        shown = f"{seconds:.3f} s" if seconds >= 0.1 else f"{seconds * 1e3:.3f} ms"
        print(f"{name:48} {shown:>12}  {note}")
    if args.json:
        result = {"machine": machine,
                  "results": [{"name": n, "seconds": s, "note": note} for n, s, note in rows]}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
