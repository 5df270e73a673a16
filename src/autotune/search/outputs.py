"""A study's outputs, published as one set: recipes/, summary.json (and whatever else a stage adds).

Each publication is written whole into a fresh folder `runs/<study>/.outputs-<n>/`, then swapped in by
renaming a symlink (`runs/<study>/published -> .outputs-<n>`) over the old one: one atomic step. The
documented paths `runs/<study>/recipes` and `runs/<study>/summary.json` are fixed links through
`published`, so a reader, an export or the dashboard sees the old set or the new set, never a mix, and a
kill at any point leaves the previous set intact. The set a publication replaces is kept one more round,
so a reader that resolved it just before the swap can finish reading; older sets (and a half-written one
a kill left) are removed. Only folders named `.outputs-<n>` inside the study are ever removed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

__all__ = ["Publication"]

_GEN = re.compile(r"\.outputs-(\d+)")
LINKS = {"recipes": "published/recipes", "summary.json": "published/summary.json"}


class Publication:
    """Stage files for the next set, then `commit()` to swap them in (under the study lock)."""

    def __init__(self, study_root: Path):
        self.root = Path(study_root)
        gens = [int(m.group(1)) for p in self.root.iterdir() if (m := _GEN.fullmatch(p.name))]
        self.n = max(gens, default=0) + 1
        self.dir = self.root / f".outputs-{self.n}"
        self.dir.mkdir()
        (self.dir / "recipes").mkdir()

    def path(self, rel: str) -> Path:
        return self.dir / rel

    def write_json(self, rel: str, data: dict) -> Path:
        p = self.dir / rel
        p.write_text(json.dumps(data, indent=2) + "\n")
        return p

    def commit(self) -> Path:
        """Swap this set in; remove the sets before the one it replaces. Returns the published folder."""
        for d in (self.dir, self.dir / "recipes"):
            _fsync_dir(d)
        tmp = self.root / f".published-{self.n}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(self.dir.name, tmp)
        os.replace(tmp, self.root / "published")  # the one atomic step
        for name, target in LINKS.items():
            link = self.root / name
            if link.is_symlink() and os.readlink(link) == target:
                continue
            if link.is_dir() and not link.is_symlink():
                _retire_legacy(link)
            elif link.is_file() and not link.is_symlink() and name == "summary.json":
                link.unlink()  # an older release's summary: the new set holds the current one
            elif link.exists() or link.is_symlink():
                link.unlink()
            os.symlink(target, link)
        _fsync_dir(self.root)
        # the set just replaced stays one more round: a reader that resolved it a moment ago can finish
        for p in self.root.iterdir():
            m = _GEN.fullmatch(p.name)
            if m and int(m.group(1)) < self.n - 1 and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
        return self.dir

    def abandon(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _retire_legacy(d: Path) -> None:
    """A recipes/ folder of an older release: moved aside (nothing is deleted), the new set replaces it."""
    n = 1
    while (d.parent / f".legacy-{d.name}-{n}").exists():
        n += 1
    d.rename(d.parent / f".legacy-{d.name}-{n}")


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
