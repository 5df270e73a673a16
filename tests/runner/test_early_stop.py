"""Early trial stops: the steady-state and clearly-losing rules on synthetic step times (pure functions),
the spec's validation, and one real CPU trial (megatron-core over gloo) that ends once steady."""

from __future__ import annotations

import statistics

import pytest
from pydantic import ValidationError

from autotune.layout import Layout
from autotune.runner.loop import clearly_losing, mean_half_width_percent, steady_window
from autotune.trials.spec import EarlyStop, StepRecord, TrialResult

from runner_helpers import cpu_spec, run_local


def test_steady_once_the_mean_step_time_is_known_to_the_stated_accuracy():
    warm = [5.0, 2.0, 1.2]  # warm-up steps are never scored
    steady = [1.00, 1.01, 0.99, 1.00, 1.005]
    assert steady_window(warm + steady[:2], 3, 3, 1.0) is None  # two scored steps: fewer than the window
    # three scored steps: CV 1.0%, t(0.975, 2) x 1.0 / sqrt(3) = 2.5% > 1%; four: 3.18 x 0.82 / 2 = 1.30%;
    # five: 2.78 x 0.74 / sqrt(5) = 0.92% <= 1%
    assert steady_window(warm + steady[:3], 3, 3, 1.0) is None
    assert steady_window(warm + steady[:4], 3, 3, 1.0) is None
    assert steady_window(warm + steady, 3, 3, 1.0) == (3, 7)
    assert mean_half_width_percent(steady) == pytest.approx(0.9198, rel=1e-3)
    assert steady_window(warm + steady[:3], 3, 3, 3.0) == (3, 5)  # a looser accuracy stops sooner
    noisy = [1.0, 1.1, 0.9, 1.05, 0.95]
    assert steady_window(warm + noisy, 3, 3, 1.0) is None
    assert steady_window(warm + noisy, 3, 3, 10.0) == (3, 7)
    # the warm-up steps never enter the interval: five steady steps, of which three are warm-up
    assert steady_window([9.0, 9.0, 9.0, 1.0, 1.0], 3, 3, 1.0) is None
    assert mean_half_width_percent([1.0]) == float("inf")


def test_against_the_full_trials_window_only_the_steps_not_yet_run_can_move_the_mean():
    """With the step cap given, the interval is of the difference from the mean over every scored step the full
    trial would run (finite-population correction sqrt(1 - n / N)): at n = N it is 0, and a sequence the true-mean
    rule keeps running (four steps: 1.30% > 1%) stops when 4 of 6 scored steps are in (1.30 x sqrt(1/3) = 0.75%)."""
    warm = [5.0, 2.0, 1.2]
    steady = [1.00, 1.01, 0.99, 1.00]
    assert steady_window(warm + steady, 3, 3, 1.0) is None  # the true mean: 1.30%
    assert mean_half_width_percent(steady, total=6) == pytest.approx(mean_half_width_percent(steady) / 3**0.5)
    assert steady_window(warm + steady, 3, 3, 1.0, cap=9) == (3, 6)  # 6 scored steps in a 9-step trial
    assert steady_window(warm + steady, 3, 3, 1.0, cap=40) is None  # 37 to come: close to the true-mean rule
    assert mean_half_width_percent(steady, total=4) == 0.0  # every step of the window is in
    assert EarlyStop().cap(20) == 20 and EarlyStop(reference="mean").cap(20) is None  # what steady_window reads
    with pytest.raises(ValidationError):
        EarlyStop(reference="median")


def test_losing_only_when_even_the_optimistic_bound_is_below_the_incumbent():
    tokens, count = 1000, 1
    slow = [10.0, 2.0, 2.0, 2.02, 1.98]  # 500 tokens/s/GPU after warm-up
    assert clearly_losing(slow, 1, tokens, count, incumbent=600.0) is not None
    assert clearly_losing(slow, 1, tokens, count, incumbent=504.0) is None  # within its error bar (best case 504.8)
    assert clearly_losing(slow[:3], 1, tokens, count, incumbent=600.0) is None  # too few scored steps
    jumpy = [10.0, 1.0, 3.0, 1.0, 3.0]
    assert clearly_losing(jumpy, 1, tokens, count, incumbent=600.0) is None  # mean 2 s, but it may be 1 s


def test_early_stop_validates():
    assert EarlyStop().window == 3 and EarlyStop().accuracy_percent == 1.0
    with pytest.raises(ValidationError):
        EarlyStop(window=1)
    for bad in (0, -1, 101):
        with pytest.raises(ValidationError):
            EarlyStop(accuracy_percent=bad)


@pytest.mark.slow
def test_a_real_cpu_trial_stops_once_steady(tmp_path):
    # a generous threshold so that the shared CI machine's jitter cannot keep the trial running
    spec = cpu_spec(Layout(world=1, micro_batch_size=1), number=31, steps=12, warmup_steps=2,
                    workload=dict(steps=12, window=(2, 11)),
                    early_stop=EarlyStop(accuracy_percent=100.0, window=3))
    res = run_local(spec, tmp_path / "t")
    assert res.status == "ok", res.reason
    assert len(res.steps) == 5 and res.window == (2, 4)
    assert res.stopped_early.startswith("steady")
    times = [s.time_s for s in res.steps[2:5]]
    assert res.tokens_per_s_per_gpu == pytest.approx(sum(s.tokens for s in res.steps[2:5]) / sum(times))
    # the measurement's standard error: the window's step-time CV over the root of its 3 steps
    assert res.stderr == pytest.approx(statistics.stdev(times) / statistics.mean(times) / 3 ** 0.5, rel=1e-6)


def test_a_results_standard_error_is_its_windows():
    steps = [StepRecord(step=i, time_s=t, tokens=100) for i, t in enumerate([9.0, 9.0, 1.0, 1.2, 0.8, 1.0])]
    res = TrialResult(study="s", number=0, status="ok", tokens_per_s_per_gpu=100.0, step_time_cv_percent=16.33,
                      window=(2, 5), steps=steps)
    assert res.stderr == pytest.approx(0.1633 / 2.0)  # 4 steps in the window, the warm-up's not counted
    assert res.model_copy(update={"source": "predicted"}).stderr is None  # a prediction has none
    assert res.model_copy(update={"window": None}).stderr is None


def test_the_collector_runs_between_steps_not_inside_them():
    """manual_gc (Megatron's --manual-gc): off while steps are timed, back as it was afterwards, even on an error."""
    import gc

    from autotune.runner.loop import manual_gc

    assert gc.isenabled()
    with manual_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), manual_gc():
        raise RuntimeError("a failed step")
    assert gc.isenabled()
    gc.disable()
    try:
        with manual_gc():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_the_trial_summary_states_the_standard_error(capsys, tmp_path):
    """`autotune trial run`'s table gives the measurement's standard error beside tokens/s/GPU."""
    from autotune.cli.trial import _summary

    steps = [StepRecord(step=i, time_s=t, tokens=100) for i, t in enumerate([9.0, 1.0, 1.2, 0.8, 1.0])]
    res = TrialResult(study="s", number=3, status="ok", tokens_per_s_per_gpu=100.0, step_time_s=1.0,
                      step_time_cv_percent=16.33, window=(1, 4), steps=steps)
    spec = cpu_spec(Layout(world=1, micro_batch_size=1), number=3)
    _summary(res, spec, "TP1", "tiny", tmp_path)
    out = capsys.readouterr().out
    assert "100.0 +/-8.2% (standard error) (steps 1..4)" in out
