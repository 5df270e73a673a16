"""GateResult: what one correctness gate says about a candidate.

Every gate (configuration, convergence, component) returns one: its name, pass / fail / not_run, a
one-line summary a person can act on, and the numbers behind it in `details`. The configuration gate
also lists in `needs` the kernel differences that each need a component test before the recipe can be
verified.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GateResult", "Status"]

Status = Literal["pass", "fail", "not_run"]


class GateResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gate: Literal["configuration", "convergence", "component"]
    status: Status
    summary: str = Field(description="One line: what passed or failed, and why.")
    details: dict[str, Any] = Field(default_factory=dict)
    needs: list[str] = Field(default_factory=list, description="Kernel differences needing a component test.")

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def recipe_status(self) -> str:
        """The word the recipe schema uses: pass, fail or `not run`."""
        return "not run" if self.status == "not_run" else self.status
