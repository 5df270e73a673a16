"""Atomic file writes: every file autotune writes (recipes, trial specs and results, summaries,
calibrations, launch scripts) goes through here, so an interrupted write leaves the old file."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from .errors import Unwritable

__all__ = ["write_text_atomic", "not_regular", "write_target"]


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


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def not_regular(st: os.stat_result) -> str | None:
    """What a file that is not a regular file is ("a character device", ...), or None for a regular file."""
    if stat.S_ISREG(st.st_mode):
        return None
    return next((what for test, what in _KINDS if test(st.st_mode)), "not a regular file")


def write_target(path: str | Path, follow: bool = True) -> Path:
    """The file a write to `path` replaces, checked: `path` itself, or (follow=True) the file a symlink at `path`
    points to, resolved through every link, so that the link stays and its target gets the new text. An existing
    target that is not a regular file (a device such as /dev/null, a FIFO, a socket, a folder) is refused: an
    atomic replace would put a regular file in its place. follow=False refuses a symlink at `path`."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except OSError:  # nothing there (or a folder above in the way: the write says so, naming the folder)
        return path
    target = path
    if stat.S_ISLNK(st.st_mode):
        real = Path(os.path.realpath(path))
        if not follow:
            raise Unwritable(f"cannot write {path}: it is a symbolic link (to {real}); autotune does not write through "
                             f"links in its own folders; remove the link", str(path), errno.ELOOP)
        try:
            st = os.stat(real)
        except FileNotFoundError:
            problem = f"{path}: it is a symbolic link to {real}, which does not exist"
            raise Unwritable(f"cannot write {problem}; give a file path", str(path), errno.ENOENT, problem) from None
        except OSError as exc:
            raise _unwritable(path, real.parent, exc) from exc
        target = real
    what = not_regular(st)
    if what is not None:
        shown = f"{path} (a link to {target})" if target != path else str(path)
        if what == "a folder":
            raise Unwritable(f"cannot write {shown}: it is a folder; give a file name", str(path), errno.EISDIR)
        problem = f"{shown}: it is {what}, not a regular file"
        raise Unwritable(f"cannot write {problem}; give a file path", str(path), errno.EINVAL, problem)
    return target


def write_text_atomic(path: str | Path, text: str, mode: int | None = None, make_parents: bool = True,
                      follow: bool | None = None) -> Path:
    """Write via a temp file in the same directory + fsync + os.replace.

    The file gets `mode`, or what a plain open() would give (0666 less the umask; mkstemp's 0600 would hide
    recipes from the rest of a shared cluster). make_parents creates missing folders, for autotune's own trees
    (runs/<study>/...); pass False for a path the user named. Failures are Unwritable, naming `path`.

    Only a regular file is ever replaced: a device (/dev/null), a FIFO, a socket or a folder at `path` is refused.
    A symlink at `path` is written through (its target gets the text, the link stays) when `follow` is true, and
    refused when it is false; by default a path the user named (make_parents=False) is followed, and a path in
    autotune's own trees is not (a link planted in runs/<study>/ must not send a write elsewhere)."""
    path = Path(path)
    if follow is None:
        follow = not make_parents
    target = write_target(path, follow)
    if target != path:
        if mode is None:  # the target keeps its own permissions, as a write through the link would
            try:
                mode = os.stat(target).st_mode & 0o7777
            except OSError:
                pass
        _write(target, text, mode, make_parents=False, shown=path)
        return path
    _write(path, text, mode, make_parents, shown=path)
    return path


def _write(path: Path, text: str, mode: int | None, make_parents: bool, shown: Path) -> None:
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
        try:  # the last look before the replace: a device, FIFO or folder put there meanwhile stays
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else not_regular(st)
            if what == "a folder":
                raise Unwritable(f"cannot write {shown}: it is a folder; give a file name", str(shown), errno.EISDIR)
            if what is not None:
                raise Unwritable(f"cannot write {shown}: {path} is {what}, not a regular file; give a file path",
                                 str(shown), errno.EINVAL)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, Unwritable):
            raise _unwritable(shown, folder, exc) from exc
        raise


def published_dir(study_root: Path) -> Path | None:
    """The folder of a study's current output set (search/outputs.py), resolved once so that a reader
    stays on one set while a newer one is swapped in; None when nothing was published yet."""
    link = Path(study_root) / "published"
    if link.is_symlink() and link.resolve().is_dir():
        return link.resolve()
    legacy = Path(study_root)  # studies from before publications kept recipes/ and summary.json here
    return legacy if (legacy / "summary.json").is_file() and not link.exists() else None
