"""Datasets as arrays: train/test features and labels, read from local files or generated.

Image pixels stay uint8 here (with a `scale` to [0, 1]); `ClientData` puts them on the run's
device as float32. Nothing is downloaded unless `[data] download = true`.
"""

from __future__ import annotations

import functools
import gzip
import math
import zlib
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from fedsim.config import DataConfig
from fedsim.data.dataset import Dataset
from fedsim.errors import FedsimError, choice_error, first_line


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, where: str):
    """Stratified train/test split with a fixed seed (0): the test set does not change with
    [run] seed, so runs with different seeds are scored on the same samples.

    Per class, a seeded permutation sends round(test_fraction * n_class) samples to the test
    set, at least one to each side. When some class has fewer than 2 samples, the whole set
    is split that way as one group instead (unstratified). Both parts keep the input order.
    """
    if not 0 < test_fraction < 1:
        raise FedsimError(f"{where}: [data] test_fraction = {test_fraction} must be in (0, 1)")
    rng = np.random.default_rng(0)
    stratify = np.bincount(y).min() >= 2  # when every class can be split
    groups = [np.flatnonzero(y == c) for c in np.unique(y)] if stratify else [np.arange(len(y))]
    test = np.zeros(len(y), dtype=bool)
    for members in groups:
        n_test = min(max(round(test_fraction * len(members)), 1), len(members) - 1)
        test[rng.permutation(members)[:n_test]] = True
    return x[~test], y[~test].astype(np.int64), x[test], y[test].astype(np.int64)


def _digits_file() -> Path:
    """scikit-learn's bundled digits.csv.gz, found without importing sklearn (0.8 s)."""
    spec = find_spec("sklearn")
    folders = spec.submodule_search_locations if spec else None
    path = Path(folders[0]) / "datasets" / "data" / "digits.csv.gz" if folders else None
    if path is None or not path.is_file():
        raise FedsimError("[data] dataset = 'digits' reads the copy bundled with scikit-learn, "
                          f"which {'is not installed' if path is None else f'lacks {path}'}; "
                          "install scikit-learn or choose another [data] dataset")
    return path


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 8x8 digits as uint8 images [n, 1, 8, 8] (values 0..16) and int64 labels: the
    rows of digits.csv.gz are 64 pixels and the label, as ``sklearn.datasets.load_digits``
    reads them. Read once per process (a study's runs share it), as read-only arrays."""
    return _read_digits(_digits_file())


@functools.cache
def _read_digits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            table = np.loadtxt(f, delimiter=",", ndmin=2)
        if table.shape[1] != 65:
            raise ValueError(f"{table.shape[1]} columns, expected 64 pixels and a label")
    except (OSError, EOFError, ValueError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise FedsimError(f"[data] dataset = 'digits': {path} is damaged ({exc}); "
                          "re-install scikit-learn") from None
    x, y = table[:, :64].astype(np.uint8).reshape(-1, 1, 8, 8), table[:, 64].astype(np.int64)
    x.flags.writeable = y.flags.writeable = False
    return x, y


def _digits(cfg: DataConfig, seed: int) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images, values 0..16)."""
    x, y = read_digits()
    x_tr, y_tr, x_te, y_te = _split(x, y, cfg.test_fraction, "digits")
    return Dataset("digits", x_tr, y_tr, x_te, y_te, 10, scale=1 / 16)


def _logistic(cfg: DataConfig, seed: int) -> Dataset:
    """Synthetic multinomial logistic data: x ~ N(0, I), y ~ softmax(x W + b), W, b ~ N(0, 1)."""
    if cfg.classes < 2 or cfg.samples < 2 * cfg.classes or cfg.dim < 1:
        raise FedsimError(
            "[data] dataset = 'logistic' needs classes >= 2, dim >= 1 and samples >= 2 * classes; "
            f"got classes = {cfg.classes}, dim = {cfg.dim}, samples = {cfg.samples}"
        )
    rng = np.random.default_rng([seed, 0x10615])
    w = rng.normal(size=(cfg.dim, cfg.classes))
    b = rng.normal(size=cfg.classes)
    x = rng.normal(size=(cfg.samples, cfg.dim)).astype(np.float32)
    logits = x @ w + b
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    cum = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
    y = np.minimum((rng.random(cfg.samples)[:, None] > cum).sum(axis=1), cfg.classes - 1)
    x_tr, y_tr, x_te, y_te = _split(x, y, cfg.test_fraction, "logistic")
    return Dataset("logistic", x_tr, y_tr, x_te, y_te, cfg.classes)


# --- IDX files (MNIST, Fashion-MNIST) -------------------------------------------------------

_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _read_idx(path: Path, ndim: int, name: str) -> np.ndarray:
    """An IDX array of unsigned bytes with ``ndim`` dimensions (the MNIST file format), gzipped
    or not; a damaged file (truncated download, wrong file) is one error line naming it. Read
    once per process while the file is unchanged (a study's 60 points decompress it once);
    the array is shared, so nobody may write into it."""
    stat = path.stat()
    return _read_idx_file(path, stat.st_mtime_ns, stat.st_size, ndim, name)


@functools.lru_cache(maxsize=8)
def _read_idx_file(path: Path, mtime_ns: int, size: int, ndim: int, name: str) -> np.ndarray:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise _damaged(name, path, f"not a complete gzip file ({exc})") from None
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise _damaged(name, path, f"truncated: {len(raw)} bytes, shorter than its header")
    magic, expected = int.from_bytes(raw[:4], "big"), 0x800 + ndim
    if magic != expected:
        raise _damaged(name, path, f"magic number {magic:#010x}, expected {expected:#010x} "
                                   f"(unsigned bytes in {ndim} dimensions)")
    dims = [int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4)]
    if len(raw) - header != math.prod(dims):
        raise _damaged(name, path, f"{len(raw) - header:,} data bytes where its header says "
                                   f"{' x '.join(map(str, dims))} = {math.prod(dims):,}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _check_idx_pair(name: str, images: Path, labels: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Images and labels of one split must pair up, with labels 0..9."""
    if len(x) != len(y):
        raise _damaged(name, images, f"{len(x):,} images but {labels} holds {len(y):,} labels")
    if y.size and y.max() > 9:
        raise _damaged(name, labels, f"label {int(y.max())} outside 0..9")


def _damaged(name: str, path: Path, problem: str) -> FedsimError:
    return FedsimError(
        f"[data] dataset = '{name}': {path} is damaged ({problem}); replace the files with a "
        f"fresh copy (re-install the dataset package, or delete them and set [data] download = true)"
    )


def _find_idx(folder: Path) -> list[Path] | None:
    """The four IDX files in `folder` (plain or .gz), or None if any is missing."""
    found = []
    for stem in _IDX_FILES:
        hits = [folder / stem, folder / f"{stem}.gz"]
        hit = next((p for p in hits if p.is_file()), None)
        if hit is None:
            return None
        found.append(hit)
    return found


def _idx_dataset(name: str, torchvision_class: str, cfg: DataConfig, root: Path) -> Dataset:
    """MNIST-format files in `root` (Debian's layout) or `root/<Class>/raw` (torchvision's)."""
    folders = [root, root / torchvision_class / "raw"]
    files = next((f for f in map(_find_idx, folders) if f), None)
    if files is None and cfg.download:
        import torchvision.datasets

        _torchvision(name, root, getattr(torchvision.datasets, torchvision_class), download=True)
        files = _find_idx(folders[1])
    if files is None:
        raise _missing(name, root, ", ".join(f"{s}[.gz]" for s in _IDX_FILES))
    x_tr, y_tr, x_te, y_te = (_read_idx(f, ndim, name) for f, ndim in zip(files, (3, 1, 3, 1)))
    _check_idx_pair(name, files[0], files[1], x_tr, y_tr)
    _check_idx_pair(name, files[2], files[3], x_te, y_te)
    return Dataset(name, x_tr[:, None], y_tr.astype(np.int64), x_te[:, None],
                   y_te.astype(np.int64), 10, scale=1 / 255)


def _fashion_mnist(cfg: DataConfig, seed: int) -> Dataset:
    return _idx_dataset("fashion-mnist", "FashionMNIST", cfg, _root(cfg, "fashion-mnist"))


def _mnist(cfg: DataConfig, seed: int) -> Dataset:
    return _idx_dataset("mnist", "MNIST", cfg, _root(cfg, "mnist"))


# --- torchvision datasets (CIFAR-10, SVHN) ---------------------------------------------------

def _cifar(name: str, folder: str, files: list[str], expected: str, torchvision_class: str, classes: int):
    """CIFAR-10 or CIFAR-100 (its 100 fine labels) through torchvision's reader."""
    def load(cfg: DataConfig, seed: int) -> Dataset:
        root = _root(cfg, name)
        if not cfg.download and not all((root / folder / f).is_file() for f in files):
            raise _missing(name, root, expected)
        import torchvision.datasets

        cls = getattr(torchvision.datasets, torchvision_class)
        parts = [_torchvision(name, root, cls, train=train, download=cfg.download) for train in (True, False)]
        x_tr, x_te = (p.data.transpose(0, 3, 1, 2).copy() for p in parts)  # NHWC -> NCHW
        y_tr, y_te = (np.asarray(p.targets, dtype=np.int64) for p in parts)
        return Dataset(name, x_tr, y_tr, x_te, y_te, classes, scale=1 / 255)
    return load


_cifar10 = _cifar("cifar10", "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"],
                  "cifar-10-batches-py/data_batch_1..5, cifar-10-batches-py/test_batch", "CIFAR10", 10)
_cifar100 = _cifar("cifar100", "cifar-100-python", ["train", "test", "meta"],
                   "cifar-100-python/train, test and meta", "CIFAR100", 100)


def _svhn(cfg: DataConfig, seed: int) -> Dataset:
    root = _root(cfg, "svhn")
    if not cfg.download and not all((root / f).is_file() for f in ("train_32x32.mat", "test_32x32.mat")):
        raise _missing("svhn", root, "train_32x32.mat, test_32x32.mat")
    from torchvision.datasets import SVHN

    parts = [_torchvision("svhn", root, SVHN, split=split, download=cfg.download) for split in ("train", "test")]
    return Dataset("svhn", parts[0].data, parts[0].labels.astype(np.int64), parts[1].data,
                   parts[1].labels.astype(np.int64), 10, scale=1 / 255)


def _torchvision(name: str, root: Path, cls, **kwargs):
    """A torchvision dataset; its failures (corrupt file, failed download) as one-line errors. A
    failed download leaves no empty folders behind (torchvision makes them first)."""
    existed = _folders(root) if kwargs.get("download") else set()
    try:
        return cls(str(root), **kwargs)
    except (RuntimeError, OSError, ValueError) as err:
        if not kwargs.get("download"):
            raise FedsimError(f"[data] dataset = '{name}': torchvision could not load it from {root} "
                              f"({first_line(err)}); check the files there, or set [data] download = true") from None
        for folder in sorted(_folders(root) - existed, key=lambda f: len(f.parts), reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()
        raise FedsimError(f"[data] dataset = '{name}': downloading it into {root} failed ({first_line(err)}); "
                          "check the network, or put the files there yourself and set [data] root") from None


def _folders(root: Path) -> set[Path]:
    """`root`, the folders above it and those in it, where they exist."""
    return {f for f in (root, *root.parents) if f.is_dir()} | {f for f in root.rglob("*") if f.is_dir()}


# --- datasets with their own clients (LEAF, Parquet) ------------------------------------------

def _leaf(name: str):
    def load(cfg: DataConfig, seed: int) -> Dataset:
        from fedsim.data.federated import federated_dataset
        from fedsim.data.leaf import read_leaf

        return federated_dataset(name, read_leaf(name, _root(cfg, name)), cfg)
    return load


def _parquet(cfg: DataConfig, seed: int) -> Dataset:
    from fedsim.data.federated import federated_dataset
    from fedsim.data.parquet_clients import read_parquet_clients

    if not cfg.root:
        raise FedsimError("[data] dataset = 'parquet' needs [data] root: the folder of its Parquet files")
    return federated_dataset("parquet", read_parquet_clients(cfg, _root(cfg, "parquet")), cfg)


# --- lookup ----------------------------------------------------------------------------------

DEFAULT_ROOTS = {
    "fashion-mnist": "/usr/share/datasets/fashion-mnist",  # Debian's dataset-fashion-mnist
    "mnist": "data/mnist",
    "cifar10": "data/cifar10",
    "cifar100": "data/cifar100",
    "svhn": "data/svhn",
    "femnist": "data/femnist/data",  # LEAF's layout: data/<name>/data/{train,test}/*.json
    "shakespeare": "data/shakespeare/data",
    "sent140": "data/sent140/data",
}


def _root(cfg: DataConfig, name: str) -> Path:
    return Path(cfg.root or DEFAULT_ROOTS[name]).expanduser()


def _missing(name: str, root: Path, expected: str) -> FedsimError:
    return FedsimError(
        f"[data] dataset = '{name}': files not found in {root} (expected {expected}); "
        f"set [data] root to the folder that holds them, or [data] download = true to fetch them"
    )


LOADERS = {
    "digits": _digits,
    "fashion-mnist": _fashion_mnist,
    "mnist": _mnist,
    "cifar10": _cifar10,
    "cifar100": _cifar100,
    "svhn": _svhn,
    "femnist": _leaf("femnist"),
    "shakespeare": _leaf("shakespeare"),
    "sent140": _leaf("sent140"),
    "parquet": _parquet,
    "logistic": _logistic,
}
DATASETS = (*LOADERS, "quadratic")


# names people call the datasets by, which "did you mean" (close spellings) would not find
NICKNAMES = {"fmnist": "fashion-mnist", "fashionmnist": "fashion-mnist", "fashion_mnist": "fashion-mnist",
             "cifar-10": "cifar10", "cifar-100": "cifar100"}


def load_dataset(cfg: DataConfig, seed: int) -> Dataset:
    """The dataset named by `[data] dataset` (not `quadratic`, which has no samples)."""
    if cfg.dataset in NICKNAMES:
        raise FedsimError(f"[data] dataset = {cfg.dataset!r} is unknown; did you mean {NICKNAMES[cfg.dataset]!r}? "
                          f"(one of: {', '.join(DATASETS)})")
    if cfg.dataset not in LOADERS:
        raise choice_error("[data] dataset", cfg.dataset, DATASETS)
    return LOADERS[cfg.dataset](cfg, seed)
