"""The keyed dropout's share of a transformer's round (issue 38, "keyed randomness that costs nothing").

bench_modules.py's user transformer (2 encoder layers, d_model 32, dropout 0.1, digits' rows as
8 tokens), 10 devices x 10 local steps x minibatches of 16, trained by fedsim's batched and loop
trainers (`[run] threads = "auto"` as a run, or `--threads N`) and by a plain one-thread PyTorch loop. Each
round with dropout is timed against the same round without it, alternated in one process
(A B B A ..., after a warm-up round of each):

* fedsim without dropout: the keyed dropout made the identity, drawing no numbers (attention
  still written out as with dropout): the difference is what keyed dropout costs.
* plain without dropout: the module with every dropout rate at 0 (what torch's own dropout
  costs, for comparison; torch then takes its fused attention kernel).
* draws: a round's dropout numbers alone (`Task.step_numbers`, for the cohort or per device as
  the trainer draws them: on a GPU several steps in one call), on the threads of the trainer's
  call; draw ops: the torch ops they take (each a kernel launched from the host on a GPU),
  here / as a GPU draws them.

The share is 1 - without / with (and draws / with), of the medians of wall time and of the
process's CPU time (less sensitive to other jobs). `--busy N` runs N busy processes beside it;
the machine's load average is recorded before and after.

    python benchmarks/bench_dropout.py [--repeats 7] [--threads auto|N] [--busy N] [--device cuda]
        [--devices N] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
from bench_modules import MODELS, SETTINGS, Pair, busy_processes, machine  # noqa: E402

from fedsim.config import ClientConfig  # noqa: E402
from fedsim.training import ThreadPolicy, build_trainer, modules, rng  # noqa: E402


@contextmanager
def keyed_dropout_off():
    """fedsim's keyed dropout as the identity, and a step's randomness drawn no more: the numbers of
    the first step of each shape, kept (a CUDA graph captures inputs of the same shapes as with
    dropout; their values no longer matter)."""
    drawn: dict = {}
    randomness = modules.ModuleModel.randomness

    def kept(self, seed, rnd, ids, step, batch, own=None):
        key = (len(ids), batch, ids.device)
        if key not in drawn:
            drawn[key] = randomness(self, seed, rnd, ids, step, batch, own)
        return drawn[key]

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(modules, "_keyed_dropout",
                                              lambda input, p=0.5, training=True, inplace=False: input))
        stack.enter_context(mock.patch.object(modules.ModuleModel, "randomness", kept))
        yield


class _Ops(TorchDispatchMode):
    """Counts the torch ops run inside it."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def without_dropout(net: nn.Module) -> nn.Module:
    """A copy of `net` with every dropout rate at 0."""
    net = copy.deepcopy(net)
    for m in net.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
    return net


class Rows:
    """The three trainers of one cohort: each round with and without dropout, and the draws."""

    def __init__(self, threads: str, device: str = "cpu", devices: int = 0):
        setting = SETTINGS["steps"]
        self.pair = Pair(MODELS["user-transformer"], dataclasses.replace(setting, devices=devices or setting.devices),
                         device=device)
        self.setting = self.pair.setting
        # a trainer each with and without dropout: a CUDA graph keeps what it captured
        self.trainers = {(path, dropout): build_trainer(self.pair.task, ClientConfig(
            batch_size=self.setting.batch, local_steps=self.setting.local_steps, trainer=path), seed=0,
            threads=ThreadPolicy(threads, self.pair.device)) for path in ("batched", "loop") for dropout in (True, False)}
        self.plain_nets = {True: self.pair.work, False: without_dropout(self.pair.work)}

    def round(self, row: str, dropout: bool, rnd: int) -> tuple[float, float]:
        """(wall, CPU) seconds of a round."""
        cpu = time.process_time()
        if row == "plain":
            self.pair.work = self.plain_nets[dropout]
            return self.pair.plain_round(), time.process_time() - cpu
        trainer, pair = self.trainers[row, dropout], self.pair
        with pair.threads.scope(), ExitStack() as stack:
            if not dropout:
                stack.enter_context(keyed_dropout_off())
            t0 = time.perf_counter()
            trainer.train(rnd, pair.ids, pair.start, pair.steps, 0.05)
            pair.synchronize()
            return time.perf_counter() - t0, time.process_time() - cpu

    def draws(self, row: str, rnd: int) -> float | None:
        """Seconds of a round's dropout numbers alone, drawn as the trainer draws them (the
        cohort's, or each device's; off a CPU several steps in one call)."""
        if row == "plain":
            return None
        trainer, pair = self.trainers[row, True], self.pair
        with pair.threads.scope(), trainer.threads.work(trainer.call_flops(pair.ids)):
            t0 = time.perf_counter()
            self.draw_round(row, rnd)
            pair.synchronize()
            return time.perf_counter() - t0

    def draw_round(self, row: str, rnd: int) -> None:
        ids = torch.as_tensor(self.pair.ids, device=self.pair.device)
        for cohort in [ids] if row == "batched" else list(ids.split(1)):
            numbers = self.pair.task.step_numbers(0, rnd, cohort, self.setting.local_steps, None)
            for step in range(self.setting.local_steps):
                numbers(step, self.setting.batch)

    def draw_ops(self, row: str) -> dict[str, int]:
        """torch ops (on a GPU: kernels launched from the host) of a round's draws, on this device
        and as a GPU draws them (`rng.in_blocks` false: steps in one call, keep-masks)."""
        counts = {}
        for where, in_blocks in (("here", rng.in_blocks), ("as_on_gpu", lambda device: False)):
            with mock.patch.object(rng, "in_blocks", in_blocks), _Ops() as ops:
                self.draw_round(row, 0)
            counts[where] = ops.count
        return counts

    def threads(self, row: str) -> int:
        return 1 if row == "plain" else self.trainers[row, True].summary()["threads"]


def measure(rows: Rows, row: str, repeats: int) -> dict:
    rows.round(row, True, 0), rows.round(row, False, 0), rows.draws(row, 0)  # warm-up
    times: dict[str, list[float]] = {"with": [], "without": [], "draws": [], "with_cpu": [], "without_cpu": []}
    for r in range(repeats):  # A B B A ...: a drift of the machine's load hits both alike
        for side in (("with", "without") if r % 2 == 0 else ("without", "with")):
            wall, cpu = rows.round(row, side == "with", r + 1)
            times[side].append(wall)
            times[f"{side}_cpu"].append(cpu)
        drawn = rows.draws(row, r + 1)
        if drawn is not None:
            times["draws"].append(drawn)
    with_s, without_s = statistics.median(times["with"]), statistics.median(times["without"])
    draws_s = statistics.median(times["draws"]) if times["draws"] else None
    with_cpu, without_cpu = statistics.median(times["with_cpu"]), statistics.median(times["without_cpu"])
    return {"row": row, "threads": rows.threads(row), "devices": rows.setting.devices,
            "local_steps": rows.setting.local_steps, "batch": rows.setting.batch,
            "dropout_numbers_per_step": rows.pair.task.model.dropout_numbers(rows.setting.batch)
            if hasattr(rows.pair.task.model, "dropout_numbers") else None,
            **{f"{side}_s": [round(t, 4) for t in ts] for side, ts in times.items()},
            "with_median_s": round(with_s, 4), "without_median_s": round(without_s, 4),
            "draws_median_s": None if draws_s is None else round(draws_s, 4),
            "dropout_share": round(1 - without_s / with_s, 3),
            "dropout_share_cpu": round(1 - without_cpu / with_cpu, 3),
            "draws_share": None if draws_s is None else round(draws_s / with_s, 3),
            "draw_ops": None if row == "plain" else rows.draw_ops(row)}


def row_text(rec: dict) -> str:
    spread = lambda xs: f"{min(xs):.3f}-{max(xs):.3f}"  # noqa: E731
    draws = "-" if rec["draws_median_s"] is None else f"{rec['draws_median_s']:.4f} {100 * rec['draws_share']:5.1f}%"
    ops = "-" if rec["draw_ops"] is None else f"{rec['draw_ops']['here']} / {rec['draw_ops']['as_on_gpu']}"
    return (f"{rec['row']:<8} {rec['threads'] or '-':>2} {rec['with_median_s']:>8.3f} {spread(rec['with_s']):>13} "
            f"{rec['without_median_s']:>8.3f} {spread(rec['without_s']):>13} {100 * rec['dropout_share']:>6.1f}% "
            f"{100 * rec['dropout_share_cpu']:>6.1f}% {draws:>15} {ops:>13}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per side")
    parser.add_argument("--threads", default="auto", help="fedsim's [run] threads (auto, or a number)")
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the measurement")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the cohort's device, the plain loop's too)")
    parser.add_argument("--devices", type=int, default=0, help="devices in the cohort (default: the setting's 10)")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.exit(2, f"error: --repeats {args.repeats}: give a number of timed rounds >= 1\n")
    load_before = os.getloadavg()
    busy = busy_processes(args.busy, "spin")
    records: list[dict] = []
    result = {"machine": machine(), "torch": torch.__version__, "device": args.device, "threads": args.threads,
              "busy": args.busy,
              "repeats": args.repeats,
              "loadavg_before": [round(x, 2) for x in load_before], "records": records}
    try:
        rows = Rows(args.threads if args.threads == "auto" else int(args.threads), args.device, args.devices)
        print(f"machine: {machine()}; busy processes: {args.busy}; load before: "
              f"{' '.join(f'{x:.2f}' for x in load_before)}; {rows.setting.devices} devices x "
              f"{rows.setting.local_steps} steps x {rows.setting.batch}")
        print(f"{'trainer':<8} {'th':>2} {'with s':>8} {'with spread':>13} {'without':>8} {'without spread':>13} "
              f"{'share':>7} {'cpu sh':>7} {'draws s, share':>15} {'draw ops':>13}")
        for row in ("batched", "loop", "plain"):
            records.append(measure(rows, row, args.repeats))
            print(row_text(records[-1]), flush=True)
            result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
            if args.out:
                args.out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"load after: {' '.join(f'{x:.2f}' for x in result['loadavg_after'])}")
    return result


if __name__ == "__main__":
    main()
