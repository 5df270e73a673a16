"""Gate results -> the recipe's `correctness` section, and the one call the search's gates stage makes.

`correctness_section(configuration, convergence, components, ...)` writes the seed recipes' format
(sections.Correctness: result, summary, reference, configuration, component_tests, convergence, rules);
its `result` is `pass` only when the configuration passed, the convergence check passed, and every
kernel difference the configuration gate listed has a passing component test. Anything failed makes it
`fail`; otherwise (a gate that did not run) `not run`. `recipe_status(section, otherwise)` is then
`verified` or the caller's `measured` / `predicted`.

`run_gates(...)` runs all three on one candidate and returns (result, section).
"""

from __future__ import annotations

from typing import Iterable

from .component import ComponentSpec, component_gate, component_test_entry
from .configuration import configuration_gate
from .convergence import PROFILES, Thresholds, convergence_gate
from .result import GateResult
from .rules import load_rules

__all__ = ["correctness_section", "overall", "recipe_status", "run_gates", "DISPATCHER_FLAG"]

DISPATCHER_FLAG = "--moe-token-dispatcher-type"
_PROFILE_WORDS = {"bridge": "with its pipeline thresholds", "fp32": "with autotune's fp32 thresholds (deterministic CPU runs)"}


def _covered(need: str, components: list[GateResult]) -> GateResult | None:
    """The component result that answers a kernel difference ("--flag ref -> cand"), if any."""
    flag, _, change = need.partition(" ")
    if flag != DISPATCHER_FLAG:
        return None
    cand = change.split(" -> ")[-1]
    hits = [c for c in components if c.details.get("spec", {}).get("dispatcher") == cand]
    return next((c for c in hits if c.status == "pass"), hits[0] if hits else None)


def _why(g: GateResult) -> str:
    """A gate's summary without its leading status ('not run: predicted' -> 'predicted'): the section's summary
    says 'not run: ' or 'failed: ' once, not again for every gate ('not run: convergence not run: ...')."""
    s = g.summary or ""
    for head in ("not run: ", "not_run: ", "fail: ", "failed: ", "pass: "):
        if s.startswith(head):
            return s[len(head):]
    return s or g.recipe_status


def overall(configuration: GateResult | None, convergence: GateResult | None,
            components: Iterable[GateResult] = ()) -> tuple[str, list[str]]:
    """('pass' | 'fail' | 'not run', the reasons for anything but pass)."""
    components = list(components)
    failed, missing = [], []
    for name, g in (("configuration", configuration), ("convergence", convergence)):
        if g is None:
            missing.append(f"{name}: no result")
        elif g.status == "fail":
            failed.append(f"{name}: {_why(g)}")
        elif g.status == "not_run":
            missing.append(f"{name}: {_why(g)}")
    for c in components:
        if c.status == "fail":
            failed.append(f"component test: {_why(c)}")
    for need in configuration.needs if configuration else []:
        hit = _covered(need, components)
        if hit is None:
            missing.append(f"no component test for {need}")
        elif hit.status == "not_run":
            missing.append(f"component test for {need}: {_why(hit)}")
    if failed:
        return "fail", failed + missing
    return ("not run", missing) if missing else ("pass", [])


def correctness_section(configuration: GateResult | None, convergence: GateResult | None,
                        components: Iterable[GateResult] = (), *, reference: str,
                        note: str = "candidate arm: the measured run; reference arm: the reference layout on the same rows",
                        gpu: str | None = None, date: str | None = None, profile: str = "bridge") -> dict:
    """A dict that validates as sections.Correctness (what recipe_from_candidate(gates=...) takes)."""
    components = list(components)
    result, reasons = overall(configuration, convergence, components)
    ran = [c for c in components if c.status in ("pass", "fail")]
    conv = None
    d = convergence.details if convergence is not None else {}
    if convergence is not None and convergence.status != "not_run" and "correlation" in d:
        conv = {"steps": d["steps"], "result": convergence.status, "correlation": round(max(-1.0, min(1.0, d["correlation"])), 6),
                "final_loss_difference": round(d["final_loss_difference"], 6), "pointwise_failures": d["pointwise_failures"],
                "note": note, "worst_step_tolerance_ratio": round(d["worst_step_tolerance_ratio"], 4)}
    if result == "pass":
        n = len([c for c in ran if c.status == "pass"])
        summary = "passed" + (f"; {n} component test{'s' if n > 1 else ''} passed" if n else "")
    else:
        summary = ("failed: " if result == "fail" else "not run: ") + "; ".join(reasons)
    steps = d.get("steps")
    return {
        "result": result,
        "summary": summary,
        "reference": reference,
        "configuration": configuration.recipe_status if configuration is not None else "not run",
        "component_tests": [component_test_entry(c, gpu=gpu, date=date) for c in ran],
        "convergence": conv,
        "rules": f"argument classes of autotune's {load_rules().source}; "
                 + (f"{steps}-step check by Megatron-Bridge validate_convergence {_PROFILE_WORDS.get(profile, '')}".rstrip()
                    if steps else "no convergence check"),
    }


def recipe_status(section: dict, otherwise: str = "measured") -> str:
    """`verified` when every gate passed, else `otherwise` (measured / predicted)."""
    return "verified" if section.get("result") == "pass" and section.get("convergence") else otherwise


_COMPONENT_CACHE: dict[tuple, GateResult] = {}


def run_gates(candidate_args, reference_args, candidate_steps=None, reference_steps=None, *,
              reference: str = "the reference layout (the simplest legal one) on the same rows",
              predicted: bool = False, profile: str | Thresholds = "bridge", components: list[GateResult] | None = None,
              run_components: bool = True, component_spec: dict | None = None, note: str | None = None,
              gpu: str | None = None, date: str | None = None) -> tuple[str, dict]:
    """All gates for one candidate: (result 'pass' | 'fail' | 'not run', correctness section).

    candidate_args / reference_args: run blocks, token lists or {argument: value} (gates.arguments).
    candidate_steps / reference_steps: loss curves (StepRecords, {step: loss}, lists, LossCurve); None or
    `predicted=True` (the simulator) makes the convergence gate `not run: predicted`.
    Kernel differences in the dispatcher get a component test (cached per dispatcher pair in this process)
    unless `components` already holds results or `run_components` is False."""
    config = configuration_gate(candidate_args, reference_args)
    if predicted or candidate_steps is None or reference_steps is None:
        why = "predicted (the simulator ran no training steps)" if predicted else "no loss curves to compare"
        conv = GateResult(gate="convergence", status="not_run", summary=f"not run: {why}")
    else:
        conv = convergence_gate(candidate_steps, reference_steps, profile)
    comps = list(components or [])
    for need in config.needs:
        if _covered(need, comps) is not None or not need.startswith(DISPATCHER_FLAG):
            continue
        # absent: megatron's default dispatcher (the run blocks name only a non-default one)
        ref_d, cand_d = ("alltoall" if d.startswith("(") else d for d in need.split(" ", 1)[1].split(" -> "))
        if predicted or not run_components:
            comps.append(GateResult(gate="component", status="not_run", details={"spec": {"dispatcher": cand_d}},
                                    summary="not run: predicted" if predicted else "not run: component tests off"))
            continue
        spec = ComponentSpec(dispatcher=cand_d, reference_dispatcher=ref_d, **(component_spec or {}))
        key = tuple(sorted(vars(spec).items()))
        if key not in _COMPONENT_CACHE:
            _COMPONENT_CACHE[key] = component_gate(spec)
        comps.append(_COMPONENT_CACHE[key])
    prof = profile if isinstance(profile, str) else next((k for k, v in PROFILES.items() if v == profile), "custom")
    kw = {"note": note} if note else {}
    section = correctness_section(config, conv, comps, reference=reference, gpu=gpu, date=date, profile=prof, **kw)
    return section["result"], section
