"""Small generated datasets in LEAF's layout (ROOT/train/*.json, ROOT/test/*.json) and in the
Parquet federated layout, for the tests: never downloaded."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from fedsim.data.text import LEAF_LETTERS

WORDS = "good bad happy sad love hate great awful day night movie food".split()


def _samples(name: str, n: int, rng: np.random.Generator) -> tuple[list, list]:
    if name == "femnist":
        ink = rng.integers(0, 256, size=(n, 784))  # about a fifth of the pixels inked, the rest white
        x = (np.where(rng.random((n, 784)) < 0.8, 255, ink) / 255).tolist()
        return x, rng.integers(0, 62, size=n).tolist()
    if name == "shakespeare":
        letters = np.array(list(LEAF_LETTERS))
        return (["".join(rng.choice(letters, 80)) for _ in range(n)],
                [str(c) for c in rng.choice(letters, n)])
    labels = rng.integers(0, 2, size=n)
    words = [" ".join(rng.choice(WORDS[:6] if y else WORDS[6:], rng.integers(3, 12))) for y in labels]
    return [[str(k), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", t] for k, t in enumerate(words)], labels.tolist()


def write_leaf(root: Path, name: str, train_sizes: list[list[int]], test_size: int = 2, seed: int = 0) -> Path:
    """LEAF files for `name`: one training file per list of user sizes, users u0, u1, ...
    numbered across the files; every user gets `test_size` test samples in test/ (one file)."""
    rng = np.random.default_rng(seed)
    users, number = [], 0
    for k, sizes in enumerate(train_sizes):
        names = [f"u{number + j}" for j in range(len(sizes))]
        number += len(sizes)
        users += names
        write_json(root / "train" / f"all_data_{k}_train.json", names,
                   {u: _samples(name, n, rng) for u, n in zip(names, sizes)})
    write_json(root / "test" / "all_data_0_test.json", users,
               {u: _samples(name, test_size, rng) for u in users})
    return root


def write_json(path: Path, users: list[str], data: dict[str, tuple[list, list]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"users": users, "num_samples": [len(data[u][1]) for u in users],
                                "user_data": {u: {"x": x, "y": y} for u, (x, y) in data.items()}}))


def write_image_parquet(path: Path, sizes, shape: tuple[int, ...], classes: int, seed: int = 0,
                        distinct: int = 256) -> Path:
    """One Parquet file of random PNG images in the federated layout (columns client, label,
    image as Hugging Face's {bytes, path}): client i has sizes[i] rows. What training costs does
    not depend on the pixels, so `distinct` images are encoded and repeated (the file stays
    small: Parquet stores each once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(seed)
    pictures = rng.integers(0, 256, size=(distinct, *shape), dtype=np.uint8)
    pool = []
    for picture in pictures:  # (h, w) grey or (channels, h, w) colour
        out = io.BytesIO()
        Image.fromarray(picture if picture.ndim == 2 else picture.transpose(1, 2, 0)).save(out, format="PNG")
        pool.append(out.getvalue())
    n = int(np.sum(sizes))
    images = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, distinct, n), pa.int32()),
                                            pa.array(pool, pa.binary()))
    labels = rng.permutation(np.arange(n) % classes)  # every class present once there are enough rows
    table = pa.table({"client": np.repeat(np.arange(len(sizes)), sizes), "label": labels,
                      "image": pa.StructArray.from_arrays([images.cast(pa.binary()), pa.nulls(n, pa.string())],
                                                          ["bytes", "path"])})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path
