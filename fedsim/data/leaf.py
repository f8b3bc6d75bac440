"""LEAF's federated datasets (FEMNIST, Shakespeare, Sent140) read from LEAF's own output.

LEAF's preprocess.sh writes `ROOT/train/*.json` and `ROOT/test/*.json`, each
`{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`.
Every user of the training files is one device, in the order of the files (by name) and of
each file's `users` list; a user's test samples are that device's test data. The parsed arrays
are cached (fedsim/data/cache.py): FEMNIST's 2.5 GB of JSON is parsed once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np

from fedsim.data import text
from fedsim.data.cache import Arrays, cached_arrays
from fedsim.errors import FedsimError

VERSION = 3  # of the parsed arrays: a new version re-parses every cached dataset (3: pixels checked finite)
CLASSES = {"femnist": 62, "shakespeare": len(text.LEAF_LETTERS), "sent140": 2}


def read_leaf(name: str, root: Path) -> Arrays:
    """The arrays of LEAF dataset `name` under `root`: x_train, y_train, owner_train, x_test,
    y_test, owner_test (the device of every sample; -1: a test-only user), users (device -> LEAF user id), and per
    dataset: `vocabulary` (sent140's words by frequency), `unknown` (shakespeare's characters
    outside LEAF's vocabulary)."""
    if not root.is_dir():
        raise FedsimError(f"[data] dataset = {name!r}: folder {root} not found; set [data] root to "
                          f"LEAF's data/{name}/data folder (the one holding train/ and test/, see "
                          "docs/datasets.md)")
    splits = [sorted((root / split).glob("*.json")) for split in ("train", "test")]
    for split, files in zip(("train", "test"), splits):
        if not files:
            raise FedsimError(f"[data] dataset = {name!r}: {root / split} holds no *.json files; "
                              f"LEAF's layout is ROOT/train/*.json and ROOT/test/*.json (written by "
                              "LEAF's preprocess.sh); set [data] root to that folder")
    return cached_arrays(f"leaf-{name}-v{VERSION}", root, splits[0] + splits[1],
                         lambda: _parse(name, *splits))


def _parse(name: str, train: list[Path], test: list[Path]) -> Arrays:
    users: list[str] = []
    device: dict[str, int] = {}
    parts: dict[str, list] = {"train": [], "test": []}
    for split, files in (("train", train), ("test", test)):
        for path in files:
            for user, x, y in _user_samples(path):
                where = f"{path}, user {user!r}"
                if split == "train":
                    if user in device:
                        raise FedsimError(f"{where}: the user appears twice in the training files; "
                                          "regenerate the dataset with LEAF's preprocess.sh")
                    device[user] = len(users)
                    users.append(user)
                # a test user without training samples (LEAF's user split, -t user) is no device:
                # its samples only join the global test set (device -1)
                parts[split].append((device.get(user, -1), *SAMPLES[name](x, y, where)))
    for split, files, samples in (("train", train, "training"), ("test", test, "test")):
        if not parts[split]:
            where = files[0] if len(files) == 1 else f"{files[0].parent} (its {len(files)} *.json files)"
            raise FedsimError(f"{where}: no users (`\"users\": []`), so no {samples} samples; regenerate the "
                              "dataset with LEAF's preprocess.sh (see docs/datasets.md)")
    arrays = {"users": np.asarray(users, dtype=str)}
    for split in ("train", "test"):
        owners, xs, ys = zip(*parts[split])
        arrays[f"owner_{split}"] = np.repeat(np.asarray(owners, dtype=np.int64), [len(y) for y in ys])
        arrays[f"x_{split}"], arrays[f"y_{split}"] = xs, np.concatenate(ys)
    return FINISH[name](arrays)


def _user_samples(path: Path) -> Iterator[tuple[str, list, list]]:
    """(user, x, y) of every user of one LEAF file, checked for LEAF's layout."""
    fix = "regenerate it with LEAF's preprocess.sh (see docs/datasets.md)"
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, OSError) as err:
        raise FedsimError(f"{path}: not a readable JSON file ({err}); {fix}") from None
    if not (isinstance(data, dict) and isinstance(data.get("users"), list)
            and isinstance(data.get("user_data"), dict)):
        raise FedsimError(f"{path}: not LEAF's layout (an object with `users`, `num_samples` and "
                          f"`user_data`); {fix}")
    counts = data.get("num_samples")
    for k, user in enumerate(data["users"]):
        if not isinstance(user, str):
            raise FedsimError(f"{path}: user {k} of `users` is {_shown(user)}, not a string (the key of its "
                              f"samples in `user_data`); {fix}")
        where = f"{path}, user {user!r}"
        entry = data["user_data"].get(user)
        if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) or not isinstance(entry.get("y"), list):
            raise FedsimError(f"{where}: no `x` and `y` lists in `user_data`; {fix}")
        x, y = entry["x"], entry["y"]
        if len(x) != len(y):
            raise FedsimError(f"{where}: {len(x)} samples in x but {len(y)} labels in y; {fix}")
        if not y:
            raise FedsimError(f"{where}: the user has no samples; remove it (LEAF's --smplseed/-k "
                              "options drop users with few samples)")
        if isinstance(counts, list) and k < len(counts) and counts[k] != len(y):
            raise FedsimError(f"{where}: num_samples says {counts[k]} but x and y hold {len(y)}; {fix}")
        yield user, x, y


def _labels(y: list, n_classes: int, where: str) -> np.ndarray:
    try:
        labels = np.asarray(y, dtype=np.float64)
    except (ValueError, TypeError):
        raise FedsimError(f"{where}: y is not a list of class numbers") from None
    bad = (labels != np.round(labels)) | (labels < 0) | (labels >= n_classes)
    if labels.ndim != 1 or bad.any():
        value = y[int(np.argmax(bad))] if labels.ndim == 1 else y[0]
        raise FedsimError(f"{where}: label {value!r} outside the classes 0..{n_classes - 1}")
    return labels.astype(np.int64)


# -- per dataset: one user's samples -> (x, y) arrays, and the whole dataset's last step ---------

def _femnist(x: list, y: list, where: str) -> tuple[np.ndarray, np.ndarray]:
    """28 x 28 grey images as 784 floats in [0, 1]: kept as bytes (k / 255) when they are."""
    try:
        pixels = np.asarray(x, dtype=np.float32)
    except (ValueError, TypeError):
        raise FedsimError(f"{where}: x is not a list of 784-number rows (28 x 28 pixels)") from None
    if pixels.ndim != 2 or pixels.shape[1] != 784:
        raise FedsimError(f"{where}: x has samples of shape {pixels.shape[1:]}, expected 784 numbers "
                          "(28 x 28 pixels)")
    finite = np.isfinite(pixels).all(axis=1)
    if not finite.all():
        k = int(np.argmin(finite))
        value = pixels[k][~np.isfinite(pixels[k])][0]
        raise FedsimError(f"{where}: sample {k} has a pixel {value}, not a finite number; fix or drop the "
                          "sample (pixels are numbers in [0, 1])")
    levels = np.rint(pixels * 255)
    if np.abs(levels / 255 - pixels).max() < 1e-6 and levels.min() >= 0 and levels.max() <= 255:
        pixels = levels.astype(np.uint8)
    return pixels.reshape(-1, 1, 28, 28), _labels(y, CLASSES["femnist"], where)


def _femnist_finish(arrays: dict) -> Arrays:
    exact = all(part.dtype == np.uint8 for split in ("train", "test") for part in arrays[f"x_{split}"])
    for split in ("train", "test"):
        parts = arrays[f"x_{split}"]
        arrays[f"x_{split}"] = (np.concatenate(parts) if exact else
                                np.concatenate([p / np.float32(255) if p.dtype == np.uint8 else p for p in parts]))
    arrays["scale"] = np.asarray(1 / 255 if exact else 1.0)
    return arrays


def _shakespeare(x: list, y: list, where: str) -> tuple[np.ndarray, np.ndarray]:
    """80-character strings -> letter ids [n, 80]; y, the next character -> its id."""
    for k, sample in enumerate(x):
        if not isinstance(sample, str) or len(sample) != text.MAX_CHARACTERS:
            raise FedsimError(f"{where}: sample {k} is {_shown(sample)}, expected a string of "
                              f"{text.MAX_CHARACTERS} characters")
    for k, label in enumerate(y):
        if not isinstance(label, str) or len(label) != 1:
            raise FedsimError(f"{where}: label {k} is {_shown(label)}, expected one character (the next one)")
    return text.letter_ids(x).reshape(len(x), text.MAX_CHARACTERS), text.letter_ids(y)


def _shakespeare_finish(arrays: dict) -> Arrays:
    """LEAF reads a character outside its vocabulary (index -1) as its last letter: so do we,
    and count them."""
    unknown = 0
    for split in ("train", "test"):
        for key in (f"x_{split}", f"y_{split}"):
            ids = np.concatenate(arrays[key]) if key.startswith("x") else arrays[key]
            unknown += int((ids < 0).sum())
            arrays[key] = np.where(ids < 0, len(text.LEAF_LETTERS) - 1, ids).astype(np.uint8)  # 80 letters
    return arrays | {"unknown": np.asarray(unknown)}


def _sent140(x: list, y: list, where: str) -> tuple[list, np.ndarray]:
    """LEAF's rows [id, date, query, user, text] -> the text's words (encoded when all are read)."""
    texts = []
    for k, row in enumerate(x):
        if not (isinstance(row, list) and len(row) >= 5 and isinstance(row[4], str)):
            raise FedsimError(f"{where}: sample {k} is {_shown(row)}, expected LEAF's row "
                              "[id, date, query, user, text]")
        texts.append(text.words(row[4]))
    return texts, _labels(y, CLASSES["sent140"], where)


def _sent140_finish(arrays: dict) -> Arrays:
    train = [t for part in arrays["x_train"] for t in part]
    vocabulary = text.word_vocabulary(train)
    ids = {w: k + 2 for k, w in enumerate(vocabulary)}
    for split in ("train", "test"):
        texts = train if split == "train" else [t for part in arrays["x_test"] for t in part]
        arrays[f"x_{split}"] = text.encode(texts, ids, text.MAX_WORDS)
    return arrays | {"vocabulary": np.asarray(vocabulary, dtype=str)}


def _shown(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


SAMPLES = {"femnist": _femnist, "shakespeare": _shakespeare, "sent140": _sent140}
FINISH = {"femnist": _femnist_finish, "shakespeare": _shakespeare_finish, "sent140": _sent140_finish}
