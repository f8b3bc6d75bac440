"""Where a second intra-op thread starts to pay: one training call at 1 thread vs all threads.

For each model and cohort size, one `Trainer.train` call (minibatches of 32, a few local steps)
is timed with torch at 1 thread and at the machine's default thread count; the call's size in
multiply-adds per gradient call (`Trainer.call_flops`, what `[run] threads = "auto"` decides
by) is printed beside the two times. The crossover is the smallest size from which every
larger call is MARGIN times faster with all threads (on an idle machine):
`fedsim.training.threads.CROSSOVER_FLOPS` is set from it. `--load K` runs K CPU-burning
processes beside the measurement (a shared machine), which shows why the margin.

    python benchmarks/bench_threads.py [--quick] [--load K] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_cohort import images_task, machine  # noqa: E402

from fedsim.config import ClientConfig  # noqa: E402
from fedsim.training import build_trainer  # noqa: E402
from fedsim.training.threads import CROSSOVER_FLOPS  # noqa: E402

CASES = {  # model -> (trainer path, cohort sizes, local steps per call)
    "logreg": ("batched", [1, 3, 10, 30, 100, 300, 1000], 5),
    "mlp": ("batched", [1, 3, 10, 30, 100, 300, 1000], 5),
    "lenet5": ("batched", [1, 3, 10, 30, 100], 2),
    "cnn-fmnist": ("loop", [1, 3], 1),
}
# All threads must beat one by this much on an idle machine to be worth it: beside busy
# processes a call on two threads was measured 5-50x slower at sizes where idle it gained
# only 1.1-1.3x (see --load).
MARGIN = 1.3


def time_call(trainer, ids, start, steps, threads: int, repeats: int) -> float:
    torch.set_num_threads(threads)
    trainer.train(0, ids, start, steps, 0.05)  # warm-up
    best = float("inf")
    for r in range(repeats):
        t0 = time.perf_counter()
        trainer.train(r + 1, ids, start, steps, 0.05)
        best = min(best, time.perf_counter() - t0)
    return best


def measure(model: str, path: str, clients: int, steps: int, most: int, repeats: int) -> dict:
    task = images_task(model, clients, torch.device("cpu"))
    trainer = build_trainer(task, ClientConfig(batch_size=32, trainer=path), seed=0)
    trainer.threads.active = False  # the benchmark sets the threads itself
    ids = np.arange(clients)
    start = task.init_params()[None].repeat(clients, 1)
    step_counts = np.full(clients, steps)
    one = time_call(trainer, ids, start, step_counts, 1, repeats)
    many = time_call(trainer, ids, start, step_counts, most, repeats)
    return {"model": model, "trainer": path, "clients": clients, "steps": steps,
            "call_flops": trainer.call_flops(ids), "s_1_thread": one, f"s_{most}_threads": many,
            "speedup": one / many}


def crossover(records: list[dict], margin: float) -> float:
    """The smallest call size from which every larger one is `margin` times faster with all threads."""
    ordered = sorted(records, key=lambda r: r["call_flops"])
    for i, rec in enumerate(ordered):
        if all(r["speedup"] >= margin for r in ordered[i:]):
            return rec["call_flops"]
    return float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--load", type=int, default=0, help="CPU-burning processes beside it")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    most = torch.get_num_threads()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    records = []
    try:
        print(f"machine: {machine()}, load: {args.load} busy processes")
        print(f"{'model':<11} {'path':<8} {'clients':>7} {'call MFLOP':>11} {'1 thread ms':>12} "
              f"{f'{most} threads ms':>13} {'speedup':>8}")
        for model, (path, cohorts, steps) in CASES.items():
            for clients in cohorts:
                rec = measure(model, path, clients, steps, most, 3 if args.quick else 7)
                records.append(rec)
                print(f"{model:<11} {path:<8} {clients:>7} {rec['call_flops'] / 1e6:>11.2f} "
                      f"{1e3 * rec['s_1_thread']:>12.2f} {1e3 * rec[f's_{most}_threads']:>13.2f} "
                      f"{rec['speedup']:>7.2f}x", flush=True)
    finally:
        for p in burners:
            p.kill()
    found = crossover(records, MARGIN)
    print(f"all threads faster from {crossover(records, 1.0) / 1e6:.1f} MFLOP per call, "
          f"{MARGIN}x faster from {found / 1e6:.1f} (in use: {CROSSOVER_FLOPS / 1e6:.1f})")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "load": args.load, "margin": MARGIN,
                                         "crossover_flops": found,
                                         "records": records}, indent=2) + "\n")


if __name__ == "__main__":
    main()
