"""``[model] init_from``: a run starts from the parameters another run saved (its model.pt)
instead of the task's own seeded initialisation, to go on training under another config or
to fine-tune. The file must hold exactly the parameters this run's model has, with the same
shapes; anything else is one error line before the run starts.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import torch
from torch import Tensor

from fedsim.config import Config
from fedsim.errors import FedsimError
from fedsim.training.task import Task


def initial_params(task: Task, config: Config) -> Tensor:
    """The flat parameters the run starts from, on the task's device."""
    init = task.init_params()
    if not config.model.init_from:
        return init
    where = init_from_where(config)
    saved = read_state_dict(model_file(config), where)
    expected = task.state_dict(init)
    check_matches(saved, expected, where, shaping_keys(config))
    check_numbers(saved, expected, where)
    flat = task.load_state_dict({name: saved[name] for name in expected})
    check_ties(saved, task.state_dict(flat), where)
    return flat.to(device=init.device, dtype=init.dtype)


def model_layout(task: Task) -> dict[str, Tensor]:
    """The names and shapes of the task's model.pt (as shape-only tensors): what a checkpoint
    records so that a resume can tell whether the model still fits it."""
    return {name: torch.empty(t.shape, device="meta") for name, t in task.state_dict(task.init_params()).items()}


def check_resumable(saved: dict[str, Tensor] | None, built: dict[str, Tensor], where: str) -> None:
    """FedsimError when the model now built (its `model_layout`) differs from the checkpoint's
    (its code changed)."""
    if saved is not None:
        check_matches(saved, built, where, fix="put back the model code the run started with, or start a new run")


def init_from_where(config: Config) -> str:
    return f"{config.where('model', 'init_from')} = {config.model.init_from!r}"


def moved_with_its_study(config: Config, path: Path) -> Path | None:
    """Where a warm start `path` of the study folder whose point (or warm-start run) `config`'s
    file is now lies, that folder having moved: the same run (the last two names of its path)
    in the folder's study; None where it is not so."""
    for folder in Path(config.source).absolute().parents[:3]:
        if (folder / "study.toml").is_file():
            moved = folder / path.parent.name / path.name
            return moved if moved.is_dir() and moved != path else None
    return None


def model_file(config: Config) -> Path:
    """The model.pt that init_from names: a relative path is looked up in the working
    directory, then beside the config file (as [trace] path is); a run directory gives its
    model.pt."""
    where = init_from_where(config)
    path = Path(config.model.init_from)
    beside_config = Path(config.source).parent / path
    if not path.is_absolute() and not path.exists() and beside_config.exists():
        path = beside_config
    if not path.exists():
        moved = moved_with_its_study(config, path)
        if moved is not None:  # (a point's config.toml names its warm start absolutely)
            raise FedsimError(f"{where}: no such run directory; the study this config.toml is a point of has "
                              f"moved since, and its warm start with it: add `--set model.init_from="
                              f"{shlex.quote(str(moved))}`")
        raise FedsimError(f"{where}: no such file or run directory; give a run's model.pt or its "
                          "run directory (relative: to the working directory or the config file)")
    if not path.is_dir():
        return path
    if (path / "model.pt").is_file():
        return path / "model.pt"
    members = sorted(p.parent.name for p in path.glob("*/model.pt"))
    if members and (path / "study.toml").is_file():
        raise FedsimError(f"{where} is a study's folder; name one point's run directory, e.g. "
                          f"{str(path / members[0])!r}")
    if members:
        raise FedsimError(f"{where} is a comparison of {', '.join(members)}; name the algorithm's "
                          f"sub-folder, e.g. {str(path / members[0])!r}")
    raise FedsimError(f"{where}: the directory holds no model.pt; give the directory of a run "
                      "that finished, or a model.pt file")


def read_state_dict(path: Path, where: str) -> dict[str, Tensor]:
    """The named tensors of a model.pt, loaded without running any code from the file."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a file it cannot read
        saved = err
    if not (isinstance(saved, dict) and all(isinstance(k, str) and isinstance(v, Tensor)
                                            for k, v in saved.items())):
        why = type(saved).__name__ if isinstance(saved, Exception) else "not a dict of named tensors"
        raise FedsimError(f"{where}: {path} is not a readable checkpoint ({why}); give a model.pt "
                          "that a fedsim run wrote")
    return saved


def check_matches(saved: dict[str, Tensor], expected: dict[str, Tensor], where: str, keys: str = "",
                  fix: str = "") -> None:
    """FedsimError on the first parameter missing, extra or of another shape."""
    fix = fix or f"set {keys} as in the run that saved it"
    missing = [name for name in expected if name not in saved]
    if missing:
        raise FedsimError(f"{where}: the file has no parameter {missing[0]!r}, which this run's "
                          f"model has; {fix}")
    extra = [name for name in saved if name not in expected]
    if extra:
        raise FedsimError(f"{where}: the file has a parameter {extra[0]!r}, which this run's "
                          f"model lacks; {fix}")
    for name, tensor in expected.items():
        if saved[name].shape != tensor.shape:
            raise FedsimError(f"{where}: parameter {name!r} has shape {list(saved[name].shape)} in "
                              f"the file but {list(tensor.shape)} in this run's model; {fix}")


def check_numbers(saved: dict[str, Tensor], expected: dict[str, Tensor], where: str) -> None:
    """FedsimError on the first parameter of the file that holds numbers a run cannot start
    from: complex, nan or inf (a diverged run's, or another tool's)."""
    for name in expected:
        t = saved[name]
        if t.is_complex() or (t.is_floating_point() and not bool(torch.isfinite(t).all())):
            what = t.dtype if t.is_complex() else "nan or inf"
            raise FedsimError(f"{where}: parameter {name!r} holds {what} in the file; start from the model.pt "
                              "of a run that did not diverge, or leave init_from empty")


def check_ties(saved: dict[str, Tensor], loaded: dict[str, Tensor], where: str) -> None:
    """FedsimError where the file gives two names of one tied tensor (a parameter two submodules
    share) two values: fedsim reads one of them, torch's load_state_dict keeps the last, so
    neither is what the file says."""
    for name, t in loaded.items():
        if saved[name].dtype == torch.float32 and not torch.equal(saved[name], t):
            read = next((other for other in loaded if other != name and torch.equal(saved[other], t)), "another key")
            raise FedsimError(f"{where}: the file gives {name!r} and {read!r}, one tensor in this run's model (tied), "
                              "different values; give them one value (or start from the model.pt of a run)")


def shaping_keys(config: Config) -> str:
    """The settings that decide the model's parameter names and shapes, for the error lines."""
    if config.data.dataset == "quadratic":
        return "[data] dim and targets"
    if config.data.dataset == "logistic":
        return "[model] name and hidden and [data] dim and classes"
    return "[model] name and hidden and [data] dataset"
