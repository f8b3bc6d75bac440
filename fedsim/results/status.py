"""What a run directory's manifest status means now (no torch: `fedsim report` reads it)."""

from __future__ import annotations

from pathlib import Path


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

