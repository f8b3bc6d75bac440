"""Dataset loading: bundled digits, IDX files, synthetic logistic, and the missing-file errors."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.config import DataConfig
from fedsim.data.clients import ClientData
from fedsim.cli import main
from fedsim.data import datasets
from fedsim.data.datasets import _split, load_dataset, read_digits
from fedsim.data.partition import partition
from fedsim.errors import FedsimError


def test_digits_split_and_scale():
    ds = load_dataset(DataConfig(dataset="digits", test_fraction=0.25), seed=0)
    assert ds.shape == (1, 8, 8) and ds.n_classes == 10
    assert len(ds.y_train) + len(ds.y_test) == 1797
    assert abs(len(ds.y_test) - 0.25 * 1797) < 1
    again = load_dataset(DataConfig(dataset="digits"), seed=5)  # the split does not follow the run seed
    assert np.array_equal(ds.y_test, again.y_test) and np.array_equal(ds.x_train, again.x_train)
    data = ClientData(ds, partition(ds.y_train, DataConfig(clients=10), 0), 10, torch.device("cpu"))
    x = data.x
    assert x.dtype == torch.float32 and float(x.min()) == 0.0 and float(x.max()) == 1.0


def test_digits_are_scikit_learns_exactly():
    from sklearn.datasets import load_digits

    x, y = read_digits()
    bunch = load_digits()
    assert x.dtype == np.uint8 and y.dtype == np.int64 and x.shape == (1797, 1, 8, 8)
    assert np.array_equal(x[:, 0], bunch.images) and np.array_equal(y, bunch.target)


@pytest.mark.parametrize("counts, fraction", [
    ([178, 182, 177], 0.25),  # digits-like
    ([2, 3, 5, 40], 0.25),  # small classes still land on both sides
    ([2, 2, 9], 0.9),
    ([10, 11], 0.05),
])
def test_split_is_stratified_disjoint_and_fixed(counts, fraction):
    y = np.random.default_rng(1).permutation(np.repeat(np.arange(len(counts)), counts))
    index = np.arange(len(y))
    i_tr, y_tr, i_te, y_te = _split(index, y, fraction, "test")
    assert np.array_equal(np.sort(np.concatenate([i_tr, i_te])), index)  # disjoint, covers all
    assert np.array_equal(y[i_tr], y_tr) and np.array_equal(y[i_te], y_te)
    for c, n in enumerate(counts):
        n_test = min(max(round(fraction * n), 1), n - 1)
        assert (y_te == c).sum() == n_test and (y_tr == c).sum() == n - n_test
    again = _split(index, y, fraction, "test")  # no seed argument: the same split every run
    assert np.array_equal(i_te, again[2]) and np.array_equal(i_tr, again[0])


def test_split_is_unstratified_when_a_class_has_one_sample():
    y = np.array([0] * 20 + [1])
    i_tr, _, i_te, _ = _split(np.arange(21), y, 0.25, "test")
    assert len(i_te) == round(0.25 * 21) and len(i_tr) + len(i_te) == 21
    assert not set(i_tr) & set(i_te)


def test_missing_or_damaged_digits_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "find_spec", lambda name: None)
    with pytest.raises(FedsimError, match="copy bundled with scikit-learn, which is not installed; "
                                          "install scikit-learn"):
        load_dataset(DataConfig(dataset="digits"), seed=0)
    spec = type("Spec", (), {"submodule_search_locations": [str(tmp_path)]})
    monkeypatch.setattr(datasets, "find_spec", lambda name: spec)
    with pytest.raises(FedsimError, match="which lacks .*digits.csv.gz"):
        load_dataset(DataConfig(dataset="digits"), seed=0)
    (tmp_path / "datasets" / "data").mkdir(parents=True)
    (tmp_path / "datasets" / "data" / "digits.csv.gz").write_bytes(gzip.compress(b"1,2,3\n"))
    with pytest.raises(FedsimError) as err:
        load_dataset(DataConfig(dataset="digits"), seed=0)
    assert "\n" not in str(err.value) and "is damaged (3 columns, expected 64 pixels and a label)" in str(err.value)


def test_label_distribution_rows_are_proportions():
    ds = load_dataset(DataConfig(dataset="digits"), seed=0)
    cfg = DataConfig(clients=10, partition="classes", classes_per_client=2)
    data = ClientData(ds, partition(ds.y_train, cfg, 0), 10, torch.device("cpu"))
    dist = data.label_distribution()
    assert dist.shape == (10, 10) and np.allclose(dist.sum(axis=1), 1)
    assert np.all((dist > 0).sum(axis=1) == 2)


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    header = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


@pytest.mark.parametrize("name, compress", [("fashion-mnist", True), ("mnist", False)])
def test_idx_folder(tmp_path, name, compress):
    rng = np.random.default_rng(0)
    images = {"train": rng.integers(0, 256, (30, 28, 28)), "t10k": rng.integers(0, 256, (7, 28, 28))}
    labels = {"train": np.arange(30) % 10, "t10k": np.arange(7)}
    suffix = ".gz" if compress else ""
    for part in ("train", "t10k"):
        write_idx(tmp_path / f"{part}-images-idx3-ubyte{suffix}", images[part], compress)
        write_idx(tmp_path / f"{part}-labels-idx1-ubyte{suffix}", labels[part], compress)
    ds = load_dataset(DataConfig(dataset=name, root=str(tmp_path)), seed=0)
    assert ds.x_train.shape == (30, 1, 28, 28) and ds.x_test.shape == (7, 1, 28, 28)
    assert np.array_equal(ds.x_train[:, 0], images["train"]) and np.array_equal(ds.y_test, labels["t10k"])
    assert ds.scale == 1 / 255


def write_idx_folder(folder, compress: bool, train: int = 30) -> str:
    """Four small IDX files (30 train and 7 test 28x28 images); the suffix they got."""
    rng = np.random.default_rng(0)
    suffix = ".gz" if compress else ""
    for part, n in (("train", train), ("t10k", 7)):
        write_idx(folder / f"{part}-images-idx3-ubyte{suffix}", rng.integers(0, 256, (n, 28, 28)), compress)
        write_idx(folder / f"{part}-labels-idx1-ubyte{suffix}", np.arange(n) % 10, compress)
    return suffix


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


def _wrong_magic(path):  # a labels header on an images file, gzipped again
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + gzip.decompress(path.read_bytes())[4:]))


def _not_gzip(path):
    path.write_bytes(gzip.decompress(path.read_bytes()))


def _cut_gzip(path):
    path.write_bytes(path.read_bytes()[:40])


@pytest.mark.parametrize("name, compress, damage, file, says", [
    ("mnist", False, _truncate, "train-images-idx3-ubyte", "data bytes where its header says 30 x 28 x 28"),
    ("mnist", False, lambda p: p.write_bytes(b"\x00\x00"), "t10k-labels-idx1-ubyte", "truncated: 2 bytes"),
    ("fashion-mnist", True, _wrong_magic, "t10k-images-idx3-ubyte.gz", "magic number 0x00000801, expected 0x00000803"),
    ("fashion-mnist", True, _not_gzip, "train-labels-idx1-ubyte.gz", "not a complete gzip file"),
    ("mnist", True, _cut_gzip, "train-images-idx3-ubyte.gz", "not a complete gzip file"),
])
def test_damaged_idx_file_is_one_line_naming_it(tmp_path, capsys, name, compress, damage, file, says):
    write_idx_folder(tmp_path, compress)
    damage(tmp_path / file)
    config = tmp_path / "c.toml"
    config.write_text(f"[run]\nout = '{tmp_path / 'runs'}'\n[data]\ndataset = '{name}'\nroot = '{tmp_path}'\n")
    assert main(["run", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: [data] dataset = '{name}': {tmp_path / file} is damaged (") and "\n" not in err
    assert says in err and "re-install the dataset package" in err and "download = true" in err


def test_images_and_labels_must_pair_up(tmp_path):
    suffix = write_idx_folder(tmp_path, False)
    write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", np.arange(29) % 10, False)
    with pytest.raises(FedsimError, match="train-images-idx3-ubyte is damaged .30 images but .*"
                                          "train-labels-idx1-ubyte holds 29 labels"):
        load_dataset(DataConfig(dataset="mnist", root=str(tmp_path)), seed=0)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.arange(30) % 11, False)
    with pytest.raises(FedsimError, match="label 10 outside 0..9"):
        load_dataset(DataConfig(dataset="mnist", root=str(tmp_path)), seed=0)


@pytest.mark.parametrize("name, files", [
    ("fashion-mnist", "train-images-idx3-ubyte"),
    ("mnist", "t10k-labels-idx1-ubyte"),
    ("cifar10", "cifar-10-batches-py/data_batch_1..5"),
    ("cifar100", "cifar-100-python/train, test and meta"),
    ("svhn", "train_32x32.mat"),
])
def test_missing_folder_is_one_line_naming_the_files(tmp_path, name, files):
    with pytest.raises(FedsimError) as err:
        load_dataset(DataConfig(dataset=name, root=str(tmp_path / "nowhere")), seed=0)
    message = str(err.value)
    assert "\n" not in message and files in message and "[data] root" in message
    assert "nowhere" in message and "download = true" in message


def test_a_failed_download_is_one_line_and_leaves_no_empty_folders(tmp_path, monkeypatch):
    """As torchvision fails offline: it makes root/FashionMNIST/raw first, then cannot fetch."""
    import torchvision.datasets

    class Offline:
        def __init__(self, root, download=False, **kwargs):
            (Path(root) / "FashionMNIST" / "raw").mkdir(parents=True)
            raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", Offline)
    (tmp_path / "kept").mkdir()
    root = tmp_path / "kept" / "new" / "fm"
    with pytest.raises(FedsimError) as err:
        load_dataset(DataConfig(dataset="fashion-mnist", root=str(root), download=True), seed=0)
    assert str(err.value) == (f"[data] dataset = 'fashion-mnist': downloading it into {root} failed (Error "
                              "downloading train-images-idx3-ubyte.gz:); check the network, or put the files "
                              "there yourself and set [data] root")
    assert [p.name for p in tmp_path.rglob("*")] == ["kept"]  # (the folders it made are gone, not the user's)


def test_unknown_dataset_suggests():
    with pytest.raises(FedsimError, match="did you mean 'digits'"):
        load_dataset(DataConfig(dataset="digit"), seed=0)


def test_logistic_is_synthetic_and_learnable():
    cfg = DataConfig(dataset="logistic", dim=5, samples=800, classes=3, test_fraction=0.25)
    ds = load_dataset(cfg, seed=0)
    assert ds.shape == (5,) and ds.n_classes == 3 and len(ds.y_train) == 600
    assert np.array_equal(ds.x_train, load_dataset(cfg, seed=0).x_train)
    assert not np.array_equal(ds.x_train, load_dataset(cfg, seed=1).x_train)
    from sklearn.linear_model import LogisticRegression

    acc = LogisticRegression(max_iter=500).fit(ds.x_train, ds.y_train).score(ds.x_test, ds.y_test)
    assert acc > 0.6  # labels follow a logistic model of x


@pytest.mark.skipif(not __import__("pathlib").Path("/usr/share/datasets/fashion-mnist").exists(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_real_fashion_mnist_default_root():
    ds = load_dataset(DataConfig(dataset="fashion-mnist"), seed=0)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert np.array_equal(np.bincount(ds.y_train), np.full(10, 6000))


@pytest.mark.parametrize("dataset, folder, files", [
    ("cifar10", "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]),
    ("cifar100", "cifar-100-python", ["train", "test", "meta"]),
])
def test_corrupt_cifar_files_are_one_line(tmp_path, dataset, folder, files):
    (tmp_path / folder).mkdir()
    for name in files:
        (tmp_path / folder / name).write_bytes(b"not a pickle")
    with pytest.raises(FedsimError) as err:
        load_dataset(DataConfig(dataset=dataset, root=str(tmp_path)), seed=0)
    assert "\n" not in str(err.value) and "torchvision could not load it" in str(err.value)


def test_runs_of_one_process_share_the_features_of_one_dataset():
    """A study's points in lockstep hold one float32 copy of the images, not one each."""
    from fedsim.config import ModelConfig
    from fedsim.training import build_task

    def task(seed, partition):
        return build_task(DataConfig(dataset="digits", clients=10, partition=partition), ModelConfig(),
                          seed=seed, device=torch.device("cpu"))

    a, b = task(0, "iid"), task(3, "dirichlet")
    assert a.data.x is b.data.x and a.data.x_test is b.data.x_test
    assert not torch.equal(a.data.indices, b.data.indices)  # each keeps its own partition
