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
    # the suffix keeps the file's extension, which writers such as matplotlib go by
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; outputs are ordinary files
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
