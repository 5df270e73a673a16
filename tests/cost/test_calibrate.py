"""Calibration: the fit recovers known factors, stays put with few rows, published rows map or say why,
the files round-trip, and `autotune calibrate` handles bad input with one-line errors (exit 2)."""

import json
from dataclasses import replace

import numpy as np
import pytest

from autotune.cli.main import main
from autotune.cost.calibrate import (SHIPPED, Calibration, Measurement, fit, fit_kinds, load_calibration, predict,
                                     published_measurements, read_calibrations, save_calibrations, seed_measurements)
from autotune.catalog import GPUS
from autotune.cost._published import catalog_name, gpu_kind
from autotune.cost.time import TimeCoefficients
from autotune.errors import ConfigError
from autotune.layout import Layout, Recompute

TRUE = {"compute_dense": 0.8, "compute_experts": 1.35, "ep_comm": 0.7, "bubble": 1.25, "layer_overhead": 1.6}


def _synthetic(factors: dict) -> list[Measurement]:
    """Rows whose 'measured' tokens/s is the model's own prediction under known factors: a hybrid MoE, a
    dense model and a coarse MoE, so dense GEMMs, experts, all-to-all and bubble are told apart."""
    rc = Recompute("full", "uniform", 1)
    spec = [("Qwen3.5-122B-A10B", dict(pp=4, ep=8, recompute=Recompute("full", "uniform", 2))),
            ("Qwen3.5-122B-A10B", dict(pp=2, ep=16, recompute=rc, dispatcher="flex")),
            ("Qwen3.5-122B-A10B", dict(pp=8, ep=4, recompute=rc, max_tokens_per_gpu=16384)),
            ("Qwen3.5-122B-A10B", dict(pp=4, ep=16, recompute=Recompute("full", "uniform", 3))),
            ("Qwen3.5-122B-A10B", dict(pp=2, ep=32, recompute=rc)),
            ("Llama-3.1-70B", dict(tp=8, pp=2, recompute=Recompute("selective"))),
            ("Llama-3.1-70B", dict(tp=4, pp=4, recompute=rc)),
            ("Llama-3.1-70B", dict(tp=8, pp=8, recompute=rc, max_tokens_per_gpu=16384)),
            ("Mixtral-8x7B-v0.1", dict(tp=2, pp=4, ep=8, recompute=rc)),
            ("Mixtral-8x7B-v0.1", dict(tp=1, pp=8, ep=8))]
    rows = []
    for model, kw in spec:
        kw = {"max_tokens_per_gpu": 8192, "precision_aware_optimizer": True, **kw}
        rows.append(Measurement(model, "H200", 64, Layout(world=64, **kw), 1000.0, source="synthetic"))
    truth = Calibration("H200", TimeCoefficients(scale=factors))
    return [replace(m, tokens_per_s_per_gpu=float(p)) for m, p in zip(rows, predict(rows, truth))]


def test_fit_recovers_known_factors():
    rows = _synthetic(TRUE)
    cal = fit(rows, base=Calibration("H200"), terms=tuple(TRUE), prior_sigma=3.0)
    for term, want in TRUE.items():
        assert cal.factors[term] == pytest.approx(want, rel=0.03), term
    assert cal.report["rms_log_error_after"] < 0.005
    assert set(cal.report["fitted_terms"]) == set(TRUE)


def test_fit_leaves_terms_no_row_exercises():
    cal = fit(_synthetic(TRUE), base=Calibration("H200"), prior_sigma=3.0)
    assert "cp_comm" not in cal.report["fitted_terms"] and cal.factors["cp_comm"] == 1.0  # no row uses CP
    assert "optimizer" not in cal.report["fitted_terms"]  # below 1% of every row's step time


def test_one_or_two_rows_cannot_run_away():
    seed = seed_measurements()[0]
    base = load_calibration("H200")
    meas = seed.tokens_per_s_per_gpu
    for slower in (2.0, 10.0):  # a trial 2x (or absurdly 10x) slower than predicted
        rows = [replace(seed, tokens_per_s_per_gpu=float(predict([seed], base)[0]) / slower)]
        cal = fit(rows, base=base)
        ratios = np.array([cal.factors[k] / base.factors[k] for k in cal.factors])
        # spread over the terms, none runs away (experts, the largest term of this row, moves most)
        # was < 1.6 before the 405B/DSv3/FSDP rows joined the Hopper pool: H200 now starts from experts x1.5, so
        # the experts term is the largest lever of this row and moves ~1.8x under a 10x outlier
        assert ratios.max() < 2.0 and ratios.min() > 0.9
        for k in ("cp_comm", "tp_comm", "dp_comm", "optimizer"):  # no share in this row: untouched
            assert cal.factors[k] == base.factors[k]
        moved = float(predict(rows, base)[0] / predict(rows, cal)[0])
        assert 1.2 < moved < slower  # it moves toward the row, a 10x outlier only as far as a 2x one
    two = [replace(seed, tokens_per_s_per_gpu=meas * 0.8), replace(seed_measurements()[2], tokens_per_s_per_gpu=1900.0)]
    cal = fit(two, base=base)
    assert all(0.7 < cal.factors[k] / base.factors[k] < 1.5 for k in cal.factors)
    assert fit([], base=base).factors == base.factors


def test_repeated_rows_do_not_outvote_distinct_ones():
    rows = _synthetic(TRUE)
    once = fit(rows, base=Calibration("H200"))
    five = fit(rows + [rows[0]] * 4, base=Calibration("H200"))
    for term in TRUE:
        assert five.factors[term] == pytest.approx(once.factors[term], rel=1e-3)


def test_source_names_and_gpus_map_onto_the_catalog():
    for src, want in [("LLAMA3_70B", "Llama-3.1-70B"), ("Llama3 70B", "Llama-3.1-70B"),
                      ("LLAMA3.1_405B", "Llama-3.1-405B"), ("DeepSeekV3", "DeepSeek-V3"),
                      ("DeepSeek V3 671B", "DeepSeek-V3"), ("Qwen3_30B_a3B", "Qwen3-30B-A3B"),
                      ("Qwen3 MoE 30B", "Qwen3-30B-A3B"), ("Qwen3-30B-A3B", "Qwen3-30B-A3B"),
                      ("Qwen3_235B_a22B", "Qwen3-235B-A22B"), ("GPT OSS 120B", "gpt-oss-120b"),
                      ("Mixtral 8x7B", "Mixtral-8x7B-v0.1"), ("Mixtral 8x22B", "Mixtral-8x22B-v0.1"),
                      ("Qwen3-Next", "Qwen3-Next-80B-A3B-Instruct")]:
        assert catalog_name(src) == (want, None), src
    assert catalog_name("Qwen3_30B_a3B (tokendrop)")[0] == "Qwen3-30B-A3B"  # token drop is a Layout setting now
    assert catalog_name("DeepSeekV4 Flash") == ("DeepSeek-V4-Flash", None)
    assert "not in the catalog" in catalog_name("DeepSeek-V3.2-Exp")[1]
    assert gpu_kind("H100 (Grand Teton, 96GB HBM2e, 500W power limit)") == ("H100", None)
    assert gpu_kind("H200 (4 per node)") == ("H200", 4)
    assert gpu_kind("GB200") == ("GB200", None)
    assert gpu_kind("MI300X") == (None, None)


def test_every_catalog_name_and_hub_spellings_of_it_map_onto_the_catalog():
    """A table that names a model the way the catalog does ('NVIDIA-Nemotron-3-Nano-30B-A3B', 'Qwen3.5-397B-A17B')
    was skipped as 'not in the catalog' unless a table-spelling pattern happened to match it."""
    from autotune.catalog import model_names

    for name in model_names():
        assert catalog_name(name) == (name, None), name
        assert catalog_name(name.upper().replace("-", "_")) == (name, None), name
    for src, want in [("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", "NVIDIA-Nemotron-3-Super-120B-A12B"),
                      ("NVIDIA Nemotron 3 Super", "NVIDIA-Nemotron-3-Super-120B-A12B"),
                      ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B"), ("Qwen/Qwen3-30B-A3B-Base", "Qwen3-30B-A3B"),
                      ("Qwen3_5_27B", "Qwen3.5-27B"), ("deepseek-ai/DeepSeek-V3", "DeepSeek-V3")]:
        assert catalog_name(src) == (want, None), src
    assert catalog_name("Qwen3-8B")[0] is None  # no config in the catalog
    for text, kind in [("NVIDIA H100 80GB HBM3", "H100"), ("H100-SXM5-80GB", "H100"), ("GB200 NVL72", "GB200"),
                       ("DGX-B200", "B200"), ("B300 (8 per node)", "B300"), ("A100-SXM4-80GB", None)]:
        assert gpu_kind(text)[0] == kind, text



def test_the_fp8_recipes_spelt_as_megatron_bridge_and_nemo_name_them_are_read():
    from autotune.cost._published import precision_of

    src = "Megatron-Bridge perf summary:26.08"
    for text, want in [("FP8-DS", "fp8-delayed"), ("fp8_ds", "fp8-delayed"), ("FP8 (delayed)", "fp8-delayed"),
                       ("FP8 Hybrid", "fp8-delayed"), ("FP8-SC", "fp8-blockwise"), ("FP8 subchannel", "fp8-blockwise"),
                       ("fp8_cs", "fp8-tensorwise"), ("FP8-MX", "mxfp8"), ("bfloat16", "bf16"), ("BF16 (mixed)", "bf16")]:
        assert precision_of(text, src)[0] == want, text
    assert precision_of("BF16/FP8", src)[0] is None  # which one ran is not said


def test_published_rows_kept_and_skipped_with_reasons():
    kept, skipped = published_measurements()
    assert len(kept) >= 10 and all(m.gpu in GPUS for m in kept)
    reasons = " | ".join(why for _, why in skipped)
    for text in ("not in the catalog", "missing field"):
        assert text in reasons
    gpt = [m for m in kept if m.model == "gpt-oss-120b" and m.gpu == "H100"]
    assert gpt and gpt[0].layout.pp == 4 and gpt[0].layout.ep == 8 and gpt[0].count == 64
    # the table leaves recompute blank; Megatron-Bridge's gpt-oss perf recipes set layernorm + moe_act
    assert all(str(m.layout.recompute) == "selective:layernorm,moe_act" and "Megatron-Bridge" in m.source for m in gpt)
    dropped = [m for m in kept if "token drop" in m.source]  # 25.09's tokendrop rows: capacity factor 1.0, padded
    assert dropped and all(m.layout.moe_capacity_factor == 1.0 for m in dropped)
    balanced = [m for m in kept if m.model == "DeepSeek-V3" and m.source.startswith("Megatron-Bridge")]
    assert balanced and all(m.force_balance for m in balanced)  # the page's footnote: force-balanced routing
    bridge = [m for m in kept if m.source.startswith("Megatron-Bridge perf")]
    assert bridge and not any(m.grads_fp32 for m in bridge)  # its perf recipes reduce gradients in bf16
    bf16_scripts = ("Megatron-Bridge perf", "Megatron-LM examples/llama", "NeMo 24.07")  # _sources.py: their scripts
    # NeMo 2.4's perf scripts reduce in bf16 and its Llama 4 perf recipes drop tokens (_sources.py, _presets.py)
    nemo_llama4 = [m for m in kept if m.source.startswith("NeMo Framework 25.") and m.model.startswith("Llama-4")]
    assert nemo_llama4 and all(not m.grads_fp32 and m.layout.moe_capacity_factor == 1.0 for m in nemo_llama4)
    assert all(m.grads_fp32 for m in kept
               if not m.source.startswith(bf16_scripts) and not any(m is n for n in nemo_llama4))
    assert all(m.weight < 1 for m in kept if "derived from" in m.source)  # TFLOP/s-derived rows count less
    big = [m for m in kept if m.model == "Llama-3.1-405B" and m.layout.pp * m.layout.vpp == 16]
    assert big and all(m.layout.layer_split == (7,) + (8,) * 14 + (7,) for m in big)  # embedding + loss counted
    assert all("assumed layer split" in m.source for m in big)


CSV_HEAD = ("source,model,gpu,num_gpus,seq_len,global_batch,micro_batch,tp,pp,cp,vp,ep,etp,precision,recompute,"
            "tokens_per_s_per_gpu,tflops_per_gpu,mfu,notes\n")


def test_a_user_csv_maps_each_row_or_says_why(tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text(CSV_HEAD
                 + "me,Qwen3-30B-A3B,H100,16,4096,256,1,1,2,1,,8,,BF16,,9000,,,mine\n"
                 + "me,Qwen3-30B-A3B,H100,16,4096,256,1,1,5,1,,8,,BF16,,9000,,,bad PP\n"
                 + "me,Llama3 70B,H100,64,8192,128,1,1,1,2,,,,BF16,,866,,,FSDP=32\n"
                 + "me,Qwen3-30B-A3B,H100,16,4096,256,1,1,1,1,,,,BF16,,9000,,,no EP\n"
                 + "me,Qwen3-30B-A3B,H100,16,4096,256,1,1,1,1,,8,,NVFP4,,9000,,,fp4\n"
                 + "me,GPT OSS 120B,H100,64,4096,1280,1,1,4,1,,8,,BF16,,5800,,,not a Megatron-Bridge row\n")
    kept, skipped = published_measurements(p)
    assert len(kept) == 3 and kept[0].layout == Layout(world=16, pp=2, ep=8, sequence_parallel=False,
                                                       micro_batch_size=1)
    assert kept[2].layout.recompute.granularity == "none" and kept[2].grads_fp32  # presets: their own source only
    why = [w for _, w in skipped]
    assert "PP x CP = 5 does not divide the 16 GPUs" in why[0]
    # NVFP4 is read as a precision; a Hopper row asking for it is not representable (no FP4 tensor cores)
    assert why[1] == "missing field(s): ep" and "H100 has no FP4 tensor cores" in why[2]
    fsdp = [m for m in kept if m.model == "Llama-3.1-70B"]
    assert fsdp and fsdp[0].layout.fsdp and fsdp[0].layout.dp == 32  # FSDP=32 x CP2 = 64 GPUs: Megatron FSDP


def test_files_round_trip_and_the_env_file_wins(tmp_path, monkeypatch):
    cals = fit_kinds(seed_measurements())
    assert set(cals) == {"H200"}
    path = save_calibrations(tmp_path / "c.json", cals)
    save_calibrations(path, {"B200": Calibration("B200", TimeCoefficients(scale={"bubble": 2.0}))})  # merges
    back = read_calibrations(path)
    assert set(back) == {"H200", "B200"} and back["H200"].factors == pytest.approx(cals["H200"].factors)
    monkeypatch.setenv("AUTOTUNE_CALIBRATION", str(path))
    assert load_calibration("b200").factors["bubble"] == 2.0
    assert load_calibration("H100").factors == read_calibrations(SHIPPED)["H100"].factors  # falls through
    monkeypatch.setenv("AUTOTUNE_CALIBRATION", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_calibration("H200")
    monkeypatch.delenv("AUTOTUNE_CALIBRATION")
    assert load_calibration("cpu").factors["bubble"] == 1.0


def test_shipped_calibration_is_current():
    """Re-fitting the shipped inputs reproduces the shipped factors; if the physics changed, regenerate with
    `autotune calibrate --out src/autotune/cost/data/calibration.json` (with AUTOTUNE_CALIBRATION unset)."""
    shipped = read_calibrations(SHIPPED)
    fresh = fit_kinds(seed_measurements() + published_measurements()[0])
    assert set(fresh) == set(shipped)
    for kind in shipped:
        assert fresh[kind].factors == pytest.approx(shipped[kind].factors, rel=2e-3), kind


def run(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_fits_writes_and_prints(capsys, tmp_path):
    out_file = tmp_path / "cal.json"
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H200", "--no-published", "--out", str(out_file), "--json")
    assert rc == 0
    d = json.loads(out)
    assert set(d["gpus"]) == {"H200"} and len(d["gpus"]["H200"]["rows"]) == 3
    assert read_calibrations(out_file)["H200"].factors == pytest.approx(d["gpus"]["H200"]["factors"])
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H200", "--no-published", "--out", str(out_file))
    assert rc == 0 and "fitted factors" in out and "AUTOTUNE_CALIBRATION" in out


def test_cli_shows_other_stacks_apart_with_every_term_named_at_80_columns(capsys, monkeypatch):
    """H100's published rows include torchtitan's, NeMo AutoModel's and Llama 3's: their factors are a second table
    (GPU+framework), so the first keeps every term's name whole at 80 columns (one table of all of them cut it)."""
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H100")
    assert rc == 0 and "other training stacks' factors" in out and "torchtitan" in out
    from autotune.cost.time import STEP_TERMS
    assert all(f"│ {term} " in out for term in STEP_TERMS)
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H100", "--json")
    assert {"H100", "H100+torchtitan", "H100+automodel"} <= set(json.loads(out)["gpus"])


def test_cli_says_when_only_another_stacks_factors_were_fitted(capsys, tmp_path):
    """A user's torchtitan rows fit "H100+torchtitan", which no search reads: the fit says H100's Megatron factors
    stay as they are; with Megatron rows beside them it says nothing."""
    row = {"model": "Llama-3.1-8B", "gpu": "H100", "count": 8, "layout": "TP1 PP1 EP1 DP8", "seq_len": 8192,
           "global_batch": 64, "tokens_per_s_per_gpu": 6000.0, "framework": "torchtitan", "attention_kernel": "sdpa"}
    f = tmp_path / "mine.json"
    f.write_text(json.dumps([row]))
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H100", "--no-published", "--no-seeds", "--measurements", str(f),
                     "--json")
    d = json.loads(out)
    assert rc == 0 and set(d["gpus"]) == {"H100+torchtitan"} and "no Megatron rows for H100" in d["notes"][0]
    f.write_text(json.dumps([row, {**row, "framework": "megatron", "attention_kernel": "te"}]))
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H100", "--no-published", "--no-seeds", "--measurements", str(f),
                     "--json")
    d = json.loads(out)
    assert rc == 0 and set(d["gpus"]) == {"H100", "H100+torchtitan"} and "notes" not in d


def test_cli_without_out_shows_the_fit_and_writes_nothing(capsys, tmp_path, monkeypatch):
    """Nothing is written outside runs/ unless --out says where (it used to default to ~/.config/autotune)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H200", "--no-published", "--json")
    d = json.loads(out)
    assert rc == 0 and d["written"] is None and set(d["gpus"]) == {"H200"}
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H200", "--no-published")
    assert rc == 0 and "nothing written" in out and "--out FILE" in out
    assert list(tmp_path.rglob("*")) == []
    rc, _, err = run(capsys, "calibrate", "--gpu", "H200", "--out", "")
    assert rc == 2 and "--out ''" in err and list(tmp_path.rglob("*")) == []


@pytest.mark.parametrize("argv,msg", [
    (["--gpu", "H300"], "unknown GPU"),
    (["--gpu", "cpu"], "no throughput model"),
    (["--no-seeds", "--no-published"], "no measured rows"),
    (["--measurements", "runs.txt"], ".csv"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, msg):
    rc, _, err = run(capsys, "calibrate", "--out", str(tmp_path / "c.json"), *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_cli_csv_missing_columns_is_exit_2(capsys, tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text("model,gpu,num_gpus\nQwen3-30B-A3B,H100,16\n")
    rc, _, err = run(capsys, "calibrate", "--measurements", str(p), "--out", str(tmp_path / "c.json"))
    assert rc == 2 and "missing column(s)" in err and "seq_len" in err


def test_cli_reads_a_json_list_of_measurements(capsys, tmp_path):
    p = tmp_path / "trials.json"
    p.write_text("\ufeff" + json.dumps([{"model": "Qwen3.5-122B-A10B", "gpu": "H200", "count": 32,  # a BOM is allowed
                                         "layout": "TP1 PP2 EP16 DP16", "recompute": "full:uniform:1",
                                         "max_tokens_per_gpu": 8192, "tokens_per_s_per_gpu": 2100.0,
                                         "source": "my trial"}]), encoding="utf-8")
    rc, out, _ = run(capsys, "calibrate", "--gpu", "H200", "--no-published", "--measurements", str(p),
                     "--out", str(tmp_path / "c.json"), "--json")
    assert rc == 0
    rows = json.loads(out)["gpus"]["H200"]["rows"]
    assert len(rows) == 4 and rows[-1]["row"].startswith("Qwen3.5-122B-A10B 32xH200 TP1 PP2 EP16 DP16")
    p.write_text(json.dumps([{"model": "Qwen3.5-122B-A10B", "gpu": "H200"}]))
    rc, _, err = run(capsys, "calibrate", "--measurements", str(p), "--out", str(tmp_path / "c.json"))
    assert rc == 2 and "measurement 0" in err


_ROW = {"model": "Llama-3.1-8B", "gpu": "H100", "count": 8, "layout": "TP1 PP1 DP8", "tokens_per_s_per_gpu": 9000.0}


@pytest.mark.parametrize("row, msg", [
    ({**_ROW, "layout": [1, 2]}, "field layout: give degrees like \"TP1 PP4 EP8 DP8\" or an object of layout fields, got list"),
    ({**_ROW, "layout": None}, "got NoneType"),
    ({**_ROW, "bogus": 1}, "unknown field 'bogus'"),
    ({**_ROW, "quant_overrides": 5}, "field quant_overrides: give a list"),
    ({**_ROW, "count": 32, "layout": "TP8 PP12 DP1"}, "but count is 32; use count 96"),
    ({k: v for k, v in _ROW.items() if k != "layout"}, "missing field(s) layout"),
])
def test_a_json_measurement_with_a_bad_field_is_named_in_its_own_words(capsys, tmp_path, row, msg):
    """Not Python's ('list' object has no attribute 'world'), nor a CLI flag calibrate does not have (--count)."""
    p = tmp_path / "m.json"
    p.write_text(json.dumps([row]))
    rc, _, err = run(capsys, "calibrate", "--no-published", "--measurements", str(p))
    assert rc == 2 and msg in err and "object has no attribute" not in err and len(err.strip().splitlines()) == 1


def test_a_measurements_file_without_a_usable_row_and_an_unmergeable_out_are_refused(capsys, tmp_path):
    """A file whose rows are all skipped (or none) fitted the other rows without a word; --out onto a file that is
    not a calibration failed after the fit, suggesting the very command that failed."""
    header = tmp_path / "h.csv"
    header.write_text("source,model,gpu,num_gpus,seq_len,global_batch,micro_batch,tp,pp,cp,vp,ep,etp,precision,"
                      "recompute,tokens_per_s_per_gpu,tflops_per_gpu,mfu,notes\n")
    rc, _, err = run(capsys, "calibrate", "--measurements", str(header))
    assert rc == 2 and "no usable row (the file has none)" in err
    good = tmp_path / "g.json"
    good.write_text(json.dumps([_ROW]))
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    rc, _, err = run(capsys, "calibrate", "--no-published", "--measurements", str(good), "--out", str(bad))
    assert rc == 2 and "is not a calibration" in err and "move it away or choose another --out" in err
    assert bad.read_text() == "not json"


def test_rows_take_the_settings_of_their_sources_recipe():
    """A published row names its layout; the settings come from its source's recipe of that release (named in the
    row's provenance) or from its notes: EP overlap, flex dispatcher, CUDA graphs, token drop, forced balance."""
    kept, skipped = published_measurements()
    h100 = [m for m in kept if m.model == "DeepSeek-V3" and m.gpu == "H100" and m.source.startswith("Megatron-Bridge")]
    assert h100 and all(m.layout.ep_overlap and m.layout.dispatcher == "flex" for m in h100)  # 25.09 run_script.py
    assert all("v0.1.0rc4" in m.source for m in h100)
    hybrid = [m for m in kept if "moe-optimization" in m.source]  # HybridEP + EP overlap + router graphs (notes)
    assert hybrid and hybrid[0].layout.ep_overlap and hybrid[0].layout.cuda_graphs == "router"
    # the full-iteration recipes (v0.5.x and v0.6.0, CuTe-DSL fused grouped MLP and A2A overlap): the paged
    # stash (full graphs of dropless experts on HybridEP), FP8 attention and the MXFP8 output layer where they set them
    stash = [m for m in kept if m.source.startswith("Megatron-Bridge perf") and m.layout.cuda_graphs == "full"
             and m.model in ("gpt-oss-120b", "Qwen3-30B-A3B", "DeepSeek-V3") and "25.09" not in m.source]
    assert len(stash) >= 15 and all(m.layout.dispatcher == "hybridep" and m.layout.moe_capacity_factor == 0
                                    and m.layout.ep_overlap for m in stash)  # the paged stash's megatron-core
    assert all(m.fp8_attention for m in stash if m.model == "gpt-oss-120b")
    assert any(m.fp8_output_proj for m in stash if m.model == "DeepSeek-V3" and "26.08" in m.source)
    assert not any("read as off" in m.source for m in stash)
    assert not any("paged_stash" in why or "fp8_dot_product_attention" in why for _, why in skipped)
    # 25.09 (v0.1.0rc4's perf matrix): `cuda_graphs: true` is megatron-core's per-layer graphs of the whole layer:
    # a dense layer's `attn`; under Qwen3's token drop with padding every MoE kernel too, priced as `full`
    v09 = {(m.model, m.gpu, m.precision): m.layout for m in kept if "archive:25.09" in m.source}
    assert v09[("Llama-3.1-8B", "GB200", "mxfp8")].cuda_graphs == "attn"
    assert v09[("Llama-3.1-8B", "GB200", "fp8-tensorwise")].cuda_graphs == "none"
    assert v09[("Llama-3.1-8B", "B200", "fp8-tensorwise")].cuda_graphs == "attn"
    q = v09[("Qwen3-30B-A3B", "B200", "fp8-tensorwise")]
    assert q.cuda_graphs == "full" and q.moe_capacity_factor == 1.0 and q.dispatcher == "alltoall"
    assert v09[("Qwen3-30B-A3B", "H100", "fp8-tensorwise")].cuda_graphs == "none"
    # 26.06 (v0.5.0): DeepSeek-V3's and gpt-oss's family scripts put the output layer under MXFP8 on GB300 / GB200
    v26 = [m for m in kept if "archive:26.06;" in m.source and m.precision == "mxfp8"
           and m.model in ("gpt-oss-120b", "DeepSeek-V3")]
    assert {m.gpu for m in v26 if m.fp8_output_proj} == {"GB300", "GB200"}
    assert not any(m.fp8_output_proj for m in v26 if m.gpu == "B300")  # v0.5.1 adds DeepSeek-V3's B300, not v0.5.0
    auto = [m for m in kept if m.source.startswith("NeMo AutoModel") and m.model != "Llama-3.1-405B"]
    assert auto and all(str(m.layout.recompute) == "full:uniform:1" for m in auto)  # activation_checkpointing
    titan = [m for m in kept if m.source.startswith("torchtitan") and m.layout.pp > 1]
    # the 2024-12 page (torchtitan 9dec370): the local batch in PP-degree micro-batches (Table 5: 32 rows in 8 of 4,
    # Table 6: 8 rows in 8 of 1); pages after pytorch/torchtitan#1073: pipeline_parallel_microbatch_size 1
    assert titan and all(m.layout.micro_batch_size == (4 if m.seq_len == 8192 else 1) for m in titan)


def test_a_layout_no_recipe_has_takes_its_gpu_and_precisions_recipe_else_what_all_the_models_recipes_set():
    """The perf scripts load the recipe of the row's model, GPU and precision and overlay the command line's layout:
    a page layout no recipe of its release has runs that recipe's settings but its FSDP and offload (Llama 3.1 405B
    GB300: TP comm overlap); with no recipe for its GPU, what every recipe of the model sets, nothing they disagree
    on (Llama 3.1 70B's TP overlap differs between recipes)."""
    from autotune.cost._presets import row_settings
    lay = {"tp": 2, "pp": 8, "cp": 2, "vpp": 4, "ep": 1, "micro_batch_size": 1}
    row = {"source": "Megatron-Bridge perf archive:26.02.01", "model": "LLAMA3.1-405B"}
    out = row_settings(row, "Llama-3.1-405B", "GB300", "fp8-tensorwise", lay, 1536, False)
    assert out["layout"]["tp_comm_overlap"] is True and "GB300 fp8-tensorwise recipe's settings" in " ".join(out["read"])
    out = row_settings(row, "Llama-3.1-70B", "GB300", "fp8-tensorwise", {**lay, "tp": 1, "pp": 3}, 128, False)
    assert not out["layout"].get("fsdp") and not out["layout"].get("activation_offload_layers")  # its TP1 PP1 recipe's
    out = row_settings(row, "Llama-3.1-70B", "H200", "fp8-tensorwise", {**lay, "pp": 3}, 128, False)
    assert not out["layout"].get("tp_comm_overlap") and "recipes' shared settings" in " ".join(out["read"])
    # a container newer than every release read runs the newest release's recipes, and the provenance says so
    out = row_settings({**row, "source": "Megatron-Bridge perf archive:99.01"}, "Llama-3.1-405B", "GB300",
                       "fp8-tensorwise", lay, 1536, False)
    assert "container 99.01 is not among the releases read" in " ".join(out["read"])
    out = row_settings({**row, "source": "Megatron-Bridge perf archive:latest"}, "Llama-3.1-405B", "GB300",
                       "fp8-tensorwise", lay, 1536, False)
    assert "tp_comm_overlap" not in out["layout"] and "Megatron's defaults" in " ".join(out["read"])


def test_a_source_that_says_its_tp_communication_overlaps_is_read_so():
    """The Megatron-LM README's weak-scaling rows say "TP/DP/PP comm overlap on": with TP > 1 that is
    --tp-comm-overlap (named in the provenance); at TP 1 there is nothing to overlap; a row that does not say
    so is left as Megatron's default."""
    from autotune.cost._presets import row_settings
    lay = {"tp": 8, "pp": 2, "cp": 1, "vpp": 1, "ep": 1, "micro_batch_size": 1}
    row = {"source": "Megatron-LM README (weak scaling, MCore r0.8-era)", "model": "GPT 70B (dense)",
           "notes": "heads=64, hidden=8192; DP=48; TP/DP/PP comm overlap on; end-to-end"}
    out = row_settings(row, "Megatron-GPT-70B", "H100", "bf16", lay, 384, False)
    assert out["layout"]["tp_comm_overlap"] is True and "TP comm overlap on" in " ".join(out["read"])
    assert "tp_comm_overlap" not in row_settings(row, "Megatron-GPT-70B", "H100", "bf16", {**lay, "tp": 1}, 384,
                                                 False)["layout"]
    assert "tp_comm_overlap" not in row_settings({**row, "notes": "DP=48"}, "Megatron-GPT-70B", "H100", "bf16", lay,
                                                 384, False)["layout"]
    kept, _ = published_measurements()
    gpt = [m for m in kept if m.model.startswith("Megatron-GPT")]
    assert len(gpt) == 9 and all(m.layout.tp_comm_overlap == (m.layout.tp > 1) for m in gpt)


def test_a_blank_vp_with_pipeline_stages_takes_the_releases_recipe():
    """A page row with PP > 1 and no VP, beside its release's recipes that all run that TP/PP/CP/EP at one VP and
    micro-batch, is read as that recipe (named in the provenance); a row with its VP given is left as published."""
    from autotune.cost._presets import row_settings
    lay = {"tp": 1, "pp": 4, "cp": 1, "vpp": 1, "ep": 1, "micro_batch_size": 2}
    row = {"source": "Megatron-Bridge perf archive:26.02.01", "model": "LLAMA3_70B", "vp": ""}
    out = row_settings(row, "Llama-3.1-70B", "GB300", "mxfp8", lay, 256, False)
    assert out["layout"]["vpp"] == 5 and out["layout"]["micro_batch_size"] == 1
    assert "leaves VP blank" in " ".join(out["read"])
    out = row_settings({**row, "vp": "1"}, "Llama-3.1-70B", "GB300", "mxfp8", lay, 256, False)
    assert "vpp" not in out["layout"]


def test_torchtitans_interleaved_schedule_runs_two_stages_per_rank():
    kept, _ = published_measurements()
    titan = [m for m in kept if m.source.startswith("torchtitan") and m.model == "Llama-3.1-405B" and m.seq_len == 8192]
    inter = [m for m in titan if "VP 2 (torchtitan" in m.source]
    assert len(inter) == 1 and inter[0].layout.vpp == 2
    assert all(m.layout.vpp == 1 for m in titan if m not in inter)


def test_torchtitan_before_1073_splits_the_local_batch_into_pp_degree_micro_batches():
    """torchtitan 9dec370 (the 2024-12 H100 page): build_pipeline_schedule runs n_microbatches =
    experimental.pipeline_parallel_microbatches or the PP degree; #1073 (2025-04) replaced it with
    pipeline_parallel_microbatch_size (default 1). Table 5's 405B at PP 8, local batch 32: 8 micro-batches of 4 rows."""
    from autotune.cost._published import map_row
    row = {"source": "torchtitan benchmarks llama3_h100_202412 (Table 5)", "model": "Llama 3.1 405B",
           "gpu": "H100 (Grand Teton, 96GB HBM2e, 500W power limit)", "num_gpus": "512", "seq_len": "8192",
           "global_batch": "256", "micro_batch": "32", "tp": "8", "pp": "8", "cp": "1", "vp": "",
           "precision": "FP8 (Float8)", "recompute": "full AC", "tokens_per_s_per_gpu": "100",
           "notes": "FSDP=8; PP schedule 1F1B; torch.compile + AsyncTP"}
    got = map_row(row)
    assert got["layout"]["micro_batch_size"] == 4 and "8 micro-batches of 4 rows" in got["source"]
    later = map_row({**row, "source": "torchtitan benchmarks some_2025_page"})
    assert later["layout"]["micro_batch_size"] == 1  # pipeline_parallel_microbatch_size default


def test_other_stacks_rows_fit_their_own_calibration_and_leave_megatrons_alone():
    """A GPU kind's factors are Megatron's: torchtitan's H100 rows fit "H100+torchtitan" (prior: H100's), and
    adding or dropping them leaves H100's factors as they were; a row is predicted with its stack's; a stack
    with no calibration of its own borrows its kind's, and says so."""
    from autotune.cost.calibrate import calibration_for, stack_kind

    kept, _ = published_measurements()
    h100 = [m for m in kept if m.gpu == "H100" and not m.regression]
    titan = [m for m in h100 if m.framework == "torchtitan"]
    assert titan and len(titan) < len(h100)
    both = fit_kinds(h100, ["H100"])
    alone = fit_kinds([m for m in h100 if m.framework != "torchtitan"], ["H100"])
    assert both["H100"].factors == pytest.approx(alone["H100"].factors)
    assert "H100+torchtitan" in both and "H100+torchtitan" not in alone
    assert both["H100+torchtitan"].factors != pytest.approx(both["H100"].factors)
    assert calibration_for(titan[0], both) is both["H100+torchtitan"]
    assert calibration_for(titan[0], alone) is alone["H100"]
    assert stack_kind("H100", "megatron") == "H100" and stack_kind("H100", "torchtitan") == "H100+torchtitan"
    own = load_calibration("H100")
    borrowed = load_calibration("H100+nosuchstack")
    assert borrowed.factors == own.factors and "no nosuchstack rows fitted" in borrowed.provenance


def test_a_table_with_a_bom_other_header_spellings_and_fewer_columns_is_read(tmp_path):
    """Another table in the published columns: a byte-order mark, headers in other case and spacing, and no
    column for what it does not vary (CP, VPP, ETP, micro-batch, recompute, TFLOP/s, notes) reads like ours."""
    from autotune.cost.measurements import published_measurements

    p = tmp_path / "other.csv"
    p.write_text("\ufeffSource,Model,GPU,Num GPUs,seq-len,Global_Batch,TP,PP,EP,Precision,tokens_per_s_per_gpu\r\n"
                 "Megatron-Bridge perf archive:26.04,Qwen3-30B-A3B,H100,16,4096,1024,1,1,16,FP8-CS,\"8,901\"\r\n"
                 "my cluster,Qwen3-30B-A3B,H100,16,4096,1024,1,1,16,,8000\r\n", encoding="utf-8")
    kept, skipped = published_measurements(p)
    assert len(kept) == 1 and kept[0].tokens_per_s_per_gpu == 8901.0 and kept[0].precision == "fp8-tensorwise"
    assert kept[0].source.startswith("Megatron-Bridge perf archive:26.04")  # the BOM did not hide the first column
    assert [why for _, why in skipped] == ["missing field(s): precision"]
    p.write_text("model,gpu,num_gpus,seq_len,global_batch,tp,pp\nQwen3-30B-A3B,H100,16,4096,1024,1,1\n")
    with pytest.raises(ConfigError, match="missing column.*tokens_per_s_per_gpu or tflops_per_gpu or mfu"):
        published_measurements(p)


def test_a_batch_predicts_each_row_as_alone():
    """Rows that differ only in a Workload setting (MTP trained or not, the optimizer's state) are never evaluated as
    one group with the first row's workload: each row's prediction in a mixed batch is its prediction alone."""
    import autotune.cost._fit as fitmod
    lay = Layout(world=256, pp=4, vpp=4, ep=64, layer_split=(4,) * 15 + (1,), recompute=Recompute("selective"))
    base = Measurement("DeepSeek-V3", "GB200", 256, lay, 4000.0, gpus_per_node=4, seq_len=4096, global_batch=4096,
                       precision="mxfp8", force_balance=True, load_balancing_loss=True)
    rows = [base, replace(base, train_mtp=True), replace(base, optimizer_state_bytes=8.0),
            replace(base, layout=replace(lay, pp=8, layer_split=(2,) * 29 + (1,) * 3))]
    cal = load_calibration("GB200")
    fitmod._CACHE.clear()
    batch = predict(rows, cal)
    alone = []
    for m in rows:
        fitmod._CACHE.clear()
        alone.append(predict([m], cal)[0])
    assert np.allclose(batch, alone, rtol=1e-9)
    assert batch[1] < batch[0]  # the MTP block is work: it cannot be free


def test_a_page_newer_than_the_releases_read_takes_the_newest_recipes_not_before_it():
    from autotune.cost._presets import release_of
    rels, note = release_of("Megatron-Bridge perf summary:26.10")
    assert rels == {"v0.6.0"} and "26.10" in note and "newest not after it" in note
    assert release_of("Megatron-Bridge perf archive:26.04") == ({"v0.4.0"}, None)
    rels, note = release_of("Megatron-Bridge perf archive:26.05")
    assert rels == {"v0.4.1", "v0.4.2"} and "26.04.01" in note
    assert release_of("Megatron-Bridge perf archive:25.01")[0] == {"v0.1.0rc4"}
    assert release_of("NeMo AutoModel perf summary") == (set(), None)


def _trial(study_dir, number: int, layout, tps: float | None, *, source="measured", status="ok", proxy=None,
           workload=None):
    """A trial folder as a search writes it: trial_spec.json (the layout and workload it ran) and trial_result.json."""
    from autotune.trials.spec import TrialResult, TrialSpec, write_json_atomic

    d = study_dir / "trials" / str(number)
    d.mkdir(parents=True)
    wl = workload or {"seq_len": 8192, "global_batch": 128, "precision": "fp8-tensorwise"}
    write_json_atomic(d / "trial_spec.json", TrialSpec(
        study=study_dir.name, number=number, model="Qwen3-30B-A3B", gpu="H100", count=16, gpus_per_node=8,
        layout=layout.to_dict(), workload=wl, proxy=proxy))
    write_json_atomic(d / "trial_result.json", TrialResult(
        study=study_dir.name, number=number, status=status, source=source, tokens_per_s_per_gpu=tps))


def test_a_studys_measured_trials_calibrate_the_model(capsys, tmp_path, monkeypatch):
    """`--measurements runs/<study>`: each measured trial is a row under the study's own workload (FP8 here);
    simulated, failed and proxy trials are skipped with their reason; the written file moves the next estimate
    toward what the trials measured."""
    monkeypatch.delenv("AUTOTUNE_CALIBRATION", raising=False)
    study = tmp_path / "runs" / "qwen-h100-try1"
    lays = [Layout.parse(s, world=16, max_tokens_per_gpu=8192) for s in ("TP1 PP1 EP8 DP16", "TP1 PP1 EP16 DP16",
                                                                         "TP2 PP1 EP8 DP8", "TP1 PP2 EP8 DP8")]
    before = [float(v) for v in _estimate(capsys, lays)]
    for i, lay in enumerate(lays[:3]):  # a cluster 20% slower than the model says
        _trial(study, i, lay, 0.8 * before[i])
    _trial(study, 3, lays[3], 5000.0, source="predicted")
    _trial(study, 4, lays[3], None, status="oom")
    _trial(study, 5, lays[3], 9000.0, proxy={"num_layers": 4})
    out_file = tmp_path / "cal.json"
    rc, out, err = run(capsys, "calibrate", "--measurements", str(study), "--no-published", "--no-seeds",
                       "--out", str(out_file), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["skipped"]["count"] == 3 and {"simulated: a prediction, not a measurement", "status oom",
                                           "ran a shrunk proxy model, not the study's"} == set(d["skipped"]["reasons"])
    rows = d["gpus"]["H100"]["rows"]
    assert [r["source"] for r in rows] == [f"trial {i} of study qwen-h100-try1" for i in range(3)]
    # priced as the FP8 runs they were: before the fit each row sits 25% above what it measured (1 / 0.8)
    assert all(r["predicted_before"] == pytest.approx(r["measured"] / 0.8, rel=0.01) for r in rows)
    assert all(abs(r["error_after_pct"]) < abs(r["error_before_pct"]) / 2 for r in rows)
    monkeypatch.setenv("AUTOTUNE_CALIBRATION", str(out_file))
    after = _estimate(capsys, lays)
    assert after[3] < 0.9 * before[3]  # the untried layout moves with what the trials taught


def _estimate(capsys, lays):
    out = []
    for lay in lays:
        rc, text, err = run(capsys, "estimate", "--model", "Qwen3-30B-A3B", "--gpu", "H100", "--count", "16",
                            "--layout", lay.label(), "--max-tokens-per-gpu", "8192", "--precision", "fp8-tensorwise",
                            "--json")
        assert rc == 0, err
        out.append(json.loads(text)["throughput"]["tokens_per_s_per_gpu"])
    return out


def test_a_folder_that_is_not_a_study_is_refused_in_one_line(capsys, tmp_path):
    rc, _, err = run(capsys, "calibrate", "--measurements", str(tmp_path), "--no-published")
    assert rc == 2 and "not a study folder (no trials/ in it)" in err and len(err.strip().splitlines()) == 1
