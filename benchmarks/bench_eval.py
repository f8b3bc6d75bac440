"""What one `run.eval_every` evaluation costs against one training round, before and after.

For each model, one process builds the task on Fashion-MNIST (/usr/share/datasets/fashion-mnist;
random images of its shape, 60,000 + 10,000, where it is absent: the cost does not depend on
the pixels) over 100 clients and times, alternately, one round's training (10 clients x 5
local steps x minibatches of 32, the `auto` trainer) and one evaluation of the 10,000 test
images, each under the thread rule a run uses (`[run] threads`, `--threads`: auto); each time is the best
of `--repeats` after a warm-up, the ratio eval / round is what an evaluation costs in rounds.
`--group M` also times M runs (seeds 0..M-1) evaluated together (`evaluate_together`) against
one after another.

`--before REV` measures the code of a git revision too (extracted with `git archive` into a
temporary folder and imported from there, in its own process), so the table shows both.

    python benchmarks/bench_eval.py [--before REV] [--models a,b] [--group 8] [--threads auto|1]
        [--device cpu|cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = ["lenet5", "cnn-fmnist", "mlp"]


def _best(call, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return min(times)


def worker(model: str, group: int, repeats: int, device_name: str, threads_setting: str) -> dict:
    """The measurement, in the process of the code under test (imports from PYTHONPATH)."""
    import numpy as np
    import torch

    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.data.datasets import Dataset, load_dataset
    from fedsim.training import ThreadPolicy, build_trainer
    from fedsim.training.task import classification_task

    device = torch.device(device_name)
    data = DataConfig(dataset="fashion-mnist", clients=100)
    try:
        dataset, real = load_dataset(data, 0), True
    except Exception:  # absent here: same-shape random images
        rng = np.random.default_rng(0)
        x, y = rng.integers(0, 256, (70000, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 70000)
        dataset, real = Dataset("fashion-mnist", x[:60000], y[:60000], x[60000:], y[60000:], 10, scale=1 / 255), False
    tasks = [classification_task(dataset, data, ModelConfig(name=model), seed=s, device=device)
             for s in range(max(group, 1))]
    task = tasks[0]
    threads = ThreadPolicy(threads_setting, device)
    trainer = build_trainer(task, ClientConfig(batch_size=32, local_steps=5), seed=0, threads=threads)
    params = task.init_params()
    ids, start, steps = np.arange(10), params[None].repeat(10, 1), np.full(10, 5)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def train():
        trainer.train(1, ids, start, steps, 0.05)
        sync()

    def evaluate(t=task, p=params):
        with threads.work(t.evaluate_flops()):
            return t.evaluate(p)

    rounds, evals = [], []
    with threads.scope():
        train(), evaluate()  # warm-ups
        for _ in range(repeats):  # alternately: a change of load hits both alike
            rounds.append(_best(train, 1))
            evals.append(_best(evaluate, 1))
        record = {"model": model, "fashion_mnist": real, "test_images": len(task.data.y_test),
                  "round_s": min(rounds), "eval_s": min(evals)}
        if group > 1:
            runs = [(t, t.init_params()) for t in tasks]
            try:
                from fedsim.training.group_eval import evaluate_together
            except ImportError:
                evaluate_together = None
            alone = _best(lambda: [evaluate(t, p) for t, p in runs], max(1, repeats // 2))
            record |= {"group": group, "group_alone_s": alone}
            if evaluate_together is not None:
                record["group_together_s"] = _best(lambda: evaluate_together(runs, threads), max(1, repeats // 2))
                pairs = zip(evaluate_together(runs, threads), (t.evaluate(p) for t, p in runs))
                record["group_max_diff"] = max(abs(a - b) for x, y in pairs for a, b in zip(x, y))
    record["eval_rounds"] = record["eval_s"] / record["round_s"]
    return record


def measure(code: Path, label: str, args) -> list[dict]:
    out = []
    for model in args.models.split(","):
        cmd = [sys.executable, __file__, "--worker", model, "--group", str(args.group), "--repeats",
               str(args.repeats), "--device", args.device, "--threads", args.threads]
        env = {**os.environ, "PYTHONPATH": str(code)}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=code)
        if done.returncode:
            sys.exit(f"error: {label} {model}: {done.stderr.strip().splitlines()[-1]}")
        out.append({"code": label, **json.loads(done.stdout.strip().splitlines()[-1])})
    return out


def machine(device: str) -> str:
    names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
    load = os.getloadavg()[0]
    return f"{names[0] if names else '?'} x {os.cpu_count()} cores, load {load:.1f}, device {device}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="git revision whose code to measure too (e.g. main)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--group", type=int, default=8, help="runs evaluated together (0: skip)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", default="auto",
                        help="[run] threads of the calls (1: steadier beside other jobs than auto's 2)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.group, args.repeats, args.device, args.threads)))
        return
    print(f"machine: {machine(args.device)}, threads {args.threads}", flush=True)
    records = []
    with tempfile.TemporaryDirectory() as old:
        if args.before:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "fedsim"], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
            records += measure(Path(old), f"before ({args.before})", args)
        records += measure(REPO, "after", args)
    print(f"{'code':<18} {'model':<11} {'round s':>8} {'eval s':>8} {'eval/round':>10} "
          f"{'group':>5} {'alone s':>8} {'together s':>10} {'max diff':>8}")
    for r in records:
        together = f"{r['group_together_s']:>10.3f}" if "group_together_s" in r else f"{'-':>10}"
        alone = f"{r['group_alone_s']:>8.3f}" if "group_alone_s" in r else f"{'-':>8}"
        print(f"{r['code']:<18} {r['model']:<11} {r['round_s']:>8.3f} {r['eval_s']:>8.3f} {r['eval_rounds']:>10.2f} "
              f"{r.get('group', 0):>5} {alone} {together} {r.get('group_max_diff', float('nan')):>8.1e}")
    print(f"machine at the end: {machine(args.device)}; Fashion-MNIST: "
          f"{'real' if all(r['fashion_mnist'] for r in records) else 'same-shape random images'}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(args.device), "threads": args.threads, "records": records},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
