"""The study on disk: runs/<study>/ with Optuna's RDB storage (study.db), a lock, and trial folders.

Layout parameters are Optuna trial params (categorical), so optuna-dashboard shows them and samplers can
learn over them. Predictions, measurements, failure classes and reasons are user attributes. An OOM is a
COMPLETE trial with a positive constraint value (samplers learn the memory wall); a crash is FAIL; a
candidate the model screened out is PRUNED with its reason. `lock()` holds an flock for the driver's life
(the kernel drops it even on kill -9), so a second driver on the same directory refuses cleanly.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from ..errors import ConfigError, StudyLocked
from ..layout.dimensions import PARAM_NAMES, layout_key, layout_params

__all__ = ["StudyDir", "PARAM_NAMES", "layout_params", "layout_key", "CONSTRAINT_ATTR", "set_constraint", "constraints_func"]

CONSTRAINT_ATTR = "constraint"  # user attr: [peak - capacity in GiB]; > 0 means infeasible (OOM)


def constraints_func(trial) -> list[float]:
    """For Optuna versions without Trial.set_constraint (before 5.0)."""
    return list(trial.user_attrs.get(CONSTRAINT_ATTR, [0.0]))


def set_constraint(trial, over_gib: float) -> None:
    """Record the memory constraint (> 0: OOM by that many GiB) where samplers read it."""
    trial.set_user_attr(CONSTRAINT_ATTR, [over_gib])
    if hasattr(trial, "set_constraint"):
        trial.set_constraint("memory_over_gib", over_gib)


class StudyDir:
    """runs/<name>/: study.db, lock, trials/<n>/, recipes/, summary.json."""

    def __init__(self, runs_dir: str | Path, name: str):
        self.root = Path(runs_dir) / name
        self.name = name
        self._lock_fh = None

    @property
    def db_path(self) -> Path:
        return self.root / "study.db"

    @property
    def storage_url(self) -> str:
        return f"sqlite:///{self.db_path}"

    def trial_dir(self, number: int) -> Path:
        return self.root / "trials" / str(number)

    def exists(self) -> bool:
        return self.db_path.exists()

    def lock(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fh = open(self.root / ".lock", "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise StudyLocked(
                f"study {self.name!r} in {self.root} is in use by another autotune search ({holder}); "
                f"wait for it to finish or pick another --study"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        self._lock_fh = fh

    def unlock(self) -> None:
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def open(self, sampler=None, create: bool = True):
        """Load (or create) the Optuna study; a corrupt database is a one-line ConfigError."""
        import optuna
        from sqlalchemy.exc import SQLAlchemyError

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if self.exists():
            head = self.db_path.read_bytes()[:16]
            if not head.startswith(b"SQLite format 3"):
                raise ConfigError(f"{self.db_path} is not an SQLite database; move it away or use another --study")
        try:
            storage = optuna.storages.RDBStorage(self.storage_url, engine_kwargs={"connect_args": {"timeout": 30}})
            return optuna.create_study(study_name=self.name, storage=storage, direction="maximize",
                                       sampler=sampler, load_if_exists=create)
        except (SQLAlchemyError, RuntimeError, ValueError, KeyError) as exc:
            first = str(exc).splitlines()[0][:200]
            raise ConfigError(
                f"{self.db_path} is not a readable Optuna study ({type(exc).__name__}: {first}); "
                f"move it away or use another --study"
            ) from None
