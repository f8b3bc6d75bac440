"""The per-run control plane of a lockstep study: host microseconds per run-round.

The runs of bench_study.py (fedavg, mifa, fedau, fedvarp x seeds; digits, mlp, 100 devices,
10 a round, ideal timing) in lockstep only, twice: with --rounds and with --short rounds; the
difference over the extra run-rounds is a run-round's cost with startup and the end taken out:
wall time, the wall time of the shared training calls, and the CPU time of the driving
thread (the control plane: servers, strategies, recorders; the shared training call runs in
pool threads).
`--sequential` also runs the same runs one after another (the same difference): the lockstep
study's speedup per run-round with startup taken out, the figure of issue 31's part 5; and
the speedup lockstep would reach if only its shared training calls were left (no control
plane at all): the ceiling of batching the control plane.
`--processes N [N ...]` also runs the study as `fedsim sweep --processes N` (a study file of the
same runs, its points stepped in lockstep by N worker processes side by side; N = 1: in the
sweep's own process), each at --rounds and --short rounds: the same difference, per run-round.
`--gpu-way` steps the lockstep studies as a GPU does (their receive steps and evaluations
together), on a CPU too: the host time of that way without a GPU's launches. `--ops` counts the torch ops of a run-round outside the shared training call (each a kernel
launched from the host on a GPU; views apart) as each run's server takes them, and as a GPU's
group takes them (its receive step together: `lockstep.rounding_allowed`, forced on a CPU).
`--profile` runs the long study under cProfile and prints where a run-round's time goes in
microseconds (cumulative, profiler overhead included). `--code DIR` imports fedsim from DIR
(another checkout); `--alternate DIR DIR ...` measures each checkout in turn, `--repeat` times,
each in its own process, and records the medians: on a shared machine, code before and after
see the same minutes.

    python benchmarks/bench_plane.py [--runs 16] [--rounds 60] [--short 10] [--repeat 3]
                                     [--sequential] [--processes N ...] [--profile] [--ops] [--gpu-way] [--code DIR]
                                     [--alternate DIR DIR ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# (label, file suffix, function) of the profile: cumulative time per run-round
PARTS = [("training (train_together)", "training/cohort.py", "train_together"),
         ("server round (all but training)", "sim/server.py", "round"),
         ("  online devices", "traces/queries.py", "online"),
         ("  strategy select", "algorithms/base.py", "select"),
         ("  strategy start parameters", "algorithms/base.py", "start_params"),
         ("  strategy receive (aggregate)", "algorithms/base.py", "receive"),
         ("    device tables (MIFA, FedVARP)", "algorithms/table.py", "write"),
         ("    server optimizer step", "algorithms/server_optimizer.py", "step"),
         ("  arrivals (rows, tensors)", "sim/server.py", "_arrivals"),
         ("  outcomes", "sim/server.py", "outcomes"),
         ("  wasted seconds (events)", "sim/events.py", "wasted_seconds"),
         ("callbacks (recorder, checks)", "runs/experiment.py", "_on_round"),
         ("  recorder row + counters + events", "results/recorder.py", "add_round"),
         ("  strategy metrics", "algorithms/mifa.py", "metrics"),
         ("divergence check (loss)", "runs/experiment.py", "_diverged"),
         ("non-finite model check", "sim/engine.py", "finite"),
         ("SimPy steps", "simpy/core.py", "step")]


DEVICE = "cpu"  # --device
GPU_WAY = False  # --gpu-way: lockstep steps its groups as on a GPU (`lockstep.rounding_allowed`)


def study(runs: int, rounds: int, out: Path, how: str = "together") -> tuple[float, float, float]:
    """Wall seconds of `runs` runs of `rounds` rounds in lockstep (bench_study.py's configs; or
    `how` = "sequential": one after another); the CPU seconds of the driving thread: the
    control plane, as the shared training call runs in pool threads (its one-thread parts), and
    less at the mercy of other jobs than wall time; and the wall seconds of the training calls
    (the shared calls in lockstep, each run's own one after another)."""
    import bench_study
    from fedsim.studies import lockstep
    from fedsim.training.trainer import Trainer

    owner, name = (lockstep, "train_together") if how == "together" else (Trainer, "train")
    training, call = [0.0], getattr(owner, name)
    if GPU_WAY:
        lockstep.rounding_allowed = lambda device: True

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            training[0] += time.perf_counter() - t0

    setattr(owner, name, timed)
    try:
        cpu = time.thread_time()
        wall = getattr(bench_study, how)(bench_study.configs(runs, rounds, DEVICE, out), out)[0]
        return wall, time.thread_time() - cpu, training[0]
    finally:
        setattr(owner, name, call)


def sweep(runs: int, rounds: int, out: Path, processes: int) -> float:
    """Wall seconds of `fedsim sweep --processes N` over bench_study.py's runs (a study file of
    them: its algorithms x seeds), with the process's start."""
    import subprocess

    from bench_study import ALGORITHMS
    from fedsim.config import dump_toml

    out.mkdir(parents=True)
    study = {"run": {"name": "s", "out": str(out), "rounds": rounds, "eval_every": rounds, "progress": False,
                     "plots": False, "device": DEVICE},
             "data": {"dataset": "digits", "clients": 100}, "model": {"name": "mlp"},
             "server": {"timing": "ideal", "clients_per_round": 10},
             "client": {"local_steps": 5, "batch_size": 32, "lr": 0.1},
             "sweep": {"algorithm.name": ALGORITHMS, "run.seed": list(range(runs // len(ALGORITHMS)))}}
    (out / "s.toml").write_text(dump_toml(study))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedsim", "sweep", str(out / "s.toml"), "--quiet", "--processes",
                    str(processes)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def alternate(args) -> dict:
    """Each checkout of --alternate measured in turn, --repeat times, in its own process."""
    import statistics
    import subprocess

    runs: dict[str, list[dict]] = {str(code): [] for code in args.alternate}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for code in args.alternate:
                out = Path(tmp) / f"{i}-{len(runs[str(code)])}-{code.name}.json"
                command = [sys.executable, __file__, "--runs", str(args.runs), "--rounds", str(args.rounds),
                           "--short", str(args.short), "--repeat", "1", "--code", str(code), "--json", str(out),
                           "--device", args.device]
                subprocess.run(command + (["--sequential"] if args.sequential else []), check=True,
                               stdout=subprocess.DEVNULL)
                runs[str(code)].append(json.loads(out.read_text()))
    from bench_cohort import machine

    record = {"runs": args.runs, "rounds": args.rounds, "short": args.short, "repeat": args.repeat,
              "machine": machine()}
    for code, done in runs.items():
        for key in ("us_per_run_round_best", "training_us_per_run_round_best", "driver_cpu_us_per_run_round_best",
                    "sequential_us_per_run_round_best", "sequential_training_us_per_run_round",
                    "speedup_if_only_training_were_left"):
            if key in done[0]:
                values = [d[key] for d in done]
                record[f"{code}: {key.replace('_best', '')} median"] = round(statistics.median(values), 1)
                record[f"{code}: {key.replace('_best', '')} all"] = values
        if args.sequential:
            record[f"{code}: speedup per run-round median"] = statistics.median(d["speedup_per_run_round"] for d in done)
    return record


def profile(runs: int, rounds: int, out: Path) -> list[dict]:
    profiler = cProfile.Profile()
    profiler.enable()
    wall = study(runs, rounds, out)[0]
    profiler.disable()
    from bench_study import part_seconds

    seconds = part_seconds(profiler, [*PARTS, ("server train", "sim/server.py", "train")])
    training = seconds.pop("server train")
    rows = []
    for label, sec in seconds.items():
        if label.startswith("server round"):  # a generator: its training is the driver's
            sec -= training
        rows.append({"part": label, "us_per_run_round": round(1e6 * sec / (runs * rounds), 1)})
    rows.append({"part": "whole (profiled)", "us_per_run_round": round(1e6 * wall / (runs * rounds), 1)})
    return rows


# ops that launch no kernel on a GPU: views and metadata (and a host number's read, counted apart)
VIEWS = {"view", "_unsafe_view", "unsqueeze", "squeeze", "expand", "select", "slice", "detach", "alias", "split",
         "split_with_sizes", "unbind", "t", "transpose", "permute", "as_strided", "flatten", "lift_fresh",
         "numpy_T", "resolve_conj", "resolve_neg", "_local_scalar_dense"}


def ops(runs: int, rounds: int, out: Path, gpu_way: bool) -> dict:
    """Torch ops a run-round on the driving thread outside the shared training call (each a kernel
    launched from the host on a GPU): as a CPU group steps them (each run's server alone), or the
    GPU's way (`gpu_way`: the group's receive step together, `lockstep.rounding_allowed`; each
    way forced, on a CPU or a GPU)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    import bench_study
    from fedsim.runs.experiment import Experiment
    from fedsim.studies import lockstep

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen, self.paused = Counter(), 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not self.paused:
                self.seen[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    counter, train, allowed = Count(), lockstep.train_together, lockstep.rounding_allowed

    def uncounted(*args, **kwargs):
        counter.paused += 1
        try:
            return train(*args, **kwargs)
        finally:
            counter.paused -= 1

    lockstep.train_together = uncounted
    lockstep.rounding_allowed = lambda device: gpu_way
    try:
        experiments = [Experiment(c, out / c.run.name, False) for c in bench_study.configs(runs, rounds, DEVICE, out)]
        with counter:
            lockstep.run_together(experiments)
    finally:
        lockstep.train_together, lockstep.rounding_allowed = train, allowed
    per = runs * rounds
    return {"ops": round(sum(counter.seen.values()) / per, 1),
            "kernel_ops": round(sum(n for name, n in counter.seen.items() if name not in VIEWS) / per, 1),
            "scalar_reads": round(counter.seen["_local_scalar_dense"] / per, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sequential", action="store_true", help="also the runs one after another")
    parser.add_argument("--processes", type=int, nargs="+", default=[], metavar="N",
                        help="also `fedsim sweep --processes N` of the same runs")
    parser.add_argument("--code", type=Path, help="import fedsim from this checkout")
    parser.add_argument("--alternate", type=Path, nargs="+", metavar="DIR", help="checkouts measured in turn")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (every study of the benchmark)")
    parser.add_argument("--gpu-way", action="store_true",
                        help="lockstep steps its groups as on a GPU (their receive steps and evaluations "
                             "together: to float rounding), here too")
    parser.add_argument("--ops", action="store_true",
                        help="also count the torch ops a run-round outside the shared training, each run's way "
                             "and the GPU's group receive (forced on a CPU)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    global DEVICE, GPU_WAY
    DEVICE, GPU_WAY = args.device, args.gpu_way
    for code in [*(args.alternate or []), *([args.code] if args.code else [])]:
        if not (code / "fedsim" / "__init__.py").is_file():  # (before any import of fedsim: --code picks which)
            print(f"error: {code} is not a fedsim checkout (no fedsim/__init__.py); give a folder made by "
                  "`git worktree add DIR COMMIT`", file=sys.stderr)
            raise SystemExit(2)
    from bench_study import show

    if args.alternate:
        load_before = os.getloadavg()
        record = alternate(args)
        record["loadavg_before"] = [round(x, 2) for x in load_before]
        record["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        show(record, args.json, str)
        return
    if args.code:
        sys.path.insert(0, str(args.code.resolve()))
    import fedsim
    from bench_cohort import machine

    load_before = os.getloadavg()
    record = {"code": str(Path(fedsim.__file__).parent.parent), "runs": args.runs, "rounds": args.rounds,
              "short": args.short, "device": args.device, "gpu_way": args.gpu_way, "machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        study(4, 2, Path(tmp) / "warm")
        per, plane, trained = [], [], []
        extra = args.runs * (args.rounds - args.short)
        for i in range(args.repeat):
            long = study(args.runs, args.rounds, Path(tmp) / f"long{i}")
            short = study(args.runs, args.short, Path(tmp) / f"short{i}")
            per.append(1e6 * (long[0] - short[0]) / extra)
            plane.append(1e6 * (long[1] - short[1]) / extra)
            trained.append(1e6 * (long[2] - short[2]) / extra)
        record["us_per_run_round"] = [round(x, 1) for x in per]
        record["us_per_run_round_best"] = round(min(per), 1)
        record["driver_cpu_us_per_run_round"] = [round(x, 1) for x in plane]
        record["driver_cpu_us_per_run_round_best"] = round(min(plane), 1)
        record["training_us_per_run_round"] = [round(x, 1) for x in trained]
        record["training_us_per_run_round_best"] = round(min(trained), 1)
        if args.sequential:
            alone = [study(args.runs, rounds, Path(tmp) / f"seq{rounds}", "sequential")
                     for rounds in (args.rounds, args.short)]
            record["sequential_us_per_run_round_best"] = round(1e6 * (alone[0][0] - alone[1][0]) / extra, 1)
            record["sequential_training_us_per_run_round"] = round(1e6 * (alone[0][2] - alone[1][2]) / extra, 1)
            record["speedup_per_run_round"] = round(record["sequential_us_per_run_round_best"] / min(per), 2)
            # what lockstep would reach if its control plane cost nothing: the shared training alone
            record["speedup_if_only_training_were_left"] = round(
                record["sequential_us_per_run_round_best"] / record["training_us_per_run_round_best"], 2)
        for n in args.processes:
            walls = [[sweep(args.runs, rounds, Path(tmp) / f"sweep{n}-{i}-{rounds}", n)
                      for rounds in (args.rounds, args.short)] for i in range(args.repeat)]
            record[f"sweep_processes_{n}_us_per_run_round"] = [round(1e6 * (a - b) / extra, 1) for a, b in walls]
            best = min(1e6 * (a - b) / extra for a, b in walls)
            record[f"sweep_processes_{n}_us_per_run_round_best"] = round(best, 1)
            if args.sequential:
                record[f"sweep_processes_{n}_speedup_per_run_round"] = round(
                    record["sequential_us_per_run_round_best"] / best, 2)
        if args.profile:
            record["profile"] = profile(args.runs, args.rounds, Path(tmp) / "profiled")
        if args.ops:
            for way, gpu_way in (("each_run", False), ("group_receive", True)):
                for key, value in ops(args.runs, args.rounds, Path(tmp) / f"ops-{way}", gpu_way).items():
                    record[f"{key}_per_run_round_{way}"] = value
    record["loadavg_before"] = [round(x, 2) for x in load_before]
    record["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    show(record, args.json, lambda row: f"{row['part']:<40} {row['us_per_run_round']:>9.1f} us")


if __name__ == "__main__":
    main()
