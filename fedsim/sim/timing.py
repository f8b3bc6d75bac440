"""How long a device's task takes: download, compute, upload (docs/timing.md, [devices]).

Every model ends in the same per-device numbers, drawn once per run so that a device is
consistently fast or slow: compute seconds per training sample of this run's model, downlink
and uplink bits per second, seconds of latency per transfer.

* `profiles` (the default): a device class from the built-in table (fedsim/sim/profiles.py),
  its sustained training FLOP/s, links and latency drawn around the class's medians; compute
  per sample = the model's training FLOPs per sample / FLOP/s, so a CNN takes longer than a
  linear model by their cost ratio. A device table may give any of the columns itself.
* `constant`, `lognormal`: the medians of `seconds_per_sample`, `bandwidth_bps` (both
  directions), `latency_s`, the same for every device or spread lognormally (the numbers of
  earlier fedsim versions, unchanged).
* `halfnormal`: compute seconds per sample `seconds_per_sample` x (1 + `compute_sigma` |z|),
  z ~ N(0, 1): a minimum and a half-normal tail of slow devices, as FLSim times FedBuff's
  clients (there per task; here per device, like every model here); links as `constant`.
* `table`: the speeds of each device from `[trace] devices_table`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedsim.config import DevicesConfig
from fedsim.errors import FedsimError
from fedsim.sim import profiles

SPEED_COLUMNS = ("flops", "seconds_per_sample", "downlink_bps", "uplink_bps", "bandwidth_bps", "latency_s")


@dataclass
class DeviceTiming:
    """Per-device speeds of the run's devices ([N] arrays)."""

    seconds_per_sample: np.ndarray  # compute seconds per training sample of this run's model
    downlink_bps: np.ndarray
    uplink_bps: np.ndarray
    latency_s: np.ndarray  # per transfer
    step_overhead_s: float = 0.0  # per local step, on top of the samples' compute
    labels: dict[str, np.ndarray] = field(default_factory=dict)  # class, flops: recorded, not timed

    @classmethod
    def build(cls, cfg: DevicesConfig, n_devices: int, seed: int, *, train_flops: float,
              table: dict | None = None, where: str = "device table") -> "DeviceTiming":
        """`train_flops`: the model's training FLOPs per sample; `table`: the device table's
        columns, one row per run device (see `device_rows`)."""
        table = table or {}
        _check_speed_columns(table, where)
        if cfg.model == "table":
            timing = cls._from_table(cfg, table, train_flops, where)
        elif cfg.model == "profiles":
            timing = cls._from_profiles(cfg, n_devices, seed, train_flops, table, where)
        else:
            sps = np.full(n_devices, cfg.seconds_per_sample)
            bw = np.full(n_devices, cfg.bandwidth_bps)
            if cfg.model == "lognormal":
                rng = np.random.default_rng([seed, 0x71AE])
                sps = sps * rng.lognormal(0.0, cfg.compute_sigma, n_devices)
                bw = bw * rng.lognormal(0.0, cfg.bandwidth_sigma, n_devices)
            elif cfg.model == "halfnormal":
                rng = np.random.default_rng([seed, 0x4A1F])
                sps = sps * (1.0 + cfg.compute_sigma * np.abs(rng.standard_normal(n_devices)))
            timing = cls(sps, bw, bw, np.full(n_devices, cfg.latency_s))
        timing.step_overhead_s = cfg.step_overhead_s
        return timing

    @classmethod
    def _from_profiles(cls, cfg: DevicesConfig, n: int, seed: int, train_flops: float,
                       table: dict, where: str) -> "DeviceTiming":
        names = list(cfg.classes or profiles.NAMES)
        which = profiles.draw_classes(names, cfg.class_weights, n, seed)
        device_class = np.array(names, dtype=object)[which]
        if "class" in table:  # the table's classes; the speeds it lacks are drawn for them
            device_class = np.asarray(table["class"], dtype=object)
            _check_known_classes(device_class, table, where)
            # each device's built-in class (0 for one of the user's own, whose speeds the table gives)
            which = (device_class[:, None] == np.array(profiles.NAMES, dtype=object)).argmax(axis=1)
            names = list(profiles.NAMES)
        speeds = profiles.draw_speeds(names, which, seed)
        speeds.update({k: np.asarray(table[k], dtype=np.float64) for k in SPEED_COLUMNS if k in table})
        return cls._from_speeds(speeds, train_flops, {"class": device_class})

    @classmethod
    def _from_table(cls, cfg: DevicesConfig, table: dict, train_flops: float, where: str) -> "DeviceTiming":
        if not table:
            raise FedsimError("[devices] model = 'table' needs a device table: set [trace] devices_table "
                              "= 'devices.parquet' (columns device_id, flops or seconds_per_sample, "
                              "downlink_bps and uplink_bps or bandwidth_bps; docs/timing.md)")
        for needs in (("flops", "seconds_per_sample"), ("downlink_bps", "bandwidth_bps"),
                      ("uplink_bps", "bandwidth_bps")):
            if not any(k in table for k in needs):
                raise FedsimError(f"{where}: missing column {needs[0]!r}; [devices] model = 'table' "
                                  f"needs {' or '.join(needs)} for every device (docs/timing.md)")
        n = len(table["device_id"])
        speeds = {k: np.asarray(table[k], dtype=np.float64) for k in SPEED_COLUMNS if k in table}
        speeds.setdefault("latency_s", np.full(n, cfg.latency_s))
        labels = {"class": np.asarray(table["class"], dtype=object)} if "class" in table else {}
        return cls._from_speeds(speeds, train_flops, labels)

    @classmethod
    def _from_speeds(cls, speeds: dict, train_flops: float, labels: dict) -> "DeviceTiming":
        """seconds per sample from FLOP/s (unless measured), one bandwidth for both directions
        where only `bandwidth_bps` is given."""
        if "seconds_per_sample" in speeds:
            speeds.pop("flops", None)
        else:
            labels = {**labels, "flops": speeds["flops"]}
            speeds["seconds_per_sample"] = train_flops / speeds["flops"]
        both = speeds.get("bandwidth_bps")
        return cls(speeds["seconds_per_sample"], speeds.get("downlink_bps", both),
                   speeds.get("uplink_bps", both), speeds["latency_s"], labels=labels)

    def download_s(self, ids: np.ndarray, n_bytes: int) -> np.ndarray:
        return self.latency_s[ids] + 8.0 * n_bytes / self.downlink_bps[ids]

    def upload_s(self, ids: np.ndarray, n_bytes: int) -> np.ndarray:
        return self.latency_s[ids] + 8.0 * n_bytes / self.uplink_bps[ids]

    def compute_s(self, ids: np.ndarray, samples: np.ndarray, steps: np.ndarray) -> np.ndarray:
        return samples * self.seconds_per_sample[ids] + steps * self.step_overhead_s

    def forward_s(self, ids: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """A forward pass over `samples` (power-of-choice's loss): a third of their training
        compute, as the backward pass costs about twice the forward (the FLOPs fedsim counts)."""
        return samples * self.seconds_per_sample[ids] / 3.0

    def columns(self) -> dict[str, np.ndarray]:
        """What devices.parquet records of each device's timing."""
        return {**self.labels, "seconds_per_sample": self.seconds_per_sample,
                "downlink_bps": self.downlink_bps, "uplink_bps": self.uplink_bps,
                "latency_s": self.latency_s}


def _check_speed_columns(table: dict, where: str) -> None:
    """Two columns that say the same thing two ways would leave one of them unread."""
    for one, other, keep in (("flops", "seconds_per_sample", "flops (the model's cost decides the time) "
                              "or seconds_per_sample (measured for this model)"),
                             ("bandwidth_bps", "downlink_bps", "downlink_bps and uplink_bps, or bandwidth_bps "
                              "for both directions"),
                             ("bandwidth_bps", "uplink_bps", "downlink_bps and uplink_bps, or bandwidth_bps "
                              "for both directions")):
        if one in table and other in table:
            raise FedsimError(f"{where}: gives both {one} and {other}; keep {keep}")


def _check_known_classes(device_class: np.ndarray, table: dict, where: str) -> None:
    """A class not in the built-in table is fine when the table gives all of its speeds."""
    complete = (("flops" in table or "seconds_per_sample" in table) and "latency_s" in table
                and ("bandwidth_bps" in table or ("downlink_bps" in table and "uplink_bps" in table)))
    if complete:
        return
    unknown = ~np.isin(device_class, np.array(profiles.NAMES, dtype=object))
    if unknown.any():
        row = int(np.argmax(unknown))
        raise FedsimError(
            f"{where}: class {device_class[row]!r} of device {int(table['device_id'][row])} is not a "
            f"built-in class ({', '.join(profiles.NAMES)}); use one of them, or give every device's "
            "speeds in the table (flops, downlink_bps, uplink_bps, latency_s)")


def device_rows(table: dict, trace_device: np.ndarray, where: str) -> dict[str, np.ndarray]:
    """The rows of a device table (one per trace device, by device_id) for the run's devices:
    run device i replays trace device `trace_device[i]`."""
    ids = np.asarray(table["device_id"], dtype=np.int64)
    position = np.full(max(int(ids.max(initial=-1)), int(trace_device.max(initial=-1))) + 1, -1)
    position[ids] = np.arange(len(ids))
    rows = position[trace_device]
    if (rows < 0).any():
        missing = int(trace_device[np.argmax(rows < 0)])
        raise FedsimError(f"{where}: has no row for device_id {missing}, which the run replays; give "
                          f"one row per trace device ({len(trace_device)} used, {len(ids)} in the table)")
    return {name: np.asarray(values)[rows] for name, values in table.items()}
