"""Rows their publisher filed as a performance regression of their release are kept and predicted but left out of
the calibration fit: Qwen3-30B-A3B on H100 and B200 in Megatron-Bridge containers 25.11 and 26.02
(NVIDIA-NeMo/Megatron-Bridge#1998: dropless 2x slower than 25.09's token drop, fixed in 26.02.01), and gpt-oss on
GB200 and GB300 in container 26.06.01 (#5028: 50% slower than 26.06.00 with no config change)."""

from __future__ import annotations

from autotune.cost._sources import known_regression
from autotune.cost.calibrate import fit_kinds
from autotune.cost.measurements import published_measurements

_SRC = "Megatron-Bridge perf archive:"


def test_the_publishers_regression_names_its_releases_model_and_gpus_only():
    for release in ("25.11", "26.02"):
        for gpu in ("H100", "B200"):
            assert "Megatron-Bridge#1998" in known_regression(_SRC + release, "Qwen3-30B-A3B", gpu)
    # the releases around it, the other GPUs, the other models and sources are not named by the issue
    assert not known_regression(_SRC + "25.09", "Qwen3-30B-A3B", "H100")
    assert not known_regression(_SRC + "26.02.01", "Qwen3-30B-A3B", "H100")
    assert not known_regression(_SRC + "26.02", "Qwen3-30B-A3B", "GB200")
    assert not known_regression(_SRC + "26.02", "Qwen3-235B-A22B", "H100")
    assert not known_regression("Megatron-LM examples/moe_recipes README (dev)", "Qwen3-30B-A3B", "H100")
    for gpu in ("GB200", "GB300"):
        assert "Megatron-Bridge#5028" in known_regression(_SRC + "26.06.01", "gpt-oss-120b", gpu)
        for release in ("26.06", "26.08"):  # the releases either side measure the same layout 1.6x faster
            assert not known_regression(_SRC + release, "gpt-oss-120b", gpu)
    assert not known_regression(_SRC + "26.06.01", "DeepSeek-V3", "GB200")


def test_flagged_rows_are_kept_but_never_fitted():
    kept, _ = published_measurements()
    flagged = [m for m in kept if m.regression and "#1998" in m.regression]
    # the four rows the issue covers: H100 5,275 (25.11) and 5,113 (26.02), B200 9,299 and 9,691
    assert sorted(round(m.tokens_per_s_per_gpu) for m in flagged) == [5113, 5275, 9299, 9691]
    assert all("Megatron-Bridge#1998" in m.source for m in flagged)
    # #5028's: gpt-oss-120b GB300 20,288 and GB200 18,304 (26.06.01); nothing else is flagged
    oss = [m for m in kept if m.regression and "#5028" in m.regression]
    assert sorted(round(m.tokens_per_s_per_gpu) for m in oss) == [18304, 20288]
    assert len([m for m in kept if m.regression]) == 6
    # the same page's 25.09 and 26.02.01 H100 rows of the same printed layouts are fitted as usual
    fine = [m for m in kept if m.model == "Qwen3-30B-A3B" and m.gpu == "H100" and m.source.startswith(_SRC)
            and m.source.split(";")[0].endswith((":25.09", ":26.02.01"))]
    assert sorted(round(m.tokens_per_s_per_gpu) for m in fine) == [9058, 10494] and not any(m.regression for m in fine)
    # fit_kinds fits nothing from flagged rows alone (no pool), and something once an unflagged row joins
    assert fit_kinds(flagged) == {}
    assert set(fit_kinds(flagged + fine)) == {"H100"}
