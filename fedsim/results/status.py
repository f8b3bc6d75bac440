"""What a run directory's manifest status means now (no torch: `fedsim report` reads it)."""

from __future__ import annotations

from pathlib import Path

from fedsim.errors import FedsimError


def run_status(run_dir: Path, manifest: dict) -> str:
    """The manifest's status, told truthfully: a `running` run whose directory nobody holds
    crashed (or was killed) after its last checkpoint."""
    from fedsim.files import DirectoryLock

    status = manifest.get("status", "unfinished")
    if status != "running":
        return status
    if DirectoryLock(run_dir).held():
        return f"running (process {manifest.get('pid')} on {manifest.get('host')})"
    return f"crashed (last checkpoint at round {manifest.get('rounds', 0)})"


def read_manifest(run_dir: Path, *, strict: bool = True) -> dict:
    """A run directory's manifest.json ({} where there is none). A damaged one (cut, or not a
    JSON object) is one line when `strict`; otherwise it reads as none: a resume goes on from
    the checkpoint, which holds the truth, and writes the manifest again."""
    import json

    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        manifest = None
    if isinstance(manifest, dict):
        return manifest
    if strict:
        raise FedsimError(f"{path}: damaged (not a JSON object); `fedsim run --resume {Path(run_dir)}` writes it "
                          "again from the last checkpoint")
    return {}
