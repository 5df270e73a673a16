"""Atomic file writes: every file autotune writes (recipes, trial specs and results, summaries,
calibrations, launch scripts) goes through here, so an interrupted write leaves the old file."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from .errors import Unwritable

__all__ = ["write_text_atomic"]


def _umask_now() -> int:
    """Set-and-restore is the only portable read, and it briefly changes the umask for every thread."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask_now()  # at import, before any worker thread exists


def _umask() -> int:
    """The process umask, read without changing it (Linux lists it in /proc); else the one seen at import."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _UMASK


def _show(folder: Path) -> str:
    return str(folder) if str(folder) not in ("", ".") else f"the current folder ({os.getcwd()})"


def _unwritable(path: Path, folder: Path, exc: OSError) -> Unwritable:
    """The OSError of a temp file or a mkdir, told about the user's path (the temp file's name means nothing)."""
    where = _show(folder)
    code = exc.errno
    if code in (errno.EACCES, errno.EPERM):
        why = f"cannot write in {where}: permission denied; choose a writable folder"
    elif code == errno.EROFS:
        why = f"cannot write in {where}: it is on a read-only file system; choose another folder"
    elif code == errno.EISDIR:
        why = "it is a folder; give a file name"
    elif code == errno.ENOTDIR:
        why = f"a part of {where} is a file, not a folder; choose another path"
    elif code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        why = f"no space left in {where} ({exc.strerror}); free some space or choose another folder"
    else:
        why = f"cannot create a file in {where} ({exc.strerror or type(exc).__name__}); choose another folder"
    return Unwritable(f"cannot write {path}: {why}", str(path), code)


def _ready_folder(path: Path, make_parents: bool) -> Path:
    """The folder `path` goes in, checked (and made, with make_parents) before any temp file exists."""
    folder = path.parent
    try:
        if folder.is_dir():
            return folder
        exists = folder.exists()
    except OSError as exc:  # e.g. a folder above that may not be searched
        raise _unwritable(path, folder, exc) from exc
    if exists:
        raise Unwritable(f"cannot write {path}: {folder} is a file, not a folder; choose another path",
                         str(path), errno.ENOTDIR)
    if not make_parents:  # a path the user named: a missing folder is more likely a typo than a wish
        raise Unwritable(f"cannot write {path}: folder {folder} does not exist; create it first "
                         f"(mkdir -p {folder}) or choose another path", str(path), errno.ENOENT)
    above = folder
    while not above.exists() and above.parent != above:
        above = above.parent
    if above.exists() and not above.is_dir():
        raise Unwritable(f"cannot write {path}: {above} is a file, not a folder; choose another path",
                         str(path), errno.ENOTDIR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(path, above, exc) from exc
    return folder


def write_text_atomic(path: str | Path, text: str, mode: int | None = None, make_parents: bool = True) -> Path:
    """Write via a temp file in the same directory + fsync + os.replace.

    The file gets `mode`, or what a plain open() would give (0666 less the umask; mkstemp's 0600 would hide
    recipes from the rest of a shared cluster). make_parents creates missing folders, for autotune's own trees
    (runs/<study>/...); pass False for a path the user named. Failures are Unwritable, naming `path`."""
    path = Path(path)
    folder = _ready_folder(path, make_parents)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _unwritable(path, folder, exc) from exc
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, Unwritable):
            raise _unwritable(path, folder, exc) from exc
        raise
    return path


def published_dir(study_root: Path) -> Path | None:
    """The folder of a study's current output set (search/outputs.py), resolved once so that a reader
    stays on one set while a newer one is swapped in; None when nothing was published yet."""
    link = Path(study_root) / "published"
    if link.is_symlink() and link.resolve().is_dir():
        return link.resolve()
    legacy = Path(study_root)  # studies from before publications kept recipes/ and summary.json here
    return legacy if (legacy / "summary.json").is_file() and not link.exists() else None
