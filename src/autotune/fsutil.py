"""Atomic file writes: every file autotune writes (recipes, trial specs and results, summaries,
calibrations, launch scripts) goes through here, so an interrupted write leaves the old file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_text_atomic"]


def write_text_atomic(path: str | Path, text: str, mode: int | None = None) -> Path:
    """Write via a temp file in the same directory + fsync + os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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
