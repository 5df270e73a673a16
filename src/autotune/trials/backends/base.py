"""The backend interface: submit, poll, cancel. Only the search driver talks to backends; backends
never rank layouts. Each backend writes into the trial folder it is given (trial_spec.json is already
there; the backend writes logs, steps.jsonl and trial_result.json)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from ..spec import TrialResult, TrialSpec

__all__ = ["Backend", "Handle"]


class Handle:
    """An opaque ticket for a submitted trial."""

    def __init__(self, spec: TrialSpec, trial_dir: Path, token: object = None):
        self.spec = spec
        self.trial_dir = Path(trial_dir)
        self.token = token


class Backend(ABC):
    name: str = "base"
    measured: bool = True  # False only for the simulator

    @abstractmethod
    def submit(self, spec: TrialSpec, trial_dir: Path) -> Handle:
        """Start the trial and return at once."""

    @abstractmethod
    def poll(self, handle: Handle) -> TrialResult | None:
        """The result once finished (any status), or None while it runs."""

    @abstractmethod
    def cancel(self, handle: Handle) -> None:
        """Stop the trial and free its resources (processes, placement groups)."""

    def close(self) -> None:
        """Release backend-wide resources."""
