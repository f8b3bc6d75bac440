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
def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


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
        "cuda_graphs": cuda_graphs(run.trainer), "git_sha": _git_sha(),
        "status": result.status, "reason": result.reason, "rounds": result.rounds,
        "pid": os.getpid(), "host": socket.gethostname(),
        "sim_time_s": result.sim_time, "host_s": round(host_s, 3),
        "algorithm": config.algorithm.name,
        "server_memory_bytes": run.strategy.memory_bytes(),
        "device_memory_bytes": run.strategy.device_memory_bytes(),
        "n_devices": run.task.n_clients, "model_dim": run.task.dim,
        "train_flops_per_sample": run.train_flops,
        "initial": run.recorder.initial,
        "warnings": run_warnings(run, result.status, result.sim_time),
        "incomplete_outputs": list(run.incomplete_outputs.values()),
        "trace": {"n_devices": trace.n_devices, "horizon": trace.horizon, "wrap": trace.wrap,
                  "generator": trace.generator, "origin": trace.origin, "file": run.trace_file,
                  "fingerprint": run.trace_fingerprint, "fingerprint_of": run.fingerprint_of},
        "plugin_folders": plugin_folders(run.plugins_of),
        "plugin_files": run.plugin_files,
        "data_sha256": run.data_sha256,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
