"""Round-indexed traces as bits (what a run holds) against their interval form: generation
time, peak memory, the lookups of a round, the fingerprint a run records and the online
fractions of devices.parquet.

Each case runs in a fresh Python process, so that its peak resident memory (ru_maxrss, minus
the process's resident memory after the imports) is its own.

    python benchmarks/bench_trace_bits.py                       # the table of RESULTS.md
    python benchmarks/bench_trace_bits.py --quick               # small sizes, seconds
    python benchmarks/bench_trace_bits.py --out benchmarks/results_trace_bits.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL = [("bits", 5000, 60_000), ("bits", 5000, 300_000), ("intervals", 5000, 30_000)]
QUICK = [("bits", 500, 6_000), ("intervals", 500, 6_000)]


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(form: str, devices: int, rounds: int) -> dict:
    """One case, in this process: Bernoulli p = 0.5 (the most runs of any p), a run's trace.
    Peaks: after generating, indexing and the lookups; then with the fingerprint and the
    online fractions too."""
    import numpy as np

    from fedsim.runs.replay import trace_fingerprint
    from fedsim.traces import generate
    from fedsim.traces.index import availability_index
    from fedsim.traces.stats import device_online_fraction

    base = peak_mb()  # after the imports
    t0 = time.perf_counter()
    trace = generate("bernoulli", devices, seed=0, rounds=rounds, p=0.5, as_bits=form == "bits")
    generated = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = availability_index(trace)
    built = time.perf_counter() - t0
    lookups = np.random.default_rng(0).integers(0, rounds, 2000).astype(np.float64)
    t0 = time.perf_counter()
    online = sum(len(index.online_ids(t)) for t in lookups)
    lookup_us = (time.perf_counter() - t0) / len(lookups) * 1e6
    cohort = np.arange(0, devices, max(1, devices // 100))
    t0 = time.perf_counter()
    for t in lookups[:200]:
        index.next_offline(cohort, t)
    offline_us = (time.perf_counter() - t0) / 200 * 1e6
    peak_index = peak_mb() - base
    t0 = time.perf_counter()
    trace_fingerprint(trace)
    fingerprint = time.perf_counter() - t0
    t0 = time.perf_counter()
    device_online_fraction(trace, rounds * 0.5)
    device_online_fraction(trace, float(rounds))
    fraction = time.perf_counter() - t0
    size = trace.bits.nbytes if form == "bits" else 24 * trace.n_intervals
    return {"form": form, "devices": devices, "rounds": rounds, "generate_s": round(generated, 2),
            "index_s": round(built, 2), "trace_mb": round(size / 2**20, 1),
            "peak_index_mb": round(peak_index, 1), "peak_all_mb": round(peak_mb() - base, 1), "online_lookup_us": round(lookup_us, 1),
            "mean_online": round(online / len(lookups), 1), "next_offline_100_us": round(offline_us, 1),
            "fingerprint_s": round(fingerprint, 2), "online_fraction_2x_s": round(fraction, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--case", nargs=3, help=argparse.SUPPRESS)  # form devices rounds: one case, JSON out
    args = parser.parse_args()
    if args.case:
        form, devices, rounds = args.case
        print(json.dumps(measure(form, int(devices), int(rounds))))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows = []
    for form, devices, rounds in QUICK if args.quick else FULL:
        done = subprocess.run([sys.executable, __file__, "--case", form, str(devices), str(rounds)],
                              capture_output=True, text=True, env=env, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    report(rows, args.out)


def report(rows: list[dict], out: Path | None) -> None:
    """The rows as a Markdown table; with the machine and its load as JSON into `out`."""
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if out:
        machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                   "load": os.getloadavg(), "python": platform.python_version()}
        out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
