"""The convergence gate on synthetic curves, the loss-file readers and `autotune check convergence`."""

from __future__ import annotations

import json
import math

import pytest
from gate_helpers import CURVE, cli

from autotune.errors import ConfigError
from autotune.gates.convergence import PROFILES, convergence_gate, read_losses
from autotune.trials.spec import StepRecord


def test_identical_curves_pass_with_exact_numbers():
    res = convergence_gate(CURVE, dict(CURVE))
    d = res.details
    assert res.status == "pass" and d["correlation"] == pytest.approx(1.0)
    assert d["final_loss_difference"] == 0 and d["pointwise_failures"] == 0 and d["worst_step_tolerance_ratio"] == 0
    assert d["skipped"] == 4 and d["scored_points"] == 16 and d["scored_steps"] == [4, 19]  # Bridge's 20% warm-up


def test_a_curve_8_percent_higher_fails_the_final_loss_test():
    res = convergence_gate({s: v * 1.08 for s, v in CURVE.items()}, CURVE)
    d = res.details
    assert res.status == "fail" and "final_loss" in d["failed"]
    assert d["correlation"] == pytest.approx(1.0)  # the shape is the same: only the level moved
    assert d["final_loss_relative"] == pytest.approx(0.08)
    # Above a loss of 2 Bridge's pointwise tolerance is 10%: there only the final-loss test catches 8%.
    high = {s: v + 1.0 for s, v in CURVE.items()}
    res = convergence_gate({s: v * 1.08 for s, v in high.items()}, high)
    assert res.details["failed"] == ["final_loss"] and res.details["pointwise_failures"] == 0


def test_small_noise_passes_under_bridge_and_fails_under_fp32():
    noisy = {s: v * (1 + 2e-3 * ((s % 3) - 1)) for s, v in CURVE.items()}
    assert convergence_gate(noisy, CURVE, "bridge").status == "pass"
    res = convergence_gate(noisy, CURVE, "fp32")
    assert res.status == "fail" and res.details["worst_step_tolerance_ratio"] == pytest.approx(20, rel=0.01)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_step_fails(bad):
    cand = dict(CURVE)
    cand[7] = bad
    res = convergence_gate(cand, CURVE)
    assert res.status == "fail" and res.details["failed"] == ["coverage"] and "step 7" in res.summary
    # the reference's NaN fails too (Bridge would score it and pass)
    assert convergence_gate(CURVE, cand).status == "fail"


def test_truncated_missing_extra_and_duplicated_steps_fail():
    trunc = {s: v for s, v in CURVE.items() if s < 12}
    res = convergence_gate(trunc, CURVE)
    assert res.status == "fail" and "truncated" in res.summary and "stops at step 11" in res.summary
    gap = {s: v for s, v in CURVE.items() if s != 9}
    assert "skips step(s) [9]" in convergence_gate(gap, CURVE).summary
    extra = {**CURVE, 20: 1.0}
    assert "extra step(s) [20]" in convergence_gate(extra, CURVE).summary
    dup = [StepRecord(step=s, time_s=1.0, tokens=1, lm_loss=v) for s, v in CURVE.items()]
    dup.insert(5, StepRecord(step=4, time_s=1.0, tokens=1, lm_loss=CURVE[4]))
    assert "repeats step(s) [4]" in convergence_gate(dup, CURVE).summary


def test_flat_and_anticorrelated_curves():
    flat = {s: 2.0 for s in range(10)}
    assert convergence_gate(flat, dict(flat)).status == "pass"
    res = convergence_gate({s: 2.0 + 0.01 * s for s in range(10)}, {s: 2.1 - 0.01 * s for s in range(10)})
    assert res.status == "fail" and "correlation" in res.details["failed"] and res.details["correlation"] < 0


def test_too_few_steps_is_bad_input():
    with pytest.raises(ConfigError, match="at least 4 steps"):
        convergence_gate({0: 2.0, 1: 1.9}, {0: 2.0, 1: 1.9})


def _steps_jsonl(path, curve, **extra):
    path.write_text("".join(StepRecord(step=s, time_s=0.5, tokens=512, lm_loss=v, **extra).model_dump_json() + "\n"
                            for s, v in curve.items()))
    return path


def test_readers_steps_jsonl_json_mapping_and_list(tmp_path):
    a = read_losses(_steps_jsonl(tmp_path / "steps.jsonl", CURVE))
    b = read_losses(_write(tmp_path / "b.json", json.dumps({str(k): v for k, v in CURVE.items()})))
    c = read_losses(_write(tmp_path / "c.json", json.dumps(list(CURVE.values()))))
    assert a.losses == b.losses == c.losses == CURVE
    dup = read_losses(_write(tmp_path / "d.json", '{"0": 2.0, "1": 1.9, "1": 1.8, "2": 1.7}'))
    assert dup.duplicates == [1]


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not JSON"),
    ('{"a": 1.0}', "step 'a' is not an integer"),
    ('{"0": "low"}', "is not a number"),
    ("[]", "no steps"),
    ("[null, null, null, null]", "no step has a loss (4 step(s), every loss null)"),
    ('"a string"', "expected {step: loss}"),
])
def test_bad_loss_files_are_config_errors(tmp_path, text, needle):
    with pytest.raises(ConfigError, match="x.json") as exc:
        read_losses(_write(tmp_path / "x.json", text))
    assert needle in str(exc.value)


def test_cli_exit_codes(capsys, tmp_path):
    ref = _steps_jsonl(tmp_path / "ref.jsonl", CURVE)
    same = _write(tmp_path / "same.json", json.dumps(CURVE))
    high = _write(tmp_path / "high.json", json.dumps({s: v * 1.08 for s, v in CURVE.items()}))
    rc, out, _ = cli(capsys, "check", "convergence", "--candidate", same, "--reference", ref)
    assert rc == 0 and "pass" in out and "correlation 1.000000" in out
    rc, out, _ = cli(capsys, "check", "convergence", "--candidate", high, "--reference", ref, "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["status"] == "fail" and "final_loss" in doc["details"]["failed"]
    assert doc["details"]["thresholds"] == json.loads(json.dumps(vars(PROFILES["bridge"])))
    for argv, needle in [((tmp_path / "missing.json", ref), "cannot read it"),
                         ((_write(tmp_path / "bad.json", "{"), ref), "not JSON"),
                         ((_write(tmp_path / "two.json", "[2.0, 1.9]"), _write(tmp_path / "two2.json", "[2.0, 1.9]")),
                          "at least 4 steps")]:
        rc, out, err = cli(capsys, "check", "convergence", "--candidate", argv[0], "--reference", argv[1])
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1 and out == ""
    rc, _, err = cli(capsys, "check", "convergence", "--candidate", same, "--reference", ref, "--profile", "loose")
    assert rc == 2 and "profile 'loose'" in err


def test_losses_at_the_float_limit_fail_without_numpy_warnings(recwarn):
    """Losses of +-1e308 overflowed numpy's correlation to NaN, printed a RuntimeWarning, and a NaN correlation
    passed the correlation test (NaN < threshold is False)."""
    ref = {s: 2.0 - 0.01 * s for s in range(20)}
    cand = {s: (1e308 if s % 2 else -1e308) for s in range(20)}
    res = convergence_gate(cand, ref)
    assert res.status == "fail" and "correlation" in res.details["failed"]
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
