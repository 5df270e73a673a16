"""The study on disk: runs/<study>/ with Optuna's RDB storage (study.db), a lock, and trial folders.

Layout parameters are Optuna trial params (categorical, one per searched dimension), so optuna-dashboard
shows them and samplers can learn over them. Everything else a trial carries (layout, prediction,
measurement, failure class, reason, the planner's rationale) is a typed `TrialAttrs` stored as user
attributes. An OOM is a COMPLETE trial with a positive constraint value (samplers learn the memory wall);
a crash is FAIL; a candidate the model screened out is PRUNED with its reason.

Only `Study` touches Optuna's storage. A trial is enqueued with its params and attributes in one write
and then asked, so a kill at any point leaves a state `repair()` recognises: WAITING (enqueued, never
asked), RUNNING without a layout (a study from an older release), RUNNING with a result on disk (told now)
or without one (failed and re-queued). `lock()` holds an flock for the driver's life (the kernel drops it
even on kill -9), so a second driver on the same directory refuses cleanly.
"""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import BadInput, ConfigError, StudyLocked
from ..killpoints import kill_point
from ..layout import Layout
from ..layout.dimensions import PARAM_NAMES, layout_key, layout_params
from ..words import count

__all__ = ["StudyDir", "Study", "TrialAttrs", "Repair", "PARAM_NAMES", "layout_params", "layout_key",
           "CONSTRAINT_ATTR", "set_constraint", "constraints_func", "check_study_name"]

CONSTRAINT_ATTR = "constraint"  # user attr: [peak - capacity in GiB]; > 0 means infeasible (OOM)
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def constraints_func(trial) -> list[float]:
    """For Optuna versions without Trial.set_constraint (before 5.0)."""
    return list(trial.user_attrs.get(CONSTRAINT_ATTR, [0.0]))


def set_constraint(trial, over_gib: float) -> None:
    """Record the memory constraint (> 0: OOM by that many GiB) where samplers read it."""
    trial.set_user_attr(CONSTRAINT_ATTR, [over_gib])
    if hasattr(trial, "set_constraint"):
        trial.set_constraint("memory_over_gib", over_gib)


class TrialAttrs(BaseModel):
    """What a study trial carries beyond its params (Optuna user attributes), typed."""

    model_config = ConfigDict(extra="ignore")

    layout: dict | None = None  # Layout.to_dict()
    label: str = ""
    why: str = ""  # the planner's rationale (one line)
    status: str | None = None  # ok | oom | timeout | nccl | nan | crash | infra | screened | requeued | abandoned
    source: str | None = None  # measured | predicted
    reason: str = ""
    predicted: float | None = None  # ranking prediction at dispatch (tokens/s/GPU)
    predicted_peak_bytes: float | None = None
    measured: float | None = None  # tokens/s/GPU measured
    stderr: float | None = None  # the measurement's relative standard error (TrialResult.stderr)
    value: float | None = None  # tokens/s/GPU predicted by the simulator
    peak_memory_bytes: float | None = None
    gpu_hours: float | None = None
    wall_s: float | None = None
    trial_dir: str | None = None
    proxy: dict | None = None
    proxy_tokens_per_s_per_gpu: float | None = None

    def as_user_attrs(self) -> dict[str, Any]:
        """The attributes this record sets (not its defaults: a finished trial's record must not blank the label
        and the planner's rationale written at dispatch)."""
        return self.model_dump(exclude_none=True, exclude_unset=True)

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        return self.measured if self.measured is not None else self.value


def check_study_name(name: str, runs_dir: Path) -> Path:
    """The study's folder, after checking the name: letters, digits, '.', '_', '-', at most 100 characters,
    not '.' or '..', and the resolved folder directly inside the resolved runs folder."""
    if not STUDY_NAME.fullmatch(name) or name in (".", ".."):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise BadInput(f"--study {shown!r}: use 1 to 100 letters, digits, '.', '_' or '-', starting with a "
                       "letter or digit (e.g. qwen-h200-try1)")
    runs = Path(runs_dir).resolve()
    root = (runs / name).resolve()
    if root.parent != runs:
        raise BadInput(f"--study {name!r} resolves to {root}, outside {runs}; pick a plain name")
    return root


def calibration_command(study_dir: str | Path) -> tuple[str, str]:
    """The command that fits the model to a study's measured trials (`autotune calibrate --measurements`), and the
    file it writes inside the study (for AUTOTUNE_CALIBRATION in the next search on that cluster)."""
    out = f"{study_dir}/calibration.json"
    return f"autotune calibrate --measurements {study_dir} --out {out}", out


class StudyDir:
    """runs/<name>/: study.db, lock, trials/<n>/, planner/, and the published outputs (see outputs.py)."""

    def __init__(self, runs_dir: str | Path, name: str):
        self.root = check_study_name(name, Path(runs_dir))
        self.name = name
        self._lock_fh = None
        self.created = False  # this process made the folder (and so may remove it after a failed start)

    @property
    def db_path(self) -> Path:
        return self.root / "study.db"

    @property
    def storage_url(self) -> str:
        return f"sqlite:///{self.db_path}"

    def trial_dir(self, number: int) -> Path:
        return self.inside("trials", str(int(number)))

    def inside(self, *parts: str) -> Path:
        """root/parts..., refused (ConfigError, one line naming the path) when a part that exists is a symlink or
        not inside the study folder: what the study writes stays in it (a link planted in runs/<study>/ must not
        send trial files or the planner's records elsewhere)."""
        p = self.root
        for part in parts:
            p = p / part
            if p.is_symlink():
                raise ConfigError(f"{p} is a symbolic link (to {os.path.realpath(p)}); a study writes only inside "
                                  f"its own folder: remove the link or use another --study")
        if p.exists() and not p.resolve().is_relative_to(self.root.resolve()):
            raise ConfigError(f"{p} resolves to {p.resolve()}, outside the study folder {self.root}; use another --study")
        return p

    # what a study writes: links among these (and in the trial folders) are refused before anything is written
    _OWN = ("study.db", "study.db-journal", "study.db-wal", "trials", "planner", "planner/exchanges",
            "planner/usage.json", "planner/rounds.json")
    _PUBLISHED = {"published", "recipes", "summary.json"}  # outputs.py's links: relative, into .outputs-<n>

    def check_tree(self) -> None:
        """Refuse a study folder holding a symlink where the study writes (ConfigError naming it): its own files,
        trials/ and everything below it, planner/ and its files. The publication links (published, recipes,
        summary.json) must point at a .outputs-<n> folder inside the study."""
        for rel in self._OWN:
            self.inside(*rel.split("/"))
        for name in self._PUBLISHED:
            link = self.root / name
            if link.is_symlink():
                target = link.resolve()
                if not target.is_relative_to(self.root.resolve()):
                    raise ConfigError(f"{link} is a symbolic link to {target}, outside the study folder; remove "
                                      "the link or use another --study")
        for top in ("trials", "planner"):
            base = self.root / top
            if not base.is_dir():
                continue
            for folder, dirs, files in os.walk(base, followlinks=False):
                for name in dirs + files:
                    p = Path(folder) / name
                    if p.is_symlink():
                        raise ConfigError(f"{p} is a symbolic link (to {os.path.realpath(p)}); a study writes only "
                                          "inside its own folder: remove the link or use another --study")

    def exists(self) -> bool:
        return self.db_path.exists()

    def attrs(self) -> dict | None:
        """The study's recorded attributes (model, gpu, count, workload, ...) without creating anything; None when
        there is no readable study here."""
        import optuna
        from sqlalchemy.exc import SQLAlchemyError

        if not self.exists() or not self.db_path.read_bytes()[:16].startswith(b"SQLite format 3"):
            return None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            return dict(optuna.load_study(study_name=self.name, storage=self.storage_url).user_attrs)
        except (SQLAlchemyError, RuntimeError, ValueError, KeyError):
            return None

    def lock(self) -> None:
        if not self.root.exists():
            try:
                self.root.mkdir(parents=True)
            except FileExistsError:
                pass
            except OSError as exc:
                raise ConfigError(f"cannot create the study folder {self.root}: {exc.strerror}; "
                                  "pick another --runs-dir") from None
            else:
                self.created = True
        lock = self.root / ".lock"
        try:  # O_NOFOLLOW: a link planted at .lock must not have its target truncated
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as exc:
            if lock.is_symlink():
                raise ConfigError(f"{lock} is a symbolic link (to {os.path.realpath(lock)}); remove it (a study's lock "
                                  "is a plain file) or use another --study") from None
            raise ConfigError(f"cannot write in {self.root}: {exc.strerror}; pick another --runs-dir") from None
        import stat as _stat

        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"{lock} is not a regular file; remove it (a study's lock is a plain file) or use "
                              "another --study")
        fh = os.fdopen(fd, "a+")
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
        try:
            self.check_tree()
        except BaseException:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()
            raise
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

    def remove_if_created(self) -> None:
        """After a failed start: remove the study folder, only if this process created it."""
        if self.created and self.root.is_dir():
            import shutil

            shutil.rmtree(self.root, ignore_errors=True)

    def open(self, create: bool = True) -> "Study":
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
            # every trial's params are fixed by the driver (enqueued), so the sampler never samples
            study = optuna.create_study(study_name=self.name, storage=storage, direction="maximize",
                                        load_if_exists=create)
        except (SQLAlchemyError, RuntimeError, ValueError, KeyError) as exc:
            first = str(exc).splitlines()[0][:200]
            raise ConfigError(
                f"{self.db_path} is not a readable Optuna study ({type(exc).__name__}: {first}); "
                f"move it away or use another --study"
            ) from None
        return Study(study)


@dataclass
class Repair:
    """What `Study.repair()` found and did after a driver died."""

    told: int = 0  # RUNNING trials whose result had reached disk
    requeued: list[Layout] | None = None  # layouts that were running or waiting, to dispatch again
    abandoned: int = 0  # trials with no layout to recover

    def note(self) -> str | None:
        parts = []
        if self.told:
            parts.append(f"{count(self.told, 'finished trial')} recorded from disk")
        if self.requeued:
            parts.append(f"{count(len(self.requeued), 'interrupted trial')} re-queued")
        if self.abandoned:
            parts.append(f"{count(self.abandoned, 'trial')} without a layout closed as failed")
        return "repaired: " + ", ".join(parts) if parts else None


class Study:
    """The Optuna study behind a search: typed attributes in, trial states out. Only the driver uses it."""

    def __init__(self, study):
        import optuna

        self._s = study
        self._TS = optuna.trial.TrialState
        self._live: dict[int, Any] = {}  # trials asked by this process

    @property
    def user_attrs(self) -> dict:
        return self._s.user_attrs

    def set_attr(self, key: str, value) -> None:
        self._s.set_user_attr(key, value)

    def stored_choices(self) -> dict[str, tuple]:
        """The values each parameter's distribution already holds in this study: Optuna fixes a categorical
        parameter's choices at its first trial and refuses any other set later."""
        out: dict[str, tuple] = {}
        for t in self._s.get_trials(deepcopy=False):
            for k, d in t.distributions.items():
                out.setdefault(k, tuple(d.choices))
        return out

    def _trial(self, number: int):
        t = self._live.get(number)
        if t is None:
            import optuna

            frozen = self._s.get_trials(deepcopy=False)[number]
            t = optuna.trial.Trial(self._s, frozen._trial_id)
            self._live[number] = t
        return t

    def start(self, lay: Layout, attrs: TrialAttrs, choices: dict[str, list]) -> int:
        """Create a RUNNING trial whose params are the layout's and whose attributes are `attrs`."""
        import optuna

        params = layout_params(lay)
        self._s.enqueue_trial(params, user_attrs={**attrs.as_user_attrs(), "layout": lay.to_dict()})
        kill_point("enqueued")
        # every distribution holds the layout's own value, so the enqueued params are the trial's params
        dists = {k: optuna.distributions.CategoricalDistribution(
            tuple(choices.get(k, [])) + (() if params[k] in choices.get(k, []) else (params[k],)))
            for k in PARAM_NAMES}
        trial = self._s.ask(dists)
        self._live[trial.number] = trial
        kill_point("asked")
        return trial.number

    def update(self, number: int, attrs: dict) -> None:
        t = self._trial(number)
        for k, v in attrs.items():
            if v is not None:
                t.set_user_attr(k, v)

    def finish(self, number: int, attrs: TrialAttrs, over_gib: float | None = None) -> None:
        """Record a finished trial: COMPLETE with its value (an OOM as value 0 with a positive constraint),
        PRUNED when screened out, FAIL otherwise."""
        t = self._trial(number)
        self.update(number, attrs.as_user_attrs())
        if attrs.status == "ok":
            set_constraint(t, 0.0)
            self._s.tell(number, attrs.tokens_per_s_per_gpu)
        elif attrs.status == "oom":
            set_constraint(t, max(1.0, over_gib or 1.0))
            self._s.tell(number, 0.0)
        elif attrs.status == "screened":
            self._s.tell(number, state=self._TS.PRUNED)
        else:
            self._s.tell(number, state=self._TS.FAIL)
        self._live.pop(number, None)

    def finished(self) -> list[tuple[int, TrialAttrs]]:
        """Trials with a final status, in order (re-queued and abandoned ones left out)."""
        out = []
        for ft in self._s.get_trials(deepcopy=False):
            if ft.state in (self._TS.RUNNING, self._TS.WAITING):
                continue
            a = TrialAttrs.model_validate(ft.user_attrs)
            if a.layout and a.status not in (None, "requeued", "abandoned"):
                out.append((ft.number, a))
        return out

    def repair(self, result_of) -> tuple[Repair, list[tuple[int, TrialAttrs]]]:
        """Bring every trial a killed driver left behind to a final state. `result_of(number)` gives the
        TrialResult on disk or None. Returns what was done and the (number, attrs) of RUNNING trials whose
        result was on disk (the caller tells them, so they are learnt like any finished trial)."""
        rep = Repair(requeued=[])
        on_disk = []
        for ft in self._s.get_trials(deepcopy=False):
            if ft.state == self._TS.WAITING:
                # enqueued, never asked: take it out of the queue (or every later ask would get its params)
                trial = self._s.ask()
                self._live[trial.number] = trial
                a = TrialAttrs.model_validate(trial.user_attrs)
                self.update(trial.number, {"status": "abandoned", "reason": "the driver stopped before dispatch"})
                self._s.tell(trial.number, state=self._TS.FAIL)
                if a.layout:
                    rep.requeued.append(Layout.from_dict(a.layout))
                continue
            if ft.state != self._TS.RUNNING:
                continue
            a = TrialAttrs.model_validate(ft.user_attrs)
            if not a.layout:
                self.update(ft.number, {"status": "abandoned", "reason": "no layout recorded (driver stopped)"})
                self._s.tell(ft.number, state=self._TS.FAIL)
                rep.abandoned += 1
                continue
            res = result_of(ft.number)
            if res is not None and not res.cancelled:
                on_disk.append((ft.number, a))
                rep.told += 1
            else:  # never finished, or stopped with the driver (an interrupt): not the layout's doing, run it again
                self.update(ft.number, {"status": "requeued", "reason": "the driver stopped while it ran"})
                self._s.tell(ft.number, state=self._TS.FAIL)
                rep.requeued.append(Layout.from_dict(a.layout))
        return rep, on_disk
