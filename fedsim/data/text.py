"""Text as token ids: LEAF's character vocabulary, word vocabularies and word vectors.

A text sample becomes a fixed-length row of int64 ids, left-padded with 0 so that the last
step of an LSTM reads the last real token. Id 0 is padding, 1 an unknown word, and words get
2, 3, ... in order of frequency in the training text, so that a smaller `[data] vocab_size`
is a cut (`limit_vocabulary`), not a new tokenisation.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from fedsim.errors import FedsimError

# LEAF's Shakespeare vocabulary (models/utils/language_utils.py, ALL_LETTERS): x and y are
# indices into these 80 characters. LEAF's letter_to_vec gives an unknown character index -1,
# which its one-hot vector reads as the last letter; fedsim does the same and counts them.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"

PAD, UNKNOWN = 0, 1
MAX_WORDS = 25  # words kept of a tweet (LEAF's Sent140 models read 25)
MAX_CHARACTERS = 80  # characters kept of a text (LEAF's Shakespeare samples are 80 long)
_WORD = re.compile(r"[\w']+|[.,!?;]")  # LEAF's split_line: words and punctuation marks


def letter_ids(texts: list[str]) -> np.ndarray:
    """Indices of every character of `texts` in LEAF_LETTERS (flat), -1 for one outside it
    (as LEAF's `ALL_LETTERS.find`)."""
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
    letters = np.frombuffer(LEAF_LETTERS.encode("utf-32-le"), dtype=np.uint32)
    order = np.argsort(letters)
    at = np.minimum(np.searchsorted(letters[order], codes), len(letters) - 1)
    return np.where(letters[order][at] == codes, order[at], -1).astype(np.int64)


def words(text: str) -> list[str]:
    """LEAF's tokenisation of a tweet, lower-cased."""
    return _WORD.findall(text.lower())


def word_vocabulary(texts: list[list[str]]) -> list[str]:
    """Every word of the training texts, most frequent first (ties alphabetically)."""
    counts = Counter(w for text in texts for w in text)
    return sorted(counts, key=lambda w: (-counts[w], w))


def encode(texts: list[list[str]], ids: dict[str, int], length: int) -> np.ndarray:
    """Token rows [n, length]: the last `length` tokens of each text, left-padded with PAD."""
    rows = np.full((len(texts), length), PAD, dtype=np.int32)  # a quarter of int64's cache and memory
    for k, text in enumerate(texts):  # load time only: the result is cached as an array
        tail = [ids.get(w, UNKNOWN) for w in text[-length:]]
        if tail:
            rows[k, length - len(tail):] = tail
    return rows


def limit_vocabulary(rows: np.ndarray, vocab_size: int) -> np.ndarray:
    """Rows with the words past the `vocab_size` most frequent read as UNKNOWN."""
    return np.where(rows >= vocab_size + 2, rows.dtype.type(UNKNOWN), rows)


def read_word_vectors(path: str, vocabulary: list[str]) -> np.ndarray:
    """Vectors [len(vocabulary) + 2, dim] of a GloVe text file (`word v1 v2 ...` per line) for
    the ids of `vocabulary` (PAD, UNKNOWN and words GloVe lacks: zeros)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FedsimError(f"[model] word_vectors = {path!r}: no such file; give a GloVe text file "
                          "(e.g. glove.twitter.27B.25d.txt, see docs/datasets.md) or leave it empty "
                          "to learn the embedding")
    wanted = {w: k + 2 for k, w in enumerate(vocabulary)}
    table: np.ndarray | None = None
    with open(file, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            word, _, rest = line.rstrip("\n").partition(" ")
            if table is None:
                table = np.zeros((len(vocabulary) + 2, len(rest.split())), dtype=np.float32)
            if word in wanted:
                values = rest.split()
                if len(values) != table.shape[1]:
                    raise FedsimError(f"{file}, line {number}: {len(values)} numbers where the first line "
                                      f"has {table.shape[1]}; give a GloVe text file")
                try:
                    table[wanted[word]] = np.asarray(values, dtype=np.float32)
                except ValueError:
                    raise FedsimError(f"{file}, line {number}: not a word and numbers; give a GloVe "
                                      "text file") from None
    if table is None or table.shape[1] == 0:
        raise FedsimError(f"{file}: empty or not a GloVe text file (`word v1 v2 ...` per line)")
    return table
