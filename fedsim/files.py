"""Writing output files so that nothing already written is lost: temp file + atomic rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from fedsim.errors import FedsimError


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Run `write(tmp)` on a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    if path.is_dir():
        raise FedsimError(f"{path} is a folder; give the path of a file to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FedsimError(f"cannot create the folder {path.parent} for {path.name}: "
                          f"{err.strerror}; choose another output path") from None
    tmp = None
    try:
        # the suffix keeps the file's extension, which writers such as matplotlib go by
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
        os.close(fd)
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; outputs are ordinary files
        os.replace(tmp, path)
    except OSError as err:  # named by the user's path, never the temporary file; the old file stays
        raise FedsimError(f"{path}: cannot write it ({err.strerror or err}); check the folder's "
                          "permissions and free space (the earlier file, if any, is intact)") from None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def claim_directory(base: Path) -> Path:
    """`base`, or `base-2`, `-3`, ...: the first that did not exist, created now. mkdir is
    atomic, so runs started together never share a directory."""
    base = Path(base)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FedsimError(f"cannot create the folder {base.parent}: {err.strerror}; choose another "
                          "[run] out") from None
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

    def held(self) -> bool:
        """Whether some process holds it now (a look that writes nothing)."""
        if not (self.folder / ".lock").exists():
            return False
        fd, holder = self._try()
        if fd >= 0:
            os.close(fd)
        return holder is not None

    def acquire(self, what: str) -> None:
        import socket

        self.folder.mkdir(parents=True, exist_ok=True)
        fd, holder = self._try()
        if holder is not None:
            raise FedsimError(f"{self.folder}: in use by {holder}; wait until it ends (or stop it), "
                              "then try again")
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()} ({what})".encode())
        self.fd = fd

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
