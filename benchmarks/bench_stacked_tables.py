"""MIFA's and FedVARP's device tables written run by run against stacked over a group's runs.

A step of batching a lockstep group's aggregation (issue 40, part 1): the runs of one
algorithm keep their `[N, d]` tables stacked as one `[runs, N, d]` tensor and write a round's
arrivals of all runs in one gather, one float64 difference and sum, and one `index_copy_`.
This measures both ways per run for `--runs` runs of `--devices` devices and a model of
`--dim` parameters (the digits MLP's 4,810), `k` arrivals a run, on one thread, and checks
that the stacked tables equal the tables written run by run bit for bit.

    python benchmarks/bench_stacked_tables.py [--runs 8] [--devices 100] [--dim 4810] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_cohort import machine  # noqa: E402


def per_run(tables, ids, deltas, lr):
    """MIFA's aggregation of each run on its own: G = -delta / lr written, the mean read."""
    for table, i, d in zip(tables, ids, deltas):
        table.write(i, -d / lr.unsqueeze(1), 1)
        table.mean()


def stacked(rows, total, flat_ids, deltas, lr):
    """The same for every run at once on `rows` [R, N, d] and `total` [R, d]."""
    runs, n, dim = rows.shape
    k = len(flat_ids) // runs
    fresh = (-torch.stack(deltas) / lr.view(1, k, 1)).reshape(runs * k, dim)
    flat = rows.view(runs * n, dim)
    total += (fresh.double() - flat.index_select(0, flat_ids).double()).view(runs, k, dim).sum(1)
    flat.index_copy_(0, flat_ids, fresh)
    return (total / n).to(rows.dtype)


def timed(fn, repeat: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def main() -> None:
    from fedsim.algorithms.table import DeviceTable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--dim", type=int, default=4810)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs, n, dim = args.runs, args.devices, args.dim
    record = {"machine": machine(), "runs": runs, "devices": n, "dim": dim, "rows": []}
    print(f"{'arrivals a run':>14} {'run by run':>12} {'stacked':>12} {'equal':>6}")
    for k in (10, 100):
        rng = np.random.default_rng(0)
        ids = [rng.permutation(n)[:k] for _ in range(runs)]
        deltas = [torch.randn(k, dim, generator=torch.Generator().manual_seed(r)) for r in range(runs)]
        lr = torch.full((k,), 0.1)
        tables = [DeviceTable(n, dim, torch.device("cpu")) for _ in range(runs)]
        rows, total = torch.zeros(runs, n, dim), torch.zeros(runs, dim, dtype=torch.float64)
        flat_ids = torch.as_tensor(np.concatenate([r * n + i for r, i in enumerate(ids)]))
        alone = timed(lambda: per_run(tables, ids, deltas, lr), args.repeat) / runs
        together = timed(lambda: stacked(rows, total, flat_ids, deltas, lr), args.repeat) / runs
        equal = all(torch.equal(t.rows, rows[r]) and torch.equal(t.total, total[r]) for r, t in enumerate(tables))
        print(f"{k:>14} {1e6 * alone:>9.1f} us {1e6 * together:>9.1f} us {str(equal):>6}")
        record["rows"].append({"arrivals": k, "per_run_us": round(1e6 * alone, 1),
                               "stacked_us_per_run": round(1e6 * together, 1), "bit_equal": equal})
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
