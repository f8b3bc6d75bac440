"""The run-directory format: the version every run records (`run_format` in manifest.json and
checkpoint.pt; a run without one is format 0, any release before format 1), and how a run
directory is read. Every reader of a manifest or a checkpoint goes through `read_manifest` and
`read_checkpoint`, which refuse a format this release does not know (a newer release's run is
never read, let alone written over in today's format). A rule added later must not refuse what
an earlier release wrote itself: STEPS says, per format, which keys of its config.toml the next
format drops or maps, and reading one prints a note per key it changed (docs/running.md).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedsim.config import Config, read_toml
from fedsim.config.registry import use_plugin_folders
from fedsim.errors import FedsimError
from fedsim.files import made_by_fedsim

RUN_FORMAT = 2  # 2: `rules` in manifest.json and checkpoint.pt (fedsim/training/rules.py)
# what every checkpoint.pt holds (experiment.py writes them, with more that some runs need)
CHECKPOINT_KEYS = ("round", "sim_time", "strategy", "recorder", "host_s")


def checked_format(record: dict, path: Path) -> int:
    """The run format that a manifest or checkpoint (`record`, read from `path`) records: 0 where
    it records none (a release before format 1); one line for one this release cannot read."""
    value = record.get("run_format", 0)
    if type(value) is not int or value < 0:  # bool is an int to isinstance
        raise FedsimError(f"{path}: run_format = {value!r} is not a run format (an integer from 0); the file was "
                          f"edited or damaged: give it back the format the run was written in ({RUN_FORMAT} for "
                          "this release), or start the run again")
    if value > RUN_FORMAT:
        raise FedsimError(f"{path}: run format {value} is newer than this release reads (at most {RUN_FORMAT}); "
                          "a later release of fedsim wrote it: upgrade fedsim-avail (pip install -U "
                          "fedsim-avail) to read or resume the run (this one leaves it untouched)")
    return value


def recorded_plugin_folders(folder: Path) -> list[str]:
    """The `plugin_folders` that the runs in `folder` recorded (a run, a comparison's or a
    study's runs, a study's warm starts): where their plugin files were imported from. A
    manifest this release cannot read adds none (the command's own check refuses the run)."""
    found = set()
    for run_dir in [folder, *folder.glob("*/"), *folder.glob("*/*/")]:
        try:
            listed = read_manifest(run_dir, strict=False).get("plugin_folders", [])
        except FedsimError:  # a newer release's run: its own reader refuses it, in one line
            continue
        found |= {f for f in listed if isinstance(f, str)} if isinstance(listed, list) else set()
    return sorted(found)


def use_recorded_plugin_folders(path: str | Path | None) -> None:
    """The folders that the runs of a run, comparison or study folder imported their plugin files
    from, on the import path, so that a command fedsim printed finds them from any directory.
    `path`: such a folder, or a file in one (its config.toml or study.toml; a user's own file
    elsewhere reads nothing)."""
    if path is None:
        return
    folder = Path(path)
    if not folder.is_dir():
        folder = folder.parent
        if not made_by_fedsim(folder):
            return
    use_plugin_folders(recorded_plugin_folders(folder))


def read_manifest(run_dir: Path, *, strict: bool = True) -> dict:
    """A run directory's manifest.json ({} where there is none), its run format checked. A
    damaged one (cut, or not a JSON object) is one line when `strict`; otherwise it reads as
    none: a resume goes on from the checkpoint, which holds the truth, and writes the manifest
    again."""
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        manifest = None
    if isinstance(manifest, dict):
        checked_format(manifest, path)
        return manifest
    if strict:
        raise FedsimError(f"{path}: damaged (not a JSON object); `fedsim run --resume {Path(run_dir)}` writes it "
                          "again from the last checkpoint")
    return {}


def read_checkpoint(path: Path, *, lazy: bool = False) -> dict:
    """A checkpoint.pt's state, checked: readable, a fedsim checkpoint, of a format this release
    reads. `lazy`: its tensors are mapped from the file, not read (enough to check it)."""
    import torch

    try:  # not weights_only: the state holds numpy arrays and plain objects of fedsim's own
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=lazy)
    except Exception as err:  # torch raises many kinds for a damaged file
        raise FedsimError(f"{path}: not a readable checkpoint ({type(err).__name__}); "
                          "the run cannot be resumed from it, start it again") from None
    missing = [k for k in CHECKPOINT_KEYS if k not in state] if isinstance(state, dict) else list(CHECKPOINT_KEYS)
    if missing:
        raise FedsimError(f"{path}: not a fedsim checkpoint (no {', '.join(missing)}); "
                          "the run cannot be resumed from it, start it again")
    checked_format(state, path)
    return state


def check_readable(run_dir: Path) -> None:
    """Before a command writes into a run directory (a run's, or each algorithm's of a
    comparison): one line when one of its manifests or checkpoints has a format this release
    does not read."""
    run_dir = Path(run_dir)
    for member in [run_dir, *sorted(d for d in run_dir.iterdir() if d.is_dir())]:
        read_manifest(member, strict=False)
        if (member / "checkpoint.pt").is_file():
            read_checkpoint(member / "checkpoint.pt", lazy=True)


@dataclass(frozen=True)
class Change:
    """`[section] key` of a config.toml, where `applies(config)` holds: dropped (today's default
    takes its place) or, with `to`, mapped to `to(value)`."""

    section: str
    key: str
    applies: Callable[[dict], bool]
    why: str
    to: Callable[[Any], Any] | None = None


def _quadratic(raw: dict) -> bool:
    return raw.get("data", {}).get("dataset") == "quadratic"


# STEPS[n]: what reads a config.toml of format n as one of format n + 1
STEPS: dict[int, list[Change]] = {
    0: [Change("data", "partition", _quadratic, "the quadratic task has no partition; earlier releases "
               "wrote their default there")],
    1: [],  # (format 2 adds the training rules a run started under; a run of format 1 resumes under rules 1)
}


def runs_in(run_dir: Path) -> list[Path]:
    """The run directories of a run or a comparison (one per algorithm), by their manifests."""
    if (run_dir / "manifest.json").exists():
        return [run_dir]
    return [d for d in sorted(run_dir.iterdir()) if (d / "manifest.json").exists()]


def format_of(run_dir: Path) -> int:
    """The run format of a run directory (a comparison's: the oldest of its algorithms')."""
    return min((read_manifest(d, strict=False).get("run_format", 0) for d in runs_in(run_dir)), default=0)


def upgrade(raw: dict, version: int, where: str) -> tuple[dict, list[str]]:
    """The config dict `raw` of run format `version` as today's format reads it, and a note
    for each key that changed value on the way."""
    defaults = Config().to_dict()
    raw = {section: dict(body) if isinstance(body, dict) else body for section, body in raw.items()}
    notes = []
    for step in range(version, RUN_FORMAT):
        for change in STEPS.get(step, []):
            section = raw.get(change.section)
            if not isinstance(section, dict) or change.key not in section or not change.applies(raw):
                continue
            old = section.pop(change.key)
            if change.to is not None:
                section[change.key] = change.to(old)
            new = section.get(change.key, defaults.get(change.section, {}).get(change.key))
            if new != old:
                what = f"now {new!r}" if change.to is not None else "dropped"
                notes.append(f"note: {where}: [{change.section}] {change.key} = {old!r} {what}, as run "
                             f"format {step + 1} reads format {step} ({change.why})")
    return raw, notes


def run_config(run_dir: Path) -> dict:
    """A run directory's config.toml as a dict of today's format; prints a note for each key
    that an earlier format wrote and this one drops or maps."""
    path = run_dir / "config.toml"
    raw, notes = upgrade(read_toml(path), format_of(run_dir), str(path))
    for note in notes:
        print(note, file=sys.stderr)
    return raw
