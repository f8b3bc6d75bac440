"""Where a small run's time goes: imports, setup, rounds (training vs the rest), output.

Runs `fedsim run` in this process on the run of bench_peers.py (digits IID over 100 devices,
logreg, 5 local steps of 32 at lr 0.1, FedAvg) or on the built-in quick start, timing each
phase with wrappers around `Trainer.train`, the task's `evaluate` and the plots. The same
script runs against another checkout (PYTHONPATH=OTHER python benchmarks/bench_round_profile.py)
for before/after tables.

    python benchmarks/bench_round_profile.py [--setting small|large|quickstart] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
import fedsim.cli  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_peers import FEDSIM_TOML, RUN, SETTINGS  # noqa: E402  (the same run)

def timed(owner, name: str, spent: list[float]) -> None:
    """Wrap owner.name so that each call's seconds are appended to `spent`."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=["small", "large", "quickstart"], default="small")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    imported = time.perf_counter() - T0
    import polars as pl
    import torch  # noqa: F401  (imported by the run anyway; timed above through fedsim's own use)

    import fedsim.runs.experiment as experiment
    from fedsim.training.task import ClassificationTask
    from fedsim.training.trainer import Trainer

    train, evaluate, plots = [], [], []
    timed(Trainer, "train", train)
    timed(ClassificationTask, "evaluate", evaluate)
    timed(experiment, "draw_plots", plots)  # the wait for the plots (worker or here)
    out = tempfile.mkdtemp()
    if args.setting == "quickstart":
        argv = ["run", "--quiet", "--set", f"run.out={json.dumps(out)}"]
    else:
        setting = SETTINGS[args.setting]
        config = Path(out) / "profile.toml"
        config.write_text(FEDSIM_TOML.format(out=json.dumps(out), eval_every=setting["rounds"] // 10,
                                             **RUN, **setting))
        argv = ["run", str(config), "--quiet"]
    t = time.perf_counter()
    assert fedsim.cli.main(argv) == 0
    run_s = time.perf_counter() - t
    frames = [pl.read_parquet(p) for p in Path(out).rglob("rounds.parquet")]
    walls = [w for df in frames for w in df["wall_s"].to_list()]
    n = len(walls)
    record = {
        "setting": args.setting, "whole_s": time.perf_counter() - T0 + 0.03,  # + interpreter start
        "import_fedsim_cli_s": imported, "run_s": run_s, "rounds": n, "rounds_s": sum(walls),
        "first_round_s": frames[0]["wall_s"][0], "median_round_ms": 1e3 * statistics.median(walls),
        "train_ms_per_round": 1e3 * sum(train) / n, "evaluations": len(evaluate),
        "evaluate_ms_each": 1e3 * sum(evaluate) / max(len(evaluate), 1), "plots_s": sum(plots),
    }
    record["rest_of_round_ms"] = 1e3 * (record["rounds_s"] - sum(train)) / n
    for key, value in record.items():
        print(f"{key:<22} {value:.4g}" if isinstance(value, float) else f"{key:<22} {value}")
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
