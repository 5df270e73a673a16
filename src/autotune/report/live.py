"""The live view of a running `autotune search`: progress against the trial and GPU-hour budgets, the best
so far, and the recent trials (layout, predicted and measured tokens/s/GPU, MFU, peak memory, state, reason,
time per trial).

On a terminal it is a rich Live panel; when the console is not a terminal (CI logs, a pipe) it prints one
plain line per event instead, so a log reads top to bottom. It consumes the search's events through
`on_event(kind, data)`:

  dispatched {number, layout, predicted, why, settings?}
  screened   {number, layout, reason}
  finished   {number, layout, status, value, predicted, source, peak_memory_bytes?, gpu_hours?, wall_s?, mfu?}
  done       {stop_reason}
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..words import hours, percent
from .fit import fit

__all__ = ["LiveView"]

GiB = 1024**3
RECENT = 12


@dataclass
class _Row:
    number: int
    layout: str
    state: str = "running"
    predicted: float | None = None
    value: float | None = None
    source: str | None = None
    mfu: float | None = None
    peak: float | None = None
    reason: str = ""
    started: float = 0.0
    wall_s: float | None = None


def _f(v, spec: str = "{:,.1f}") -> str:
    return spec.format(v) if v is not None else "-"


def _tps(v):
    """A prediction may come as a number or as a Prediction record (dict)."""
    return v.get("tokens_per_s_per_gpu") if isinstance(v, dict) else v


class LiveView:
    """`mfu_per_tps` (optional): MFU of one token/s/GPU, i.e. cost.flops.mfu_of(1.0, N_active, peak TFLOPS),
    used when a finished event carries no `mfu` of its own."""

    def __init__(self, title: str, trials_budget: int, gpu_hours_budget: float | None, enabled: bool = True,
                 console: Console | None = None, *, mfu_per_tps: float | None = None):
        self.title, self.trials_budget, self.gpu_hours_budget = title, trials_budget, gpu_hours_budget
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.enabled, self.mfu_per_tps = enabled, mfu_per_tps
        self.rows: dict[int, _Row] = {}
        self.finished = self.screened = 0
        self.gpu_hours = 0.0
        self.best: _Row | None = None
        self.stop_reason: str | None = None
        self.chance: float | None = None  # the stop rule's chance after the last trial, and the noise it is over
        self.noise = 0.0
        self.t0 = time.monotonic()
        self.live = (Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
                     if enabled and self.console.is_terminal else None)

    @classmethod
    def for_search(cls, model, cluster, study: str, trials_budget: int, gpu_hours_budget: float | None,
                   enabled: bool, console: Console | None = None) -> "LiveView":
        """The view `autotune search` shows: titled with the model, cluster and study, MFU by the one formula."""
        from ..catalog import param_counts
        from ..cost.flops import mfu_of

        title = f"searching {model.name} on {cluster.count} x {cluster.gpu.name} (study {study})"
        per = float(mfu_of(1.0, param_counts(model).active, cluster.gpu.bf16_tflops))
        return cls(title, trials_budget, gpu_hours_budget, enabled, console, mfu_per_tps=per)

    # --- events ---------------------------------------------------------------------------------------
    def on_event(self, kind: str, d: dict) -> None:
        n = int(d.get("number", -1))
        if kind == "dispatched":
            self.rows[n] = _Row(n, str(d.get("layout", "?")), predicted=_tps(d.get("predicted")), started=time.monotonic())
            what = self.rows[n].layout + (f" [{d['settings']}]" if d.get("settings") else "")
            why = str(d.get("why") or "")
            if why.startswith("predicted"):  # the rationale gives the prediction itself (the model-guided planner)
                self._line(f"trial {n} dispatched: {what}: {why}")
            else:
                self._line(f"trial {n} dispatched: {what}, predicted {_f(self.rows[n].predicted)} tokens/s/GPU"
                           + (f" ({why})" if why else ""))
        elif kind == "screened":
            self.screened += 1
            self.rows[n] = _Row(n, str(d.get("layout", "?")), state="screened", reason=str(d.get("reason") or ""))
            self._line(f"trial {n} screened: {self.rows[n].layout}: {self.rows[n].reason}")
        elif kind == "finished":
            self._finished(n, d)
        elif kind == "resumed":  # the finished trials a resumed study keeps count toward the progress and the best
            self.finished += int(d.get("finished") or 0)
            self.gpu_hours += float(d.get("gpu_hours") or 0.0)
            b = d.get("best")
            if b and b.get("value"):
                r = _Row(int(b["number"]), str(b.get("layout", "?")), state=("measured" if b.get("source") == "measured"
                                                                            else "predicted"))
                r.value = float(b["value"])
                self.best = r
        elif kind == "note":  # something a trial taught the search (e.g. a memory wall after an OOM)
            self._line(f"note: {d.get('text', '')}")
        elif kind == "done":
            self.stop_reason = str(d.get("stop_reason") or "")
            # a converged search's reason already gives the chance
            self._line(f"search stopped: {self.stop_reason}; "
                       f"{self._progress_text(chance=not self.stop_reason.startswith('converged'))}")
        if self.live is not None:
            self.live.update(self.render())

    event = on_event  # the name the current search driver calls

    def _finished(self, n: int, d: dict) -> None:
        r = self.rows.get(n) or _Row(n, str(d.get("layout", "?")), started=time.monotonic())
        self.rows[n] = r
        self.finished += 1
        r.source, r.value = d.get("source"), d.get("value")
        r.predicted = _tps(d.get("predicted")) if d.get("predicted") is not None else r.predicted
        status = d.get("status") or "?"
        r.state = ("measured" if r.source == "measured" else "predicted") if status == "ok" else status
        r.peak = d.get("peak_memory_bytes")
        r.reason = str(d.get("reason") or "")
        r.wall_s = d.get("wall_s") if d.get("wall_s") is not None else time.monotonic() - r.started
        r.mfu = d.get("mfu")
        if r.mfu is None and self.mfu_per_tps and r.value and status == "ok":
            r.mfu = r.value * self.mfu_per_tps
        self.gpu_hours += float(d.get("gpu_hours") or 0.0)
        if status == "ok" and r.value and (self.best is None or r.value > self.best.value):
            self.best = r
        if d.get("chance") is not None:  # the stop rule's number after this trial (SearchDriver.chance)
            self.chance, self.noise = float(d["chance"]), float(d.get("noise") or 0.0)
        extra = "".join(f", {k} {v}" for k, v in (("MFU", _f(r.mfu, "{:.1%}") if r.mfu else None),
                                                  ("peak", f"{r.peak / GiB:,.1f} GiB" if r.peak else None)) if v)
        why = f": {r.reason}" if r.reason and status != "ok" else ""
        got = f"{r.value:,.1f} tokens/s/GPU " if r.value else ""
        self._line(f"trial {n} {r.state}: {r.layout} {got}(predicted {_f(r.predicted)}){extra}, "
                   f"{_f(r.wall_s, '{:.1f}')} s{why} | {self._progress_text()}")

    # --- output ---------------------------------------------------------------------------------------
    def _progress_text(self, chance: bool = True) -> str:
        gh = hours(self.gpu_hours) + (f"/{self.gpu_hours_budget:g}" if self.gpu_hours_budget else "")
        best = f"{self.best.value:,.1f} ({self.best.layout}, trial {self.best.number})" if self.best else "-"
        return f"{self.finished}/{self.trials_budget} trials, {gh} GPU-hours, best {best}{self._chance_text() if chance else ''}"

    def _chance_text(self) -> str:
        """'; 41% chance an untried layout beats it by > 2%': how far the search is from converging (below
        STOP_CHANCE it stops), once the driver has said."""
        if self.chance is None or self.best is None:
            return ""
        return f"; {percent(self.chance)} chance an untried layout beats it by > {self.noise:.0%}"

    def _line(self, text: str) -> None:
        if self.enabled and self.live is None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def render(self) -> Group:
        head = Text(self.title, style="bold")
        bars = Table.grid(padding=(0, 1))
        bars.add_row("trials", ProgressBar(total=max(1, self.trials_budget), completed=self.finished, width=30),
                     f"{self.finished}/{self.trials_budget} (+{self.screened} screened)")
        if self.gpu_hours_budget:
            bars.add_row("GPU-hours", ProgressBar(total=self.gpu_hours_budget, completed=min(self.gpu_hours,
                         self.gpu_hours_budget), width=30), f"{hours(self.gpu_hours)}/{self.gpu_hours_budget:g}")
        else:
            bars.add_row("GPU-hours", "", f"{hours(self.gpu_hours)} (no budget)")
        b = self.best
        best = Text(f"best so far: {b.layout} {b.value:,.1f} tokens/s/GPU [{b.state}] (trial {b.number})"
                    f"{self._chance_text()}" if b else "best so far: -")
        t = Table(title=None, expand=False, pad_edge=False)
        for c in ("trial", "layout", "predicted", "result", "MFU", "peak GiB", "state", "time s", "reason"):
            t.add_column(c, justify="right" if c in ("trial", "predicted", "result", "MFU", "peak GiB", "time s") else "left",
                         max_width=48 if c == "reason" else None)
        for r in sorted(self.rows.values(), key=lambda r: r.number)[-RECENT:]:
            t.add_row(str(r.number), r.layout, _f(r.predicted), _f(r.value),  # state says measured or predicted
                      _f(r.mfu, "{:.1%}"), _f(r.peak / GiB if r.peak else None), r.state,
                      _f(r.wall_s if r.wall_s is not None else (time.monotonic() - r.started if r.started else None), "{:.1f}"),
                      r.reason[:120])
        parts = [head, bars, best, fit(t)]  # numbers whole at any width; layouts and reasons fold
        if self.stop_reason:
            parts.append(Text(f"stopped: {self.stop_reason}"))
        return Group(*parts)

    def __enter__(self) -> "LiveView":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
