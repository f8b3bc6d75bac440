"""Keyed, counter-based randomness for the cohort (splitmix64 on int64 tensors).

Every random number a device uses in training is a pure function of
(seed, stream, round, device, step, counter). The batched trainer draws the numbers of the
whole cohort in one vectorised call, the loop trainer draws one device at a time, a resumed run
draws them again: all three see the same values, with no generator state to carry around.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

# streams: independent families of numbers per (round, device, step)
BATCH, DROPOUT, NOISE, MODULE, EPOCH = 1, 2, 3, 4, 5

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _srl(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: Tensor) -> Tensor:
    """splitmix64's finaliser; int64 multiplication wraps around like uint64."""
    z = (z ^ _srl(z, 30)) * _signed(_M1)
    z = (z ^ _srl(z, 27)) * _signed(_M2)
    return z ^ _srl(z, 31)


def _mix_int(z: int) -> int:
    """The same finaliser on a Python int (for the scalar part of a key)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def _base(seed: int, stream: int, rnd: int, step: int) -> int:
    h = _mix_int(int(seed) * _GOLDEN + stream)
    h = _mix_int(h ^ (int(rnd) * _GOLDEN))
    return _mix_int(h ^ (int(step) + 0x632BE59BD9B4E019))


def keys(seed: int, stream: int, rnd: int, ids: Tensor, step: int | range) -> Tensor:
    """int64 [m] keys of devices `ids` at local step `step` ([S, m] for a range of steps):
    what `from_keys` draws a device's numbers of that step from."""
    steps = step if isinstance(step, range) else [step]
    base = torch.tensor([_signed(_base(seed, stream, rnd, s)) for s in steps], dtype=torch.int64,
                        device=ids.device)
    h = _mix(ids.to(torch.int64) * _signed(_GOLDEN) ^ base[:, None])
    return h if isinstance(step, range) else h[0]


def stacked_keys(seeds: list[int], stream: int, rnds: list[int], ids: list[Tensor], steps: range) -> Tensor:
    """int64 [S, M] keys of several runs' devices stacked (M = their devices together): run r's
    columns are `keys(seeds[r], stream, rnds[r], ids[r], steps)`, mixed in one call."""
    base = torch.tensor([[_signed(_base(seed, stream, rnd, s)) for s in steps] for seed, rnd in zip(seeds, rnds)],
                        dtype=torch.int64, device=ids[0].device)
    counts = torch.tensor([len(i) for i in ids], device=base.device)
    per_device = base.repeat_interleave(counts, dim=0).T  # [S, M]
    return _mix(torch.cat(ids).to(torch.int64) * _signed(_GOLDEN) ^ per_device)


def from_keys(key: Tensor, n: int, offset: int = 0) -> Tensor:
    """[..., n] int64 random bits number offset..offset+n-1 of each key [...]. Elementwise, so
    it also runs inside `torch.func.vmap` on one device's key (fedsim/training/modules.py)."""
    counter = (torch.arange(n, device=key.device, dtype=torch.int64) + offset) * _signed(_GOLDEN)
    return _mix(key[..., None] + counter)


def to_uniform(bits: Tensor) -> Tensor:
    """float32 uniforms in [0, 1), 24 random bits each."""
    return _srl(bits, 40).to(torch.float32) * 2.0**-24


def _bits(seed: int, stream: int, rnd: int, ids: Tensor, step: int | range, n: int) -> Tensor:
    """[m, n] int64 random bits for devices `ids` (int64 [m], on the target device) at local
    step `step`; [S, m, n] for a range of S steps (the same bits, drawn in one call)."""
    return from_keys(keys(seed, stream, rnd, ids, step), n)


def uniform(seed: int, stream: int, rnd: int, ids: Tensor, step: int | range, n: int) -> Tensor:
    """[m, n] float32 uniforms in [0, 1), 24 random bits each ([S, m, n] for a range of steps)."""
    return to_uniform(_bits(seed, stream, rnd, ids, step, n))


def normal(seed: int, stream: int, rnd: int, ids: Tensor, step: int | range, n: int) -> Tensor:
    """[m, n] float32 standard normals (Box-Muller on two 24-bit uniforms per value)."""
    bits = _bits(seed, stream, rnd, ids, step, n)
    u1 = (_srl(bits, 40).to(torch.float32) + 1.0) * 2.0**-24  # (0, 1]: log is finite
    u2 = (bits & 0xFFFFFF).to(torch.float32) * 2.0**-24
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * np.pi * u2)
