"""A run alone per round, before and after training rules 3 (fedsim/training/rules.py).

Rules 3 lay each device's parameters on a 64-byte boundary in a batched call (under rules 2 they
lay one model's size apart, so most sat off a 16-byte boundary, where MKL sums a matrix product
with the weight in another order), and compute the gradient of a stack of dense layers with
ReLUs between them (the MLP) in closed form instead of by reverse mode. Each checkout of
`--alternate` runs the same fedavg run alone (digits, 100 devices, 10 a round, 5 local steps of
32, ideal timing) at `--rounds` and at `--short` rounds, each in its own process, in turn,
`--repeat` times; the difference over the extra rounds is a round's cost with startup and the
end taken out. Medians are recorded.

    git archive c977a51 | tar -x -C /tmp/old      # the release before rules 3
    python benchmarks/bench_rules3.py --alternate /tmp/old . [--models logreg mlp mlp-37]
                                      [--repeat 3] [--rounds 210] [--short 10] [--json FILE]

`--steps` instead times one batched step of the mlp (hidden 64, batch 32, one thread) under
rules 2 (reverse mode) and rules 3 (closed form) in this checkout, at 10, 160 and 1,000 devices
(medians of 200 steps), on `--device` (cpu or cuda: benchmarks/gpu_checks.sh rules3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def seconds(code: Path, model: str, rounds: int) -> float:
    """Wall seconds of the run alone in this process, fedsim imported from `code`."""
    sys.path.insert(0, str(code.resolve()))
    import fedsim
    from fedsim.config import config_from_dict
    from fedsim.runs.experiment import Experiment

    assert Path(fedsim.__file__).resolve().is_relative_to(code.resolve()), fedsim.__file__
    name, _, hidden = model.partition("-")
    with tempfile.TemporaryDirectory() as out:
        config = config_from_dict({
            "run": {"rounds": rounds, "eval_every": rounds, "name": "r", "out": out, "progress": False, "plots": False},
            "data": {"dataset": "digits", "clients": 100},
            "model": {"name": name, **({"hidden": int(hidden)} if hidden else {})},
            "server": {"timing": "ideal", "clients_per_round": 10},
            "client": {"local_steps": 5, "batch_size": 32, "lr": 0.1}})
        t0 = time.perf_counter()
        Experiment(config, Path(out) / "r").run()
        return time.perf_counter() - t0


def per_round_ms(code: Path, model: str, rounds: int, short: int) -> float:
    """A round's milliseconds: two runs (`rounds`, `short`), each in a process of its own."""
    def one(n: int) -> float:
        done = subprocess.run([sys.executable, __file__, "--one", str(code), model, str(n)], check=True,
                              capture_output=True, text=True)
        return float(done.stdout.split()[-1])
    return 1e3 * (one(rounds) - one(short)) / (rounds - short)


def step_us(rules: int, devices: int, device: str = "cpu", repeats: int = 200) -> float:
    """Median microseconds of one batched step of the mlp under training `rules` on `device`."""
    import torch

    from fedsim.config import ModelConfig
    from fedsim.training.losses import weighted_cross_entropy
    from fedsim.training.models import build_model

    torch.set_num_threads(1)
    model = build_model(ModelConfig(name="mlp"), (1, 8, 8), 10, "digits", rules=rules)
    step = model.step_fn(weighted_cross_entropy, batched=True)
    g = torch.Generator().manual_seed(0)
    params = model.split(0.1 * torch.randn(devices, model.dim, generator=g).to(device))
    x, y = torch.randn(devices, 32, 1, 8, 8, generator=g), torch.randint(0, 10, (devices, 32), generator=g)
    weight, u = torch.rand(devices, 32, generator=g), torch.empty(devices, 32, 0)
    x, y, weight, u = (t.to(device) for t in (x, y, weight, u))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for i in range(repeats + 5):
        t0 = time.perf_counter()
        step(params, x, y, weight, u)
        sync()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alternate", type=Path, nargs="+", default=[Path(__file__).parent.parent], metavar="DIR")
    parser.add_argument("--models", nargs="+", default=["logreg", "mlp"], help="logreg, mlp or mlp-WIDTH")
    parser.add_argument("--rounds", type=int, default=210)
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--steps", action="store_true", help="time one mlp step under rules 2 and 3")
    parser.add_argument("--device", default="cpu", help="--steps: cpu or cuda")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps:
        rows = [{"devices": m, "device": args.device, "rules_2_us": round(step_us(2, m, args.device)),
                 "rules_3_us": round(step_us(3, m, args.device))} for m in (10, 160, 1000)]
        for row in rows:
            print(f"{row['devices']:>4} devices: reverse mode (rules 2) {row['rules_2_us']:>6} us, closed form (rules 3) "
                  f"{row['rules_3_us']:>6} us, {row['rules_2_us'] / row['rules_3_us']:.2f}x")
        if args.json:
            args.json.write_text(json.dumps({"steps": rows}, indent=2) + "\n")
        return
    if args.one:
        print(seconds(Path(args.one[0]), args.one[1], int(args.one[2])))
        return
    from bench_cohort import machine

    times: dict[tuple[str, str], list[float]] = {(str(c), m): [] for c in args.alternate for m in args.models}
    for _ in range(args.repeat):
        for model in args.models:
            for code in args.alternate:
                times[str(code), model].append(per_round_ms(code, model, args.rounds, args.short))
    record = {"rounds": args.rounds, "short": args.short, "repeat": args.repeat, "machine": machine(), "rows": []}
    print(f"{'model':<10} {'checkout':<40} {'ms per round (median)':>22}  all")
    for (code, model), values in times.items():
        median = statistics.median(values)
        record["rows"].append({"model": model, "code": code, "ms_per_round_median": round(median, 3),
                               "ms_per_round_all": [round(v, 3) for v in values]})
        print(f"{model:<10} {code:<40} {median:>22.3f}  {', '.join(f'{v:.3f}' for v in values)}")
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
