"""The gates stage of a search: which top trials are verified, and the correctness section they carry.

A `GatesStage` takes the session and its ranked trials and returns, per trial number, a `GateOutcome`:
`verified` only when every gate passed, otherwise `failed` or `not run`, with the recipe's correctness
section in the seed's format. `NoGates` is the stage when no gate is configured: nothing is verified and
each recipe says why (the simulator's trials are predictions; real trials had no gates to run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .planners import TrialRecord

if TYPE_CHECKING:
    from .session import SearchSession

__all__ = ["GateOutcome", "GatesStage", "NoGates"]


@dataclass
class GateOutcome:
    status: str  # verified | failed | not run
    summary: str  # one line
    section: dict | None = None  # the recipe's correctness section (seed format), when the gates ran
    results: list[dict] = field(default_factory=list)  # one entry per gate: name, status, summary

    def to_json(self) -> dict:
        return {"status": self.status, "summary": self.summary, "results": self.results}


class GatesStage:
    name = "gates"

    def run(self, session: "SearchSession", ranked: list[TrialRecord]) -> dict[int, GateOutcome]:
        raise NotImplementedError


class NoGates(GatesStage):
    def run(self, session: "SearchSession", ranked: list[TrialRecord]) -> dict[int, GateOutcome]:
        why = ("not run: predicted (the simulator ran no training step)" if session.driver.backend.name == "simulate"
               else "not run: no correctness gates are configured for this search")
        return {r.number: GateOutcome("not run", why) for r in ranked}
