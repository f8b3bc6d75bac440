"""Federated datasets stored as Parquet with a client column (Flower / Hugging Face layout).

`[data] root` is a folder of Parquet files (searched recursively, read in path order); a file
with the word `test` (`tests`, `testing`) in its path (`test-00000-of-00001.parquet`,
`test/part-0.parquet`, `my_test.parquet`; not `latest.parquet`) holds test samples, every
other file training samples. Each row is one sample: its client (any type),
its label (integers 0..C-1, or strings, numbered in sorted order) and its feature: an image
(Hugging Face's `{bytes, path}` struct or raw PNG/JPEG bytes), a list of numbers, a number,
or a text (tokenised by `[data] tokens`). Clients are devices in order of first appearance.
A test client without training rows is no device: its rows join the global test set only.
Without test files, each client's samples are split by `[data] test_fraction` (seeded).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fedsim.config import DataConfig
from fedsim.data import text
from fedsim.data.cache import Arrays, cached_arrays
from fedsim.errors import FedsimError

VERSION = 4  # of the parsed arrays: a new version re-parses every cached dataset (2: labels, features checked;
# 3: test files by TEST_NAME, not by 'test' anywhere in a path: `latest.parquet` was a test file; 4: 16-bit
# images, one class and class numbers that leave most of 0..max unused refused, a split that holds out no test
# row too)
TEST_NAME = re.compile(r"(^|[^a-z])test(s|ing)?([^a-z]|$)")  # test-00000-of-00001.parquet, test/, my_test.parquet
MAX_CLASSES = 1_000_000  # a label beyond it is a damaged or misread one (an output layer that wide is not trained)
WIDE_MODES = {"I;16": "16-bit", "I;16B": "16-bit", "I;16L": "16-bit", "I;16N": "16-bit", "I": "32-bit integer",
              "F": "32-bit float"}  # PIL's modes of more than 8 bits a channel
MAX_SIDE = 4096  # pixels of an image's side: federated datasets' images are small; a larger one is a mistake


def read_parquet_clients(cfg: DataConfig, root: Path) -> Arrays:
    """The arrays of a Parquet federated dataset (keys as fedsim.data.leaf.read_leaf's)."""
    if root.is_file():
        raise FedsimError(f"[data] dataset = 'parquet': {root} is a file; set [data] root to its folder "
                          f"({str(root.parent)!r}), which holds the dataset's Parquet files")
    if not root.is_dir():
        raise FedsimError(f"[data] dataset = 'parquet': folder {root} not found; set [data] root to the "
                          "folder of the dataset's Parquet files (a resume of a run whose dataset moved: "
                          "--set data.root=NEW)")
    files = sorted(f for f in root.rglob("*.parquet") if ".fedsim-cache" not in f.parts)
    if not files:
        raise FedsimError(f"[data] dataset = 'parquet': {root} holds no *.parquet files; set [data] root "
                          "to the folder of the dataset's Parquet files")
    missing = [k for k in ("label_column", "feature_column") if not getattr(cfg, k)]
    if missing:
        raise FedsimError(f"[data] dataset = 'parquet' needs [data] {' and '.join(missing)}: the name"
                          f"{'s' if len(missing) > 1 else ''} of the column{'s' if len(missing) > 1 else ''} holding "
                          "each row's " + " and ".join(k.removesuffix("_column") for k in missing))
    roles = [(k, getattr(cfg, k)) for k in ("client_column", "label_column", "feature_column") if getattr(cfg, k)]
    for i, (key, name) in enumerate(roles):
        other = next((k for k, n in roles[:i] if n == name), None)
        if other:
            raise FedsimError(f"[data] {key} = {name!r} is also the {other}: a column has one role; set each of "
                              "client_column, label_column and feature_column to a column of its own")
    if not cfg.client_column and (cfg.partition or "natural") == "natural":
        raise FedsimError("[data] dataset = 'parquet' with partition = 'natural' (its default) needs [data] "
                          "client_column, the column of each row's client; without one, spread the rows over "
                          "[data] clients devices with partition = 'iid' (or 'dirichlet', 'classes', ...)")
    # everything the parse reads of [data]: the per-client test split (no test files) too
    kind = (f"parquet-v{VERSION}-{cfg.client_column}-{cfg.label_column}-{cfg.feature_column}-{cfg.tokens}"
            f"-{cfg.test_fraction}")
    return cached_arrays(kind, root, files, lambda: _parse(cfg, root, files))


def _parse(cfg: DataConfig, root: Path, files: list[Path]) -> Arrays:
    test_files = [f for f in files if any(TEST_NAME.search(part.lower()) for part in f.relative_to(root).parts)]
    train_files = [f for f in files if f not in test_files]
    if not train_files:
        raise FedsimError(f"[data] dataset = 'parquet': every Parquet file under {root} has the word 'test' in "
                          "its path, so there is no training data; name the training files without it")
    columns = tuple(c for c in (cfg.client_column, cfg.label_column, cfg.feature_column) if c)
    tables = {f: _read(f, columns) for f in files}
    _check_types(tables)
    train, test = (_concat([tables[f] for f in part], part, split) if part else None
                   for part, split in ((train_files, "training"), (test_files, "test")))
    clients, owner_train = np.unique(_clients(train, cfg, train_files), return_inverse=True)
    first_seen = np.argsort(np.unique(owner_train, return_index=True)[1])  # clients by first row
    device_of = np.empty(len(clients), dtype=np.int64)
    device_of[first_seen] = np.arange(len(clients))
    owner_train = device_of[owner_train]
    users = clients[first_seen]
    labels, names = _labels(train, test, cfg, train_files, test_files)
    x_train = _features(train, cfg, train_files)
    if test is not None:
        at, known = _find(clients, _clients(test, cfg, test_files))  # unknown: test-only clients
        x_test = _features(test, cfg, test_files)
        if x_test.shape[1:] != x_train.shape[1:] and x_train.dtype != object:
            raise FedsimError(f"{test_files[0].parent}: the test rows' features have shape {x_test.shape[1:]} where "
                              f"the training rows' have {x_train.shape[1:]}; give every row one shape (images of one "
                              "size and colour mode, lists of one length)")
        arrays = {"x_train": x_train, "y_train": labels[0], "owner_train": owner_train,
                  "x_test": x_test, "y_test": labels[1], "owner_test": np.where(known, device_of[at], -1)}
    else:
        held_out = _per_client_split(owner_train, cfg.test_fraction)
        if not held_out.any():
            pooled = (cfg.partition or "natural") != "natural"
            raise FedsimError(f"{root}: no test samples: without test files fedsim holds out [data] test_fraction = "
                              f"{cfg.test_fraction:g} of each client's rows, and a client keeps at least one for "
                              "training, so clients of one row hold none out; give the dataset test files"
                              + (", or leave [data] client_column unset (the rows are then split as one client's)"
                                 if pooled else ""))
        arrays = {"x_train": x_train[~held_out], "y_train": labels[0][~held_out], "owner_train": owner_train[~held_out],
                  "x_test": x_train[held_out], "y_test": labels[0][held_out], "owner_test": owner_train[held_out]}
    arrays["users"] = users.astype(str)
    if names is not None:
        arrays["label_names"] = names
    arrays.update(_text_extras(arrays, cfg))
    return arrays


def _read(path: Path, columns: tuple[str, ...]) -> pa.Table:
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as err:
        raise FedsimError(f"{path}: not a readable Parquet file ({err}); replace it") from None
    absent = [c for c in columns if c not in schema.names]
    if absent:
        raise FedsimError(f"{path}: no column {absent[0]!r} (it has {', '.join(schema.names)}); set [data] "
                          "client_column, label_column and feature_column to its columns")
    return pq.read_table(path, columns=list(columns))


def _check_types(tables: dict[Path, pa.Table]) -> None:
    """Every file gives each column a type of the first file's kind (int32 and int64 are one
    kind; a client id that is a string in one file and a number in another is no one client)."""
    (first, table), *others = tables.items()
    for path, other in others:
        for ours, theirs in ((table.schema.field(n), other.schema.field(n)) for n in table.column_names):
            try:
                pa.unify_schemas([pa.schema([ours]), pa.schema([theirs])], promote_options="permissive")
            except (pa.ArrowTypeError, pa.ArrowInvalid):
                raise FedsimError(f"{path}: column {ours.name!r} is of type {theirs.type} where {first} has "
                                  f"{ours.type}; give the column one type in every file") from None


def _concat(tables: list[pa.Table], files: list[Path], split: str) -> pa.Table:
    """The rows of one split's files; none is an error (nothing to train on or to test)."""
    table = pa.concat_tables(tables, promote_options="permissive")
    if not table.num_rows:
        fix = ("give the dataset training rows" if split == "training" else "give its test files rows, or remove "
               "them to hold out [data] test_fraction of each client's rows")
        where = files[0] if len(files) == 1 else f"{files[0].parent} (its {len(files)} {split} files)"
        raise FedsimError(f"{where}: no rows, so no {split} samples; {fix}")
    return table


def _column(table: pa.Table, name: str, files: list[Path], role: str = "") -> np.ndarray:
    """The values of a column of one value a row (`role`: what they are, for the refusal of
    lists and records)."""
    column = table.column(name)
    if role and pa.types.is_nested(column.type):
        raise FedsimError(f"{files[0]}: column {name!r} holds {column.type} values, not one {role} a row; store "
                          f"each row's {role} as one {'integer or string' if role == 'class' else 'string or number'}"
                          + (" (the class number of a one-hot vector: its argmax)" if role == "class" else ""))
    if column.null_count:
        row = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
        raise FedsimError(f"{_file_of(files, table, row)}: a row without a {name!r} value; fill or drop it")
    return column.to_numpy(zero_copy_only=False)


def _file_of(files: list[Path], table: pa.Table, row: int) -> str:
    """Which file (of those concatenated into `table`) holds `row`."""
    ends = np.cumsum([pq.ParquetFile(f).metadata.num_rows for f in files])
    k = min(int(np.searchsorted(ends, row, side="right")), len(files) - 1)
    return f"{files[k]}, row {row - (int(ends[k - 1]) if k else 0)}"


def _labels(train, test, cfg, train_files, test_files) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Class numbers of the training and test rows (none for no test files), and the class
    names of string labels."""
    parts = [(t, f) for t, f in ((train, train_files), (test, test_files)) if t is not None]
    raw = [_column(t, cfg.label_column, f, role="class") for t, f in parts]
    names = np.unique(raw[0]).astype(str) if raw[0].dtype.kind in "OUS" else None
    numbers = []
    for values, (table, files) in zip(raw, parts):
        if names is not None:
            classes, known = _find(names, values.astype(str))
            if not known.all():
                row = int(np.argmin(known))
                raise FedsimError(f"{_file_of(files, table, row)}: label {values[row]!r} appears in no training "
                                  "row; a test label must be a training class")
            values = classes
        elif values.dtype.kind == "f" and (values >= 0).all() and (values == np.round(values)).all():
            raise FedsimError(f"{_file_of(files, table, 0)}: [data] label_column = {cfg.label_column!r} holds "
                              f"{values.dtype} numbers ({values[0].item()!r}, ...), not integers; store the labels as "
                              "integers (pandas writes a column with a missing value as floats: fill it, then cast)")
        elif values.dtype.kind not in "iub" or (values.dtype.kind == "i" and values.min(initial=0) < 0):
            row = int(np.argmax(values < 0)) if values.dtype.kind in "if" else 0
            raise FedsimError(f"{_file_of(files, table, row)}: label {values[row].item()!r} is not a class number "
                              f"0, 1, ...; [data] label_column = {cfg.label_column!r} must hold integers "
                              "from 0 or strings")
        elif values.max(initial=0) >= MAX_CLASSES:
            row = int(np.argmax(values >= MAX_CLASSES))
            raise FedsimError(f"{_file_of(files, table, row)}: label {values[row].item()!r} is beyond the "
                              f"{MAX_CLASSES:,} classes fedsim trains; number the classes 0, 1, ... (or give "
                              "them as strings)")
        numbers.append(values.astype(np.int64))
    _refuse_sparse_labels(numbers[0], cfg, train_files)
    return numbers + [np.zeros(0, np.int64)] * (2 - len(numbers)), names


def _refuse_sparse_labels(labels: np.ndarray, cfg: DataConfig, files: list[Path]) -> None:
    """Class numbers that leave most of 0..max unused (a stray label 999999 among 0..3; classes
    numbered 10, 20, 30) would give the model max + 1 outputs, most for classes no sample has,
    and its accuracy would be below chance: a mistake, not a dataset."""
    top = int(labels.max(initial=-1)) + 1
    used = len(np.unique(labels))
    if used == 1:
        raise FedsimError(f"[data] label_column = {cfg.label_column!r}: every training row (in {files[0].parent}) has "
                          "one class, so any model scores 100 %; name the column that holds the labels")
    if used * 2 < top:
        raise FedsimError(f"[data] label_column = {cfg.label_column!r}: the training rows use {used:,} class numbers "
                          f"of 0..{top - 1:,} (in {files[0].parent}), so the model would have {top:,} outputs, "
                          f"{top - used:,} of them for classes no sample has; number the classes 0, 1, ... (or give "
                          "them as strings)")


def _clients(table: pa.Table, cfg: DataConfig, files: list[Path]) -> np.ndarray:
    """Each row's client; without a client column, one (the rows are pooled and partitioned)."""
    if not cfg.client_column:
        return np.zeros(table.num_rows, dtype=np.int64)
    return _column(table, cfg.client_column, files, role="client id")


def _find(known: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of `values` in the sorted array `known`, and which of them are there."""
    at = np.minimum(np.searchsorted(known, values), len(known) - 1)
    return at, known[at] == values


def _features(table: pa.Table, cfg: DataConfig, files: list[Path]) -> np.ndarray:
    column = table.column(cfg.feature_column).combine_chunks()
    kind = column.type
    if column.null_count:
        _column(table, cfg.feature_column, files)  # raises, naming the row
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        paths = column.field("path").to_pylist() if kind.get_field_index("path") >= 0 else None
        return _images(column.field("bytes").to_pylist(), table, files, paths)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return _images(column.to_pylist(), table, files)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.asarray(column.to_pylist(), dtype=object)  # tokenised with the vocabulary (_text_extras)
    if _is_list(kind) and _is_number(kind.value_type):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            row = int(np.argmax(lengths != lengths[0]))
            raise FedsimError(f"{_file_of(files, table, row)}: feature of {lengths[row]} numbers where the "
                              f"first row has {lengths[0]}; every sample needs the same length")
        if len(lengths) and not lengths[0]:
            raise FedsimError(f"{_file_of(files, table, 0)}: the feature is an empty list; every sample needs at "
                              "least one number")
        return _finite(column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(column), -1),
                       table, files)
    if _is_number(kind):
        return _finite(column.to_numpy(zero_copy_only=False).astype(np.float32)[:, None], table, files)
    raise FedsimError(f"{files[0]}: column {cfg.feature_column!r} is of type {kind}; a feature must be an "
                      "image, a list of numbers (one list per row, not lists of lists), a number or a text")


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _finite(x: np.ndarray, table: pa.Table, files: list[Path]) -> np.ndarray:
    """The features, if all of them are numbers a model can train on (not nan, not infinite)."""
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        raise FedsimError(f"{_file_of(files, table, row)}: the feature holds {x[row][~np.isfinite(x[row])][0]}, not a "
                          "finite number; fix or drop the row")
    return x


def _images(encoded: list, table: pa.Table, files: list[Path], paths: list | None = None) -> np.ndarray:
    """PNG/JPEG bytes -> uint8 [n, channels, height, width] (decoding is cached with the rest);
    `paths`: the rows' image paths where the column has them (Hugging Face's image records)."""
    from PIL import Image, UnidentifiedImageError

    pictures, modes = [], []
    bomb_limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # MAX_SIDE, lower, is checked instead
    try:
        for row, data in enumerate(encoded):  # load time only: the decoded array is cached
            if data is None:
                path = paths[row] if paths is not None else None
                raise FedsimError(f"{_file_of(files, table, row)}: the image has no bytes"
                                  + (f" (only a path, {path!r}, which fedsim does not read)" if path else "")
                                  + "; store each image's PNG or JPEG bytes in the column")
            try:
                image = Image.open(io.BytesIO(data))
                if max(image.size) > MAX_SIDE:  # read from the header: nothing decoded yet
                    raise FedsimError(f"{_file_of(files, table, row)}: the image is larger than fedsim reads "
                                      f"({image.width} x {image.height} pixels; at most {MAX_SIDE} x {MAX_SIDE}); "
                                      "resize the images")
                if image.mode in WIDE_MODES:
                    raise FedsimError(f"{_file_of(files, table, row)}: a {WIDE_MODES[image.mode]} image (mode "
                                      f"{image.mode}); fedsim reads images of 8 bits a channel, as bytes / 255: "
                                      "save them as 8-bit images")
                picture = np.asarray(image)
            except (UnidentifiedImageError, OSError, TypeError):
                raise FedsimError(f"{_file_of(files, table, row)}: the feature is not a readable image") from None
            if pictures and picture.shape != pictures[0].shape:
                what = (f"{image.mode} image where the first is {modes[0]}; give every image one colour mode "
                        "(convert them)") if image.mode != modes[0] else (
                        f"image of shape {picture.shape} where the first is {pictures[0].shape}; every image needs "
                        "the same size")
                raise FedsimError(f"{_file_of(files, table, row)}: {what}")
            pictures.append(picture)
            modes.append(image.mode)
    finally:
        Image.MAX_IMAGE_PIXELS = bomb_limit
    images = np.stack(pictures)
    return images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2).copy()


def _text_extras(arrays: dict, cfg: DataConfig) -> Arrays:
    """Texts -> token rows, by words (a vocabulary of the training text) or by characters."""
    if arrays["x_train"].dtype != object:
        return {"scale": np.asarray(1 / 255 if arrays["x_train"].dtype == np.uint8 else 1.0)}
    split = text.words if cfg.tokens == "words" else list
    length = text.MAX_WORDS if cfg.tokens == "words" else text.MAX_CHARACTERS
    texts = {k: [split(t) for t in arrays[k]] for k in ("x_train", "x_test")}
    vocabulary = text.word_vocabulary(texts["x_train"])
    ids = {w: k + 2 for k, w in enumerate(vocabulary)}
    return {k: text.encode(v, ids, length) for k, v in texts.items()} | {
        "vocabulary": np.asarray(vocabulary, dtype=str)}


def _per_client_split(owner: np.ndarray, fraction: float) -> np.ndarray:
    """Which rows are test rows: round(fraction * n_i) random ones of each client with >= 2
    rows (at least one on each side), with a fixed seed (0) so that every run tests on them."""
    keys = np.random.default_rng(0).random(len(owner))
    order = np.lexsort((keys, owner))
    sizes = np.bincount(owner)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(len(owner), dtype=np.int64)
    rank[order] = np.arange(len(owner)) - starts[owner[order]]
    n_test = np.where(sizes >= 2, np.clip(np.rint(fraction * sizes), 1, sizes - 1), 0)
    return rank < n_test[owner]
