"""Partitions (ALGORITHMS.md §3): coverage, sizes and label skew."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.config import DataConfig
from fedsim.config.catalog import PARTITIONS
from fedsim.data.partition import partition, to_csr
from fedsim.errors import FedsimError

LABELS = np.repeat(np.arange(10), 120)  # 1200 samples, 10 balanced classes
np.random.default_rng(0).shuffle(LABELS)


def label_counts(owner: np.ndarray, labels: np.ndarray, n_clients: int) -> np.ndarray:
    counts = np.zeros((n_clients, labels.max() + 1), dtype=int)
    np.add.at(counts, (owner, labels), 1)
    return counts


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(set(PARTITIONS) - {"natural"})), clients=st.integers(10, 40), seed=st.integers(0, 10**6))
def test_every_sample_belongs_to_exactly_one_client(name, clients, seed):
    cfg = DataConfig(clients=clients, partition=name, alpha=0.3, classes_per_client=2)
    owner = partition(LABELS, cfg, seed)
    offsets, indices = to_csr(owner, clients)
    assert np.array_equal(np.sort(indices), np.arange(len(LABELS)))  # each sample once
    assert offsets[-1] == len(LABELS) and np.all(np.diff(offsets) > 0)  # nobody empty
    for i in (0, clients - 1):
        assert np.all(owner[indices[offsets[i]:offsets[i + 1]]] == i)


def test_deterministic_for_a_seed():
    cfg = DataConfig(clients=20, partition="dirichlet", alpha=0.2)
    assert np.array_equal(partition(LABELS, cfg, 3), partition(LABELS, cfg, 3))
    assert not np.array_equal(partition(LABELS, cfg, 3), partition(LABELS, cfg, 4))


def test_iid_sizes_equal_and_labels_balanced():
    owner = partition(LABELS, DataConfig(clients=12, partition="iid"), 0)
    sizes = np.bincount(owner)
    assert sizes.max() - sizes.min() <= 1
    assert label_counts(owner, LABELS, 12).min() >= 2


def test_dirichlet_label_skew_falls_with_alpha():
    def skew(alpha):
        owner = partition(LABELS, DataConfig(clients=20, partition="dirichlet", alpha=alpha), 0)
        counts = label_counts(owner, LABELS, 20)
        props = counts / counts.sum(axis=1, keepdims=True)
        return np.abs(props - 0.1).sum(axis=1).mean() / 2  # mean total-variation from uniform

    skews = [skew(a) for a in (0.05, 0.5, 5.0, 100.0)]
    assert skews == sorted(skews, reverse=True)
    assert skews[0] > 0.6 and skews[-1] < 0.25  # 60 samples a client: some noise remains
    sizes = np.bincount(partition(LABELS, DataConfig(clients=20, partition="dirichlet", alpha=0.1), 0))
    assert sizes.max() - sizes.min() <= 1  # equal-sized clients


@pytest.mark.parametrize("per", [1, 2, 3, 5])
def test_classes_gives_each_client_exactly_its_classes_in_equal_shards(per):
    owner = partition(LABELS, DataConfig(clients=40, partition="classes", classes_per_client=per), 1)
    counts = label_counts(owner, LABELS, 40)
    assert np.all((counts > 0).sum(axis=1) == per)
    shards = counts[counts > 0]
    assert shards.max() - shards.min() <= 1 + shards.max() // 10  # equal shards (+- rounding)
    assert (counts > 0).sum(axis=0).max() - (counts > 0).sum(axis=0).min() <= 1  # classes used evenly


def test_classes_with_just_enough_slots_gives_each_class_one_holder():
    owner = partition(LABELS, DataConfig(clients=5, partition="classes", classes_per_client=2), 1)
    counts = label_counts(owner, LABELS, 5)
    assert np.array_equal((counts > 0).sum(axis=0), np.ones(10)) and counts.sum() == len(LABELS)
    assert np.array_equal((counts > 0).sum(axis=1), np.full(5, 2))


def test_classes_pairs_are_diverse():
    owner = partition(LABELS, DataConfig(clients=50, partition="classes", classes_per_client=2), 0)
    pairs = {tuple(np.flatnonzero(row)) for row in label_counts(owner, LABELS, 50)}
    assert len(pairs) > 15  # not just 5 fixed pairs


def test_one_class_normal_sizes():
    cfg = DataConfig(clients=30, partition="one-class", size_sigma=0.3)
    owner = partition(LABELS, cfg, 0)
    counts = label_counts(owner, LABELS, 30)
    assert np.all((counts > 0).sum(axis=1) == 1)
    assert np.all((counts > 0).sum(axis=0) == 3)  # clients spread evenly over classes
    sizes = counts.sum(axis=1)
    assert 0.1 < sizes.std() / sizes.mean() < 0.6


def test_majority_fraction():
    cfg = DataConfig(clients=20, partition="majority", majority=0.95)
    owner = partition(LABELS, cfg, 0)
    counts = label_counts(owner, LABELS, 20)
    top = counts.max(axis=1) / counts.sum(axis=1)
    assert abs(top.mean() - 0.95) < 0.03
    assert np.all(np.bincount(counts.argmax(axis=1), minlength=10) == 2)  # majorities round-robin
    minority = counts.copy()
    minority[np.arange(20), counts.argmax(axis=1)] = 0
    assert np.all(minority.sum(axis=0) > 0)  # the other 5% is spread over every label


@pytest.mark.parametrize("cfg, words", [
    (DataConfig(clients=2000, partition="iid"), "lower [data] clients"),
    (DataConfig(clients=10, partition="classes", classes_per_client=11), "classes_per_client"),
    (DataConfig(clients=5, partition="one-class"), "clients >= the 10 classes"),
    (DataConfig(clients=4, partition="classes", classes_per_client=2),
     "4 clients x 2 classes_per_client cover at most 8 of the 10 classes"),
    (DataConfig(clients=10, partition="dirichlet", alpha=0.0), "alpha"),
    (DataConfig(clients=10, partition="shards"), "one of: iid"),
])
def test_partition_errors_are_one_line(cfg, words):
    with pytest.raises(FedsimError) as err:
        partition(LABELS, cfg, 0)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_natural_partition_needs_a_dataset_with_its_own_clients():
    with pytest.raises(FedsimError, match="'natural' needs a dataset with its own clients.*'digits' has none"):
        partition(LABELS, DataConfig(clients=10, partition="natural"), 0)
