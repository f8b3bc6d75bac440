"""The Ray backend of `fedsim sweep --backend ray`: every point that is not done runs as one
Ray task, on this machine's cores (a local Ray) or on a cluster (`--address`, or RAY_ADDRESS).

A task gets plain data (the point's config as a dict, its run directory, its state) and runs
the point with `fedsim.studies.point.run_point`, exactly as a standalone `fedsim run` does (the
in-process backend steps its points in lockstep instead, to the same results). Workers write
the run directories straight into the study folder, so on a cluster every node needs fedsim
installed and the study folder on a shared filesystem, mounted at the same path. Ctrl-C or
SIGTERM cancels the tasks: the running points finish their round and keep a checkpoint, and
running the study again resumes them. A point whose node dies (Ray's NodeDiedError) runs again
as a new task on a node that is left, from its last checkpoint; a worker process that dies on a
live node (killed, out of memory) is an error instead, as running it again would likely kill it
again. What Ray itself prints in the driver (its warnings, a dead worker's report) is left out:
a point that fails is one `error:` line naming it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path

from fedsim.errors import FedsimError, Stopped, first_line, say_stopping
from fedsim.results.recorder import write_json
from fedsim.results.run_format import read_manifest
from fedsim.sim.engine import finish_round_on_stop_signal
from fedsim.studies.point import run_point
from fedsim.studies.study import Point, Study

WAIT_S = 1.0  # how often the driver wakes up while it waits (so Ctrl-C is seen at once)
NODE_LOSSES = 3  # times a point runs again after its node died, before it is an error
LOST_WRITER_S = 120.0  # how long a point run again waits for its lost process to let go of its folder


def run_task(raw_config: dict, origin: str, run_dir: str, state: str | None, cwd: str) -> tuple:
    """One point, in a Ray worker: ("ok", status), ("error", message) for a FedsimError, or
    ("bug", message, traceback) for anything else, so nothing Ray-specific crosses back.
    `state` None: a point whose node died, run again from what its folder holds."""
    import torch

    from fedsim.config import config_from_dict

    torch.set_num_threads(1)  # one core per task: tasks side by side must not fight over cores
    if os.path.isdir(cwd):
        os.chdir(cwd)  # relative paths in the config mean what they mean to `fedsim run`
    (Path(run_dir) / "error.txt").unlink(missing_ok=True)  # an earlier failure's traceback
    try:
        config = config_from_dict(raw_config, origin=origin)
        if state is None:
            state = state_once_let_go(config, Path(run_dir))
        status = run_point(config, Path(run_dir), state, progress=False)
        record_node(Path(run_dir))
        return "ok", status
    except FedsimError as err:
        return "error", str(err)
    except Exception as err:  # a bug: its traceback goes to the point's folder
        return "bug", f"{type(err).__name__}: {err}", traceback.format_exc()


def state_once_let_go(config, run_dir: Path) -> str:
    """The state of a point whose node died, read once the process that ran it there has let go
    of its folder (on one machine it outlives its raylet by a second or two; on a shared
    filesystem a dead client's lock lasts until its lease ends); after LOST_WRITER_S the
    point's run refuses the folder with one line naming that process."""
    import time

    from fedsim.files import DirectoryLock
    from fedsim.runs.experiment import run_state

    end = time.monotonic() + LOST_WRITER_S
    while DirectoryLock(run_dir).held() and time.monotonic() < end:
        time.sleep(0.5)
    return run_state(run_dir, config)


def record_node(run_dir: Path) -> None:
    """The Ray node that ran the point, in its manifest (`ray_node`): with the `host` there, it
    tells where each point of a study ran (`ray list nodes` names the node)."""
    import ray

    manifest = read_manifest(run_dir, strict=False)
    if manifest:
        write_json(run_dir / "manifest.json", {**manifest, "ray_node": ray.get_runtime_context().get_node_id()})


def check_backend(address: str | None) -> None:
    """Before a sweep writes anything: ray is installed, and the cluster asked for answers."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise FedsimError("the Ray backend needs ray: pip install 'fedsim-avail[ray]'") from None
    address, where = cluster_address(address)
    if address:
        check_reachable(address, where)
        check_admitted(address, where)


def cluster_address(address: str | None) -> tuple[str | None, str]:
    """The cluster to join (--address, else RAY_ADDRESS; None: a local Ray) and the flag or
    variable that gave it, as a message names it."""
    if address:
        return address, f"--address {address}"
    return os.environ.get("RAY_ADDRESS") or None, f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS')}"


def run_points(study: Study, todo: list[tuple[Point, str]], address: str | None = None,
               progress: bool = True) -> tuple[list[str], str]:
    """Run every point of `todo` ((point, state) pairs) that is not done as a Ray task; one
    status per entry, in order (a done point's status is read from its manifest), and the
    signal that stopped them ("" if none)."""
    import ray

    statuses = [run_point(p.config, study.folder / p.name, "done") if state == "done" else None
                for p, state in todo]
    pending = [i for i, (_, state) in enumerate(todo) if state != "done"]
    if not pending:
        return statuses, ""
    address, where = cluster_address(address)
    with main_thread_output():
        with keeping_our_sigterm_handler(ray):
            started = start_ray(ray, address, where)
        try:
            check_gpus(ray, study.gpus_per_task)
            task = ray.remote(run_task).options(num_cpus=1, num_gpus=study.gpus_per_task, max_retries=0)
            stopped = {"name": None}  # the first Ctrl-C or SIGTERM: `gather` cancels the tasks; a second aborts
            with finish_round_on_stop_signal(stopped, notice=""):
                cwd = os.getcwd()

                def submit(i: int, state: str | None):
                    point = todo[i][0]
                    run_dir = str((study.folder / point.name).resolve())
                    return task.remote(point.config.to_dict(), point.config.source, run_dir, state, cwd)

                refs = {submit(i, todo[i][1]): i for i in pending}
                from fedsim.studies.progress import StudyProgress

                shown = StudyProgress([1] * len(pending), len(todo), len(todo) - len(pending), progress,
                                      label=study.name, unit="point")
                failures = gather(ray, refs, submit, todo, study, statuses, shown, stopped)
                shown.close()
        finally:
            if started:
                ray.shutdown()
    if failures:  # the first in the study's order
        more = f" ({len(failures) - 1} more points failed)" if len(failures) > 1 else ""
        raise FedsimError(min(failures)[1] + more)
    return statuses, stopped["name"] or ""


@contextmanager
def keeping_our_sigterm_handler(ray):
    """Within (ray.init): Ray does not replace fedsim's SIGTERM handler with its own, which
    exits with status 15 (or 1) and no word, during its start or at any later moment of the
    sweep; a SIGTERM stops the sweep with 143 and one line, as it stops an in-process one."""
    import signal

    ours = signal.getsignal(signal.SIGTERM)
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    replace = getattr(utils, "set_sigterm_handler", None)
    if replace is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if replace is not None:
            utils.set_sigterm_handler = replace
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, ours)  # whatever another Ray version set all the same


def start_ray(ray, address: str | None, where: str) -> bool:
    """Join the cluster at `address` (`where`: the flag or variable that gave it), else start a
    local Ray on every core; whether this call started Ray (and so shuts it down)."""
    if ray.is_initialized():
        return False
    options = {"ignore_reinit_error": True, "log_to_driver": False, "include_dashboard": False,
               "logging_level": logging.ERROR}
    try:
        if address:
            ray.init(address=address, **options)
        else:
            # "local": a new Ray of its own, even where `ray start` left a cluster (or its stale
            # address file) on this machine, which Ray would join otherwise
            ray.init(address="local", num_cpus=os.cpu_count() or 1, **options)
    except (ConnectionError, ValueError, RuntimeError) as err:
        where = where if address else "a local Ray"
        first = first_line(err)
        raise FedsimError(f"{where}: Ray could not start ({first}); check the address (a cluster "
                          "started with `ray start --head`), or leave out --address and RAY_ADDRESS "
                          "for a local Ray") from None
    return True


def check_reachable(address: str, where: str) -> None:
    """Ray retries an address where no cluster answers for ever: try it first, in seconds."""
    if address in ("auto", "local"):  # Ray's own words: the cluster on this machine, a new one
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise FedsimError(f"{where}: not HOST:PORT; give the head node's address, e.g. 10.0.0.5:6379 "
                          "(the port of `ray start --head`)")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as err:
        raise FedsimError(f"{where}: no Ray cluster answers there ({err.strerror or err}); start one "
                          "with `ray start --head`, or leave out --address and RAY_ADDRESS for a "
                          "local Ray") from None


ANSWER_S = 7  # how long the head's GCS may take to answer before the address is refused

# The head asked once, in a process of its own: exit 3, a cluster with token authentication
# refused us; 4, the GCS failed (its first line on stdout); 0, it answered (or a Ray without it)
_ASK_HEAD = """import sys
try:
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError
except ImportError:
    sys.exit(0)
try:
    GcsClient(address=sys.argv[1])
except AuthenticationError:
    sys.exit(3)
except Exception as err:
    print((str(err).strip().splitlines() or [type(err).__name__])[0])
    sys.exit(4)
"""


def check_admitted(address: str, where: str) -> None:
    """Ask the head's GCS once, in a process of its own given `ANSWER_S` seconds: a cluster with
    token authentication refuses a process without its token (ray.init tries again for 20 s,
    printing a line each time), and a port that takes connections with no GCS answering behind
    it (a head that has just stopped, another service) keeps ray.init trying for minutes."""
    if address in ("auto", "local") or address.startswith("ray://"):  # no head's GCS to ask here
        return
    try:
        asked = subprocess.run([sys.executable, "-c", _ASK_HEAD, address], capture_output=True, text=True,
                               timeout=ANSWER_S)
    except subprocess.TimeoutExpired:
        asked = None
    if asked is not None and asked.returncode == 3:
        raise FedsimError(f"{where}: the Ray cluster there uses token authentication and refused this "
                          "process; set RAY_AUTH_MODE=token and give it the head's token (the same "
                          "~/.ray/auth_token, or RAY_AUTH_TOKEN)")
    if asked is None or asked.returncode == 4:
        why = f"no Ray head replied within {ANSWER_S} s" if asked is None else asked.stdout.strip()
        raise FedsimError(f"{where}: no Ray cluster answers there ({why}); start one with `ray start "
                          "--head`, or leave out --address and RAY_ADDRESS for a local Ray")


def check_gpus(ray, per_task: float) -> None:
    """A task asking for more GPUs than the cluster has would wait forever: refuse it."""
    if per_task > 0:
        have = ray.cluster_resources().get("GPU", 0)
        if have < per_task:
            raise FedsimError(f"[sweep] gpus_per_task = {per_task:g}, but the Ray cluster has {have:g} "
                              "GPUs; set gpus_per_task = 0 for CPU tasks, or join a cluster with GPUs")


class MainThreadStream:
    """A stream that passes on what the main thread writes and drops what other threads do:
    in the driver, those are Ray's, which print a dead worker's report from the raylet."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        if threading.current_thread() is threading.main_thread():
            return self.stream.write(text)
        return len(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextmanager
def main_thread_output():
    """Only the study's own lines reach stdout and stderr while Ray runs in the driver."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = MainThreadStream(sys.stdout), MainThreadStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


def stopped_within(error: BaseException) -> Stopped | None:
    """The second Ctrl-C or SIGTERM's Stopped, raised by its handler while Ray's C code waited,
    which Ray hands on as a SystemError ("returned a result with an exception set") whose
    context is the Stopped; None for another error."""
    while error is not None and not isinstance(error, Stopped):
        error = error.__cause__ or error.__context__
    return error


def gather(ray, refs: dict, submit, todo: list, study: Study, statuses: list, shown,
           stopped: dict) -> list[tuple[int, str]]:
    """Wait for the tasks, filling `statuses`; (index, error line) of the points that failed.
    A point whose node died is `submit`ted again (up to NODE_LOSSES times), to run on from
    what its folder holds. Once a stop signal is `stopped`, the tasks are cancelled (a running
    point finishes its round and checkpoints, status interrupted); a second signal kills them
    and aborts."""
    from fedsim.runs.trackers import warn

    failures: list[tuple[int, str]] = []
    losses = dict.fromkeys(refs.values(), 0)
    left = list(refs)
    cancelled = False
    while left:
        if stopped["name"] and not cancelled:
            cancelled = True
            say_stopping(f"stopping: the running points finish their round ({stopped['name']} again to abort)")
            for ref in left:
                ray.cancel(ref)
        try:
            ready, left = ray.wait(left, num_returns=1, timeout=WAIT_S)
        except (Stopped, SystemError) as err:  # (Ray's C code wraps the signal handler's Stopped)
            stop = stopped_within(err)
            if stop is None:
                raise
            for ref in left:
                ray.cancel(ref, force=True)
            raise stop from None
        for ref in ready:
            i = refs[ref]
            point = todo[i][0]
            status, failure = outcome(ray, ref, point, study, stopping=bool(stopped["name"]))
            if status == "lost":
                died = f"point {point.name}: its Ray node ({failure}) died while it ran"
                if losses[i] < NODE_LOSSES and not stopped["name"]:
                    losses[i] += 1
                    warn(f"{died}; it runs again on a node that is left, from its last checkpoint")
                    again = submit(i, None)
                    refs[again] = i
                    left.append(again)
                    continue
                resume = study.resume_command()
                status, failure = None, f"{died} ({losses[i] + 1} times); run `{resume}` to run it again from its last checkpoint"
            statuses[i] = status
            warn_incomplete(study.folder / point.name)
            if statuses[i] == "interrupted" and stopped["name"]:
                name_the_signal(study.folder / point.name, stopped["name"])
            if failure:
                failures.append((i, failure))
            shown.rounds_done(1)
            shown.point_finished(point.name, "failed" if failure else statuses[i])
    return failures


def warn_incomplete(run_dir: Path) -> None:
    """The warning of each tracker that failed in the point's worker (whose output Ray does
    not pass on), from its manifest's `incomplete_outputs`."""
    from fedsim.runs.trackers import stopped_logging, warn

    for entry in read_manifest(run_dir, strict=False).get("incomplete_outputs") or []:
        warn(f"{run_dir}: {stopped_logging(entry)}")


def name_the_signal(run_dir: Path, name: str) -> None:
    """Ray stops a task by interrupting it as Ctrl-C would: the manifest of a point that a
    SIGTERM to the sweep interrupted says SIGTERM, as a standalone run's would."""
    manifest = read_manifest(run_dir, strict=False)
    reason = str(manifest.get("reason", ""))
    if manifest.get("status") == "interrupted" and "Ctrl-C" in reason and name != "Ctrl-C":
        write_json(run_dir / "manifest.json", {**manifest, "reason": reason.replace("Ctrl-C", name)})


def outcome(ray, ref, point: Point, study: Study, stopping: bool = False) -> tuple[str | None, str | None]:
    """(status, None) of a finished task, (None, the error line naming its point), or ("lost",
    the node's address) where the task's node died. `stopping`: once a stop signal came, a task
    that Ray lost (its worker, raylet or node: a SIGTERM to the sweep's process group stops a
    local Ray's processes too) was interrupted, as the point's folder keeps its last checkpoint."""
    from ray.exceptions import RayError, TaskCancelledError

    try:
        result = ray.get(ref)
    except TaskCancelledError:  # cancelled before it started, or before its run's first round
        return "interrupted", None
    except RayError as error:
        return ("interrupted", None) if stopping else lost(error, point, study)
    if result[0] == "ok":
        return result[1], None
    message = result[1]
    if result[0] == "bug":
        log = study.folder / point.name / "error.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(result[2])
        return None, f"point {point.name}: its run failed with {message.splitlines()[0]} (traceback: {log})"
    return None, message if point.name in message else f"point {point.name}: {message}"


def lost(error: Exception, point: Point, study: Study) -> tuple[str | None, str | None]:
    """`outcome` of a task that Ray lost (`error`: what `ray.get` raised)."""
    from ray.exceptions import NodeDiedError, WorkerCrashedError

    if isinstance(error, NodeDiedError):  # its node's raylet died (the machine lost, preempted, ...)
        node = re.search(r"node IP: ([^,\s]+)", str(error), re.IGNORECASE)
        return "lost", node[1] if node else "its address unknown"
    if isinstance(error, WorkerCrashedError):  # its process was killed (by hand, by the kernel for memory, ...)
        return None, (f"point {point.name}: its Ray worker died while it ran (killed, or out of memory); "
                      f"run `{study.resume_command()}` to run it again from its last checkpoint")
    return None, f"point {point.name}: its Ray task failed: {first_line(error)}"  # (Ray's memory monitor, ...)
