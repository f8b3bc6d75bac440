"""Partitions of a labelled training set over N clients (docs/algorithms.md).

Each partitioner returns `owner`, the client of every sample, so that every sample belongs to
exactly one client by construction; `to_csr` turns it into the offsets/indices lists the
trainer gathers from.
"""

from __future__ import annotations

import numpy as np

from fedsim.config import DataConfig
from fedsim.config.catalog import PARTITIONS
from fedsim.errors import FedsimError


def _equal_sizes(n: int, n_clients: int) -> np.ndarray:
    """n split into n_clients sizes that differ by at most one."""
    return np.diff(np.arange(n_clients + 1) * n // n_clients)


def _split_among(owner: np.ndarray, members: np.ndarray, clients: np.ndarray,
                 weights: np.ndarray) -> None:
    """Give the samples `members` (already shuffled) to `clients` in proportion to `weights`."""
    cuts = np.round(np.cumsum(weights) / weights.sum() * len(members)).astype(np.int64)
    owner[members] = np.repeat(clients, np.diff(cuts, prepend=0))


def iid(labels: np.ndarray, n_clients: int, cfg: DataConfig, rng: np.random.Generator) -> np.ndarray:
    """A random permutation cut into equal parts."""
    owner = np.empty(len(labels), dtype=np.int64)
    owner[rng.permutation(len(labels))] = np.repeat(np.arange(n_clients), _equal_sizes(len(labels), n_clients))
    return owner


def dirichlet(labels: np.ndarray, n_clients: int, cfg: DataConfig, rng: np.random.Generator) -> np.ndarray:
    """Equal-sized clients whose class proportions are drawn from Dir(alpha) (002).

    Clients fill up in random order; when a class runs out, a client's remaining demand is
    spread over its other classes in proportion to its draw (Hsu et al. 2019).
    """
    if cfg.alpha <= 0:
        raise FedsimError(f"[data] alpha = {cfg.alpha} must be > 0 for partition = 'dirichlet'")
    n_classes = labels.max() + 1
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(n_classes)]
    left = np.array([len(p) for p in pools])
    props = rng.dirichlet(np.full(n_classes, cfg.alpha), size=n_clients)
    sizes = _equal_sizes(len(labels), n_clients)
    owner = np.empty(len(labels), dtype=np.int64)
    for i in rng.permutation(n_clients):
        take = np.zeros(n_classes, dtype=np.int64)
        while (want := sizes[i] - take.sum()) > 0:
            p = props[i] * (left > take)
            p = p if p.sum() > 0 else (left > take).astype(float)
            take += np.minimum(rng.multinomial(want, p / p.sum()), left - take)
        for c in np.flatnonzero(take):
            used = len(pools[c]) - left[c]
            owner[pools[c][used:used + take[c]]] = i
        left -= take
    return owner


def classes(labels: np.ndarray, n_clients: int, cfg: DataConfig, rng: np.random.Generator) -> np.ndarray:
    """Each client holds `classes_per_client` distinct classes, one equal shard of each (004).

    Class slots are dealt from a deck of shuffled copies of all classes, so every class is
    split into the same number of shards (+-1); a hand with a repeated class swaps the repeat
    with another client's card.
    """
    n_classes = labels.max() + 1
    per = cfg.classes_per_client
    if not 1 <= per <= n_classes:
        raise FedsimError(
            f"[data] classes_per_client = {per} must be between 1 and the {n_classes} classes"
        )
    if n_clients * per < n_classes:  # a class nobody holds would leave its samples unowned
        raise FedsimError(
            f"[data] partition = 'classes': {n_clients} clients x {per} classes_per_client cover "
            f"at most {n_clients * per} of the {n_classes} classes, and every class needs a "
            f"holder; raise [data] clients to {-(-n_classes // per)} or classes_per_client")
    decks = -(-n_clients * per // n_classes)
    hands = np.concatenate([rng.permutation(n_classes) for _ in range(decks)])[: n_clients * per]
    hands = hands.reshape(n_clients, per)
    for i in range(n_clients):
        while len(set(hands[i])) < per:
            _swap_repeat(hands, i, rng)
    owner = np.empty(len(labels), dtype=np.int64)
    for c in range(n_classes):  # the first deck gives every class a holder
        holders = np.flatnonzero((hands == c).any(axis=1))
        members = rng.permutation(np.flatnonzero(labels == c))
        _split_among(owner, members, holders, np.ones(len(holders)))
    return owner


def _swap_repeat(hands: np.ndarray, i: int, rng: np.random.Generator) -> None:
    """Swap one repeated class of client i with a card of another client, keeping both distinct."""
    _, first = np.unique(hands[i], return_index=True)
    pos = np.setdiff1d(np.arange(hands.shape[1]), first)[0]
    mine = hands[i, pos]
    ok = ~np.isin(hands, hands[i]) & ~(hands == mine).any(axis=1, keepdims=True)
    candidates = np.argwhere(ok)
    if len(candidates) == 0:
        raise FedsimError(
            f"[data] partition = 'classes': cannot give {hands.shape[0]} clients "
            f"{hands.shape[1]} distinct classes each; lower classes_per_client or clients"
        )
    k, q = candidates[rng.integers(len(candidates))]
    hands[i, pos], hands[k, q] = hands[k, q], mine


def one_class(labels: np.ndarray, n_clients: int, cfg: DataConfig, rng: np.random.Generator) -> np.ndarray:
    """Each client holds one class; sizes ~ Normal(mean, (size_sigma * mean)^2) (001).

    Clients are spread evenly over the classes; a class's samples are cut among its clients in
    proportion to their drawn sizes (floored at 10% of the mean).
    """
    n_classes = labels.max() + 1
    if n_clients < n_classes:
        raise FedsimError(
            f"[data] partition = 'one-class' needs clients >= the {n_classes} classes; got {n_clients}"
        )
    holder_class = rng.permutation(np.arange(n_clients) % n_classes)
    weights = np.maximum(rng.normal(1.0, cfg.size_sigma, size=n_clients), 0.1)
    owner = np.empty(len(labels), dtype=np.int64)
    for c in range(n_classes):
        holders = np.flatnonzero(holder_class == c)
        _split_among(owner, rng.permutation(np.flatnonzero(labels == c)), holders, weights[holders])
    return owner


def majority(labels: np.ndarray, n_clients: int, cfg: DataConfig, rng: np.random.Generator) -> np.ndarray:
    """Each client has one majority class; the other samples are spread uniformly (003).

    Majority classes go round-robin over the clients. A sample goes, with probability
    `majority`, to a random client whose majority is its label, and otherwise to a random
    client with another majority; so a client holds about a fraction `majority` of its class.
    """
    if not 0 <= cfg.majority <= 1:
        raise FedsimError(f"[data] majority = {cfg.majority} must be in [0, 1]")
    n_classes = labels.max() + 1
    major = rng.permutation(np.arange(n_clients) % n_classes)
    by_class = [np.flatnonzero(major == c) for c in range(n_classes)]
    others = [np.flatnonzero(major != c) for c in range(n_classes)]
    home = rng.random(len(labels)) < cfg.majority
    pick = rng.random(len(labels))
    owner = np.empty(len(labels), dtype=np.int64)
    for c in range(n_classes):
        members = labels == c
        for pool, chosen in ((by_class[c], members & home), (others[c], members & ~home)):
            pool = pool if len(pool) else np.arange(n_clients)
            owner[chosen] = pool[(pick[chosen] * len(pool)).astype(np.int64)]
    return owner


def natural(labels: np.ndarray, n_clients: int, cfg: DataConfig, rng: np.random.Generator) -> np.ndarray:
    """One device per user: the dataset's own clients (fedsim/data/federated.py sets them; a
    dataset that gets here has none)."""
    raise FedsimError(f"[data] partition = 'natural' needs a dataset with its own clients (femnist, "
                      f"shakespeare, sent140 or parquet); {cfg.dataset!r} has none: choose another partition")


def partition(labels: np.ndarray, cfg: DataConfig, seed: int) -> np.ndarray:
    """owner[j] = the client of training sample j, for `[data] partition` and `[data] clients`."""
    split = PARTITIONS.lookup(cfg.partition or "iid", "[data] partition")
    if cfg.clients > len(labels):  # checked first: a huge count would exhaust memory below
        raise FedsimError(
            f"[data] clients = {cfg.clients} is more than the {len(labels)} training samples of "
            f"{cfg.dataset!r}, and every client needs one; lower [data] clients")
    rng = np.random.default_rng([seed, 0x9A27])
    owner = split(labels, cfg.clients, cfg, rng)
    sizes = np.bincount(owner, minlength=cfg.clients)
    if sizes.min() == 0:
        skew = ", or lower [data] size_sigma (its spread of sizes leaves the smallest clients none)" \
            if cfg.partition == "one-class" else ""
        raise FedsimError(
            f"[data] partition = {cfg.partition or 'iid'!r} left {int((sizes == 0).sum())} of {cfg.clients} "
            f"clients without samples ({len(labels)} training samples); lower [data] clients{skew}"
        )
    return owner


def to_csr(owner: np.ndarray, n_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [N+1], indices [n]): client i's samples are indices[offsets[i]:offsets[i+1]]."""
    indices = np.argsort(owner, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_clients))])
    return offsets.astype(np.int64), indices.astype(np.int64)
