"""The convergence gate: a candidate's loss curve against a reference's, step by step.

The scoring is Megatron-Bridge's `validate_convergence` (scripts/performance/utils/evaluate.py) as
REFERENCE.md describes it: drop the first fraction of points (the pipeline's 20%), then five tests, all
run: Pearson correlation; pointwise |cur - ref| / |ref| within a tolerance chosen by the reference's
magnitude, at most a fraction of points failing; the final step's relative difference; 3-sigma outliers
of the residuals. What Bridge misses fails here first: a NaN or inf in either curve, a duplicated,
missing or extra step, curves that do not cover the same steps (a truncated run).

Two threshold profiles: `bridge` (its pipeline thresholds, for bf16 runs on GPUs) and `fp32` (for
deterministic fp32 runs such as autotune's CPU trials, where layouts agree to ~1e-6 and a perturbed data
seed moves the loss by ~1e-3: Bridge's 10% tolerance could not tell them apart).

Loss files: the runner's steps.jsonl (one StepRecord per line, `lm_loss`) or JSON {step: loss} (or a
list of losses, step = index). An unreadable or malformed file is ConfigError (one line).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .result import GateResult

__all__ = ["Thresholds", "PROFILES", "LossCurve", "read_losses", "curve_of", "convergence_gate", "profile_for",
           "with_thresholds"]


@dataclass(frozen=True)
class Thresholds:
    correlation: float = 0.95
    high_loss_tolerance: float = 0.10  # reference loss > 2.0
    medium_loss_tolerance: float = 0.05  # (0.5, 2.0]
    low_loss_tolerance: float = 0.02  # <= 0.5
    final_loss_tolerance: float = 0.05  # the pipeline's (validate_convergence's own default is 0.03)
    max_outlier_ratio: float = 0.10
    outlier_sigma: float = 3.0
    skip_first_fraction: float = 0.20
    min_scored_points: int = 3

    def tolerance(self, ref: float) -> float:
        if ref > 2.0:
            return self.high_loss_tolerance
        return self.medium_loss_tolerance if ref > 0.5 else self.low_loss_tolerance


PROFILES = {
    "bridge": Thresholds(),
    "fp32": Thresholds(correlation=0.9999, high_loss_tolerance=1e-4, medium_loss_tolerance=1e-4,
                       low_loss_tolerance=1e-4, final_loss_tolerance=1e-4),
}


@dataclass
class LossCurve:
    """Loss per step as read, with what was wrong in the file's step numbering."""

    losses: dict[int, float]
    source: str = "curve"
    duplicates: list[int] = field(default_factory=list)
    missing_loss: list[int] = field(default_factory=list)  # steps recorded without a loss


def curve_of(data, source: str = "curve") -> LossCurve:
    """A LossCurve from a {step: loss} mapping, a list of losses, or StepRecords / their dicts."""
    if isinstance(data, LossCurve):
        return data
    if isinstance(data, dict):
        pairs = list(data.items())
    else:
        items = list(data)
        if items and not isinstance(items[0], (int, float)) and items[0] is not None:
            pairs = [(getattr(r, "step", None) if not isinstance(r, dict) else r.get("step"),
                      getattr(r, "lm_loss", None) if not isinstance(r, dict) else r.get("lm_loss")) for r in items]
        else:
            pairs = list(enumerate(items))
    return _collect(pairs, source)


def _collect(pairs, source: str) -> LossCurve:
    curve = LossCurve({}, source)
    for step, loss in pairs:
        try:
            s = int(step)
            if str(step).strip() != str(s):
                raise ValueError
        except (TypeError, ValueError):
            raise ConfigError(f"{source}: step {step!r} is not an integer; give {{step: loss}} with integer steps") from None
        if loss is None:
            curve.missing_loss.append(s)
            continue
        if isinstance(loss, bool) or not isinstance(loss, (int, float)):
            raise ConfigError(f"{source}: step {s}: loss {loss!r} is not a number")
        if s in curve.losses:
            curve.duplicates.append(s)
        curve.losses[s] = float(loss)
    if not curve.losses and not curve.missing_loss:
        raise ConfigError(f"{source}: no steps; pass the runner's steps.jsonl or a JSON {{step: loss}} file")
    return curve


def read_losses(path: str | Path) -> LossCurve:
    """A loss file: steps.jsonl (StepRecord lines) or JSON {step: loss} / [loss, ...]."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"loss file {p}: cannot read it ({exc.strerror}); pass steps.jsonl or a JSON {{step: loss}} file") from None
    pairs: list = []
    try:
        if p.suffix == ".jsonl" or (text.lstrip().startswith("{") and "\n{" in text.strip()):
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as exc:
                        what = exc.msg.removesuffix(" at")  # "Unterminated string starting at"
                        raise ConfigError(f"loss file {p} line {n}: not valid JSON ({what} at column {exc.colno}); "
                                          "pass the runner's steps.jsonl") from None
                    if not isinstance(rec, dict) or "step" not in rec:
                        raise ConfigError(f"loss file {p}: line {n} is not a StepRecord (no `step`)")
                    pairs.append((rec["step"], rec.get("lm_loss")))
        else:
            doc = json.loads(text, object_pairs_hook=list)  # keeps duplicated keys visible
            if isinstance(doc, list) and all(isinstance(x, (int, float)) or x is None for x in doc):
                pairs = list(enumerate(doc))
            elif isinstance(doc, list) and all(isinstance(x, tuple) for x in doc):
                pairs = doc
            else:
                raise ConfigError(f"loss file {p}: expected {{step: loss}} or a list of losses")
    except json.JSONDecodeError as exc:
        raise ConfigError(f"loss file {p}: not JSON ({exc.msg}: line {exc.lineno} column {exc.colno}); pass steps.jsonl or {{step: loss}}") from None
    curve = _collect(pairs, str(p))
    if not curve.losses:  # a file given to compare that has nothing to compare: bad input, not a failed gate
        raise ConfigError(f"{p}: no step has a loss ({len(curve.missing_loss)} step(s), every loss null); pass "
                          "the steps.jsonl of a trial that recorded its loss")
    return curve


def _coverage(cand: LossCurve, ref: LossCurve) -> list[str]:
    """Why the two curves cannot be scored step for step (empty when they can)."""
    why = []
    for c, name in ((cand, "candidate"), (ref, "reference")):
        bad = sorted(s for s, v in c.losses.items() if not math.isfinite(v))
        if bad:
            why.append(f"{name} loss is {c.losses[bad[0]]} at step {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
        if c.duplicates:
            why.append(f"{name} repeats step(s) {sorted(set(c.duplicates))}")
        if c.missing_loss:
            why.append(f"{name} has no loss at step(s) {sorted(c.missing_loss)}")
        steps = sorted(c.losses)
        gaps = sorted(set(range(steps[0], steps[-1] + 1)) - set(steps)) if steps else []
        if gaps:
            why.append(f"{name} skips step(s) {gaps[:5]}")
    cs, rs = set(cand.losses), set(ref.losses)
    if cs != rs:
        if cs and rs and cs < rs and max(cs) < max(rs):
            why.append(f"candidate is truncated: it stops at step {max(cs)}, the reference at {max(rs)}")
        else:
            if rs - cs:
                why.append(f"candidate lacks step(s) {sorted(rs - cs)[:5]}")
            if cs - rs:
                why.append(f"candidate has extra step(s) {sorted(cs - rs)[:5]}")
    return why


def convergence_gate(candidate, reference, thresholds: Thresholds | str = "bridge") -> GateResult:
    """Score two loss curves (LossCurve, {step: loss}, lists, or StepRecords). Losses near the float limit overflow
    the spreads and products: they come out inf or NaN and fail, without numpy's warnings."""
    with np.errstate(all="ignore"):
        return _score(candidate, reference, thresholds)


def _score(candidate, reference, thresholds: Thresholds | str) -> GateResult:
    th = PROFILES[thresholds] if isinstance(thresholds, str) else thresholds
    cand, ref = curve_of(candidate, "candidate"), curve_of(reference, "reference")
    details: dict = {"thresholds": asdict(th), "steps": len(ref.losses)}
    problems = _coverage(cand, ref)
    if problems:
        details.update(failed=["coverage"], problems=problems)
        return GateResult(gate="convergence", status="fail", details=details, summary="fail: " + "; ".join(problems))
    steps = sorted(ref.losses)
    skip = max(0, int(len(steps) * th.skip_first_fraction))
    scored = steps[skip:]
    if len(scored) < th.min_scored_points:
        raise ConfigError(f"{len(steps)} steps leave {len(scored)} scored after the {th.skip_first_fraction:.0%} warm-up; "
                          f"compare runs of at least {math.ceil(th.min_scored_points / (1 - th.skip_first_fraction))} steps")
    cur = np.array([cand.losses[s] for s in scored])
    gold = np.array([ref.losses[s] for s in scored])
    failed = []
    if np.ptp(cur) == 0 and np.ptp(gold) == 0:
        corr = 1.0 if np.array_equal(cur, gold) else 0.0  # flat curves: corrcoef is undefined
    elif np.ptp(cur) == 0 or np.ptp(gold) == 0:
        corr = 0.0
    else:
        corr = float(np.corrcoef(cur, gold)[0, 1])
    if not corr >= th.correlation:  # a NaN correlation fails too (NaN < x is False)
        failed.append("correlation")
    tol = np.array([th.tolerance(g) for g in gold])
    rel = np.where(gold != 0, np.abs(cur - gold) / np.where(gold != 0, np.abs(gold), 1.0), np.abs(cur))
    ratio = rel / tol
    pointwise = [int(s) for s, r in zip(scored, ratio) if r > 1.0]
    if len(pointwise) / len(scored) > th.max_outlier_ratio:
        failed.append("pointwise")
    final_rel = float(rel[-1])
    if final_rel > th.final_loss_tolerance:
        failed.append("final_loss")
    resid = cur - gold
    sd = float(np.std(resid))
    outliers = int(np.sum(np.abs(resid - resid.mean()) > th.outlier_sigma * sd)) if sd > 0 else 0
    if outliers / len(scored) > th.max_outlier_ratio:
        failed.append("outliers")
    worst = int(np.argmax(ratio))
    details.update(
        scored_steps=[int(scored[0]), int(scored[-1])], scored_points=len(scored), skipped=skip,
        correlation=corr, final_loss_difference=float(abs(cur[-1] - gold[-1])), final_loss_relative=final_rel,
        pointwise_failures=len(pointwise), pointwise_failed_steps=pointwise[:10], outliers=outliers,
        worst_step=int(scored[worst]), worst_step_tolerance_ratio=float(ratio[worst]), failed=failed)
    head = (f"correlation {corr:.6f}, final loss difference {abs(cur[-1] - gold[-1]):.3g} ({final_rel:.2%}), "
            f"{len(pointwise)} of {len(scored)} points outside tolerance, worst step {scored[worst]} at "
            f"{ratio[worst]:.3g} x its tolerance")
    if failed:
        return GateResult(gate="convergence", status="fail", details=details, summary=f"fail ({', '.join(failed)}): {head}")
    return GateResult(gate="convergence", status="pass", details=details, summary=f"pass: {head}")


def with_thresholds(profile: str, **overrides) -> Thresholds:
    if profile not in PROFILES:
        raise ConfigError(f"convergence profile {profile!r}: choose one of {', '.join(PROFILES)}")
    return replace(PROFILES[profile], **overrides)


def profile_for(result) -> str:
    """The profile for a TrialResult's curve: `fp32` when the runner trained in fp32 on CPU (it says so
    in its notes), else `bridge`."""
    reason = getattr(result, "reason", None) or ""
    return "fp32" if "fp32 on CPU" in reason else "bridge"
