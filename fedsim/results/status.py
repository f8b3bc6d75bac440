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
    damage = "not a JSON object" if not isinstance(manifest, dict) else trace_record_damage(manifest)
    if not damage:
        return manifest
    if strict:
        raise FedsimError(f"{path}: damaged ({damage}); `fedsim run --resume {Path(run_dir)}` writes it "
                          "again from the last checkpoint")
    return {}


# what a manifest's record of the trace holds where it is set: (type, what the error calls it)
TRACE_RECORD = {"file": (dict, "a table of bytes and sha256"), "fingerprint": (str, "a SHA-256 text"),
                "horizon": ((int, float), "a number of seconds"), "generator": (dict, "a table")}


def trace_record_damage(manifest: dict) -> str:
    """What is wrong with the manifest's record of the run's trace ('' if nothing): the
    fields that commands read (a resume, `fedsim trace info RUN_DIR`) of the types a run writes."""
    trace = manifest.get("trace")
    if trace is None:
        return ""
    if not isinstance(trace, dict):
        return f"trace = {trace!r} is not a table"
    for key, (kind, what) in TRACE_RECORD.items():
        value = trace.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"trace.{key} = {value!r} is not {what}"
    file = trace.get("file") or {}
    if not (isinstance(file.get("bytes", 0), int) and isinstance(file.get("sha256", ""), str)):
        return f"trace.file = {file!r} is not a table of bytes and sha256"
    return ""
