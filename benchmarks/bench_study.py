"""A study's runs stepped together (one batched training call per round for all of them)
against the same runs one after another in one process, and with Ray.

16 runs by default (4 algorithms x 4 seeds; digits, mlp, 100 devices, 10 a round, 300
rounds, ideal timing); `--runs 32` for 8 seeds; `--model lenet5 --dataset fashion-mnist` for
runs whose cohorts train on the loop trainer on a CPU (a model's convolutions on 28x28 images). Prints a table; --json FILE writes it.
`--load K` runs K CPU-burning processes beside it (a shared machine); the load averages
before and after are recorded. `--profile` also runs the lockstep study under cProfile and
prints where its host time goes (training, SimPy, selection, strategy, callbacks, events).

    python benchmarks/bench_study.py [--runs 16|32] [--rounds 300] [--ray] [--device cpu|cuda]
                                     [--model mlp] [--dataset digits] [--load K] [--profile [--profile-dump FILE]]
                                     [--json FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_cohort import machine  # noqa: E402

ALGORITHMS = ["fedavg", "mifa", "fedau", "fedvarp"]


def configs(runs: int, rounds: int, device: str, out: Path, model: str = "mlp", dataset: str = "digits"):
    from fedsim.config import config_from_dict

    seeds = runs // len(ALGORITHMS)
    return [config_from_dict({
        "run": {"name": f"{a}-{s}", "out": str(out), "rounds": rounds, "eval_every": rounds,
                "seed": s, "progress": False, "plots": False, "device": device},
        "data": {"dataset": dataset, "clients": 100},
        "model": {"name": model},
        "server": {"timing": "ideal", "clients_per_round": 10},
        "client": {"local_steps": 5, "batch_size": 32, "lr": 0.1},
        "algorithm": {"name": a},
    }) for a in ALGORITHMS for s in range(seeds)]


def sequential(cfgs, out: Path) -> tuple[float, list]:
    from fedsim.runs.experiment import Experiment

    t0 = time.perf_counter()
    results = [Experiment(c, out / "seq" / c.run.name, False).run() for c in cfgs]
    return time.perf_counter() - t0, results


def together(cfgs, out: Path) -> tuple[float, list]:
    from fedsim.runs.experiment import Experiment
    from fedsim.studies.lockstep import run_together

    t0 = time.perf_counter()
    results = run_together([Experiment(c, out / "together" / c.run.name, False) for c in cfgs])
    return time.perf_counter() - t0, results


# Where a lockstep round's host time goes: (label, file suffix, function), cumulative seconds.
PARTS = [("training (Trainer.train: a run alone)", "training/trainer.py", "train"),
         ("a round's server work (training is the driver's)", "sim/server.py", "round"),
         ("  selection", "algorithms/base.py", "select"),
         ("  strategy (receive: aggregate)", "algorithms/base.py", "receive"),
         ("  events of the round", "sim/events.py", "task_events"),
         ("callbacks (evaluation, recorder, checkpoints)", "runs/experiment.py", "_on_round"),
         ("SimPy steps (server, callbacks, engine)", "simpy/core.py", "step"),
         ("start (outputs, first checkpoint)", "runs/experiment.py", "start"),
         ("end (evaluation, tables, model)", "runs/experiment.py", "end")]


def part_seconds(profiler: cProfile.Profile, parts) -> dict[str, float]:
    """Cumulative seconds of each (label, file suffix, function) of `parts` in a profile."""
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, _, tottime, cumtime, _)}
    return {label: sum(v[3] for (f, _, name), v in stats.items() if f.endswith(suffix) and name == fn)
            for label, suffix, fn in parts}


def profile(cfgs, out: Path, dump: Path | None = None) -> list[dict]:
    """The lockstep study under cProfile: cumulative seconds of PARTS, and their share (the
    whole profile to `dump`, for pstats). The shared training and evaluation calls are timed
    by the clock around them (host time to return: a GPU's kernels may still run): cProfile
    under Python 3.12 attributed 0 s to them on the GPU machine, whatever they took."""
    import fedsim.studies.lockstep as lockstep

    spent = {"train_together": 0.0, "evaluate_together": 0.0}
    originals = {name: getattr(lockstep, name) for name in spent}

    def timed(name, call):
        def clocked(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        return clocked

    for name, call in originals.items():
        setattr(lockstep, name, timed(name, call))
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        wall, _ = together(cfgs, out / "profiled")
        profiler.disable()
    finally:
        for name, call in originals.items():
            setattr(lockstep, name, call)
    if dump:
        profiler.dump_stats(dump)
    cumulative = {"training (train_together, by the clock)": spent["train_together"],
                  "evaluation (evaluate_together, by the clock)": spent["evaluate_together"],
                  **part_seconds(profiler, PARTS)}
    return [{"part": label, "s": round(sec, 2), "share": round(sec / wall, 3)} for label, sec in cumulative.items()]


def with_ray(runs: int, rounds: int, device: str, out: Path) -> float:
    """The same study through `fedsim sweep --backend ray` (local Ray, a worker per core)."""
    from fedsim.config import dump_toml
    from fedsim.studies.study import load_study
    from fedsim.studies.sweep import run_study

    study = {"run": {"name": "ray", "out": str(out / "ray"), "rounds": rounds, "eval_every": rounds,
                     "progress": False, "plots": False, "device": device},
             "data": {"dataset": "digits", "clients": 100}, "model": {"name": "mlp"},
             "server": {"timing": "ideal", "clients_per_round": 10},
             "client": {"local_steps": 5, "batch_size": 32, "lr": 0.1},
             "sweep": {"algorithm.name": ALGORITHMS, "run.seed": list(range(runs // len(ALGORITHMS)))}}
    path = out / "study.toml"
    path.write_text(dump_toml(study))
    t0 = time.perf_counter()
    run_study(load_study(str(path)), progress=False, backend="ray")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="mlp", help="every run's [model] name")
    parser.add_argument("--dataset", default="digits", help="every run's [data] dataset")
    parser.add_argument("--ray", action="store_true", help="also through the Ray backend")
    parser.add_argument("--load", type=int, default=0, help="CPU-burning processes beside it")
    parser.add_argument("--profile", action="store_true", help="also profile the lockstep study")
    parser.add_argument("--profile-dump", type=Path, help="with --profile: the whole profile to this file (pstats)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    load_before = os.getloadavg()
    try:
        record = measure(args)
    finally:
        for p in burners:
            p.kill()
    record.update(machine=machine(), load=args.load, loadavg_before=[round(x, 2) for x in load_before],
                  loadavg_after=[round(x, 2) for x in os.getloadavg()])
    print(f"machine: {machine()}, python {platform.python_version()}")
    show(record, args.json, lambda row: f"{row['part']:<50} {row['s']:>8.2f} s {100 * row['share']:>5.1f} %")


def show(record: dict, path: Path | None, profile_row) -> None:
    """Print the record (its profile's rows as `profile_row` words them); JSON to `path`."""
    for key, value in record.items():
        if key != "profile":
            print(f"{key:<30} {value}")
    for row in record.get("profile", []):
        print("  " + profile_row(row))
    if path:
        path.write_text(json.dumps(record, indent=2) + "\n")


def measure(args) -> dict:
    """Both ways (and Ray, the profile, if asked): the record of the table."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cfgs = configs(args.runs, args.rounds, args.device, out, args.model, args.dataset)
        seq_s, seq = sequential(cfgs, out)
        tog_s, tog = together(cfgs, out)
        pairs = [(a.params.cpu().numpy(), b.params.cpu().numpy()) for a, b in zip(seq, tog)]
        # elementwise (0 on a CPU: bit-identical) and as a whole (on a GPU the stacked calls pick
        # other kernels, so runs agree to float rounding, amplified over the rounds)
        worst = max(float(np.max(np.abs(a - b) / (np.abs(a) + 1e-6))) for a, b in pairs)
        worst_norm = max(float(np.linalg.norm(a - b) / np.linalg.norm(a)) for a, b in pairs)
        record = {"runs": args.runs, "rounds": args.rounds, "device": args.device, "model": args.model,
                  "dataset": args.dataset, "paths": sorted({json.loads((r.run_dir / "manifest.json").read_text())["trainer"]["path"] for r in tog}),
                  "sequential_s": round(seq_s, 2), "together_s": round(tog_s, 2),
                  "speedup": round(seq_s / tog_s, 2),
                  "per_run_round_ms_sequential": round(1000 * seq_s / (args.runs * args.rounds), 3),
                  "per_run_round_ms_together": round(1000 * tog_s / (args.runs * args.rounds), 3),
                  "max_relative_difference": worst, "max_norm_relative_difference": worst_norm}
        if args.ray:
            record["ray_s"] = round(with_ray(args.runs, args.rounds, args.device, out), 2)
        if args.profile:
            record["profile"] = profile(cfgs, out, args.profile_dump)
    return record


if __name__ == "__main__":
    main()
