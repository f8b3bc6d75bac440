"""Collects per-round and per-device results and writes the run directory atomically.

Files (docs/running.md, "The run directory"): rounds.parquet, devices.parquet, events.parquet,
manifest.json, config.toml, model.pt, checkpoint.pt. Every write goes to a temporary file that is renamed
into place, so an interrupted run never leaves a half-written file behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from fedsim.files import atomic_write
from fedsim.results.events_log import EventLog

ROUND_COLUMNS = {
    "round": pl.Int64, "t_start": pl.Float64, "t_end": pl.Float64, "duration": pl.Float64,
    "online": pl.Int64, "invited": pl.Int64, "arrived": pl.Int64, "dropped": pl.Int64,
    "late": pl.Int64, "surplus": pl.Int64, "close_reason": pl.String,
    "train_loss": pl.Float64, "test_loss": pl.Float64, "test_acc": pl.Float64, "wall_s": pl.Float64,
}
DEVICE_COUNTERS = ("invitations", "arrivals", "drops", "late", "surplus")


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def save_torch(path: Path, obj: Any) -> None:
    atomic_write(path, lambda tmp: _torch_save(obj, tmp))


def _torch_save(obj: Any, target) -> None:
    """torch.save through a Python file: a full disk is then an OSError (ENOSPC) that names
    itself, where torch's own writer says only "unexpected pos"."""
    if not isinstance(target, Path):  # atomic_write's byte counter
        torch.save(obj, target)
        return
    with open(target, "wb") as file:
        torch.save(obj, file)


class Recorder:
    """Rounds, per-device counters, the events log and the initial evaluation of one run."""

    def __init__(self, run_dir: Path, n_devices: int, device_info: dict[str, np.ndarray] | None = None,
                 events: str = "all"):
        """`events`: `[run] events`, which invitations the events log keeps."""
        self.run_dir = Path(run_dir)
        self.rows: list[dict[str, Any]] = []
        self.counters = {name: np.zeros(n_devices, dtype=np.int64) for name in DEVICE_COUNTERS}
        self.last_round = np.full(n_devices, -1, dtype=np.int64)
        self.device_info = device_info or {}  # per-device columns known before the run
        self.events = EventLog(self.run_dir, events)
        self.initial: dict[str, float | None] | None = None  # the initial model's evaluation
        self.events_missing = 0  # rows a resume found missing from the events log (lost for good)

    def add_round(self, outcome, metrics: dict[str, Any]) -> dict[str, Any]:
        """Record a round; `metrics` (test_loss, test_acc, the strategy's and callbacks') join
        its row."""
        row = {
            "round": outcome.round, "t_start": outcome.t_start, "t_end": outcome.t_end,
            "duration": outcome.t_end - outcome.t_start, "online": outcome.online,
            "invited": len(outcome.invited), "arrived": len(outcome.arrived),
            "dropped": len(outcome.dropped), "late": len(outcome.late),
            "surplus": len(outcome.surplus), "close_reason": outcome.close_reason,
            "train_loss": outcome.train_loss, "test_loss": None, "test_acc": None,
            "wall_s": outcome.wall_s, **outcome.extra, **metrics,
        }
        self.rows.append(row)
        for name, ids in (("invitations", outcome.invited), ("arrivals", outcome.arrived),
                          ("drops", outcome.dropped), ("late", outcome.late),
                          ("surplus", outcome.surplus)):
            if len(ids):  # (most rounds drop nobody)
                np.add.at(self.counters[name], ids, 1)
        self.last_round[outcome.arrived] = outcome.round
        self.events.add(outcome.questions)
        self.events.add(outcome.events)
        return row

    def rounds_frame(self) -> pl.DataFrame:
        # The last row's columns in its order, then the first row's: a run resumed from an earlier
        # release records the columns of today's (null in the rows that release wrote).
        ends = (self.rows[-1], self.rows[0]) if self.rows else ()
        extra = [k for k in dict.fromkeys(k for row in ends for k in row) if k not in ROUND_COLUMNS]
        schema = {**ROUND_COLUMNS, **{k: pl.Float64 for k in extra}}
        return pl.DataFrame(self.rows, schema=schema)

    def devices_frame(self) -> pl.DataFrame:
        n = len(self.last_round)
        info = {k: v.tolist() if v.dtype == object else v for k, v in self.device_info.items()}
        return pl.DataFrame({"device_id": np.arange(n, dtype=np.int64), **self.counters,
                             "last_round": self.last_round, **info})

    def write_tables(self) -> None:
        """rounds.parquet and devices.parquet as they stand; the events so far to the log."""
        atomic_write(self.run_dir / "rounds.parquet", self.rounds_frame().write_parquet)
        atomic_write(self.run_dir / "devices.parquet", self.devices_frame().write_parquet)
        self.events.flush()

    def finish(self) -> None:
        self.events.finish()

    def state_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "counters": self.counters, "last_round": self.last_round,
                "events_rows": self.events.rows, "initial": self.initial}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.rows = list(sd["rows"])
        self.counters = {k: np.asarray(v) for k, v in sd["counters"].items()}
        for name in DEVICE_COUNTERS:  # (checkpoints of fedsim before the surplus counter)
            self.counters.setdefault(name, np.zeros(len(sd["last_round"]), dtype=np.int64))
        self.last_round = np.asarray(sd["last_round"])
        self.initial = sd.get("initial")
        self.events_missing = self.events.resume(sd.get("events_rows", 0))
