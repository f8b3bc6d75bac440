"""The built-in device classes of `[devices] model = "profiles"` (docs/timing.md says where
every number comes from).

A class gives the median and the lognormal spread (sigma of the log) of a device's sustained
training speed, downlink and uplink bandwidth and per-transfer latency. A run draws each
device's class from the mix, then its four numbers around its class's medians, once per run
and seeded, so that a device is consistently fast or slow and two runs of one seed agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DeviceClass:
    name: str
    meaning: str
    flops: float  # median sustained training FLOP/s (forward + backward, fp32)
    flops_sigma: float
    downlink_bps: float  # median bits per second to the device
    uplink_bps: float  # median bits per second from the device
    link_sigma: float  # spread of both directions (drawn together: one network)
    latency_s: float  # median seconds of setup per transfer (about one round trip)
    latency_sigma: float
    share: float  # of the devices when the mix is not given


# Sources and derivations: docs/timing.md "Device profiles". In short: training FLOP/s are
# FLASH's (Yang et al., WWW 2021) measured on-phone training times of two CNNs per tier,
# converted with the models' multiply-adds (geometric mean of the two), spreads from the
# AI Benchmark CPU scores of each tier's phones; links are FLASH's measured Wi-Fi speeds
# (devices train on Wi-Fi while charging; no source ties bandwidth to a device class);
# latency is three round trips (TCP, TLS 1.3, the request) at Ookla's 10 ms global median
# fixed-broadband latency; the mix splits phones by Counterpoint's premium share (>= $600:
# one fifth of 2022 sales) and FLASH's low/mid device counts; tablets (Samsung Tab S6: the
# AI Benchmark CPU score of a flagship phone) have no sourced share and join only when asked.
CLASSES = (
    DeviceClass("phone-low", "low-end phone (FLASH's low tier: Nexus-class)",
                flops=0.44e9, flops_sigma=0.33, downlink_bps=34.5e6, uplink_bps=26.3e6, link_sigma=0.4,
                latency_s=0.03, latency_sigma=0.5, share=0.43),
    DeviceClass("phone-mid", "mid-range phone (FLASH's mid tier: Redmi Note-class)",
                flops=1.46e9, flops_sigma=0.19, downlink_bps=34.5e6, uplink_bps=26.3e6, link_sigma=0.4,
                latency_s=0.03, latency_sigma=0.5, share=0.37),
    DeviceClass("phone-high", "flagship phone (FLASH's high tier: Pixel 4 / Note10-class)",
                flops=4.1e9, flops_sigma=0.36, downlink_bps=34.5e6, uplink_bps=26.3e6, link_sigma=0.4,
                latency_s=0.03, latency_sigma=0.5, share=0.20),
    DeviceClass("tablet", "Android tablet with a flagship SoC (not in the default mix)",
                flops=4.4e9, flops_sigma=0.36, downlink_bps=34.5e6, uplink_bps=26.3e6, link_sigma=0.4,
                latency_s=0.03, latency_sigma=0.5, share=0.0),
)
BY_NAME = {c.name: c for c in CLASSES}
NAMES = tuple(BY_NAME)


def draw_classes(names: list[str], weights: list[float], n: int, seed: int) -> np.ndarray:
    """Each device's class (an index into `names`) drawn from the mix (`weights`, else the
    classes' shares; equal shares where those are all 0)."""
    mix = np.asarray(weights or [BY_NAME[name].share for name in names], dtype=np.float64)
    if mix.sum() == 0:  # classes without a share of their own (tablet alone): equal shares
        mix = np.ones(len(names))
    rng = np.random.default_rng([seed, 0xC1A55])
    return rng.choice(len(names), size=n, p=mix / mix.sum())


def draw_speeds(names: list[str], which: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """flops, downlink_bps, uplink_bps, latency_s of devices of classes `which` (indices into
    `names`): lognormal around their class's medians. One normal per device and quantity, in a
    fixed order, so a device's draws do not depend on the other devices' classes."""
    classes = [BY_NAME[name] for name in names]
    column = lambda attr: np.array([getattr(c, attr) for c in classes])[which]  # noqa: E731
    z = np.random.default_rng([seed, 0x5BEED]).standard_normal((3, len(which)))
    link = np.exp(column("link_sigma") * z[1])
    return {
        "flops": column("flops") * np.exp(column("flops_sigma") * z[0]),
        "downlink_bps": column("downlink_bps") * link,
        "uplink_bps": column("uplink_bps") * link,
        "latency_s": column("latency_s") * np.exp(column("latency_sigma") * z[2]),
    }
