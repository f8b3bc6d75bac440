"""Parsed datasets cached as arrays, keyed by the content of the files they came from.

Parsing LEAF's JSON (FEMNIST: ~2.5 GB) or decoding a Parquet dataset's images takes minutes;
the arrays it gives load in a second. The cache file sits next to the data
(`ROOT/.fedsim-cache/`, or `~/.cache/fedsim/` where ROOT is read-only) and is named by a
SHA-256 of the files' names and bytes and of the parser's version, so that an edited file or
a new fedsim parser is never served a stale cache. Within a process, the arrays of unchanged
files are read once (a study's points share them).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import numpy as np

from fedsim.errors import FedsimError
from fedsim.files import atomic_write

Arrays = dict[str, np.ndarray]


def cached_arrays(kind: str, root: Path, files: list[Path], parse: Callable[[], Arrays]) -> Arrays:
    """`parse()`'s arrays for these files, from the cache when it has them."""
    key = (kind, root, tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _READ:
        if len(_READ) >= 4:
            _READ.pop(next(iter(_READ)))
        _READ[key] = _cached(kind, root, files, parse)
    return _READ[key]


_READ: dict[tuple, Arrays] = {}  # this process's arrays by (kind, root, file sizes and times)


def _cached(kind: str, root: Path, files: list[Path], parse: Callable[[], Arrays]) -> Arrays:
    files_sha256 = files_digest(root, files)
    _SOURCES[root.resolve()] = files_sha256
    name = f"{kind}-{hashlib.sha256(kind.encode() + files_sha256.encode()).hexdigest()[:20]}.npz"
    for folder in _folders(root):
        if (folder / name).is_file():
            try:
                with np.load(folder / name, allow_pickle=False) as stored:
                    return _read_only(dict(stored))
            except (OSError, ValueError, EOFError):
                pass  # a damaged cache is parsed again and replaced
    arrays = parse()
    for folder in _folders(root):
        try:
            atomic_write(folder / name, lambda tmp: _save(tmp, arrays))
            break
        except (OSError, FedsimError):
            continue  # read-only: try the next place, else keep the arrays uncached
    return _read_only(arrays)


def _save(path, arrays: Arrays) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)


_SOURCES: dict[Path, str] = {}  # a data folder -> the `files_digest` of the files last read there


def source_digest(root: Path) -> str | None:
    """The `files_digest` of the files this process read a dataset from in `root` (None if none)."""
    return _SOURCES.get(Path(root).resolve())


def files_digest(root: Path, files: list[Path]) -> str:
    """SHA-256 of the files' names (relative to `root`) and bytes: what a dataset came from."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(root)).encode() + b"\0")
        with open(f, "rb") as stream:
            digest.update(hashlib.file_digest(stream, "sha256").digest())
    return digest.hexdigest()


def _folders(root: Path) -> list[Path]:
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedsim"
    return [root / ".fedsim-cache", home]


def _read_only(arrays: Arrays) -> Arrays:
    for array in arrays.values():
        array.flags.writeable = False
    return arrays
