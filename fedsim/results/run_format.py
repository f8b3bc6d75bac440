"""The run-directory format: the version every run records (`run_format` in manifest.json and
checkpoint.pt; a run without one is format 0, any release before format 1), and how a run
directory of an earlier format is read. A rule added later must not refuse what an earlier
release wrote itself: STEPS says, per format, which keys of its config.toml the next format
drops or maps, and reading one prints a note per key it changed (docs/running.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedsim.config import Config, read_toml
from fedsim.results.status import read_manifest

RUN_FORMAT = 1


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
