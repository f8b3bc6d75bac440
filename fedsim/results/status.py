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


INITIAL_KEYS = ("test_loss", "test_acc", "t")


def initial_evaluation(run_dir: Path, manifest: dict) -> dict | None:
    """The manifest's `initial` (the initial model's evaluation, where the accuracy curves of
    the report and the plots start; None where there is none), checked: numbers or null."""
    import json

    initial = manifest.get("initial")
    if initial is None:
        return None
    if not isinstance(initial, dict) or any(
            isinstance(initial.get(k), bool) or not isinstance(initial.get(k), (int, float, type(None)))
            for k in INITIAL_KEYS):
        shown = json.dumps(initial)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise FedsimError(f"{Path(run_dir) / 'manifest.json'}: \"initial\" = {shown} is not the initial model's "
                          f"evaluation (an object of {', '.join(INITIAL_KEYS)}: numbers or null); the file was "
                          "edited or damaged: delete the entry, and the curves start at the first evaluation")
    return initial
