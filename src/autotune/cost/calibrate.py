"""Calibration: per-GPU-kind factors on the time model's terms, fitted to measured runs.

`load_calibration(gpu)` returns what `evaluate` uses: the file named by $AUTOTUNE_CALIBRATION when it
holds that GPU kind, else the shipped defaults (data/calibration.json), else factors of 1. `fit` fits
factors to measurements (see _fit.py for the estimator); `fit_kinds` is the recipe behind the shipped
file and `autotune calibrate`: GPU kinds of one family (H100 and H200 are the same Hopper SM with different
HBM) first fit together, then each kind is refined from that pooled fit with its own rows, so a kind with
few rows (H200: the three seeds) borrows the family's compute factors instead of guessing them.

A GPU kind's factors are Megatron-core's: they come from the rows Megatron ran (what `evaluate` predicts for a
search). Rows of another training stack (torchtitan, NeMo AutoModel, Llama 3's: Measurement.framework) fit a
calibration of their own, keyed "<kind>+<framework>" (`stack_kind`), with the kind's Megatron calibration as its
prior: their stacks' kernels, TP collectives and pipeline schedules differ from Megatron's in ways the physics
does not name, and one factor set for both was absorbing the difference (measured: fitted without torchtitan's
rows, H100's tp_comm factor is 0.58 and bubble 0.52; with them, 0.93 and 1.09). `calibration_for(m, cals)` picks
a row's. Measurements live in measurements.py. No torch, no ray, no scipy.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path

import numpy as np

from ..catalog.hardware import VARIANT_KINDS
from ..errors import ConfigError
from ..fsutil import write_text_atomic
from ._fit import predict_step_times, solve
from .measurements import Measurement, published_measurements, read_measurements, seed_measurements
from .memory import MemoryCoefficients
from .time import STEP_TERMS, TimeCoefficients

__all__ = ["Calibration", "load_calibration", "fit", "fit_kinds", "stack_kind", "calibration_for", "STACK_SEP",
           "save_calibrations", "read_calibrations", "predict", "row_report",
           "Measurement", "published_measurements", "seed_measurements", "read_measurements", "FAMILIES",
           "ENV_VAR", "SHIPPED"]

ENV_VAR = "AUTOTUNE_CALIBRATION"
SHIPPED = Path(str(resources.files("autotune.cost") / "data" / "calibration.json"))
FAMILIES = {"H100": "hopper", "H200": "hopper", "H800": "hopper", "B200": "blackwell", "B300": "blackwell",
            "GB200": "blackwell", "GB300": "blackwell"}
# precisions whose rows the fit uses: all of them. FP8 rows were kept out while the BF16 rows of a family were
# nearly one model each (Blackwell: gpt-oss-120b), so every shared factor was that model's; with the recipes'
# settings read (_presets.py) and the FP8 casts in the physics, fitting them too cut the leave-one-model-out error
# from 27% to 23% (bench/throughput_accuracy.py) and leaves no term unconstrained
FIT_PRECISIONS = ("bf16", "fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8")
STACK_SEP = "+"


def stack_kind(gpu: str, framework: str = "megatron") -> str:
    """The calibration key of a GPU kind under a training stack: the kind itself for Megatron, else
    "<kind>+<framework>" (module docstring)."""
    return gpu if framework == "megatron" else f"{gpu}{STACK_SEP}{framework}"


@dataclass(frozen=True)
class Calibration:
    gpu: str
    time: TimeCoefficients = field(default_factory=TimeCoefficients)
    memory: MemoryCoefficients = field(default_factory=MemoryCoefficients)
    provenance: str = "defaults (uncalibrated)"
    report: dict = field(default_factory=dict, compare=False)  # the fit's rows, residuals, date

    @property
    def factors(self) -> dict[str, float]:
        return {k: float(self.time.scale.get(k, 1.0)) for k in STEP_TERMS}

    def to_json(self) -> dict:
        return {"factors": self.factors, "coefficients": {f.name: getattr(self.time, f.name)
                                                          for f in fields(self.time) if f.name != "scale"},
                "provenance": self.provenance, **self.report}

    @classmethod
    def from_json(cls, gpu: str, d: dict, where: str) -> "Calibration":
        known = {f.name for f in fields(TimeCoefficients)} - {"scale"}
        try:
            coef = {k: float(v) for k, v in (d.get("coefficients") or {}).items() if k in known}
            scale = {k: float(v) for k, v in (d.get("factors") or {}).items() if k in STEP_TERMS}
        except (TypeError, ValueError, AttributeError):
            raise ConfigError(f"{where}: calibration for {gpu} has non-numeric factors; "
                              "re-run `autotune calibrate`") from None
        report = {k: v for k, v in d.items() if k not in ("factors", "coefficients", "provenance")}
        return cls(gpu, TimeCoefficients(**coef, scale=scale), MemoryCoefficients(),
                   str(d.get("provenance") or where), report)


def read_calibrations(path: str | Path) -> dict[str, Calibration]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"calibration file {str(p)!r}: cannot read ({exc.strerror}); check ${ENV_VAR}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"calibration file {str(p)!r}: not valid JSON ({exc.msg}); "
                          "re-run `autotune calibrate`") from None
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, dict):
        raise ConfigError(f"calibration file {str(p)!r}: no 'gpus' object; re-run `autotune calibrate --out {p}`")
    return {k: Calibration.from_json(k, v, str(p)) for k, v in gpus.items()}


_LOADED: dict[tuple, dict[str, Calibration]] = {}


def _cached(path: Path) -> dict[str, Calibration]:
    key = (str(path), path.stat().st_mtime_ns if path.exists() else 0)
    if key not in _LOADED:
        _LOADED[key] = read_calibrations(path) if path.exists() else {}
    return _LOADED[key]


def _find(gpu: str) -> Calibration | None:
    user = os.environ.get(ENV_VAR)
    for path in ([Path(user).expanduser()] if user else []) + [SHIPPED]:
        if path != SHIPPED and not path.exists():
            raise ConfigError(f"${ENV_VAR}={user!r} does not exist; unset it or run `autotune calibrate --out {user}`")
        for kind, cal in _cached(path).items():
            if kind.lower() == gpu.lower():
                return cal
    return None


def load_calibration(gpu: str) -> Calibration:
    """The calibration `evaluate` uses for a GPU kind: $AUTOTUNE_CALIBRATION's file, then the shipped one;
    a kind with none borrows a calibrated sibling's of its family (same SM and software stack), and says so; a
    catalog variant (catalog.VARIANT_KINDS) takes its kind's."""
    kind = next((k for v, k in VARIANT_KINDS.items() if v.lower() == gpu.lower()), None)
    if kind is not None:
        base = load_calibration(kind)
        return replace(base, gpu=gpu, provenance=f"{kind}'s calibration ({gpu} is a {kind} part): {base.provenance}")
    own = _find(gpu)
    if own is not None:
        return own
    if STACK_SEP in gpu:  # a stack with no calibration of its own: its GPU kind's (Megatron's)
        kind, framework = gpu.split(STACK_SEP, 1)
        base = load_calibration(kind)
        return replace(base, gpu=gpu,
                       provenance=f"{kind}'s calibration (no {framework} rows fitted): {base.provenance}")
    fam = next((f for k, f in FAMILIES.items() if k.lower() == gpu.lower()), None)
    for other in [k for k, f in FAMILIES.items() if f == fam and k.lower() != gpu.lower()]:
        base = _find(other)
        if base is not None:
            return replace(base, gpu=gpu, provenance=f"{other}'s calibration ({gpu} has none of its own): "
                                                     f"{base.provenance}")
    return Calibration(gpu, provenance=f"defaults (no calibration for {gpu}: factors 1)")


def save_calibrations(path: str | Path, cals: dict[str, Calibration], merge: bool = True) -> Path:
    """Write (merging into an existing file) atomically: a temp file in the same folder, then rename."""
    p = Path(path).expanduser()
    gpus = {}
    if merge and p.exists():
        gpus = {k: c.to_json() for k, c in read_calibrations(p).items()}
    gpus.update({k: c.to_json() for k, c in cals.items()})
    doc = {"schema_version": 1, "written": _dt.date.today().isoformat(), "generator": "autotune calibrate",
           "gpus": dict(sorted(gpus.items()))}
    write_text_atomic(p, json.dumps(doc, indent=1) + "\n", make_parents=False)
    return p


def predict(measurements: list[Measurement], cal: Calibration) -> np.ndarray:
    """Predicted tokens/s/GPU of each measurement's configuration under `cal` (vectorised, cached)."""
    if not measurements:
        return np.zeros(0)
    t = predict_step_times(measurements, cal.time, cal.memory)
    return np.array([m.seq_len * m.global_batch / m.count for m in measurements]) / t


def row_report(ms: list[Measurement], before: np.ndarray, after: np.ndarray) -> list[dict]:
    """Per row: measured and predicted tokens/s/GPU before/after, errors in % (predicted / measured - 1)."""
    return [{"row": m.label(), "source": m.source, "weight": m.weight, "measured": round(m.tokens_per_s_per_gpu, 2),
             "predicted_before": round(float(b), 2), "predicted_after": round(float(a), 2),
             "error_before_pct": round(100 * (b / m.tokens_per_s_per_gpu - 1), 2),
             "error_after_pct": round(100 * (a / m.tokens_per_s_per_gpu - 1), 2)}
            for m, b, a in zip(ms, before, after)]


def fit(measurements: list[Measurement], base: Calibration | None = None, terms=STEP_TERMS, *,
        gpu: str | None = None, prior_sigma: float = 0.2, noise_sigma: float = 0.07,
        min_share: float = 0.01, provenance: str | None = None) -> Calibration:
    """Factors on the time terms for one GPU kind, fitted by least squares on log step time.

    `base` supplies the physics coefficients and the factors the prior pulls toward (default: factors
    of 1); measurements may span GPU kinds (each is evaluated on its own cluster) when the caller pools a
    family. prior_sigma is the prior's standard deviation in log-factor (0.2: a factor of 1.22 is one
    sigma; leave-one-model-out checks in bench/throughput_accuracy.py found looser priors fit the rows
    better but transfer worse to unseen models), noise_sigma the rows' (0.07: run-to-run and
    software-version spread)."""
    ms = list(measurements)
    kinds = sorted({m.gpu for m in ms})
    gpu = gpu or (base.gpu if base else (kinds[0] if len(kinds) == 1 else None))
    if gpu is None:
        raise ValueError(f"measurements span GPU kinds {kinds}: pass gpu= (the kind the factors are for)")
    base = base or Calibration(gpu)
    if not ms:
        return replace(base, gpu=gpu)
    res = solve(ms, base.time, base.memory, terms, prior_sigma=prior_sigma, noise_sigma=noise_sigma,
                min_share=min_share)
    rms = lambda r: float(np.sqrt(np.mean(r**2)))  # noqa: E731
    report = {"date": _dt.date.today().isoformat(), "fitted_terms": res.fitted, "rows_used": len(ms),
              "gpus_in_rows": kinds, "prior_sigma": prior_sigma, "noise_sigma": noise_sigma,
              "rms_log_error_before": round(rms(res.log_resid_before), 4),
              "rms_log_error_after": round(rms(res.log_resid_after), 4),
              "rows": row_report(ms, *(np.array([m.tokens_per_s_per_gpu for m in ms]) * np.exp(-r)
                                        for r in (res.log_resid_before, res.log_resid_after)))}
    text = provenance or f"fitted to {len(ms)} measured row(s) on {', '.join(kinds)} from {base.provenance}"
    return Calibration(gpu, replace(base.time, scale=res.factors), base.memory, text, report)


def fit_kinds(measurements: list[Measurement], kinds: list[str] | None = None, **fit_kw) -> dict[str, Calibration]:
    """One calibration per GPU kind: pooled per family, then refined per kind (see module docstring); only
    rows of FIT_PRECISIONS, none kept out (m.kept_out: a release's filed performance regression, or a model the time
    model cannot yet price).
    `fit_kw` goes to every `fit` (prior_sigma, noise_sigma, terms)."""
    by_kind: dict[str, list[Measurement]] = {}  # Megatron's rows per GPU kind
    by_stack: dict[tuple[str, str], list[Measurement]] = {}  # other stacks' rows per (kind, framework)
    usable = [m for m in measurements if m.precision in FIT_PRECISIONS and not m.kept_out]
    for m in usable:
        if m.framework == "megatron":
            by_kind.setdefault(m.gpu, []).append(m)
        else:
            by_stack.setdefault((m.gpu, m.framework), []).append(m)
    wanted = kinds or sorted({m.gpu for m in usable})
    out: dict[str, Calibration] = {}
    for family in sorted({FAMILIES.get(k, k) for k in wanted}):
        members = [k for k in FAMILIES if FAMILIES[k] == family] or [family]
        pool = [m for k in members for m in by_kind.get(k, [])]
        if not pool:
            continue
        pooled = fit(pool, gpu=members[0], **fit_kw, provenance=f"{family} family pool: {len(pool)} rows "
                     f"({', '.join(k for k in members if k in by_kind)})")
        for k in members:
            if k not in wanted:
                continue
            own = by_kind.get(k, [])
            if own and len(own) < len(pool):
                cal = fit(own, base=replace(pooled, gpu=k), **fit_kw,
                          provenance=f"{k}: {len(own)} own rows, prior from the {family} pool of {len(pool)} rows")
            else:
                cal = replace(pooled, gpu=k, provenance=pooled.provenance + (f" (no {k} rows)" if not own else ""))
            shown = own or pool  # the shipped report: each row against uncalibrated factors and the final ones
            rows = row_report(shown, predict(shown, Calibration(k)), predict(shown, cal))
            out[k] = replace(cal, report={**cal.report, "rows": rows, "rows_shown": "own" if own else "family pool"})
    for (k, framework), own in sorted(by_stack.items()):
        if k not in wanted:
            continue
        base = out.get(k)
        name = stack_kind(k, framework)
        prior = f"prior from {k}'s Megatron calibration" if base else f"prior: factors of 1 (no Megatron rows of {k})"
        cal = fit(own, base=replace(base or Calibration(k), gpu=name), **fit_kw,
                  provenance=f"{name}: {len(own)} {framework} rows, {prior}")
        rows = row_report(own, predict(own, Calibration(name)), predict(own, cal))
        out[name] = replace(cal, report={**cal.report, "rows": rows, "rows_shown": "own"})
    return out


def calibration_for(m: Measurement, cals: dict[str, Calibration]) -> Calibration:
    """The calibration of `cals` a measurement is predicted with: its stack's, else its GPU kind's, else a
    fitted kind's of its family (same SM), else factors of 1."""
    for key in (stack_kind(m.gpu, m.framework), m.gpu):
        if key in cals:
            return cals[key]
    sib = next((c for k, c in sorted(cals.items()) if STACK_SEP not in k and FAMILIES.get(k) == FAMILIES.get(m.gpu)),
               None)
    return replace(sib, gpu=m.gpu) if sib else Calibration(m.gpu)
