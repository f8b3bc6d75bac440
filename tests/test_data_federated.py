"""Datasets with their own clients: LEAF (FEMNIST, Shakespeare, Sent140) and Parquet federated
datasets, from generated files in their layouts, through the loaders and `fedsim run`."""

from __future__ import annotations

import io
import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from fedsim.cli import main
from fedsim.config import DataConfig, ModelConfig
from fedsim.data import cache, leaf, text
from fedsim.data.datasets import load_dataset
from fedsim.errors import FedsimError
from fedsim.training import build_task
from leaf_files import write_json, write_leaf

CPU = torch.device("cpu")
SIZES = [[10, 20, 5], [15, 8]]  # two training files: users u0..u2, then u3, u4


def fails(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def run_config(tmp_path, dataset: str, root, model: str, **data) -> str:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in {"clients": 5, **data}.items())
    path = tmp_path / f"{dataset}.toml"
    path.write_text(f'[run]\nname = "{dataset}"\nrounds = 3\nout = "{tmp_path / "out"}"\nprogress = false\n'
                    f'[data]\ndataset = "{dataset}"\nroot = "{root}"\n{extra}'
                    f'[model]\nname = "{model}"\n[client]\nlocal_steps = 2\nbatch_size = 4\nlr = 0.05\n')
    return str(path)


def test_femnist_one_device_per_user_in_file_order(tmp_path):
    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    data = load_dataset(DataConfig(dataset="femnist", root=str(root), clients=5), seed=0)
    assert data.users.tolist() == ["u0", "u1", "u2", "u3", "u4"]
    assert np.bincount(data.owner_train).tolist() == [10, 20, 5, 15, 8]
    assert np.bincount(data.owner_test).tolist() == [2] * 5
    assert data.x_train.shape == (58, 1, 28, 28) and data.x_train.dtype == np.uint8 and data.n_classes == 62
    # the pixels are the files' numbers (k / 255 kept as bytes k)
    first = json.loads((root / "train" / "all_data_0_train.json").read_text())["user_data"]["u0"]
    assert np.allclose(data.x_train[0].reshape(-1) * data.scale, first["x"][0], atol=1e-7)
    assert data.y_train[:10].tolist() == first["y"]


def test_femnist_runs_with_n_samples_and_users_in_devices_parquet(tmp_path):
    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    assert main(["run", run_config(tmp_path, "femnist", root, "cnn-femnist", users="most-samples", clients=3)]) == 0
    devices = pl.read_parquet(tmp_path / "out" / "femnist" / "devices.parquet")
    assert devices["user"].to_list() == ["u0", "u1", "u3"]  # the 3 largest, in file order
    assert devices["n_samples"].to_list() == [10, 20, 15]
    assert devices["n_test_samples"].to_list() == [2, 2, 2]


def test_report_shows_the_spread_of_samples_and_who_arrived_by_size(tmp_path, capsys):
    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    assert main(["run", run_config(tmp_path, "femnist", root, "logreg", clients=4)]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "out" / "femnist"), "--json"]) == 0
    samples = json.loads(capsys.readouterr().out)["runs"][0]["samples"]
    assert {k: samples[k] for k in ("total", "min", "median", "max")} == {"total": 50, "min": 5, "median": 12.5,
                                                                       "max": 20}
    assert [(q["min"], q["max"], q["devices"]) for q in samples["quarters"]] == [(5, 5, 1), (10, 10, 1),
                                                                                 (15, 15, 1), (20, 20, 1)]
    assert all(q["arrival_rate"] == 1.0 for q in samples["quarters"])  # always online, all invited
    assert main(["report", str(tmp_path / "out" / "femnist")]) == 0
    text = capsys.readouterr().out
    assert "training samples per device" in text and "Q1 (smallest)" in text and "Q4 (largest)" in text


def test_shakespeare_reads_leaf_letters_and_counts_unknown_ones(tmp_path):
    root = write_leaf(tmp_path / "shk", "shakespeare", [[6, 4]])
    path = root / "train" / "all_data_0_train.json"
    content = json.loads(path.read_text())
    content["user_data"]["u0"]["x"][0] = "é" + content["user_data"]["u0"]["x"][0][1:]
    path.write_text(json.dumps(content))
    arrays = leaf.read_leaf("shakespeare", root)
    sample = content["user_data"]["u0"]["x"][0]
    assert arrays["x_train"][0, 0] == len(text.LEAF_LETTERS) - 1  # as LEAF: index -1, its last letter
    assert arrays["x_train"][0, 1:].tolist() == [text.LEAF_LETTERS.index(c) for c in sample[1:]]
    assert arrays["y_train"][0] == text.LEAF_LETTERS.index(content["user_data"]["u0"]["y"][0])
    assert int(arrays["unknown"]) == 1


def test_shakespeare_trains_char_lstm_and_learns(tmp_path):
    root = write_leaf(tmp_path / "shk", "shakespeare", [[6, 4], [5]])
    task = build_task(DataConfig(dataset="shakespeare", root=str(root), clients=3),
                      ModelConfig(name="char-lstm"), seed=0, device=CPU)
    # the FedAvg paper's model: embedding 80 x 8, LSTM layers 8 -> 256 -> 256, dense 256 -> 80
    assert task.dim == 80 * 8 + 4 * 256 * (8 + 256 + 1) + 4 * 256 * (256 + 256 + 1) + 256 * 80 + 80
    assert task.client_sizes().tolist() == [6, 4, 5] and task.n_classes == 80


def test_sent140_vocabulary_by_frequency_and_its_cut(tmp_path):
    root = write_leaf(tmp_path / "s140", "sent140", [[12, 9], [11]], test_size=3)
    arrays = leaf.read_leaf("sent140", root)
    vocabulary = arrays["vocabulary"].tolist()
    texts = [text.words(row[4]) for f in sorted((root / "train").glob("*.json"))
             for u in json.loads(f.read_text())["user_data"].values() for row in u["x"]]
    counts = [sum(t.count(w) for t in texts) for w in vocabulary]
    assert counts == sorted(counts, reverse=True) and len(vocabulary) == len({w for t in texts for w in t})
    row = arrays["x_train"][0]
    words = texts[0][-text.MAX_WORDS:]
    assert row[-len(words):].tolist() == [vocabulary.index(w) + 2 for w in words]
    assert (row[:-len(words)] == text.PAD).all()  # left-padded: the LSTM ends on the last word
    data = load_dataset(DataConfig(dataset="sent140", root=str(root), clients=3, vocab_size=3), seed=0)
    assert data.vocab_size == 5 and data.x_train.max() == 4
    assert ((arrays["x_train"] >= 5) == (data.x_train == text.UNKNOWN)).all()


def test_sent140_word_vectors_are_a_fixed_embedding(tmp_path):
    root = write_leaf(tmp_path / "s140", "sent140", [[12, 9], [11]], test_size=3)
    glove = tmp_path / "glove.txt"
    glove.write_text("good 0.5 1.5 -2\nzebra 9 9 9\nbad -1 0 1\n")
    learned = build_task(DataConfig(dataset="sent140", root=str(root), clients=3),
                         ModelConfig(name="lstm"), seed=0, device=CPU)
    fixed = build_task(DataConfig(dataset="sent140", root=str(root), clients=3),
                       ModelConfig(name="lstm", word_vectors=str(glove)), seed=0, device=CPU)
    vocab = list(load_dataset(DataConfig(dataset="sent140", root=str(root), clients=3), seed=0).vocabulary)
    # the learned table of 25 per word is parameters; fixed vectors are not (nor trained, nor sent)
    second_layer_and_head = 4 * 16 * (16 + 16 + 1) + 16 * 2 + 2
    assert fixed.dim == 4 * 16 * (3 + 16 + 1) + second_layer_and_head
    assert learned.dim == (len(vocab) + 2) * 25 + 4 * 16 * (25 + 16 + 1) + second_layer_and_head
    table = fixed.model.layers[0].fixed
    assert table[vocab.index("good") + 2].tolist() == [0.5, 1.5, -2.0]
    assert table[vocab.index("bad") + 2].tolist() == [-1.0, 0.0, 1.0]
    assert table[vocab.index("love") + 2].tolist() == [0.0, 0.0, 0.0]  # not in the file


def test_test_only_users_join_the_global_test_set(tmp_path):
    """LEAF's user split (-t user): test users that hold no training samples are no devices."""
    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    x = (np.arange(784 * 3).reshape(3, 784) % 256 / 255).tolist()
    write_json(root / "test" / "all_data_1_test.json", ["t0"], {"t0": (x, [1, 2, 3])})
    data = load_dataset(DataConfig(dataset="femnist", root=str(root), clients=2), seed=0)
    assert data.owner_test.tolist() == [0, 0, 1, 1, -1, -1, -1] and data.y_test[-3:].tolist() == [1, 2, 3]
    task = build_task(DataConfig(dataset="femnist", root=str(root), clients=2), ModelConfig(name="logreg"),
                      seed=0, device=CPU)
    assert task.device_columns()["n_test_samples"].tolist() == [2, 2] and len(task.data.y_test) == 7


def test_pooled_partition_takes_every_user_and_test_sample(tmp_path):
    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    data = load_dataset(DataConfig(dataset="femnist", root=str(root), clients=2, partition="iid"), seed=0)
    assert data.owner_train is None and len(data.y_train) == 58 and len(data.y_test) == 10
    task = build_task(DataConfig(dataset="femnist", root=str(root), clients=2, partition="iid"),
                      ModelConfig(name="logreg"), seed=0, device=CPU)
    assert task.client_sizes().tolist() == [29, 29]


def test_parsed_arrays_come_from_the_cache_until_a_file_changes(tmp_path, monkeypatch):
    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    first = leaf.read_leaf("femnist", root)
    assert len(list((root / ".fedsim-cache").glob("leaf-femnist-*.npz"))) == 1
    cache._READ.clear()
    monkeypatch.setattr(leaf, "_parse", lambda *a: pytest.fail("parsed again"))
    again = leaf.read_leaf("femnist", root)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    monkeypatch.undo()
    write_leaf(root, "femnist", [[10, 20, 5], [15, 9]])  # one more sample for u4
    assert np.bincount(leaf.read_leaf("femnist", root)["owner_train"]).tolist() == [10, 20, 5, 15, 9]


def test_more_clients_than_users_is_said(tmp_path, capsys):
    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    err = fails(capsys, ["run", run_config(tmp_path, "femnist", root, "logreg", clients=9)])
    assert "[data] clients = 9" in err and "has 5 users" in err and "partition = 'iid'" in err


@pytest.mark.parametrize("damage, expected", [
    (lambda root: (root / "train" / "all_data_0_train.json").write_text("[1, 2]"), "not LEAF's layout"),
    (lambda root: write_json(root / "train" / "all_data_0_train.json", ["u0"], {"u0": ([], [])}),
     "user 'u0': the user has no samples"),
    (lambda root: write_json(root / "train" / "all_data_0_train.json", ["u0"], {"u0": ([[0.0] * 784], [62])}),
     "user 'u0': label 62 outside the classes 0..61"),
    (lambda root: write_json(root / "train" / "all_data_0_train.json", ["u0"], {"u0": ([[0.0] * 780], [3])}),
     "user 'u0': x has samples of shape (780,), expected 784"),
    (lambda root: (root / "train" / "all_data_0_train.json").write_text("{"), "not a readable JSON file"),
])
def test_damaged_leaf_files_are_one_line_naming_file_and_user(tmp_path, capsys, damage, expected):
    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    damage(root)
    err = fails(capsys, ["run", run_config(tmp_path, "femnist", root, "logreg")])
    assert expected in err and "all_data_0_train.json" in err


def test_missing_folder_and_wrong_layout(tmp_path, capsys):
    err = fails(capsys, ["run", run_config(tmp_path, "sent140", tmp_path / "nowhere", "lstm")])
    assert "folder" in err and "nowhere" in err and "[data] root" in err
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "data.json").write_text("{}")
    err = fails(capsys, ["run", run_config(tmp_path, "sent140", tmp_path / "flat", "lstm")])
    assert "train holds no *.json" in err and "LEAF's layout" in err


def test_text_needs_a_text_model(tmp_path, capsys):
    root = write_leaf(tmp_path / "s140", "sent140", [[12, 9], [11]])
    err = fails(capsys, ["run", run_config(tmp_path, "sent140", root, "mlp", clients=3)])
    assert "'mlp' cannot read text" in err and "lstm" in err


# -- Parquet federated datasets ----------------------------------------------------------------

def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def write_image_parquet(folder, with_test: bool = True):
    """Hugging Face's image layout: {bytes, path} structs, string client ids, integer labels."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    sizes = {"train": {"w7": 6, "w2": 9, "w5": 4}, "test": {"w2": 2, "w7": 1}}
    for split in ("train", "test") if with_test else ("train",):
        clients = [c for c, n in sizes[split].items() for _ in range(n)]
        pictures = rng.integers(0, 256, size=(len(clients), 12, 12), dtype=np.uint8)
        images = [{"bytes": _png(p), "path": None} for p in pictures]
        pq.write_table(pa.table({"writer_id": clients, "character": rng.integers(0, 10, len(clients)),
                                 "image": images}), folder / f"{split}-00000-of-00001.parquet")
    return folder


def test_parquet_images_one_device_per_client(tmp_path):
    root = write_image_parquet(tmp_path / "pq")
    cfg = DataConfig(dataset="parquet", root=str(root), clients=3, client_column="writer_id",
                     label_column="character", feature_column="image")
    data = load_dataset(cfg, seed=0)
    assert data.users.tolist() == ["w7", "w2", "w5"]  # by first appearance
    assert np.bincount(data.owner_train).tolist() == [6, 9, 4]
    assert np.bincount(data.owner_test, minlength=3).tolist() == [1, 2, 0]
    assert data.x_train.shape == (19, 1, 12, 12) and data.x_train.dtype == np.uint8
    first = np.asarray(__import__("PIL.Image").Image.open(io.BytesIO(
        pq.read_table(root / "train-00000-of-00001.parquet")["image"][0].as_py()["bytes"])))
    assert np.array_equal(data.x_train[0, 0], first)


def test_parquet_without_test_files_splits_each_client(tmp_path):
    root = write_image_parquet(tmp_path / "pq", with_test=False)
    cfg = DataConfig(dataset="parquet", root=str(root), clients=3, client_column="writer_id",
                     label_column="character", feature_column="image", test_fraction=0.25)
    data = load_dataset(cfg, seed=0)
    assert np.bincount(data.owner_test).tolist() == [2, 2, 1]  # round(0.25 n), at least one
    assert np.bincount(data.owner_train).tolist() == [4, 7, 3]


def test_a_run_of_a_dataset_named_relatively_resumes_from_anywhere_and_after_the_dataset_moved(tmp_path, monkeypatch,
                                                                                                capsys):
    """config.toml names the dataset's folder absolutely (as it does trace files); a moved
    dataset resumes with --set data.root=NEW, and another dataset there is refused by its bytes."""
    write_image_parquet(tmp_path / "work" / "pq")
    config = tmp_path / "work" / "c.toml"
    config.write_text('[run]\nname = "r"\nrounds = 2\nout = "runs"\nprogress = false\nplots = false\n'
                      '[data]\ndataset = "parquet"\nroot = "pq"\nclients = 3\nclient_column = "writer_id"\n'
                      'label_column = "character"\nfeature_column = "image"\n[model]\nname = "logreg"\n')
    monkeypatch.chdir(tmp_path / "work")
    assert main(["run", "c.toml", "--quiet"]) == 0
    run_dir = tmp_path / "work" / "runs" / "r"
    assert json.loads(json.dumps(__import__("tomllib").loads((run_dir / "config.toml").read_text())))["data"][
        "root"] == str(tmp_path / "work" / "pq")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--resume", str(run_dir), "--quiet", "--set", "run.rounds=3"]) == 0
    (tmp_path / "work" / "pq").rename(tmp_path / "moved")
    assert main(["run", "--resume", str(run_dir), "--quiet", "--set", "run.rounds=4",
                 "--set", f"data.root='{tmp_path / 'moved'}'"]) == 0
    other = write_image_parquet(tmp_path / "other", with_test=False)
    err = fails(capsys, ["run", "--resume", str(run_dir), "--quiet", "--set", "run.rounds=5",
                         "--set", f"data.root='{other}'"])
    assert "the dataset's files changed since the run started" in err and "\n" not in err.strip()
    assert pl.read_parquet(run_dir / "rounds.parquet")["round"].to_list() == [0, 1, 2, 3]
    import fedsim  # the run's test samples through the API: its own files only

    assert len(fedsim.test_data(run_dir)[1]) == 3  # (config.toml names the moved folder since the resume)
    (tmp_path / "moved").rename(tmp_path / "aside")
    other.rename(tmp_path / "moved")
    with pytest.raises(FedsimError, match="the dataset's files changed since the run started"):
        fedsim.test_data(run_dir)


def test_a_client_column_that_no_partition_reads_is_a_warning(tmp_path, capsys):
    """A Parquet dataset's clients pooled by a partition other than natural (a base's
    `classes`, say): the run says so and how to get one device per client."""
    root = write_image_parquet(tmp_path / "pq")
    data = dict(clients=3, client_column="writer_id", label_column="character", feature_column="image")
    assert main(["run", run_config(tmp_path, "parquet", root, "logreg", partition="iid", **data), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "parquet" / "manifest.json").read_text())
    said = [w for w in manifest["warnings"] if "client_column" in w]
    assert said == [f"[data] client_column = 'writer_id' makes no devices under partition = 'iid' (set in "
                    f"{tmp_path / 'parquet.toml'}): the rows of its clients are pooled and spread over 3 devices; set "
                    "partition = 'natural' for one device per client"]
    assert f"warning: fedavg: {said[0]}" in capsys.readouterr().out  # (the run's summary, as every warning)
    assert main(["run", run_config(tmp_path, "parquet", root, "logreg", partition="natural", **data), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "parquet-2" / "manifest.json").read_text())
    assert not [w for w in manifest["warnings"] if "client_column" in w]


def test_parquet_split_follows_test_fraction_through_the_cache(tmp_path):
    root = write_image_parquet(tmp_path / "pq", with_test=False)
    cfg = dict(dataset="parquet", root=str(root), clients=3, client_column="writer_id",
               label_column="character", feature_column="image")
    quarter = load_dataset(DataConfig(**cfg, test_fraction=0.25), seed=0)
    half = load_dataset(DataConfig(**cfg, test_fraction=0.5), seed=0)
    assert np.bincount(quarter.owner_test).tolist() == [2, 2, 1]
    assert np.bincount(half.owner_test).tolist() == [3, 4, 2]


def test_parquet_test_label_unknown_to_training_is_named(tmp_path, capsys):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(pa.table({"user": ["a", "b"], "label": ["pos", "neg"], "x": [[1.0], [2.0]]}), root / "train.parquet")
    pq.write_table(pa.table({"user": ["a", "b"], "label": ["pos", "meh"], "x": [[1.0], [2.0]]}), root / "test.parquet")
    err = fails(capsys, ["run", run_config(tmp_path, "parquet", root, "logreg", clients=2, client_column="user",
                                           label_column="label", feature_column="x")])
    assert "test.parquet, row 1: label 'meh' appears in no training row" in err


def test_parquet_text_and_string_labels_train(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(pa.table({"user": ["a", "a", "b", "b", "b", "c", "c"],
                             "sentiment": ["pos", "neg", "pos", "pos", "neg", "neg", "pos"],
                             "text": ["good day", "bad day", "love it", "great food", "awful", "sad", "happy"]}),
                   root / "train.parquet")
    assert main(["run", run_config(tmp_path, "parquet", root, "lstm", clients=3, client_column="user",
                                   label_column="sentiment", feature_column="text", test_fraction=0.34)]) == 0
    devices = pl.read_parquet(tmp_path / "out" / "parquet" / "devices.parquet")
    assert devices["user"].to_list() == ["a", "b", "c"] and devices["n_samples"].to_list() == [1, 2, 1]


def test_parquet_errors_name_file_and_row(tmp_path, capsys):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(pa.table({"user": ["a", None], "label": [0, 1], "x": [[1.0, 2.0], [3.0, 4.0]]}),
                   root / "train.parquet")
    base = dict(clients=1, client_column="user", label_column="label", feature_column="x")
    err = fails(capsys, ["run", run_config(tmp_path, "parquet", root, "logreg", **base)])
    assert "train.parquet, row 1" in err and "'user'" in err
    err = fails(capsys, ["run", run_config(tmp_path, "parquet", root, "logreg", **{**base, "label_column": "y"})])
    assert "no column 'y'" in err and "user, label, x" in err
    pq.write_table(pa.table({"user": ["a", "b"], "label": [0, -3], "x": [[1.0, 2.0], [3.0, 4.0]]}),
                   root / "train.parquet")
    err = fails(capsys, ["run", run_config(tmp_path, "parquet", root, "logreg", **base)])
    assert "row 1" in err and "label -3" in err
    pq.write_table(pa.table({"user": ["a", "b"], "label": [1.0, 2.0], "x": [[1.0, 2.0], [3.0, 4.0]]}),
                   root / "train.parquet")  # as pandas writes integer labels of a column that had a NaN
    err = fails(capsys, ["run", run_config(tmp_path, "parquet", root, "logreg", **base)])
    assert "[data] label_column = 'label' holds float64 numbers (1.0, ...), not integers; store the labels" in err, err
    pq.write_table(pa.table({"user": ["a", "b"], "label": [0, 999_999], "x": [[1.0, 2.0], [3.0, 4.0]]}),
                   root / "train.parquet")  # a stray label: a model of a million outputs
    err = fails(capsys, ["run", run_config(tmp_path, "parquet", root, "logreg", **base)])
    assert err.endswith("the training rows use 2 class numbers of 0..999,999 (in " + str(root) + "), so the model would "
                        "have 1,000,000 outputs, 999,998 of them for classes no sample has; number the classes 0, 1, ... (or "
                        "give them as strings)")
    err = fails(capsys, ["run", run_config(tmp_path, "parquet", root / "train.parquet", "logreg", **base)])
    assert err.endswith(f"{root / 'train.parquet'} is a file; set [data] root to its folder ('{root}'), which holds the "
                        "dataset's Parquet files")


def test_participation_plot_shows_arrivals_against_samples_where_sizes_differ(tmp_path):
    from fedsim.results.plots import build_figures, load_run

    root = write_leaf(tmp_path / "femnist", "femnist", SIZES)
    assert main(["run", run_config(tmp_path, "femnist", root, "logreg")]) == 0
    run = load_run(tmp_path / "out" / "femnist")
    panel = build_figures({"fedavg": run})["participation_per_device"].axes[-1]
    assert panel.get_xlabel() == "training samples on the device"
    points = panel.collections[0].get_offsets()
    assert sorted(points[:, 0].tolist()) == [5, 8, 10, 15, 20]
    even = run.devices.with_columns(n_samples=pl.lit(10))  # equal sizes: no such panel
    same = build_figures({"fedavg": type(run)(**{**vars(run), "devices": even})})["participation_per_device"]
    assert all(ax.get_xlabel() != "training samples on the device" for ax in same.axes)


def test_a_plugin_text_model_reads_the_token_shape(tmp_path, monkeypatch):
    """docs/extending.md: a model of one's own gets a TokenShape and starts with an Embedding
    (whose size the word vectors set when given)."""
    (tmp_path / "my_text.py").write_text(
        "import torch\nfrom torch import nn\nfrom fedsim.training.architectures import LastHiddenLSTM\n\n"
        "def tiny(in_shape, n_classes, cfg):\n"
        "    embed = nn.Embedding(in_shape.vocab_size, 4) if in_shape.vectors is None else \\\n"
        "        nn.Embedding.from_pretrained(torch.as_tensor(in_shape.vectors), freeze=True)\n"
        "    return nn.Sequential(embed, LastHiddenLSTM(embed.embedding_dim, 5, 1), nn.Linear(5, n_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    root = write_leaf(tmp_path / "s140", "sent140", [[12, 9], [11]], test_size=3)
    glove = tmp_path / "glove.txt"
    glove.write_text("good 0.5 1.5 -2\nbad -1 0 1\n")
    data = DataConfig(dataset="sent140", root=str(root), clients=3)
    learned = build_task(data, ModelConfig(name="my_text:tiny"), seed=0, device=CPU)
    fixed = build_task(data, ModelConfig(name="my_text:tiny", word_vectors=str(glove)), seed=0, device=CPU)
    vocab = len(load_dataset(data, seed=0).vocabulary) + 2
    assert learned.dim == vocab * 4 + 4 * 5 * (4 + 5 + 1) + 5 * 2 + 2
    assert fixed.dim == 4 * 5 * (3 + 5 + 1) + 5 * 2 + 2
    loss, acc = fixed.evaluate(fixed.init_params())
    assert np.isfinite(loss) and 0 <= acc <= 1


def test_each_device_is_scored_on_its_own_test_data_and_they_add_up_to_the_global_score(tmp_path, capsys):
    """devices.parquet's test_acc / test_loss: the final model on each user's test samples;
    weighted by n_test_samples they are the run's final test accuracy and loss."""
    root = write_leaf(tmp_path / "s140", "sent140", [[30, 22, 41], [25, 33]], test_size=7)
    assert main(["run", run_config(tmp_path, "sent140", root, "lstm"), "--set", "run.rounds=6"]) == 0
    folder = tmp_path / "out" / "sent140"
    devices = pl.read_parquet(folder / "devices.parquet")
    final = pl.read_parquet(folder / "rounds.parquet").drop_nulls("test_acc").row(-1, named=True)
    weights = devices["n_test_samples"].to_numpy()
    assert np.dot(devices["test_acc"].to_numpy(), weights) / weights.sum() == pytest.approx(final["test_acc"], abs=1e-9)
    assert np.dot(devices["test_loss"].to_numpy(), weights) / weights.sum() == pytest.approx(final["test_loss"], rel=1e-6)
    assert set(np.round(devices["test_acc"].to_numpy() * 7)) <= set(range(8))  # k of a device's 7 samples
    capsys.readouterr()
    assert main(["report", str(folder), "--json"]) == 0
    spread = json.loads(capsys.readouterr().out)["runs"][0]["device_accuracy"]
    assert spread["devices"] == 5 and spread["median"] == pytest.approx(float(np.median(devices["test_acc"])))


def test_parquet_files_may_store_a_column_in_types_of_one_kind(tmp_path):
    """int32 in one file and int64 in another (columns in another order too) are one kind:
    read as one; a string in one and a number in another is refused (test_reliability)."""
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(pa.table({"x": [[1.0]] * 4, "u": pa.array([1, 1, 2, 2], pa.int32()), "y": [0, 1, 0, 1]}),
                   root / "a.parquet")
    pq.write_table(pa.table({"u": [3, 3], "y": [0, 1], "x": pa.array([[1], [2]], pa.list_(pa.int64()))}),
                   root / "b.parquet")
    pq.write_table(pa.table({"u": [1, 2], "y": [0, 1], "x": [[1.0], [2.0]]}), root / "test.parquet")
    data = load_dataset(DataConfig(dataset="parquet", root=str(root), clients=3, client_column="u",
                                   label_column="y", feature_column="x"), seed=0)
    assert data.users.tolist() == ["1", "2", "3"]
    assert data.owner_train.tolist() == [0, 0, 1, 1, 2, 2] and data.owner_test.tolist() == [0, 1]
    assert data.x_train[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 2.0]


@pytest.mark.parametrize("dataset", ["parquet", "femnist"])
def test_a_resume_refuses_data_files_changed_since_the_run_started(tmp_path, capsys, dataset):
    """Its labels permuted (Parquet) or a user's samples rewritten (LEAF): one line, nothing
    written; the files put back, the resume goes on."""
    if dataset == "parquet":
        root = write_image_parquet(tmp_path / "pq")
        config = run_config(tmp_path, dataset, root, "logreg", clients=3, client_column="writer_id",
                            label_column="character", feature_column="image")
        changed = root / "train-00000-of-00001.parquet"
    else:
        root = write_leaf(tmp_path / "leaf", "femnist", SIZES)
        config = run_config(tmp_path, dataset, root, "logreg")
        changed = sorted((root / "train").glob("*.json"))[0]
    assert main(["run", config, "--quiet"]) == 0
    run_dir = tmp_path / "out" / dataset
    recorded = json.loads((run_dir / "manifest.json").read_text())["data_sha256"]
    assert len(recorded) == 64
    original = changed.read_bytes()
    table = pl.read_parquet(changed) if dataset == "parquet" else None
    if table is not None:
        table.with_columns(pl.col("character").reverse()).write_parquet(changed)
    else:
        changed.write_text(changed.read_text().replace("0.5", "0.25", 1))
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    capsys.readouterr()
    err = fails(capsys, ["run", "--resume", str(run_dir), "--set", "run.rounds=5", "--quiet"])
    assert err.startswith(f"error: [data] root = '{root}': the dataset's files changed since the run started") and \
        err.endswith("put back the files it started with, or start a new run on these")
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before
    changed.write_bytes(original)
    assert main(["run", "--resume", str(run_dir), "--set", "run.rounds=5", "--quiet"]) == 0


def test_parquet_test_files_are_those_with_the_word_test_in_their_path():
    from fedsim.data.parquet_clients import TEST_NAME

    tests = ["test-00000-of-00001.parquet", "test", "my_test.parquet", "testing", "Test.parquet", "val-test-1.parquet", "tests"]
    trains = ["latest.parquet", "attestation.parquet", "contest_entries", "fastest", "train-0.parquet", "testament"]
    assert [bool(TEST_NAME.search(p.lower())) for p in tests] == [True] * len(tests)
    assert [bool(TEST_NAME.search(p.lower())) for p in trains] == [False] * len(trains)


def test_a_parquet_table_without_a_client_column_is_partitioned_over_the_devices(tmp_path, capsys):
    root = write_image_parquet(tmp_path / "pq", with_test=False)
    cfg = DataConfig(dataset="parquet", root=str(root), clients=4, partition="iid", label_column="character",
                     feature_column="image", test_fraction=0.25)
    data = load_dataset(cfg, seed=0)
    assert data.owner_train is None and len(data.y_train) + len(data.y_test) == 19 and len(data.y_test) == 5
    task = build_task(cfg, ModelConfig(name="logreg"), seed=0, device=CPU)
    assert task.n_clients == 4 and int(task.data.sizes_np.sum()) == 14
    config = run_config(tmp_path, "parquet", root, "logreg", clients=4, label_column="character",
                        feature_column="image")
    err = fails(capsys, ["run", config])
    assert err.endswith("needs [data] client_column, the column of each row's client; without one, spread the rows over "
                        "[data] clients devices with partition = 'iid' (or 'dirichlet', 'classes', ...)")
