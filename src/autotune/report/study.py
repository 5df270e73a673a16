"""Read a study folder (runs/<study>/) into a StudyView: what the dashboard and the HTML report show.

The folder is the contract: study.db (Optuna RDB storage, read here with sqlite3 in read-only mode, so a
running search is never disturbed and Optuna need not be imported), summary.json (written at the end of a
search), trials/<n>/trial_spec.json and trial_result.json, recipes/*.yaml. Each piece is read by its own
small loader; a missing or unreadable optional piece (no summary yet, no predictions in an old study, no
recipes, no gates) becomes a line in `StudyView.missing`, never a crash. Only a folder that is not a study
at all, or a study without trials, is bad input.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog.workload import routing_of
from ..errors import BadInput
from ..trials.spec import Prediction
from ..words import count, measured_text

from .recipes import RecipeView, load_recipes

__all__ = ["StudyView", "TrialView", "RecipeView", "load_study", "newest_study"]


@dataclass
class TrialView:
    """One trial as the report shows it. `value` is the result (measured, or the simulator's prediction)."""

    number: int
    state: str  # Optuna's: COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    status: str | None  # ok, oom, timeout, crash, ..., screened, requeued; None while running
    source: str | None  # measured | predicted
    label: str
    layout: dict
    recompute: str = "none"
    dispatcher: str = ""
    predicted: float | None = None  # the ranking prediction at dispatch
    value: float | None = None
    peak_bytes: float | None = None  # from the result (measured or simulated)
    predicted_peak_bytes: float | None = None
    gpu_hours: float | None = None
    reason: str | None = None
    why: str | None = None  # the planner's rationale
    stderr: float | None = None  # a measured value's relative standard error (its window's CV / sqrt(steps))
    wall_s: float | None = None
    mfu: float | None = None
    usd_per_million_tokens: float | None = None
    prediction: Prediction | None = None

    @property
    def measured_text(self) -> str:
        """The measured tokens/s/GPU with its standard error when its trial reported one ("2,451.4 +/-0.3%"), or "-"."""
        return measured_text(self.measured, self.stderr)

    @property
    def split(self) -> str:
        """The layer split as labels show it ('even', or '1,2x46,1')."""
        from ..layout.splits import split_text

        return split_text(tuple(self.layout.get("layer_split") or ()))

    @property
    def display_state(self) -> str:
        if self.status == "ok":
            return "measured" if self.source == "measured" else "predicted"
        return self.status or self.state.lower()

    @property
    def measured(self) -> float | None:
        return self.value if self.source == "measured" and self.status == "ok" else None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.value)


@dataclass
class StudyView:
    root: Path
    name: str
    trials: list[TrialView]
    backend: str = "?"
    planner: str = "?"
    model: str = "?"
    gpu: str = "?"
    count: int | None = None
    stop_reason: str | None = None  # None: still running, or killed before the end
    gpu_hours: float = 0.0
    funnel: list[tuple[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    best: dict | None = None
    reference: dict | None = None
    recipes: list[RecipeView] = field(default_factory=list)
    capacity_bytes: float | None = None
    missing: list[str] = field(default_factory=list)  # optional pieces that were not available, and why
    workload: dict = field(default_factory=dict)  # the study's rows and precision (its Optuna attrs), when stored

    def rows_text(self) -> str:
        """'8,192-token rows, 128 a step, bf16', or '' for a study that did not store its workload."""
        w = self.workload
        if not w.get("seq_len") or not w.get("global_batch"):
            return ""
        routing = {"aux-loss": ", load-balancing loss on", "forced": ", forced routing"}.get(routing_of(w), "")
        return (f"{int(w['seq_len']):,}-token rows, {int(w['global_batch']):,} a step, {w.get('precision') or 'bf16'}"
                + routing)

    def ranked(self) -> list[TrialView]:
        """Trials with a result, best first (ties by trial number, so the order is stable)."""
        return sorted((t for t in self.trials if t.ok), key=lambda t: (-t.value, t.number))

    @property
    def in_flight(self) -> int:
        """Trials dispatched and not finished: the search is running (or was killed mid-trial)."""
        return sum(1 for t in self.trials if t.state == "RUNNING")

    def state_line(self) -> str:
        if self.in_flight:
            last = f"; last stop: {self.stop_reason}" if self.stop_reason else ""
            return f"running, or killed mid-trial: {count(self.in_flight, 'trial')} in flight{last}"
        return f"stopped: {self.stop_reason}" if self.stop_reason else "stopped before the end (no stop reason recorded)"

    @property
    def dispatched(self) -> list[TrialView]:
        return [t for t in self.trials if t.status != "screened"]

    def model_errors(self) -> list[float]:
        """|predicted at dispatch / measured - 1| of every measured trial with a prediction, smallest first (its
        median is how wrong the model was on this cluster; the plot and the terminal summary both state it)."""
        return sorted(abs(t.predicted / t.measured - 1) for t in self.trials if t.measured and t.predicted)


def newest_study(runs: Path) -> Path:
    """The most recently modified study folder under `runs` (one holding a study.db)."""
    runs = Path(runs)
    cands = [p for p in runs.glob("*") if (p / "study.db").exists()] if runs.is_dir() else []
    if not cands:
        raise BadInput(f"no study under {runs}/: pass a study folder (runs/<study>) or run `autotune search` first")
    return max(cands, key=lambda p: (p / "study.db").stat().st_mtime)


def load_study(root: str | Path) -> StudyView:
    root = Path(root)
    db, summary_path = root / "study.db", root / "summary.json"
    if not root.is_dir() or not (db.exists() or summary_path.exists()):
        raise BadInput(f"{root} is not a study folder (no study.db or summary.json); pass runs/<study>, "
                       "e.g. the study_dir `autotune search --json` prints")
    missing: list[str] = []
    summary = _json(summary_path, missing, "summary.json (the search has not finished)")
    attrs, trials = _read_db(db, root.name, missing) if db.exists() else ({}, [])
    if not trials and summary:
        trials = _trials_from_summary(summary)
    if not trials:
        raise BadInput(f"study {root.name!r} in {root} has no trials yet; wait for `autotune search` to dispatch "
                       "one, or run it with --study " + root.name)
    rows = {r.get("number"): r for r in (summary or {}).get("trials", [])}
    no_pred = 0
    for t in trials:
        _attach_files(root / "trials" / str(t.number), t, missing)
        row = rows.get(t.number) or {}
        if t.prediction is None and t.status != "screened":
            no_pred += 1
        _fill_costs(t, row)
    if no_pred:
        missing.append(f"predictions (breakdowns) for {count(no_pred, 'trial')}: their trial_spec.json and "
                       "trial_result.json carry no Prediction record")
    s = summary or {}
    view = StudyView(
        root=root, name=s.get("study") or root.name, trials=trials,
        backend=s.get("backend") or attrs.get("backend", "?"), planner=s.get("planner") or attrs.get("planner", "?"),
        model=attrs.get("model", "?"), gpu=attrs.get("gpu", "?"), count=attrs.get("count"),
        stop_reason=s.get("stop_reason") or attrs.get("stop_reason"),
        gpu_hours=float(s.get("gpu_hours") or sum(t.gpu_hours or 0.0 for t in trials)),
        funnel=[(f["stage"], int(f["count"])) for f in s.get("funnel", []) if "stage" in f],
        notes=list(s.get("notes", [])), best=s.get("best"), reference=s.get("reference"), missing=missing,
        workload=attrs.get("workload") if isinstance(attrs.get("workload"), dict) else {},
    )
    caps = [t.prediction.capacity_bytes for t in trials if t.prediction and t.prediction.capacity_bytes]
    view.capacity_bytes = caps[0] if caps else None
    if not view.funnel:
        missing.append("the pruning funnel (summary.json has none)")

    view.recipes = load_recipes(root / "recipes", missing, finished=bool(s.get("stop_reason")))
    return view


def _json(path: Path, missing: list[str], what: str) -> dict | None:
    if not path.exists():
        missing.append(what)
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        missing.append(f"{path.name}: unreadable ({type(exc).__name__})")
        return None


def _read_db(db: Path, name: str, missing: list[str]) -> tuple[dict, list[TrialView]]:
    """Study user attributes and trials, straight from Optuna's tables (stable since Optuna 3)."""
    try:
        con = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        raise BadInput(f"{db}: not readable ({exc}); move it away or pass another study") from None
    try:
        got = con.execute("SELECT study_id FROM studies WHERE study_name = ?", (name,)).fetchone()
        got = got or con.execute("SELECT study_id FROM studies ORDER BY study_id LIMIT 1").fetchone()
        if got is None:
            return {}, []
        sid = got[0]
        attrs = {k: json.loads(v) for k, v in con.execute(
            "SELECT key, value_json FROM study_user_attributes WHERE study_id = ?", (sid,))}
        trials = {}
        for tid, number, state, start, end in con.execute(
                "SELECT trial_id, number, state, datetime_start, datetime_complete FROM trials WHERE study_id = ? "
                "ORDER BY number", (sid,)):
            trials[tid] = [number, state, start, end, {}]
        for tid, key, value in con.execute(
                "SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a JOIN trials t "
                "ON a.trial_id = t.trial_id WHERE t.study_id = ?", (sid,)):
            trials[tid][4][key] = json.loads(value)
    except (sqlite3.Error, ValueError) as exc:
        raise BadInput(f"{db} is not a readable Optuna study ({type(exc).__name__}: {exc}); "
                       "move it away or pass another study") from None
    finally:
        con.close()
    out = [_trial(number, state, start, end, ua) for number, state, start, end, ua in trials.values()
           if ua.get("layout") or ua.get("label")]
    return attrs, out


def _trial(number: int, state: str, start, end, ua: dict) -> TrialView:
    lay = ua.get("layout") or {}
    t = TrialView(number=number, state=str(state), status=ua.get("status"), source=ua.get("source"),
                  label=ua.get("label") or lay.get("label") or f"trial {number}", layout=lay,
                  predicted=ua.get("predicted"), value=ua.get("measured") or ua.get("value"),
                  peak_bytes=ua.get("peak_memory_bytes"), predicted_peak_bytes=ua.get("predicted_peak_bytes"),
                  gpu_hours=ua.get("gpu_hours"), reason=ua.get("reason") or None, why=ua.get("why"),
                  stderr=ua.get("stderr"))
    t.recompute, t.dispatcher = _recompute_str(lay.get("recompute")), str(lay.get("dispatcher") or "")
    if start and end:
        from datetime import datetime

        try:
            t.wall_s = (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds()
        except ValueError:
            pass
    return t


def _recompute_str(rc) -> str:
    """The layout's recompute as the CLI writes it (full:block:2, selective, none)."""
    if not isinstance(rc, dict) or rc.get("granularity") in (None, "none"):
        return "none"
    if rc["granularity"] == "selective":
        mods = rc.get("modules") or []
        return "selective" + (":" + ",".join(mods) if mods else "")
    return f"{rc['granularity']}:{rc.get('method')}:{rc.get('num_layers')}"


def _trials_from_summary(summary: dict) -> list[TrialView]:
    """A summary.json without its study.db (copied alone): the ranked rows are still a report."""
    out = []
    for r in summary.get("trials", []):
        state = r.get("state", "")
        status = "ok" if state in ("measured", "predicted") else state
        out.append(TrialView(number=int(r["number"]), state="COMPLETE", status=status,
                             source="measured" if state == "measured" else "predicted", label=r.get("layout", "?"),
                             layout={}, recompute=r.get("recompute", "none"), dispatcher=r.get("dispatcher", ""),
                             predicted=r.get("predicted"), value=r.get("value"), peak_bytes=r.get("peak_memory_bytes"),
                             stderr=r.get("stderr")))
    return out


def _attach_files(d: Path, t: TrialView, missing: list[str]) -> None:
    """The trial folder's Prediction (the result's, else the spec's) and wall time, when there."""
    for name, key in (("trial_result.json", "prediction"), ("trial_spec.json", "predicted")):
        p = d / name
        if not p.exists():
            continue
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            missing.append(f"trial {t.number}: {name} unreadable")
            continue
        if name == "trial_result.json" and doc.get("wall_s"):
            t.wall_s = float(doc["wall_s"])
        raw = doc.get(key)
        if t.prediction is None and isinstance(raw, dict):
            try:
                t.prediction = Prediction.model_validate(raw)
            except ValueError:
                missing.append(f"trial {t.number}: {name} has an unrecognised prediction")


def _fill_costs(t: TrialView, row: dict) -> None:
    """MFU and $ per 1M tokens of the trial's value: summary.json's, else the Prediction's scaled to the
    value (both are linear in tokens/s, so scaling keeps cost/flops.py the one formula)."""
    t.mfu, t.usd_per_million_tokens = row.get("mfu"), row.get("usd_per_million_tokens")
    p = t.prediction
    if p is not None and t.value and p.tokens_per_s_per_gpu:
        k = t.value / p.tokens_per_s_per_gpu
        if t.mfu is None and p.mfu is not None:
            t.mfu = p.mfu * k
        if t.usd_per_million_tokens is None and p.usd_per_million_tokens is not None:
            t.usd_per_million_tokens = p.usd_per_million_tokens / k
    if t.peak_bytes is None and row.get("peak_memory_bytes"):
        t.peak_bytes = row["peak_memory_bytes"]
    if not t.ok:
        t.mfu = t.usd_per_million_tokens = None
