"""Engine overhead: simulated rounds per host second as the population grows.

The quadratic task keeps training cost negligible, so this measures the SimPy server and
device processes, the availability index and the recorder. Prints a table; --json FILE
writes the records.

    python benchmarks/bench_engine.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from fedsim.config import config_from_dict
from fedsim.comparison import run


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
    t0 = time.perf_counter()
    result = run(config, progress=False)
    host = time.perf_counter() - t0
    df = result.rounds
    in_rounds = float(df["wall_s"].sum())
    return {"devices": n_devices, "per_round": per_round, "timing": timing, "rounds": len(df),
            "invited_mean": float(df["invited"].mean()), "host_s": round(host, 3),
            "setup_and_output_s": round(host - in_rounds, 3),
            "rounds_per_s": round(len(df) / in_rounds, 1),
            "round_wall_ms": round(1000 * in_rounds / len(df), 3)}


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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    rounds = 200 if args.quick else 500
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for timing in ("model", "ideal"):
                records.append(measure(n, 100, rounds, timing, Path(tmp)))
    print(f"machine: {machine()}, python {platform.python_version()}")
    print(f"{'devices':>8} {'timing':>6} {'rounds':>6} {'invited':>8} {'rounds/s':>9} "
          f"{'ms/round':>9} {'setup+io s':>10}")
    for r in records:
        print(f"{r['devices']:>8} {r['timing']:>6} {r['rounds']:>6} {r['invited_mean']:>8.1f} "
              f"{r['rounds_per_s']:>9.1f} {r['round_wall_ms']:>9.2f} {r['setup_and_output_s']:>10.2f}")
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
