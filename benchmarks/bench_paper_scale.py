"""What the paper studies cost at the papers' own scale: one point of each, a few rounds at
the paper's dataset, model and settings (docs/reproductions.md, "At the papers' scale"),
timed per round and multiplied out to the whole study.

Datasets that are not on this machine are replaced by data of the same shape and size, which
costs the same to train on: MNIST by Fashion-MNIST (28x28, 60 k + 10 k), SVHN by random
32x32 colour images in a Parquet folder (73,257 + 26,032), Sent140 by generated LEAF files
(1,473 users of 41-200 tweets, FedLaAvg's selection). Prints a table and writes
benchmarks/results_paper_scale.json.

    python benchmarks/bench_paper_scale.py [--only paper-fedawe] [--device cuda] [--timed 50]

Where Fashion-MNIST is not installed (a GPU machine), random images of its shape in IDX files
stand in for it (the cost of a step does not depend on the pixels).
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

FMNIST = "{fmnist}"
# study -> (the paper-scale --set lines, rounds of the full study per point, rounds timed here, at least 3)
CASES = {
    "paper-fedlaavg": (["data.root=" + FMNIST, "trace.half_period=100"], 3000, 200),
    "paper-mifa": (["data.root=" + FMNIST, "client.lr=0.1", "client.lr_schedule=inverse",
                    "client.weight_decay=0.001", "client.batch_size=100", "client.local_steps=12", "sweep.trace.p_min=[0.2, 0.1, 0.05]",
                    "sweep.run.seed=[0, 1, 2, 3, 4]"], 300, 20),
    "paper-fedawe": (["data.dataset=parquet", "data.root={svhn}", "data.client_column=client",
                      "data.label_column=label", "data.feature_column=image", "data.partition=dirichlet",
                      "model.name=cnn-svhn", "client.local_steps=10", "client.batch_size=128",
                      "client.clip=0.5", "algorithm.clip=0.5"], 2000, 3),
    "paper-wangji": (["data.root=" + FMNIST, "model.name=cnn-fmnist", "data.clients=250", "algorithm.S=250",
                      "trace.rounds_per_group=100", "algorithm.period=500", "warm_start.run.rounds=2000",
                      "run.eval_every=500", "sweep.run.seed=[0,1,2,3,4,5,6,7,8,9]"], 300000, 20),
    "paper-fedlaavg-sent140": (["data.root={sent140}", "data.clients=1473"], 240, 24),
}


def fmnist_like(folder: Path) -> Path:
    """Fashion-MNIST's IDX files (60 k + 10 k 28x28 images), random, uncompressed."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", 60000), ("t10k", 10000)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        (folder / f"{prefix}-images-idx3-ubyte").write_bytes(
            (0x803).to_bytes(4, "big") + np.array([n, 28, 28], dtype=">u4").tobytes() + images.tobytes())
        (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(
            (0x801).to_bytes(4, "big") + np.array([n], dtype=">u4").tobytes() + labels.tobytes())
    return folder


def svhn_like(folder: Path) -> Path:
    """SVHN's sizes as random 32x32 RGB PNGs in a Parquet folder (what a CNN step costs), over
    100 clients."""
    from leaf_files import write_image_parquet

    for split, n in (("train", 73257), ("test", 26032)):
        sizes = np.full(100, n // 100)
        sizes[: n % 100] += 1
        write_image_parquet(folder / f"{split}.parquet", sizes, (3, 32, 32), 10)
    return folder


def sent140_like(folder: Path) -> Path:
    from leaf_files import write_leaf

    sizes = np.random.default_rng(0).integers(41, 201, size=1473).tolist()
    return write_leaf(folder, "sent140", [sizes[k:k + 150] for k in range(0, len(sizes), 150)], test_size=12)


def machine() -> str:
    import torch

    gpu = f", {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}" if torch.cuda.is_available() else ""
    return f"{platform.processor() or platform.machine()}, {platform.node()}{gpu}, torch {torch.__version__}"


def points(study: str, sets: list[str]) -> int:
    from fedsim.studies.study import load_study

    loaded = load_study(study, sets)
    return len(loaded.points) + len(loaded.warm)


def time_point(study: str, sets: list[str], rounds: int, out: Path) -> dict:
    """One point of the study (its first: first algorithm, seed 0) run alone for `rounds`, from
    its resolved config (a warm start replaced by the model's own initialisation)."""
    from fedsim.config import dump_toml
    from fedsim.studies.study import load_study

    config = load_study(study, sets).points[0].config.to_dict()
    config["run"].update(rounds=rounds, eval_every=rounds, plots=False, out=str(out), name=study, progress=False)
    config["model"]["init_from"] = ""
    path = out.parent / f"{study}.toml"
    path.write_text(dump_toml(config))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fedsim", "run", str(path)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{study}: {done.stderr.strip()}")
    wall = time.perf_counter() - start
    import polars as pl

    run = next(p.parent for p in (out / study).rglob("rounds.parquet"))
    per_round = pl.read_parquet(run / "rounds.parquet")["wall_s"].to_numpy()[1:]  # round 0 warms up
    host_s = json.loads((run / "manifest.json").read_text())["host_s"]
    return {"wall_s": wall, "host_s": host_s, "s_per_round": float(per_round.mean()),
            "median_s_per_round": float(np.median(per_round))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(CASES))
    parser.add_argument("--device", default="cpu", help="run.device of the timed point (cpu, cuda)")
    parser.add_argument("--timed", type=int, default=0, help="rounds timed per point (default: each study's own)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        installed = Path("/usr/share/datasets/fashion-mnist")
        data = {"svhn": Path(folder) / "svhn", "sent140": Path(folder) / "sent140",
                "fmnist": installed if installed.exists() else fmnist_like(Path(folder) / "fmnist")}
        if "paper-fedawe" in args.only:
            svhn_like(data["svhn"])
        if "paper-fedlaavg-sent140" in args.only:
            sent140_like(data["sent140"])
        for study in args.only:
            template, full_rounds, timed = CASES[study]
            timed = args.timed or timed
            sets = [s.format(**data) for s in template] + [f"run.device={args.device}"]
            n = points(study, sets)
            timing = time_point(study, sets, timed, Path(folder) / "out")
            hours = n * full_rounds * timing["s_per_round"] / 3600
            rows.append({"study": study, "device": args.device, "points": n, "rounds": full_rounds,
                         "timed_rounds": timed, **timing,
                         "study_hours": hours, "sets": sets,
                         "machine": machine()})
            print(f"{study:24} {n:>4} points x {full_rounds:>6} rounds: {timing['s_per_round']:8.3f} s/round "
                  f"(mean of rounds 1-{timed - 1}) -> {hours:10.1f} h", flush=True)
    path = HERE / "results_paper_scale.json"
    old = json.loads(path.read_text()) if path.exists() else []
    kept = [r for r in old if (r["study"], r.get("device", "cpu")) not in {(r["study"], args.device) for r in rows}]
    path.write_text(json.dumps(kept + rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
