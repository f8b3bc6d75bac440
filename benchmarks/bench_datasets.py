"""What loading a LEAF dataset costs: the first load (parsing LEAF's JSON, writing the cache)
and every later one (the cached arrays), each in a fresh process, with its peak memory.

The data are generated in LEAF's layout at the size asked (FEMNIST-shaped by default: 784
floats k/255 per sample, written as LEAF writes them), so no download is needed:

    python benchmarks/bench_datasets.py --users 355 --samples 226     # 1/10 of FEMNIST
    python benchmarks/bench_datasets.py --dataset sent140 --users 2000 --samples 40

Prints a table and writes benchmarks/results_datasets.json (merged by dataset and size).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))

LOAD = """
import resource, sys, time
from pathlib import Path
from fedsim.config import DataConfig
from fedsim.data.datasets import load_dataset
t = time.perf_counter()
data = load_dataset(DataConfig(dataset=sys.argv[1], root=sys.argv[2], clients=int(sys.argv[3])), seed=0)
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, len(data.y_train))
"""


def generate(root: Path, dataset: str, users: int, samples: int, files: int = 10) -> int:
    """LEAF files of `users` users of about `samples` samples each (sizes vary 0.5x-1.5x)."""
    from leaf_files import write_leaf

    rng = np.random.default_rng(0)
    sizes = np.maximum(1, rng.integers(samples // 2, samples * 3 // 2 + 1, size=users)).tolist()
    per_file = -(-users // files)
    write_leaf(root, dataset, [sizes[k:k + per_file] for k in range(0, users, per_file)],
               test_size=max(1, samples // 9))
    return sum(f.stat().st_size for f in root.rglob("*.json"))


def load(dataset: str, root: Path, users: int) -> tuple[float, float, int]:
    out = subprocess.run([sys.executable, "-c", LOAD, dataset, str(root), str(users)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="femnist", choices=("femnist", "shakespeare", "sent140"))
    parser.add_argument("--users", type=int, default=355)
    parser.add_argument("--samples", type=int, default=226, help="mean training samples per user")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / args.dataset
        t = time.perf_counter()
        size = generate(root, args.dataset, args.users, args.samples)
        made = time.perf_counter() - t
        first_s, first_mb, n = load(args.dataset, root, args.users)
        cached_s, cached_mb, _ = load(args.dataset, root, args.users)
        cache_mb = sum(f.stat().st_size for f in (root / ".fedsim-cache").iterdir()) / 2**20
    row = {"dataset": args.dataset, "users": args.users, "train_samples": n, "json_mb": size / 2**20,
           "first_load_s": first_s, "first_peak_mb": first_mb, "cached_load_s": cached_s,
           "cached_peak_mb": cached_mb, "cache_mb": cache_mb, "generate_s": made,
           "machine": f"{platform.processor() or platform.machine()}, {platform.node()}"}
    print(f"{'dataset':12} {'users':>6} {'samples':>8} {'JSON MB':>8} {'first load':>11} {'peak MB':>8} "
          f"{'cached load':>12} {'peak MB':>8} {'cache MB':>9}")
    print(f"{args.dataset:12} {args.users:>6} {n:>8} {size / 2**20:>8.0f} {first_s:>10.1f}s {first_mb:>8.0f} "
          f"{cached_s:>11.2f}s {cached_mb:>8.0f} {cache_mb:>9.0f}")
    path = HERE / "results_datasets.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in rows if (r["dataset"], r["users"]) != (args.dataset, args.users)] + [row]
    path.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
