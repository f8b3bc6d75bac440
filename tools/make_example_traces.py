"""Rebuild the small example traces in traces/ (run from the repository root):

    python tools/make_example_traces.py [--out traces]

Each trace is deterministic for its seed; traces/README.md says what each one is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedsim.traces import generate, write_trace  # noqa: E402
from fedsim.traces.commands import _one_line  # noqa: E402


def one_class_labels(n: int, classes: int = 10) -> np.ndarray:
    """Device i holds only label i mod 10 (FedLaAvg's one-class partition)."""
    return np.eye(classes)[np.arange(n) % classes]


def dirichlet_labels(n: int, alpha: float, seed: int, classes: int = 10) -> np.ndarray:
    """Label distributions ~ Dirichlet(alpha) per device (FedAWE's partition)."""
    return np.random.default_rng(seed).dirichlet(np.full(classes, alpha), size=n)


EXAMPLES = {
    "diurnal_500x7d.parquet": lambda: generate("diurnal", 500, seed=1, days=7),
    "markov_200x2d.parquet": lambda: generate("markov", 200, seed=2, days=2),
    "sleep_window_100x7d.parquet": lambda: generate("sleep-window", 100, seed=3, days=7),
    "bernoulli_sine_100x300.parquet": lambda: generate(
        "bernoulli", 100, seed=4, rounds=300, dynamics="sine",
        label_dist=dirichlet_labels(100, 0.1, seed=4)),
    "grid_100x2000.parquet": lambda: generate(
        "grid", 100, seed=5, rounds=2000, half_period=100, digits=5,
        label_dist=one_class_labels(100)),
    "periodic_250x2000.parquet": lambda: generate(
        "periodic", 250, seed=6, rounds=2000, label_dist=one_class_labels(250)),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="traces", help="folder to write to (traces)")
    out = Path(parser.parse_args().out)
    total = 0
    for name, make in EXAMPLES.items():
        trace = make()
        write_trace(trace, out / name)
        size = (out / name).stat().st_size
        total += size
        print(f"{name:34} {size / 1024:7.1f} KiB  {_one_line(trace)}")
    print(f"total {total / 1024:.1f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
