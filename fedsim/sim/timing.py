"""How long a device's task takes: download, compute, upload (README, [devices])."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsim.config import DevicesConfig
from fedsim.errors import FedsimError


@dataclass
class DeviceTiming:
    """Per-device speeds, drawn once per run so a device is consistently fast or slow."""

    seconds_per_sample: np.ndarray  # float [N]
    bandwidth_bps: np.ndarray  # float [N], bits per second, both directions
    latency_s: float

    @classmethod
    def build(cls, cfg: DevicesConfig, n_devices: int, seed: int, table: dict | None = None):
        if cfg.model == "table":
            if table is None:
                raise FedsimError(
                    "[devices] model = 'table' needs a device table: set [trace] devices_table "
                    "= 'devices.parquet' (columns device_id, seconds_per_sample, bandwidth_bps)"
                )
            return cls._from_table(table, n_devices, cfg.latency_s)
        sps = np.full(n_devices, cfg.seconds_per_sample)
        bw = np.full(n_devices, cfg.bandwidth_bps)
        if cfg.model == "lognormal":
            rng = np.random.default_rng([seed, 0x71AE])
            sps = sps * rng.lognormal(0.0, cfg.compute_sigma, n_devices)
            bw = bw * rng.lognormal(0.0, cfg.bandwidth_sigma, n_devices)
        return cls(sps, bw, cfg.latency_s)

    @classmethod
    def _from_table(cls, table: dict, n_devices: int, latency_s: float):
        missing = [c for c in ("seconds_per_sample", "bandwidth_bps") if c not in table]
        if missing:  # the reader checked the values; this model needs both speed columns
            raise FedsimError(f"device table: missing column {missing[0]!r}; [devices] model = "
                              "'table' needs device_id, seconds_per_sample, bandwidth_bps")
        ids = np.asarray(table["device_id"], dtype=np.int64)
        if len(ids) != n_devices or not np.array_equal(np.sort(ids), np.arange(n_devices)):
            raise FedsimError(
                f"device table: has {len(ids)} rows but the run has {n_devices} devices; "
                "it needs one row per device_id 0..n-1"
            )
        order = np.argsort(ids)
        return cls(
            np.asarray(table["seconds_per_sample"], dtype=float)[order],
            np.asarray(table["bandwidth_bps"], dtype=float)[order],
            latency_s,
        )

    def transfer_s(self, ids: np.ndarray, n_bytes: int) -> np.ndarray:
        return self.latency_s + 8.0 * n_bytes / self.bandwidth_bps[ids]
