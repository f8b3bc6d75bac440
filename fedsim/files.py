"""Writing output files so that nothing already written is lost: temp file + atomic rename."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shlex
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Callable

from fedsim.errors import FedsimError


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Run `write(tmp)` on a temporary file beside `path`, then rename it over `path`.

    If the disk fills up, `write` is run once more on a sink that only counts bytes (writers
    that take a path take a binary file object too: torch, polars, pyarrow, matplotlib), so
    that the error can say how much space the file needs."""
    path = Path(path)
    if path.is_dir():
        raise FedsimError(f"{path} is a folder; give the path of a file to write")
    make_folder(path.parent, "choose another output path")
    tmp, full = None, False
    try:
        # the suffix keeps the file's extension, which writers such as matplotlib go by
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
        os.close(fd)
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; outputs are ordinary files
        if _KILL_AT:
            _test_kill_point("before", path)
        os.replace(tmp, path)
        if _KILL_AT:
            _test_kill_point("after", path)
    except FedsimError:
        raise
    except Exception as err:  # named by the user's path, never the temporary file; the old file stays
        full = _disk_full(err, path.parent)
        if not full and isinstance(err, OSError):
            raise FedsimError(f"{path}: cannot write it ({err.strerror or err}); check the folder's "
                              "permissions (the earlier file, if any, is intact)") from None
        if not full:
            raise
    finally:
        written = _remove(tmp)
    if full:  # out of the except clause, which keeps the writer (and its open file) alive
        raise FedsimError(_no_space(path, write, written))


def make_folder(folder: Path, fix: str) -> None:
    """`mkdir -p folder`, or one line saying why not: a file standing where a folder must be
    (the system says only "File exists" or "Not a directory"), or the system's reason."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file" if blocker else err.strerror
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free some space, then run the command again"
        raise FedsimError(f"cannot create the folder {folder}: {why}; {fix}") from None


def _remove(tmp: str | None) -> int:
    """Delete the temporary file if it is there; the bytes it held."""
    if not tmp or not os.path.exists(tmp):
        return 0
    size = os.path.getsize(tmp)
    os.unlink(tmp)
    return size


def _disk_full(err: Exception, folder: Path) -> bool:
    """Whether a failed write ran out of space: an OSError's ENOSPC or EDQUOT, or their words
    in polars' own error; torch's says only that its write fell short, so there a folder left
    with (almost) no free space by the partial file counts too."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    if any(text in str(err) for text in ("No space left on device", "Disk quota exceeded")):
        return True
    try:
        return shutil.disk_usage(folder).free < 1 << 16
    except OSError:
        return False


def _no_space(path: Path, write: Callable, written: int) -> str:
    """The disk-full line: how much the file needs (counted by writing it again, to nothing)
    and how much is free."""
    counter = _ByteCounter()
    try:
        write(counter)
        needed = f"needs {human_size(counter.count)}"
    except Exception:  # a writer that takes paths only: what it wrote is a lower bound
        needed = f"needs more than {human_size(written)}"
    free = shutil.disk_usage(path.parent).free
    # room for the file twice over, yet no space: not the bytes but a quota or the count of files ran out
    limit = ": a quota or the limit on the number of files is reached" if free > 2 * counter.count + (1 << 16) else ""
    return (f"{path}: no space left on device (the file {needed}, {human_size(free)} free{limit}; the earlier file, "
            "if any, is intact); free some space, then run the command again")  # (a run's line adds its resume)


class _ByteCounter(io.RawIOBase):
    """A binary file that keeps nothing and counts the bytes written to it."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        self.count += size
        return size

    def tell(self) -> int:
        return self.count

    def write_bytes(self, data) -> int:  # the Path methods that writers use
        return self.write(data)

    def write_text(self, text: str) -> int:
        return self.write(text.encode())


# the PNG `Software` text of the pictures `fedsim trace plot` draws: the only files in a run
# directory that a command other than the run's own may write over (drawing them again)
TRACE_PICTURE = "fedsim trace plot"


def check_out(path: str | Path | None, force: bool, inputs: list = (), flag: str = "--out",
              redraws: str | None = None, suffix: str = "") -> None:
    """Where a command may write its output `path`: never over an input or a folder, nor over
    a file in the folder of a run, comparison or study (the run's own, or one put there by
    hand), even with --force, unless it is a picture this command drew there (`redraws`: its
    PNG's Software text); over any other file that exists only with --force. `suffix`: the
    file's format (.parquet, .png), which its name must say."""
    if not path:
        return
    out = Path(path)
    for given in inputs:
        if given and out.resolve() == Path(given).resolve():
            raise FedsimError(f"{flag} {path}: is the input {given}; give another path (an input is never "
                              "written over)")
    if out.is_dir():
        raise FedsimError(f"{flag} {path}: is a folder; give the path of a file")
    if out.exists():
        folder = run_folder_of(out)
        if folder is not None and not (redraws and _drawn_by(out, redraws)):
            raise FedsimError(f"{flag} {path}: is a file of the run directory {folder}, which no other command "
                              "writes over (not even with --force); give a path outside it, or a new file name")
        if not force:
            raise FedsimError(f"{flag} {path}: the file exists; give another path, or --force to overwrite it")
    if suffix and out.suffix and out.suffix.lower() != suffix:  # (a name without one is the user's)
        raise FedsimError(f"{flag} {path}: the file is written as {suffix[1:].upper()}; name it "
                          f"{out.with_suffix(suffix).name}")


def run_folder_of(path: Path) -> Path | None:
    """The nearest folder above `path` that fedsim made for a run, a comparison or a study."""
    return next((folder for folder in Path(path).absolute().parents if made_by_fedsim(folder)), None)


def made_by_fedsim(folder: Path) -> bool:
    """Whether `folder` is a run directory, or the folder of a comparison or a study: its
    config.toml (or study.toml) beside what only fedsim puts there (the lock of its writers, a
    manifest, a checkpoint, a summary, or the run directories of its members). A user's own
    study.toml or config.toml among other files does not make a folder fedsim's."""
    if not ((folder / "config.toml").is_file() or (folder / "study.toml").is_file()):
        return False
    if any((folder / name).exists() for name in (".lock", "manifest.json", "checkpoint.pt", "summary.parquet")):
        return True
    return any((member / "manifest.json").is_file() for member in folder.iterdir() if member.is_dir())


def _drawn_by(path: Path, software: str) -> bool:
    """Whether `path` is a PNG whose metadata (a text chunk before its pixels) names `software`."""
    with open(path, "rb") as f:
        head = f.read(1 << 12)
    return head.startswith(b"\x89PNG") and b"Software\x00" + software.encode() in head


def resolved(path: str | Path, where: str) -> Path:
    """`path` made absolute, symbolic links followed; a loop of links is one line."""
    try:
        return Path(path).resolve(strict=False)
    except (RuntimeError, OSError) as err:  # Python 3.11 raises RuntimeError on a loop
        raise FedsimError(f"{where}: {path} is a symbolic link in a loop ({err}); give the path of a file") from None


def plain_name(name: str) -> str:
    """A name fit for a file or folder: a plugin's algorithm `my_algos:RareFedAvg` (or
    `pkg/mod:Name`) becomes `my_algos.RareFedAvg`; the manifest keeps the full name."""
    return "".join(c if c.isalnum() or c in "-_.+" else "." for c in name) or "run"


def human_size(n: int) -> str:
    """Bytes in decimal units, 3 significant digits: 1.23 MB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def human_duration(seconds: float) -> str:
    """Seconds in the largest unit they reach (ms below a second), 3 significant digits, so
    that 3 ms sessions do not print as 0.0 s: 16.7 min, 2.5 d."""
    if seconds == 0:
        return "0 s"
    units = ((86400.0, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s"))
    size, unit = next(((size, unit) for size, unit in units if abs(seconds) >= size), (1e-3, "ms"))
    return f"{seconds / size:.3g} {unit}"


# Test hook (tests/test_kill_resume.py): FEDSIM_TEST_KILL_AT="before:checkpoint.pt:2" kills
# this process with SIGKILL right before (or `after`) the 2nd rename of a file of that name,
# as a crash or kill -9 would. Read once at import; unset, a write pays one test of a global.
_KILL_AT = os.environ.get("FEDSIM_TEST_KILL_AT")
_renames: dict[tuple[str, str], int] = {}


def _test_kill_point(when: str, path: Path) -> None:
    point, name, count = _KILL_AT.split(":")
    key = (when, path.name)
    _renames[key] = _renames.get(key, 0) + 1
    if (point, name) == key and _renames[key] == int(count):
        os.kill(os.getpid(), signal.SIGKILL)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def claim_directory(base: Path) -> Path:
    """`base`, or `base-2`, `-3`, ...: the first that did not exist, created now. mkdir is
    atomic, so runs started together never share a directory."""
    base = Path(base)
    make_folder(base.parent, "choose another [run] out")
    candidate, k = base, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            k += 1
            candidate = base.with_name(f"{base.name}-{k}")


class DirectoryLock:
    """One writer per run directory: an exclusive `flock` on its `.lock` file, held while a run
    or a resume writes there. The system releases it when the process ends, even by kill -9,
    so a crash never leaves a directory locked."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.fd: int | None = None

    def _try(self) -> tuple[int, str | None]:
        """The lock file's descriptor, locked by us; or (-1, its holder's description)."""
        import fcntl

        fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            return -1, holder
        return fd, None

    def holder(self) -> str | None:
        """Who holds it now, None if nobody (a look that writes nothing)."""
        if not (self.folder / ".lock").exists():
            return None
        fd, holder = self._try()
        if fd >= 0:
            os.close(fd)
        return holder

    def held(self) -> bool:
        return self.holder() is not None

    def refuse_if_held(self) -> None:
        """FedsimError naming the process that holds it, if one does."""
        holder = self.holder()
        if holder is not None:
            raise self._in_use(holder)

    def acquire(self, what: str) -> None:
        import socket

        self.folder.mkdir(parents=True, exist_ok=True)
        fd, holder = self._try()
        if holder is not None:
            raise self._in_use(holder)
        with contextlib.suppress(OSError):  # a full disk: locked all the same, the next write says so
            os.ftruncate(fd, 0)
            os.write(fd, f"process {os.getpid()} on {socket.gethostname()} ({what})".encode())
        self.fd = fd

    def _in_use(self, holder: str) -> FedsimError:
        return FedsimError(f"{self.folder}: in use by {holder}; wait until it ends (or stop it), then try again")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the file drops the lock
            self.fd = None


def remove_stale_temporaries(folder: Path) -> None:
    """The temporary files of writes that a crash interrupted (atomic_write's `.NAME.*.tmp*`):
    called by the run that holds the folder's lock, so no write of another is under way."""
    for tmp in Path(folder).glob(".*.tmp*"):
        tmp.unlink(missing_ok=True)


def file_fingerprint(path: Path) -> dict:
    """Size and SHA-256 of a file (read in blocks), to tell later whether it is the same file."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": Path(path).stat().st_size, "sha256": digest.hexdigest()}


def resume_command(command: str, folder: Path) -> str:
    """`fedsim run --resume /abs/folder`: what finishes the work in `folder`, typed from any
    directory (an absolute path, quoted for the shell where it needs it)."""
    return f"fedsim {command} --resume {shlex.quote(str(Path(folder).absolute()))}"
