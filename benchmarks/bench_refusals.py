"""How long `fedsim run` takes to refuse a bad config: each kind of refusal as users meet it, a
fresh `python -m fedsim run c.toml --quiet` per try, wall time from start to exit (median of
`--repeat`). A rule that needs no data should answer before torch is imported (<= 1 s on an
idle machine); the last rows need the data (the largest device's steps, the algorithm's state
against the machine's memory) and load the dataset first.

    python benchmarks/bench_refusals.py                      # this checkout
    python benchmarks/bench_refusals.py --root /path/to/other/checkout --out before.json

Prints a table and writes benchmarks/results_refusals.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent

WIDE_NET = ("from torch import nn\n\n\ndef make(in_shape, n_classes, cfg):\n"
            "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 15_625_000), nn.Linear(15_625_000, n_classes))\n")

# kind -> (config file, whether the rule needs the data); the user module has 1.17 G parameters, which a
# release that builds it before checking allocates (skip these rows with --no-data for such a --root)
REFUSALS = {
    "unknown key": ("[server]\ndedline = 5\n", False),
    "deadline_sigma under ideal timing": ("[server]\ntiming = 'ideal'\ndeadline_sigma = 5.0\n", False),
    "min_selected above the clients": ("[data]\nclients = 10\n[server]\nmin_selected = 20\n", False),
    "update_frac with async": ("[server]\nmode = 'async'\nupdate_frac = 0.5\n", False),
    "clients_per_round above the clients": ("[data]\nclients = 10\n[server]\nclients_per_round = 20\n", False),
    "an algorithm's own key (mifa warmup = 'yes')": ("[algorithm]\nname = 'mifa'\nwarmup = 'yes'\n", False),
    "local_epochs = 1e9": ("[client]\nlocal_epochs = 1e9\n", False),
    "rounds x clients x steps beyond any run": ("[run]\nrounds = 1000000000000\n", False),
    "local_epochs: the largest device's steps": (
        "[data]\nclients = 2\npartition = 'iid'\n[client]\nlocal_epochs = 200\nbatch_size = 1\n", True),
    "mifa's table beyond memory (a user module)": (
        "[model]\nname = 'wide_net:make'\n[algorithm]\nname = 'mifa'\n[server]\nclients_per_round = 1\n", True),
}


def refuse(root: Path, folder: Path, limit: float) -> tuple[float, str]:
    """Seconds of one `fedsim run c.toml` in `folder`, and its error line (or what happened
    instead: a release that accepts the config runs it, stopped after `limit` seconds)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "fedsim", "run", "c.toml", "--quiet"], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - started, f"not refused: still running after {limit:g} s"
    seconds = time.perf_counter() - started
    lines = proc.stderr.strip().splitlines()
    return seconds, lines[-1] if proc.returncode == 2 else f"not refused: exit {proc.returncode}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=HERE.parent, help="the checkout whose fedsim runs")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results_refusals.json")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds before a run that was not refused is stopped")
    parser.add_argument("--no-data", action="store_true", help="only the refusals that need no data")
    args = parser.parse_args()
    rows = []
    print(f"{'refusal':<46} {'needs data':>10} {'median s':>9} {'min s':>7}")
    for kind, (text, needs_data) in REFUSALS.items():
        if needs_data and args.no_data:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "c.toml").write_text(text)
            (folder / "wide_net.py").write_text(WIDE_NET)
            times, line = zip(*(refuse(args.root.resolve(), folder, args.limit) for _ in range(args.repeat)))
            written = sorted(p.name for p in folder.iterdir() if p.name not in ("c.toml", "wide_net.py", "__pycache__"))
        refused = line[0].startswith("error: ")
        rows.append({"refusal": kind, "needs_data": needs_data, "median_s": statistics.median(times),
                     "min_s": min(times), "refused": refused, "line": line[0], "written": written})
        print(f"{kind:<46} {'yes' if needs_data else 'no':>10} {statistics.median(times):>9.2f} {min(times):>7.2f}"
              + ("" if refused else f"  ({line[0]}; wrote {', '.join(written) or 'nothing'})"))
    doc = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "load": os.getloadavg(), "python": platform.python_version(), "root": str(args.root.resolve()),
           "repeat": args.repeat, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
