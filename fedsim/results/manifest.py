"""manifest.json: what a run was (versions, seed, device, trace) and how it is going or ended.

It is written when the run starts and at every checkpoint with status `running` (and the
process and host), then with how it ended; a manifest that still says `running` while
nobody holds the run directory's lock belongs to a run that crashed.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch

from fedsim.config.registry import plugin_folders
from fedsim.results.recorder import write_json
from fedsim.results.run_format import RUN_FORMAT
from fedsim.results.warnings import run_warnings


@functools.cache
def _git() -> tuple[str | None, bool | None]:
    """The commit of fedsim's own checkout, and whether its tracked files differ from it (None
    outside a git checkout: an installed package)."""
    def git(*args: str) -> str | None:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent)
        return out.stdout if out.returncode == 0 else None

    try:
        sha = (git("rev-parse", "HEAD") or "").strip() or None
        changed = git("status", "--porcelain", "--untracked-files=no") if sha else None
    except (OSError, subprocess.SubprocessError):
        return None, None
    return sha, None if changed is None else bool(changed.strip())


def session(from_round: int, plugin_files: dict[str, str], warnings: list[str]) -> dict:
    """What ran a run's rounds from `from_round` on in this process: releases, the checkout and
    the plugin files; a resume adds its own, so each round's code stays on record."""
    import numpy
    import fedsim

    sha, dirty = _git()
    return {"from_round": from_round, "fedsim": fedsim.__version__, "git_sha": sha, "git_dirty": dirty,
            "torch": torch.__version__, "numpy": numpy.__version__, "python": platform.python_version(),
            "host": socket.gethostname(), "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "plugin_files": plugin_files, "warnings": warnings}


def cuda_graphs(trainer) -> dict | None:
    """What the run's CUDA graphs did (None: the run trained without them)."""
    batched = getattr(trainer, "batched", trainer)  # auto holds its batched path
    graphs = getattr(batched, "graphs", None)
    return graphs.summary() if graphs is not None else None


def incomplete_outputs(run_dir: Path) -> dict[str, dict]:
    """The manifest's `incomplete_outputs` by output name: a tracker's log that lacks rounds of
    rounds.parquet (`{"output": "tensorboard", "path": ..., "cause": ...}`)."""
    from fedsim.results.run_format import read_manifest

    listed = read_manifest(run_dir, strict=False).get("incomplete_outputs", [])
    return {o["output"]: o for o in listed if isinstance(o, dict) and "output" in o} if isinstance(listed, list) else {}


def write_manifest(run, result, host_s: float) -> None:
    """`run`: the Experiment; `result`: its EngineResult (status `running` while it goes)."""
    import fedsim

    config, trace = run.config, run.trace
    write_json(run.run_dir / "manifest.json", {
        "run_format": RUN_FORMAT, "rules": run.rules, "fedsim": fedsim.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "seed": config.run.seed,
        "device": str(run.device), "threads": run.threads.summary(),
        "trainer": {**run.trainer.summary(), "from_round": run.start_round},
        "cuda_graphs": cuda_graphs(run.trainer), "git_sha": _git()[0], "git_dirty": _git()[1],
        "status": result.status, "reason": result.reason, "rounds": result.rounds,
        "pid": os.getpid(), "host": socket.gethostname(),
        "sim_time_s": result.sim_time, "host_s": round(host_s, 3),
        "algorithm": config.algorithm.name,
        "options": run.options_in_use(),  # every option in use, defaults included (a resume keeps them)
        "server_memory_bytes": run.strategy.memory_bytes(),
        "device_memory_bytes": run.strategy.device_memory_bytes(),
        "n_devices": run.task.n_clients, "model_dim": run.task.dim,
        "train_flops_per_sample": run.train_flops,
        "initial": run.recorder.initial,
        "warnings": run_warnings(run, result.status, result.sim_time) + [w for s in run.sessions for w in s.get("warnings", [])],
        "incomplete_outputs": list(run.incomplete_outputs.values()),
        "trace": {"n_devices": trace.n_devices, "horizon": trace.horizon, "wrap": trace.wrap,
                  "generator": trace.generator, "origin": trace.origin, "file": run.trace_file,
                  "fingerprint": run.trace_fingerprint, "fingerprint_of": run.fingerprint_of},
        "plugin_folders": plugin_folders(run.plugins_of),
        "plugin_files": run.plugin_files,
        "sessions": run.sessions,
        "data_sha256": run.data_sha256,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
