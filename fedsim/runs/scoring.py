"""What a user needs to score a run's saved model themselves: the test split it evaluated on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedsim.config import load_config
from fedsim.data.datasets import load_dataset
from fedsim.errors import FedsimError
from fedsim.results.run_format import read_manifest, use_recorded_plugin_folders


def test_data(source: str | Path):
    """The test samples a run evaluates its model on, as the model receives them: (features
    float32 [N, *shape], scaled as in training, or int64 token ids; labels int64 [N]), for
    scoring a run's model.pt yourself. `source`: a run directory, a config file or a scenario."""
    folder = Path(source)
    if (folder / "study.toml").is_file() and not (folder / "config.toml").exists():
        raise FedsimError(f"{folder}: a study's folder, whose points may read different data; give one point's "
                          "run directory")
    use_recorded_plugin_folders(folder if folder.exists() else None)  # its plugins, from any directory
    config = load_config(folder / "config.toml" if folder.is_dir() else source)
    dataset = load_dataset(config.data, config.run.seed)
    if folder.is_dir() and config.data.root:  # a run's: the files it read, not others now at its root
        from fedsim.data.cache import source_digest
        from fedsim.runs.experiment import check_same_data

        ran = read_manifest(folder, strict=False).get("data_sha256")
        check_same_data(ran, source_digest(Path(config.data.root)), config.data.root)
    x = torch.from_numpy(np.array(dataset.x_test))  # (a copy: the cached arrays are read-only)
    x = x.long() if dataset.vocab_size else x.float() * dataset.scale
    return x, torch.from_numpy(np.array(dataset.y_test, dtype=np.int64))
