"""Keyed, counter-based randomness for the cohort (splitmix64 on int64 tensors).

Every random number a device uses in training is a pure function of
(seed, stream, round, device, step, counter). The batched trainer draws the numbers of the
whole cohort in one vectorised call, the loop trainer draws one device at a time, a resumed run
draws them again: all three see the same values, with no generator state to carry around.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

# streams: independent families of numbers per (round, device, step)
BATCH, DROPOUT, NOISE, MODULE, EPOCH = 1, 2, 3, 4, 5

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_FEW = 16  # keys mixed as Python ints up to this many (a dozen torch calls cost more on a CPU)
_BLOCK = 1 << 15  # numbers mixed at a time on a CPU: torch's grain for threads (256 KiB of int64)
_INF = torch.tensor(float("inf"))  # a dropped unit's divisor


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _srl(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: Tensor, last_shift: bool = True) -> Tensor:
    """splitmix64's finaliser, in place on `z` (a tensor of the caller's own); int64
    multiplication wraps around like uint64. Without its last xor-shift (z ^ z >>> 31), which
    changes none of the top 33 bits: the same top bits, for less."""
    shifted = torch.empty_like(z)

    def xor_shift(s: int) -> None:
        torch.bitwise_right_shift(z, s, out=shifted)
        shifted.bitwise_and_((1 << (64 - s)) - 1)  # (a logical shift)
        z.bitwise_xor_(shifted)

    xor_shift(30)
    z.mul_(_signed(_M1))
    xor_shift(27)
    z.mul_(_signed(_M2))
    if last_shift:
        xor_shift(31)
    return z


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
    bases = [_base(seed, stream, rnd, s) for s in steps]
    if ids.device.type == "cpu" and len(ids) * len(steps) <= _FEW:  # (the loop's one device)
        h = torch.tensor([_signed(_mix_int(i * _GOLDEN ^ b)) for b in bases for i in ids.tolist()],
                         dtype=torch.int64).view(len(bases), len(ids))
    else:
        base = torch.tensor([_signed(b) for b in bases], dtype=torch.int64, device=ids.device)
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


def _counters(key: Tensor, n: int) -> Tensor:
    """[..., n] int64: numbers 0..n-1 of each key [...], before mixing."""
    return key[..., None] + torch.arange(n, device=key.device, dtype=torch.int64) * _signed(_GOLDEN)


def from_keys(key: Tensor, n: int) -> Tensor:
    """[..., n] int64 random bits number 0..n-1 of each key [...]."""
    return _mix(_counters(key, n))


def uniform_of_keys(key: Tensor, n: int) -> Tensor:
    """[..., n] float32 uniforms in [0, 1) of each key [...]: the top 24 of `from_keys`' bits
    (mixed without the last xor-shift, which leaves them as they are)."""
    z = _mix(_counters(key, n), last_shift=False)
    z >>= 40
    z &= 0xFFFFFF
    return z.to(torch.float32).mul_(2.0**-24)


def in_blocks(device: torch.device) -> bool:
    """Whether numbers are mixed in cache-sized blocks, a local step at a time (a CPU: a draw is
    bound by its arithmetic), or whole, several steps in one call (a GPU: bound by launching
    its kernels)."""
    return device.type == "cpu"


def dropout_bits(key: Tensor, n: int, divisors: tuple[int, Tensor] | None = None, keep: int | None = None) -> Tensor:
    """[m, n] int64 of each key [m] in the order of `uniform_of_keys`' uniforms:
    (uniform >= p) is (number >= `keep_threshold(p)`), a comparison of integers. They are
    `from_keys`' bits (the top 24 as they are) with the sign bit flipped, so that their signed
    order is the bits' unsigned order. On a CPU mixed in blocks that stay in a core's cache and
    under torch's grain for threads (a cohort's [m, n] at once was measured 3x slower on one
    thread, and two threads beside busy processes wait for a core at every op).
    `divisors` = (threshold, kept): float32 instead, `kept` (a 0-d tensor) where a number is
    >= threshold and inf where it is not (a CPU step's dropout divisors), made from each block
    while it is in cache. `keep` (a threshold): bool instead, number >= keep (a GPU step's
    keep-mask: an eighth of the bytes to copy into a CUDA graph and read in its forward)."""
    out = torch.empty(len(key), n, dtype=torch.int64 if divisors is None else torch.float32, device=key.device)
    rows, cols = (max(1, _BLOCK // max(n, 1)), min(n, _BLOCK)) if in_blocks(key.device) else (len(key), n)
    bits = out if divisors is None else torch.empty(min(rows, len(key)), cols, dtype=torch.int64, device=key.device)
    for c in range(0, n, cols):
        counter = _counter(c, min(c + cols, n), key.device)
        for r in range(0, len(key), rows):
            mine = out[r:r + rows, c:c + cols]
            z = mine if divisors is None else bits[:mine.shape[0], :mine.shape[1]]
            torch.add(key[r:r + rows, None], counter, out=z)
            _mix(z, last_shift=False).bitwise_xor_(-(1 << 63))
            if divisors is not None:
                torch.where(z >= divisors[0], divisors[1], _INF, out=mine)
    return out if keep is None else out >= keep


@functools.lru_cache(maxsize=64)
def _counter(start: int, stop: int, device: torch.device) -> Tensor:
    """int64 counters start..stop-1 times the golden gamma, as `dropout_bits` adds them to its keys
    (the same for every step of a batch size: made once)."""
    return torch.arange(start, stop, device=device, dtype=torch.int64) * _signed(_GOLDEN)


def keep_threshold(p: float) -> int | None:
    """T with (u >= p) == (number >= T) for each uniform u of `uniform_of_keys` and its number
    of `dropout_bits`; None when no uniform reaches p. torch compares a float32 tensor with p
    rounded to float32, q; a uniform is k * 2**-24 for its top 24 bits k, so u >= q for the k
    from t = ceil(q * 2**24) on (both exact), and their numbers are those >= t * 2**40 - 2**63."""
    if not p <= 1:  # (nor nan)
        return None
    t = max(0, math.ceil(float(np.float32(p)) * 2**24))
    return None if t >= 2**24 else t * 2**40 - 2**63


def _bits(seed: int, stream: int, rnd: int, ids: Tensor, step: int | range, n: int) -> Tensor:
    """[m, n] int64 random bits for devices `ids` (int64 [m], on the target device) at local
    step `step`; [S, m, n] for a range of S steps (the same bits, drawn in one call)."""
    return from_keys(keys(seed, stream, rnd, ids, step), n)


def uniform(seed: int, stream: int, rnd: int, ids: Tensor, step: int | range, n: int) -> Tensor:
    """[m, n] float32 uniforms in [0, 1), 24 random bits each ([S, m, n] for a range of steps)."""
    return uniform_of_keys(keys(seed, stream, rnd, ids, step), n)


def normal(seed: int, stream: int, rnd: int, ids: Tensor, step: int | range, n: int) -> Tensor:
    """[m, n] float32 standard normals (Box-Muller on two 24-bit uniforms per value)."""
    bits = _bits(seed, stream, rnd, ids, step, n)
    u1 = (_srl(bits, 40).to(torch.float32) + 1.0) * 2.0**-24  # (0, 1]: log is finite
    u2 = (bits & 0xFFFFFF).to(torch.float32) * 2.0**-24
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * np.pi * u2)
