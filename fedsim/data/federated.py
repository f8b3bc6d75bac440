"""A dataset with its own clients (LEAF, Parquet) as a `Dataset`, its users chosen as devices.

Under the natural partition every user is one device: `[data] clients` users are taken, the
first ones (in file order) or those with the most training samples (`[data] users`), and the
test set is their test samples (and those of test-only users, who are no device). Under any
other partition the users' samples are pooled and split like an image dataset's, and the test
set is every user's test samples.
"""

from __future__ import annotations

import numpy as np

from fedsim.config import DataConfig
from fedsim.data import text
from fedsim.data.cache import Arrays
from fedsim.data.dataset import Dataset
from fedsim.data.leaf import CLASSES
from fedsim.errors import FedsimError


def federated_dataset(name: str, arrays: Arrays, cfg: DataConfig) -> Dataset:
    x_train, x_test = arrays["x_train"], arrays["x_test"]
    vocab_size, vocabulary = 0, ()
    if "vocabulary" in arrays:  # words: keep the vocab_size most frequent
        words = min(cfg.vocab_size, len(arrays["vocabulary"]))
        x_train, x_test = (text.limit_vocabulary(x, words) for x in (x_train, x_test))
        vocab_size, vocabulary = words + 2, tuple(arrays["vocabulary"][:words].tolist())
    elif name == "shakespeare":  # LEAF's letters: the ids are the letters' indices
        vocab_size = len(text.LEAF_LETTERS)
    data = Dataset(name, x_train, arrays["y_train"], x_test, arrays["y_test"], _classes(name, arrays),
                   scale=float(arrays.get("scale", 1.0)), vocab_size=vocab_size, vocabulary=vocabulary)
    if (cfg.partition or "natural") != "natural":
        return data
    chosen = _chosen_users(name, arrays, cfg)
    device = np.full(len(arrays["users"]), -1, dtype=np.int64)
    device[chosen] = np.arange(len(chosen))
    for split in ("train", "test"):
        raw = arrays[f"owner_{split}"]
        owner = np.where(raw >= 0, device[raw], -1)  # -1 stays: a test-only user's samples
        keep = (owner >= 0) | (raw < 0)
        if not keep.all():
            setattr(data, f"x_{split}", getattr(data, f"x_{split}")[keep])
            setattr(data, f"y_{split}", getattr(data, f"y_{split}")[keep])
        setattr(data, f"owner_{split}", owner[keep])
    data.users = arrays["users"][chosen]
    if not len(data.y_test):
        more = "take more users ([data] clients) or " if len(chosen) < len(arrays["users"]) else ""
        raise FedsimError(f"[data] dataset = {name!r}: the {len(chosen)} users taken have no test samples; " + more
                          + "give the dataset test files")
    return data


def _chosen_users(name: str, arrays: Arrays, cfg: DataConfig) -> np.ndarray:
    """The users that become devices 0..clients-1, in the dataset's order."""
    n_users = len(arrays["users"])
    if cfg.clients > n_users:
        raise FedsimError(f"[data] clients = {cfg.clients}, but [data] dataset = {name!r} has {n_users} users, "
                          f"one device each under the natural partition; set [data] clients <= {n_users}, "
                          "or pool the users' samples with [data] partition = 'iid'")
    if cfg.users == "first":
        return np.arange(cfg.clients)
    sizes = np.bincount(arrays["owner_train"], minlength=n_users)
    return np.sort(np.argsort(-sizes, kind="stable")[:cfg.clients])


def _classes(name: str, arrays: Arrays) -> int:
    if name in CLASSES:
        return CLASSES[name]
    if "label_names" in arrays:
        return len(arrays["label_names"])
    return int(max(arrays["y_train"].max(initial=0), arrays["y_test"].max(initial=0))) + 1
