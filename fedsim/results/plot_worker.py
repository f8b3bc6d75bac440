"""The run's plots drawn by a second process that `fedsim run` starts first thing.

matplotlib's import (0.3 s) and the drawing were a sixth of a small run's wall time; in a
process of their own they overlap torch's import and the simulation on a machine with two or
more cores. The worker reads one JSON request a line (run directories, the plot folder,
the title), draws with `plots.plot_dirs` and answers "ok"; whenever it cannot (it failed to
start, died, or raised), the caller draws in its own process instead, so a plot is never lost.
One worker serves every run of a process (the test suite's hundreds of in-process runs too).
This module imports nothing heavy: the CLI imports it before torch.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

_shared: PlotWorker | None = None


def shared_worker() -> PlotWorker | None:
    """This process's worker, started on first use (again if it died); None on a single core."""
    global _shared
    if _shared is None or _shared.proc.poll() is not None:
        _shared = PlotWorker.start()
        if _shared is not None:
            atexit.register(_shared.close)
    return _shared


class PlotWorker:
    """Requests are queued, not waited for: a comparison's first plots draw while the next
    algorithm runs. `finish()` waits for the queue and draws here what the worker could not."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "fedsim.results.plot_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.pending: list[tuple[dict[str, Path], Path, str]] = []

    @classmethod
    def start(cls) -> PlotWorker | None:
        """A worker where a second core can run it; None on a single core."""
        if (os.cpu_count() or 1) < 2:
            return None
        try:
            return cls()
        except OSError:
            return None

    def plot(self, runs: dict[str, Path], out_dir: Path, title: str) -> bool:
        """Queue the plots of `runs` (name -> run directory) into `out_dir`; False if the worker
        cannot take them."""
        request = {"runs": {name: str(path) for name, path in runs.items()}, "out": str(out_dir),
                   "title": title}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):  # it died (broken pipe) or was closed
            return False
        self.pending.append((runs, out_dir, title))
        return True

    def finish(self) -> None:
        """Wait until every queued plot is drawn; draw here each one the worker did not (it
        raised, or died)."""
        from fedsim.results.plots import plot_dirs

        pending, self.pending, failed = self.pending, [], []
        for runs, out_dir, title in pending:  # every answer is read, whatever happens here
            try:
                answer = self.proc.stdout.readline().strip()
            except (OSError, ValueError):
                answer = ""
            if answer != "ok":
                try:
                    plot_dirs(runs, out_dir, title)
                except Exception as err:  # raised once the queue is done
                    failed.append(err)
        if failed:
            raise failed[0]

    def close(self) -> None:
        self.finish()
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def serve() -> None:
    """The worker: import what drawing needs now (while the run starts), then draw on request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the run, which finishes its round
    import polars as pl  # noqa: F401  (the imports are the point)
    from matplotlib.figure import Figure  # noqa: F401

    from fedsim.results.plots import plot_dirs

    for line in sys.stdin:
        try:
            request = json.loads(line)
            runs = {name: Path(path) for name, path in request["runs"].items()}
            plot_dirs(runs, Path(request["out"]), title=request["title"])
            print("ok", flush=True)
        except Exception as err:  # the caller draws it itself and reports the error
            print(f"failed: {type(err).__name__}", flush=True)


if __name__ == "__main__":
    serve()
