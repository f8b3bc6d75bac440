"""fedsim at the published settings of FLUTE and BlazeFL: the same model, clients, cohort,
local work and rounds, timed through `fedsim run` and set beside the published time.

The real datasets are not on this machine: each setting trains on generated data of the same
shape (image size, classes, clients, samples a client, test share), which costs the same to
train on; the accuracy is meaningless. The data are written once per invocation (or kept in
`--data DIR` for the next one) in a layout fedsim reads: images as PNG in a Parquet folder,
Shakespeare as LEAF files.

Timed: `rounds` = the sum of rounds.parquet's wall_s (selection, the cohort's training,
aggregation); `loop` = the run's host_s (the rounds plus evaluations every eval_every rounds,
recording and the final writes). Printed apart: generating the data, and `startup` (the
process: imports, reading the data, building the model, CUDA's start). A run of fewer rounds
than the published count is extrapolated: round 0 (one-time costs) + the mean of the others
x the remaining rounds; the loop's other costs (evaluations) in proportion to the evaluations.
The lower bound is the training arithmetic alone: fedsim's training FLOPs per sample (3 x
forward) x the samples trained / the device's fp32 rate (a table for known GPUs, else a large
matmul measured once).

    python benchmarks/bench_published.py --quick                       # all four, tiny, any CPU
    python benchmarks/bench_published.py --device cuda --rounds 300 --settings femnist-cnn
    python benchmarks/bench_published.py --device cuda --set client.trainer=batched --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))

# fp32 (non-tensor-core) peak FLOP/s of known GPUs, by a part of torch's device name
GPU_FP32 = {"H100 PCIe": 51.2e12, "H100": 67e12, "H200": 67e12, "A100": 19.5e12, "L4": 30.3e12}


@dataclass
class Setting:
    """One published setting and the generated data of its shape."""

    model: str
    clients: int
    per_round: int  # 0: every client, every round
    batch: int
    epochs: float  # local epochs a round ([client] local_epochs): ceil(n_i / batch) steps each
    rounds: int
    lr: float
    data: dict  # how to generate: images (shape, classes) or shakespeare
    samples: float  # mean training samples a client
    test_share: float  # of each client's rows held out for testing
    published: dict  # who -> seconds for `published_rounds` rounds
    published_rounds: int
    target_s: float  # for `rounds` rounds on one H100
    source: str
    spread: float = 0.5  # lognormal sigma of the clients' sizes (0: all equal)
    weight_decay: float = 0.001
    eval_every: int = 50
    quick: dict = field(default_factory=dict)  # --quick: overrides of the fields above

    def scaled(self, **changes) -> "Setting":
        return Setting(**{**self.__dict__, **changes})


SETTINGS = {
    # FLUTE's CNN_FEMNIST row (FedML's config: TFF's EMNIST-62, 3,400 writers, 671,585 training
    # samples = 198 a writer; 1 epoch of batch 20, lr 0.1, weight decay 0.001, test every 50)
    "femnist-cnn": Setting(
        model="cnn-femnist", clients=3400, per_round=10, batch=20, epochs=1, rounds=1500, lr=0.1,
        data={"shape": (28, 28), "classes": 62}, samples=198, test_share=0.1,
        published={"FLUTE": 8 * 60 + 22, "FedML": 5 * 3600 + 49 * 60 + 52}, published_rounds=800, target_s=30,
        source="FLUTE's README table; its experiments/cv_cnn_femnist config (and FedML's beside it) runs 800 "
               "rounds, so its time is scaled to the issue's 1,500",
        quick={"clients": 20, "rounds": 2, "per_round": 2, "samples": 40}),
    # FedML's fed_shakespeare as FLUTE reads it: 715 roles, 16,068 training snippets (lines), each
    # cut into padded sequences of 80 characters: about 3 a snippet (the snippets' lengths are not
    # at hand: an estimate), 67 a role; 1 epoch of batch 4, lr 0.8
    "shakespeare-lstm": Setting(
        model="char-lstm", clients=715, per_round=10, batch=4, epochs=1, rounds=1200, lr=0.8,
        data={"leaf": "shakespeare"}, samples=67, test_share=0.13, spread=1.0,
        published={"FLUTE": 21 * 60 + 50, "FedML": 6 * 3600 + 46 * 60 + 21}, published_rounds=1200, target_s=120,
        source="FLUTE's README (experiments/nlp_rnn_fedshakespeare, batch 4, 1 epoch)",
        quick={"clients": 10, "rounds": 2, "per_round": 1, "samples": 8}),
    # Fed-CIFAR100 (TFF): 500 clients x 100 training images, 1 epoch of batch 20, lr 0.1
    "resnet18-cifar100": Setting(
        model="resnet18-gn", clients=500, per_round=10, batch=20, epochs=1, rounds=4000, lr=0.1,
        data={"shape": (3, 32, 32), "classes": 100}, samples=100, test_share=1 / 6, spread=0.0,
        published={"FLUTE": 3600 + 42 * 60 + 1, "FedML": 15 * 3600 + 55 * 60 + 36}, published_rounds=4000,
        target_s=600, source="FLUTE's README (experiments/cv_resnet_fedcifar100)",
        quick={"clients": 15, "rounds": 2, "per_round": 1, "batch": 4, "samples": 8}),
    # BlazeFL's README benchmark: CIFAR-10 over 100 clients (500 images each, 80 % trained),
    # all of them every round, 5 epochs of batch 50 (8 steps each); ~25 s for 5 rounds at its best
    "cifar10-blazefl": Setting(
        model="lenet5", clients=100, per_round=0, batch=50, epochs=5, rounds=50, lr=0.01,
        data={"shape": (3, 32, 32), "classes": 10}, samples=400, test_share=0.2, spread=0.0,
        published={"BlazeFL": 5 * 60 / 12, "Flower": 5 * 60 / 4.6}, published_rounds=5, target_s=50 * 60 / 40,
        weight_decay=0.0, eval_every=1_000_000, source="BlazeFL's README chart (16 threads, 4 Quadro RTX 6000)",
        quick={"clients": 4, "rounds": 3, "epochs": 1, "batch": 10, "samples": 40}),
}


# --- the data --------------------------------------------------------------------------------

def client_sizes(setting: Setting, seed: int = 0) -> np.ndarray:
    """Rows (training + test) of each client: the published mean, spread lognormally where the
    clients differ in size (FEMNIST's writers, Shakespeare's roles: the spread is a guess, the
    mean is not; it is what a round costs), or all equal."""
    mean = setting.samples / (1 - setting.test_share)
    if not setting.spread:
        return np.full(setting.clients, round(mean), dtype=np.int64)
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(0.0, setting.spread, setting.clients)
    return np.maximum(2, np.round(raw * mean / raw.mean())).astype(np.int64)


def generate(setting: Setting, folder: Path) -> tuple[dict, float]:
    """The [data] keys of the setting's generated data in `folder`, and the seconds writing it
    took (nothing when `folder` already holds it: a kept --data folder)."""
    start = time.perf_counter()
    sizes = client_sizes(setting)
    done = folder / "done"
    if "leaf" in setting.data:
        if not done.exists():
            from leaf_files import write_leaf

            trains = np.maximum(1, np.round(sizes * (1 - setting.test_share))).astype(int).tolist()
            test_size = max(1, round(setting.samples * setting.test_share / (1 - setting.test_share)))
            write_leaf(folder, "shakespeare", [trains[k:k + 100] for k in range(0, len(trains), 100)], test_size)
        keys = {"dataset": "shakespeare", "root": str(folder)}
    else:
        if not done.exists():
            from leaf_files import write_image_parquet

            write_image_parquet(folder / "train.parquet", sizes, setting.data["shape"], setting.data["classes"])
        keys = {"dataset": "parquet", "root": str(folder), "client_column": "client", "label_column": "label",
                "feature_column": "image", "test_fraction": setting.test_share}
    done.touch()
    return {**keys, "clients": setting.clients}, time.perf_counter() - start


# --- the arithmetic ----------------------------------------------------------------------------

def train_flops_per_sample(setting: Setting) -> float:
    """fedsim's own count (the device clock's): 3 x the forward pass, 2 FLOPs a multiply-add."""
    from fedsim.config import ModelConfig
    from fedsim.data.text import LEAF_LETTERS
    from fedsim.training.architectures import TokenShape
    from fedsim.training.models import build_model

    if "leaf" in setting.data:
        shape, classes = TokenShape(80, len(LEAF_LETTERS)), len(LEAF_LETTERS)
    else:
        dims = setting.data["shape"]
        shape, classes = (dims if len(dims) == 3 else (1, *dims)), setting.data["classes"]
    return 6.0 * build_model(ModelConfig(name=setting.model), shape, classes, "generated").flops


def samples_per_round(setting: Setting) -> int:
    cohort = setting.per_round or setting.clients
    return round(cohort * setting.epochs * setting.samples)  # the cohort's epochs over its mean share


def lower_bound_s(flops_per_sample: float, samples: float, rate: float) -> float:
    """Seconds the training arithmetic alone takes at the device's fp32 peak."""
    return flops_per_sample * samples / rate


def evaluations(rounds: int, eval_every: int) -> int:
    """Evaluations of a run: before round 1, every eval_every rounds and after the last, and the
    final scoring of every device on its own tests (these datasets have their own clients)."""
    return 2 + math.ceil(rounds / min(eval_every, rounds))


def extrapolate(wall_s: list[float], loop_s: float, rounds: int, eval_every: int) -> dict:
    """Times of `rounds` rounds from the timed ones: round 0 (one-time costs: kernel choice,
    allocation, capture) plus the mean of the later rounds for each remaining round; the loop's
    other costs (mostly evaluations) in proportion to the evaluations. Exact when all were timed."""
    timed = len(wall_s)
    steady = float(np.mean(wall_s[1:])) if timed > 1 else float(wall_s[0])
    rounds_s = float(wall_s[0]) + (rounds - 1) * steady
    other = max(loop_s - float(np.sum(wall_s)), 0.0)
    scale = evaluations(rounds, eval_every) / evaluations(timed, eval_every)
    return {"steady_s_per_round": steady, "rounds_s": rounds_s, "loop_s": rounds_s + other * scale}


def fp32_rate(device: str) -> tuple[float, str]:
    """FLOP/s of fp32 on `device`: a known GPU's peak, else a large matmul measured (TF32 off)."""
    import torch

    if device == "cuda":
        name = torch.cuda.get_device_name()
        known = next((rate for part, rate in GPU_FP32.items() if part in name), None)
        if known:
            return known, f"{name}: fp32 peak {known / 1e12:.1f} TFLOP/s (datasheet, non-tensor)"
        torch.backends.cuda.matmul.allow_tf32 = False
    n = 2048 if device == "cpu" else 8192
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    best = math.inf
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    rate = 2 * n**3 / best
    return rate, f"{device}: fp32 matmul {n}x{n} measured at {rate / 1e12:.3f} TFLOP/s"


class RunFailed(Exception):
    """A setting's `fedsim run` ended with an error (its last line): the others still run."""


# --- one run -----------------------------------------------------------------------------------

def config(setting: Setting, name: str, data: dict, rounds: int, device: str, out: Path) -> dict:
    return {
        "run": {"name": name, "out": str(out), "seed": 0, "rounds": rounds, "device": device,
                "eval_every": min(setting.eval_every, rounds), "progress": False, "plots": False},
        "data": data,
        "model": {"name": setting.model},
        "trace": {"source": "always"},
        "server": {"timing": "ideal", "round_duration": 1.0, "clients_per_round": setting.per_round},
        "client": {"local_epochs": setting.epochs, "batch_size": setting.batch, "lr": setting.lr,
                   "weight_decay": setting.weight_decay},
        "algorithm": {"name": "fedavg"},
    }


def time_run(setting: Setting, name: str, data: dict, rounds: int, device: str, sets: list[str],
             out: Path) -> dict:
    """`fedsim run` of the setting in a fresh process: its rounds' wall_s, host_s and the process's."""
    import polars as pl

    from fedsim.config import dump_toml

    path = out / f"{name}.toml"
    path.write_text(dump_toml(config(setting, name, data, rounds, device, out)))
    command = [sys.executable, "-m", "fedsim", "run", str(path), "--quiet", *(a for s in sets for a in ("--set", s))]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=out)
    process_s = time.perf_counter() - start
    if done.returncode:
        lines = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        raise RunFailed(f"{name}: fedsim run failed: {lines[-1]}")
    run = out / name
    wall_s = pl.read_parquet(run / "rounds.parquet")["wall_s"].to_list()
    manifest = json.loads((run / "manifest.json").read_text())
    return {"wall_s": wall_s, "host_s": manifest["host_s"], "process_s": process_s}


def measure(key: str, setting: Setting, rounds: int, device: str, sets: list[str], data_root: Path,
            out: Path, rate: float) -> dict:
    data, gen_s = generate(setting, data_root / f"{key}-{setting.clients}x{setting.samples:g}")
    run = time_run(setting, key, data, rounds, device, sets, out)
    full = extrapolate(run["wall_s"], run["host_s"], setting.rounds, setting.eval_every)
    flops = train_flops_per_sample(setting)
    bound = lower_bound_s(flops, samples_per_round(setting) * setting.rounds, rate)
    published = {who: s * setting.rounds / setting.published_rounds for who, s in setting.published.items()}
    return {
        "setting": key, "model": setting.model, "clients": setting.clients, "per_round": setting.per_round,
        "local_epochs": setting.epochs, "batch": setting.batch, "rounds_full": setting.rounds,
        "rounds_timed": len(run["wall_s"]), "timed_rounds_s": float(np.sum(run["wall_s"])),
        "timed_loop_s": run["host_s"], "startup_s": run["process_s"] - run["host_s"], "data_gen_s": gen_s,
        **full, "train_flops_per_sample": flops, "samples_per_round": samples_per_round(setting),
        "lower_bound_s": bound, "fraction_of_bound": bound / full["loop_s"],
        "rounds_per_min": 60 * setting.rounds / full["loop_s"],
        "published_s": published, "published_rounds": setting.published_rounds, "source": setting.source,
        "target_s": setting.target_s, "meets_target": full["loop_s"] <= setting.target_s,
        "sets": sets, "device": device,
    }


def rounds_to_time(text: str) -> dict[str, int]:
    """--rounds: "" (the published counts), "N" (every setting) or "SETTING=N,..." -> {key: N}
    ("" for every setting)."""
    if not text:
        return {}
    parts = [p.partition("=") for p in text.split(",")]
    pairs = {key if sep else "": value if sep else key for key, sep, value in parts}
    unknown = [key for key in pairs if key and key not in SETTINGS]
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r}; choose from {', '.join(SETTINGS)}")
    rounds = {key: int(value) if value.strip().isdigit() else 0 for key, value in pairs.items()}
    if not all(rounds.values()):
        raise ValueError("give a positive whole number of rounds, e.g. 300 or femnist-cnn=300,cifar10-blazefl=10")
    return rounds


# --- the report ------------------------------------------------------------------------------

def machine(device: str) -> dict:
    import torch

    names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")] \
        if os.path.exists("/proc/cpuinfo") else []
    info = {"cpu": f"{names[0] if names else platform.machine()} x {os.cpu_count()} cores",
            "torch": torch.__version__, "python": platform.python_version()}
    if device == "cuda":
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    return info


def minutes(s: float) -> str:
    if s < 1:
        return f"{1000 * s:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{int(s // 60)} min {s % 60:02.0f} s" if s < 3600 else f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def report(r: dict) -> str:
    """One setting's block: what was timed, the published count's time, the bound, the peers."""
    cohort = f"{r['per_round']} a round" if r["per_round"] else "all every round"
    full = "measured" if r["rounds_timed"] == r["rounds_full"] else "EXTRAPOLATED"
    ratio = ", ".join(f"{who} {minutes(s)} ({s / r['loop_s']:.1f}x fedsim's)" for who, s in r["published_s"].items())
    if r["published_rounds"] != r["rounds_full"]:
        ratio += f" (published for {r['published_rounds']:,} rounds, scaled to {r['rounds_full']:,})"
    return "\n".join([
        f"{r['setting']}: {r['model']}, {r['clients']:,} clients, {cohort}, {r['local_epochs']:g} local "
        f"epoch{'' if r['local_epochs'] == 1 else 's'} of {r['batch']}, {r['rounds_full']:,} rounds"
        + ("  [--quick]" if r["quick"] else ""),
        f"  timed {r['rounds_timed']:,} rounds: rounds {r['timed_rounds_s']:.2f} s "
        f"({1000 * r['steady_s_per_round']:.1f} ms a round after the first), loop {r['timed_loop_s']:.2f} s; "
        f"apart: startup {r['startup_s']:.1f} s, data generation {r['data_gen_s']:.1f} s",
        f"  {r['rounds_full']:,} rounds, {full}: rounds {minutes(r['rounds_s'])}, loop {minutes(r['loop_s'])} "
        f"({r['rounds_per_min']:.1f} rounds/min)",
        f"  lower bound {minutes(r['lower_bound_s'])} ({r['train_flops_per_sample'] / 1e6:,.1f} MFLOP a sample x "
        f"{r['samples_per_round'] * r['rounds_full']:,} samples / {r['bound_rate'] / 1e12:.3g} TFLOP/s): "
        f"fedsim's loop at {100 * r['fraction_of_bound']:.1f} % of it",
        f"  published: {ratio}; target {minutes(r['target_s'])}: {verdict(r)}",
    ])


def verdict(r: dict) -> str:
    return "n/a (--quick)" if r["meets_target"] is None else "met" if r["meets_target"] else "NOT met"


def table(records: list[dict]) -> str:
    """The summary: one line a setting."""
    lines = [f"{'setting':<18} {'timed':>6} {'rounds':>7} {'full loop':>14} {'bound':>10} {'of bound':>8} "
             f"{'published':>14} {'target':>10} {'':>8}"]
    for r in records:
        who, published = next(iter(r["published_s"].items()))
        lines.append(f"{r['setting']:<18} {r['rounds_timed']:>6} {r['rounds_full']:>7} {minutes(r['loop_s']):>14} "
                     f"{minutes(r['lower_bound_s']):>10} {100 * r['fraction_of_bound']:>7.1f}% "
                     f"{who + ' ' + minutes(published):>14} {minutes(r['target_s']):>10} {verdict(r):>8}")
    return "\n".join(lines)


def fail(message: str) -> None:
    """Bad input: one line, exit status 2, before anything is written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: " + ", ".join(SETTINGS))
    parser.add_argument("--rounds", default="", metavar="N | SETTING=N,...",
                        help="rounds to time: in every setting, or per setting (default: the published count); "
                             "the published count's time is extrapolated from them")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="passed to every `fedsim run` (e.g. an A/B of a trainer option)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny clients and rounds: all four in a few minutes on a CPU")
    parser.add_argument("--max-clients", type=int, default=0, metavar="N",
                        help="generate at most N clients a setting (less data to write and read; a round's "
                             "work is its cohort's, the same for any population)")
    parser.add_argument("--data", type=Path, help="keep the generated data here for the next invocation")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    keys = args.settings.split(",")
    unknown = [k for k in keys if k not in SETTINGS]
    if unknown:
        fail(f"--settings: unknown setting {unknown[0]!r}; choose from {', '.join(SETTINGS)}")
    try:
        timed = rounds_to_time(args.rounds)
    except ValueError as err:
        fail(f"--rounds {args.rounds!r}: {err}")
    if args.max_clients < 0:
        fail(f"--max-clients {args.max_clients}: give a positive number of clients, or 0 for the published population")
    rate, rate_note = fp32_rate(args.device)
    print(f"machine: {json.dumps(machine(args.device))}")
    print(f"bound rate: {rate_note}")
    print("data: GENERATED, same shape as the published datasets (not the real data: accuracy means nothing)")
    records, failed = [], []
    with tempfile.TemporaryDirectory() as folder:
        data_root = args.data or Path(folder) / "data"
        out = Path(folder) / "runs"
        out.mkdir()
        for key in keys:
            setting = SETTINGS[key]
            if args.quick:
                setting = setting.scaled(**setting.quick)
            if args.max_clients and setting.clients > args.max_clients:
                print(f"{key}: population capped at {args.max_clients:,} of {setting.clients:,} clients (--max-clients)")
                setting = setting.scaled(clients=args.max_clients)
            rounds = min(timed.get(key, timed.get("", setting.rounds)), setting.rounds)
            try:
                record = measure(key, setting, rounds, args.device, args.set, data_root, out, rate)
                if args.quick:  # the targets are for the published settings
                    record["meets_target"] = None
                record.update(quick=args.quick, machine=machine(args.device), bound_rate=rate, bound_note=rate_note)
                records.append(record)
                print(report(record), flush=True)
            except RunFailed as err:
                print(f"error: {err}", flush=True)
                failed.append({"setting": key, "error": str(err), "sets": args.set, "device": args.device})
            if args.json:  # after every setting: a run cut short keeps what it measured
                args.json.write_text(json.dumps(records + failed, indent=1) + "\n")
    print(table(records))
    if failed:
        raise SystemExit(1)
    return records


if __name__ == "__main__":
    main()
