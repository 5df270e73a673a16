"""The configuration gate: a candidate's arguments against the reference's, by argument class.

Each argument whose value differs (or that one side sets and the other does not) is listed with its
class from skill/correctness/numerics_list.yaml. Pass when every difference is `layout` or
`performance`; each `kernel` difference passes the configuration but is listed in `needs` (a
component test must pass before the recipe is verified); a `numerics` difference or an argument the
rules do not know fails, naming it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .arguments import parse_arguments
from .result import GateResult
from .rules import Rules, load_rules

__all__ = ["configuration_gate", "argument_differences"]

Args = str | Iterable[str] | Mapping[str, str | None]


def _show(value: str | None, present: bool) -> str:
    if not present:
        return "(absent)"
    return "(set)" if value is None else value


def argument_differences(candidate: Args, reference: Args, rules: Rules | None = None) -> list[dict]:
    """[{argument, candidate, reference, class, why}] for every argument that differs, in the candidate's order."""
    rules = load_rules() if rules is None else rules
    cand, ref = parse_arguments(candidate), parse_arguments(reference)
    out = []
    for arg in list(cand) + [a for a in ref if a not in cand]:
        if arg in cand and arg in ref and cand[arg] == ref[arg]:
            continue
        rule = rules.get(arg)
        out.append({
            "argument": arg,
            "candidate": _show(cand.get(arg), arg in cand),
            "reference": _show(ref.get(arg), arg in ref),
            "class": rule.cls if rule else "unknown",
            "why": rule.why if rule else f"not in {rules.source}: classify it there before it can ship",
        })
    return out


def configuration_gate(candidate: Args, reference: Args, rules: Rules | None = None) -> GateResult:
    """Run the gate on two argument lists (run blocks, token lists or {argument: value} mappings)."""
    rules = load_rules() if rules is None else rules
    diffs = argument_differences(candidate, reference, rules)
    by = {c: [d for d in diffs if d["class"] == c] for c in ("layout", "performance", "kernel", "numerics", "unknown")}
    word = lambda ds: ", ".join(f"{d['argument']} {d['reference']} -> {d['candidate']}" for d in ds)  # noqa: E731
    needs = [f"{d['argument']} {d['reference']} -> {d['candidate']}" for d in by["kernel"]]
    details = {"differences": diffs, "rules": rules.source,
               "counts": {c: len(ds) for c, ds in by.items() if ds}}
    if by["numerics"] or by["unknown"]:
        bad = by["numerics"] + by["unknown"]
        kinds = " and ".join(k for k in ("numerics", "unknown") if by[k])
        return GateResult(gate="configuration", status="fail", details=details, needs=needs,
                          summary=f"fail: {kinds} argument difference{'s' if len(bad) != 1 else ''}: {word(bad)}")
    if not diffs:
        return GateResult(gate="configuration", status="pass", details=details, summary="pass: the same arguments")
    parts = [f"{len(by[c])} {c}" for c in ("layout", "performance", "kernel") if by[c]]
    summary = "pass: " + ", ".join(parts) + (" difference" if len(diffs) == 1 else " differences")
    if needs:
        summary += f"; {len(needs)} need{'s' if len(needs) == 1 else ''} a component test ({word(by['kernel'])})"
    return GateResult(gate="configuration", status="pass", details=details, needs=needs, summary=summary)
