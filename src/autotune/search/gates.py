"""The gates stage of a search: which top trials are verified, and the correctness section they carry.

A `GatesStage` takes the session and its ranked trials and returns, per trial number, a `GateOutcome`:
`verified` only when every gate passed, otherwise `failed` or `not run`, with the recipe's correctness
section in the seed's format. `RecipeGates` is the stage the search runs; with the simulator its gates that
need a run say "not run: predicted".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .planners import TrialRecord

if TYPE_CHECKING:
    from .session import SearchSession

__all__ = ["GateOutcome", "GatesStage", "RecipeGates"]


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


class RecipeGates(GatesStage):
    """The gates of issue 13 on the top trials: the configuration gate on every emitted recipe against the
    reference's arguments; the convergence gate of each measured trial's loss curve against a reference
    run of the same steps on the same rows (the simplest candidate layout, or the layout of the recipe
    given with --reference), run once through the search's own backend; a component test for each kernel
    difference (gates.section.run_gates). The simulator's trials get `not run: predicted`."""

    REFERENCE_NUMBER = 999_999  # the reference run's trial number (its folder is trials/reference/)

    def __init__(self, reference_recipe: str | None = None, profile: str | None = None):
        self.reference_recipe = reference_recipe
        self.profile = profile  # None: fp32 thresholds on CPU (deterministic), Bridge's on GPUs

    def check(self, model, cluster, workload=None) -> None:
        """Refuse a --reference the gates could not use, before any trial is spent: a recipe that does not
        parse, one for another model or GPU count, or (an MoE model) one whose load-balancing loss is not the
        search's --routing: the loss the convergence and numerics gates compare would differ by that term."""
        if not self.reference_recipe:
            return
        from ..errors import BadInput
        from ..recipes.convert import layout_of, load_balancing_of
        from ..recipes.io import load_recipe

        recipe = load_recipe(self.reference_recipe)  # a broken file is a one-line ConfigError here
        if recipe.model.lower() != model.name.lower():
            raise BadInput(f"--reference {self.reference_recipe}: a recipe for {recipe.model}, the search is for "
                           f"{model.name}; give a recipe of the same model (autotune recipes list --model "
                           f"{model.name}) or leave --reference out")
        lay = layout_of(recipe)
        if lay.world != cluster.count:
            raise BadInput(f"--reference {self.reference_recipe}: its layout is for {lay.world} GPUs, the search "
                           f"for {cluster.count}; give a recipe for the same GPU count")
        theirs = load_balancing_of(recipe)
        if workload is not None and model.is_moe and theirs != workload.load_balancing_loss:
            on = {True: "on", False: "off"}
            routing = {True: "aux-loss", False: "natural"}
            raise BadInput(f"--reference {self.reference_recipe}: it trains with the load-balancing loss {on[theirs]}, "
                           f"the search with it {on[not theirs]} (--routing {routing[not theirs]}); the gates would "
                           f"compare different losses: give a reference with the loss {on[not theirs]}, or search with "
                           f"--routing {routing[theirs]}")

    def run(self, session: "SearchSession", ranked: list[TrialRecord]) -> dict[int, GateOutcome]:
        from ..gates import run_gates
        from ..gates.convergence import profile_for

        d = session.driver
        predicted = not d.backend.measured
        ref_layout, ref_label = self._reference_layout(session)
        ref_args = self._args(session, ref_layout) if not self.reference_recipe else \
            _recipe_args(self.reference_recipe)
        ref_steps, ref_note = (None, "") if predicted or not ranked else self._reference_steps(session, ref_layout, ranked)
        out: dict[int, GateOutcome] = {}
        for rec in ranked:
            res = None if predicted else _result_of(session, rec.number)
            steps = res.steps if res is not None and res.source == "measured" and res.steps else None
            ref = ref_steps
            if steps and ref_steps and getattr(res, "stopped_early", None):
                # a trial that ended early (steady or losing) is compared on the steps it ran
                ref = [r for r in ref_steps if r.step <= steps[-1].step]
            profile = self.profile or (profile_for(res) if res is not None else "bridge")
            result, section = run_gates(
                self._args(session, rec.layout), ref_args, steps, ref, predicted=predicted,
                reference=ref_label + ref_note, profile=profile, gpu=session.cluster.gpu.name,
                run_components=not predicted,
                note=f"candidate arm: trial {rec.number}; reference arm: {ref_label}{ref_note}, same rows and seed")
            status = {"pass": "verified", "fail": "failed"}.get(result, "not run")
            out[rec.number] = GateOutcome(status, section["summary"], section,
                                          [{"gate": "configuration", "status": section["configuration"]},
                                           {"gate": "convergence", "status": (section["convergence"] or {}).get(
                                               "result", "not run")},
                                           *({"gate": "component", "status": c["result"]}
                                             for c in section["component_tests"])])
        return out

    # --- the reference ---------------------------------------------------------------------------------
    def _reference_layout(self, session):
        if self.reference_recipe:
            from ..recipes.convert import layout_of
            from ..recipes.io import load_recipe

            self.check(session.model, session.cluster)  # the CLI checked before any trial; a caller may not have
            lay = layout_of(load_recipe(self.reference_recipe))
            return lay, f"the recipe {self.reference_recipe} ({lay.label(session.model.is_moe)})"
        c = session.driver.candidates
        t = c.table
        # the simplest candidate: least model parallelism, then no interleaving, recompute or overlap
        cost = (t.tp * t.pp * t.cp * t.ep * t.etp).astype(float) * 1e6 + t.vpp * 1e4 + t.rc_gran * 1e2 \
            + t.dispatcher * 10 + t.shared_overlap + t.offload
        lay = t.row(int(cost.argmin()))
        return lay, f"the simplest candidate layout, {lay.label(session.model.is_moe)}, on the same rows"

    def _reference_steps(self, session, lay, ranked):
        """The reference run's loss curve: a trial of the reference layout through the search's backend (or
        a ranked trial that already is that layout)."""
        from ..layout.dimensions import layout_key

        key = layout_key(lay)
        for r in session.driver.records:
            if r.status == "ok" and r.source == "measured" and layout_key(r.layout) == key:
                res = _result_of(session, r.number)
                return (res.steps if res is not None else None), f" (trial {r.number})"
        res = session.driver.run_reference(lay, self.REFERENCE_NUMBER, session.sd.inside("trials", "reference"))
        if res.status != "ok" or not res.steps:
            return None, f" (the reference run ended {res.status}: {res.reason or 'no steps'})"
        return res.steps, " (trials/reference)"

    def _args(self, session, lay) -> dict:
        from ..gates import candidate_arguments

        return candidate_arguments(session.model, session.cluster, lay, session.workload)


def _result_of(session, number: int):
    from ..trials.spec import TrialResult, read_model

    p = session.sd.trial_dir(number) / "trial_result.json"
    return read_model(TrialResult, p) if p.exists() else None


def _recipe_args(path: str) -> dict:
    from ..gates import recipe_arguments

    return recipe_arguments(path)
