"""A dataset as arrays: train/test features and labels, and, for a dataset with its own
clients, the device of every sample (what the loaders of fedsim/data/datasets.py give)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Dataset:
    name: str
    x_train: np.ndarray  # [n, *shape] uint8 (images) or float32
    y_train: np.ndarray  # [n] int64
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    scale: float = 1.0  # features = x * scale (1/255 for uint8 images)
    # datasets with their own clients (fedsim/data/federated.py): the device of every sample
    owner_train: np.ndarray | None = None
    owner_test: np.ndarray | None = None
    users: np.ndarray | None = None  # device -> the dataset's user id
    vocab_size: int = 0  # > 0: x holds token ids below it (text), not features
    vocabulary: tuple[str, ...] = ()  # the words of ids 2, 3, ... (fedsim/data/text.py)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one sample: (channels, height, width) for images, (dim,) for vectors,
        (length,) for token rows."""
        return tuple(self.x_train.shape[1:])
