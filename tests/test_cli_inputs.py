"""Bad input at the command line, as a user test met it: one `error:` line on stderr naming the value and a way out,
exit 2, nothing written or started; and the cases that looked fine but said something untrue (exit 0 for a typo,
`DP?`, a 400-stage split, options silently ignored)."""

import json
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.errors import BadInput
from autotune.layout import Layout, Recompute

EST = ["estimate", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32"]
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
RECIPE = str(RECIPES / "qwen3.5-122b-a10b" / "h200" / "attune-tp1-pp4-ep8-rc2.yaml")


def run(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def bad(capsys, *argv) -> str:
    """Run argv, assert the bad-input contract, return the one error line."""
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (rc, out, err)
    assert out == "" and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.fixture
def wide(monkeypatch):
    from autotune.cli.console import console

    monkeypatch.setattr(console, "width", 400)  # one line per printed line, whatever COLUMNS says


@pytest.fixture
def no_ranks(monkeypatch):
    """Starting a component rank fails the test: bad input must be refused before anything starts."""
    import autotune.gates.component as component

    def popen(*a, **k):
        raise AssertionError("a component rank was started")

    monkeypatch.setattr(component.subprocess, "Popen", popen)


# --- 1. check component ----------------------------------------------------------------------------------------


def test_check_component_without_torch_names_the_install(capsys, monkeypatch, no_ranks):
    import autotune.trials.plan as plan

    real = plan.has_module
    monkeypatch.setattr(plan, "has_module", lambda name: False if name == "torch" else real(name))
    err = bad(capsys, "check", "component", "--dispatcher", "allgather")
    assert "torch is not installed" in err and "pip install" in err and "did not finish" not in err


@pytest.mark.parametrize("tokens", ["0", "-5"])
def test_check_component_refuses_non_positive_tokens(capsys, no_ranks, tokens):
    assert f"--tokens {tokens}" in bad(capsys, "check", "component", "--dispatcher", "allgather", "--tokens", tokens)


# --- 2. recipes list ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,needle", [
    (("--model", "NoSuch"), "unknown model 'NoSuch'"),
    (("--model", "Qwen3.5-122B"), "did you mean"),
    (("--gpu", "zzz"), "unknown GPU 'zzz'"),
    (("--model", ""), "--model ''"),
])
def test_recipes_list_refuses_unknown_names(capsys, tmp_path, argv, needle):
    html = tmp_path / "board.html"
    assert needle in bad(capsys, "recipes", "list", "--dir", str(RECIPES), *argv, "--html", str(html))
    assert not html.exists()


def test_recipes_list_known_names_without_recipes_say_so_cleanly(capsys):
    rc, out, err = run(capsys, "recipes", "list", "--dir", str(RECIPES), "--gpu", "H100")
    assert rc == 0 and err == "" and out.startswith("no recipes for H100; ") and "  " not in out.strip()
    rc, out, _ = run(capsys, "recipes", "list", "--dir", str(RECIPES), "--model", "Qwen3-235B-A22B", "--gpu", "h100")
    assert rc == 0 and out.startswith("no recipes for Qwen3-235B-A22B on h100; ")


def test_recipes_list_takes_a_model_only_the_recipes_name(capsys, monkeypatch):
    """The filter compares with recipes' `model:` field: a name they use is known even if the catalog lacks it."""
    import autotune.catalog as catalog

    monkeypatch.setattr(catalog, "model_names", lambda: ())
    rc, out, _ = run(capsys, "recipes", "list", "--dir", str(RECIPES), "--model", "qwen3.5-122b-a10b", "--json")
    assert rc == 0 and {e["model"] for e in json.loads(out)} == {"Qwen3.5-122B-A10B"}


# --- 3. a DP to suggest only when one exists -------------------------------------------------------------------


def test_layout_count_mismatch_suggests_a_real_dp_or_none(capsys):
    err = bad(capsys, *EST, "--layout", "TP1 PP5 EP8 DP8")
    assert "?" not in err and "--count 40" in err and "divides 32" in err
    with pytest.raises(BadInput, match=r"use DP16 or --count 16"):
        Layout.parse("TP1 PP2 EP8 DP8", world=32)


# --- 4. more virtual stages than layers --------------------------------------------------------------------------


def test_more_stages_than_layers_gives_no_split_list(capsys):
    from autotune.layout.splits import legal_splits, too_many_stages

    err = bad(capsys, *EST, "--layout", "TP1 PP4 VPP100 EP8 DP8")
    assert "cut" not in err and "[1, 1" not in err and len(err) < 400
    assert legal_splits(48, 4, 100) == [] and legal_splits(2, 4) == [(0, 1, 1, 0)]  # embedding / loss stages stay
    assert too_many_stages(48, 4, 100) == ("PP 4 x VPP 100 = 400 stages for 48 layers: each stage needs at least one "
                                           "layer; use VPP <= 12")
    assert "use PP <= 48" in too_many_stages(48, 64) and too_many_stages(48, 4, 6) is None


# --- 5. estimate ----------------------------------------------------------------------------------------------


def test_estimate_refuses_tp_comm_overlap_at_tp1(capsys):
    assert "--tp-comm-overlap" in bad(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8", "--recompute", "full:uniform:2",
                                      "--tp-comm-overlap")
    rc, out, _ = run(capsys, *EST, "--layout", "TP2 PP4 EP8", "--recompute", "full:uniform:2", "--tp-comm-overlap",
                     "--json")
    assert rc == 0 and json.loads(out)["layout_detail"]["tp_comm_overlap"] is True


@pytest.mark.parametrize("extra,named", [
    (("--model", "Qwen3-235B-A22B"), "--model"),
    (("--layout", "TP1 PP4 EP8 DP8", "-n", "32"), "--count, --layout"),
    (("--recompute", "none"), "--recompute"),  # the default value, given: still ignored, still refused
    (("--no-distributed-optimizer",), "--no-distributed-optimizer"),
])
def test_estimate_recipe_refuses_options_it_would_ignore(capsys, extra, named):
    err = bad(capsys, "estimate", "--recipe", RECIPE, *extra)
    assert f"drop {named} " in err and "from the recipe" in err


def test_estimate_recipe_keeps_the_options_it_applies(capsys):
    rc, out, _ = run(capsys, "estimate", "--recipe", RECIPE, "--fsdp", "--json")
    assert rc == 0 and json.loads(out)["layout_detail"]["fsdp"] is True


@pytest.mark.parametrize("text", ["", " ", "selective:", "selective:,", "selective:core_attn:moe_act"])
def test_estimate_refuses_empty_recompute_specs(capsys, text):
    assert f"--recompute {text!r}" in bad(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8", "--recompute", text)
    with pytest.raises(BadInput):
        Recompute.parse(text)


def test_recompute_none_and_plain_selective_still_parse():
    assert Recompute.parse(None) == Recompute() and Recompute.parse("none") == Recompute()
    assert Recompute.parse("selective") == Recompute("selective")
    assert Recompute.parse("selective:core_attn,moe_act,").modules == ("core_attn", "moe_act")


def test_estimate_names_fsdp_and_says_when_pp_makes_it_a_no_op(capsys, wide):
    args = [*EST, "--recompute", "full:uniform:2", "--fsdp"]
    rc, out, _ = run(capsys, *args, "--layout", "TP1 PP1 EP8 DP32")
    assert rc == 0 and "Megatron FSDP" in out.splitlines()[0] and "note:" not in out
    rc, out, _ = run(capsys, *args, "--layout", "TP1 PP4 EP8 DP8")
    assert rc == 0 and "Megatron FSDP" in out.splitlines()[0]
    assert "note: --fsdp with PP 4" in out and "as with the distributed optimizer alone" in out
    rc, out, _ = run(capsys, *args, "--layout", "TP1 PP4 EP8 DP8", "--json")
    assert rc == 0 and json.loads(out)["notes"][0].startswith("--fsdp with PP 4")


QWEN30 = ["estimate", "--model", "Qwen3-30B-A3B", "--gpu", "H100", "--count", "16", "--layout", "TP1 PP1 EP8 DP16"]


@pytest.mark.parametrize("extra, needles", [
    # each DP rank gets 128 / 16 = 8 rows of 8,192 tokens: a larger cap was evaluated as a 122-row micro-batch
    (["--max-tokens-per-gpu", "1000000"], ["max tokens per GPU 1,000,000", "use at most 65,536"]),
    (["--micro-batch-size", "3"], ["micro-batch size 3", "use 2 rows"]),
    (["--optimizer-offload", "0.5"], ["optimizer offload 50%", "--precision-aware-optimizer"]),
    (["--optimizer-offload", "0.5", "--precision-aware-optimizer", "--precision", "fp8-tensorwise",
      "--fp8-param-gather"], ["--fp8-param-gather", "fp8-tensorwise", "--precision fp8-delayed"]),
    (["--cuda-graphs", "router", "--recompute", "full:uniform:1"], ["full recompute", "--cuda-graphs full or none"]),
    (["--cuda-graphs", "attn", "--recompute", "selective:layernorm,moe"], ["selective recompute of moe",
                                                                             "drop moe from the modules"]),
])
def test_estimate_refuses_settings_megatron_refuses_in_one_line(capsys, extra, needles):
    """Settings Megatron-LM refuses at start-up (a micro-batch that does not divide a DP rank's rows, offload without
    the precision-aware optimizer, CUDA graphs beside the recompute they cannot hold) exit 2 with the value and the
    way out, and no 'no legal layout is near' (the degrees are not what is wrong)."""
    err = bad(capsys, *QWEN30, *extra)
    assert all(n in err for n in needles), err
    assert "no legal layout is near" not in err


def test_estimate_refuses_router_graphs_and_expert_biases_where_megatron_does(capsys):
    err = bad(capsys, "estimate", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "16", "--layout", "TP2 PP2 DP4",
              "--cuda-graphs", "router")
    assert "no experts" in err and "--cuda-graphs attn or none" in err
    err = bad(capsys, "estimate", "--model", "gpt-oss-20b", "--gpu", "H100", "--count", "16", "--layout",
              "TP2 PP2 EP2 ETP2 DP4")
    assert "ETP 1 only" in err and "nearest legal layout: TP2 PP2 EP2 DP4" in err


def test_a_token_cap_whose_rows_do_not_divide_a_ranks_is_estimated(capsys):
    """3 rows per micro-batch over the 8 rows a DP rank gets: slime's dynamic batching packs 3, 3, 2 (Megatron's
    fixed --micro-batch-size would need a divisor: the export takes 2)."""
    from autotune.cli.main import main

    assert main([*QWEN30, "--max-tokens-per-gpu", "24576", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput"]["tokens_per_s_per_gpu"] > 0


def test_a_split_with_the_wrong_layer_count_is_named_as_written(capsys):
    """1 + 3 x 30 + 2 = 93 decoder layers for a 94-layer model: the error shows the split as typed (not 32 numbers)
    and the count it is off by, with the option that picks Megatron's split."""
    err = bad(capsys, "estimate", "--model", "Qwen3-235B-A22B", "--gpu", "H100", "--count", "64", "--layout",
              "TP2 PP8 VPP4 EP8 DP4", "--layer-split", "1,3x30,2")
    assert "layer split 1,3x30,2 places 93 decoder layers; Qwen3-235B-A22B has 94" in err
    assert "--layer-split auto" in err and "[1, 3, 3" not in err


def test_cpu_rows_default_small_and_say_so(capsys):
    """`--gpu cpu` is this machine: the seed's 8,192 x 128 rows would take minutes a step, so --seq-len and
    --global-batch default to 2,048 and 16 there (a note says so); given values and GPU defaults are unchanged."""
    from autotune.cli.main import main

    def est(*extra):
        assert main(["estimate", "--model", "tiny-moe", "--count", "2", "--layout", "EP2", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    cpu = est("--gpu", "cpu")
    assert cpu["workload"] == {"seq_len": 2048, "global_batch": 16, "precision": "bf16", "routing": "natural"}
    assert any(n.startswith("--gpu cpu: --seq-len 2048 and --global-batch 16 by default") for n in cpu["notes"])
    given = est("--gpu", "cpu", "--seq-len", "512")
    assert given["workload"] == {"seq_len": 512, "global_batch": 16, "precision": "bf16", "routing": "natural"}
    assert any("--global-batch 16 by default" in n and "--seq-len 2048" not in n for n in given["notes"])
    gpu = est("--gpu", "H100")
    assert gpu["workload"] == {"seq_len": 8192, "global_batch": 128, "precision": "bf16", "routing": "natural"}
    assert not gpu.get("notes")
    assert main(["space", "--model", "tiny-moe", "--gpu", "CPU", "--count", "2", "--top", "1", "--json"]) == 0
    space = json.loads(capsys.readouterr().out)
    assert space["workload"] == {"seq_len": 2048, "global_batch": 16, "precision": "bf16", "routing": "natural"}
    assert space["notes"][0].startswith("--gpu cpu")


def test_layer_split_takes_megatrons_pipeline_layout_string(capsys):
    """`--layer-split 'Et*4|(tttt|)*14tmL'` is the MoE model zoo's DeepSeek-V3 layout: 16 stages on PP 8 set VPP 2
    and the split; a string whose stages do not make PP x VPP is refused naming both."""
    from autotune.cli.main import main

    base = ["estimate", "--model", "DeepSeek-V3", "--gpu", "B200", "--count", "256", "--seq-len", "4096",
            "--global-batch", "2048", "--micro-batch-size", "1", "--precision", "mxfp8"]
    assert main([*base, "--layout", "TP1 PP8 EP32", "--layer-split", "Et*4|(tttt|)*14tmL", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["layout_detail"]
    assert d["vpp"] == 2 and d["layer_split"] == [4] * 15 + [1]
    err = bad(capsys, *base, "--layout", "TP1 PP8 VPP4 EP32", "--layer-split", "Et*4|(tttt|)*14tmL")
    assert "16 stages on PP 8 x VPP 4" in err and "give 32 stages or drop the VPP" in err
    err = bad(capsys, *base, "--layout", "TP1 PP8 EP32", "--layer-split", "Et*4|(tttt|)*14tm")
    assert "the loss 'L' must appear once" in err


def test_routing_is_a_workload_setting_of_estimate_space_and_search(capsys, tmp_path):
    """--routing: natural (the seed's load-balancing loss off), aux-loss (on: a less loaded hottest expert rank) and
    forced (benchmarks' even routing). An EP layout's prediction rises in that order; the JSON states it; a dense
    model says it changes nothing; search refuses forced routing (no recipe trains with it) before writing anything."""
    tps = {}
    for routing in ("natural", "aux-loss", "forced"):
        rc, out, _ = run(capsys, *QWEN30, "--routing", routing, "--json")
        assert rc == 0
        d = json.loads(out)
        assert d["workload"]["routing"] == routing
        tps[routing] = d["throughput"]["tokens_per_s_per_gpu"]
    assert tps["natural"] < tps["aux-loss"] < tps["forced"]
    rc, out, _ = run(capsys, *QWEN30, "--routing", "aux-loss")
    assert rc == 0 and "routing: the load-balancing loss on" in out  # said above the tables
    rc, out, _ = run(capsys, *QWEN30)
    assert rc == 0 and "routing:" not in out  # the seed's natural routing goes without saying
    rc, out, _ = run(capsys, *QWEN30, "--force-balance", "--json")  # the older spelling of forced
    assert rc == 0 and json.loads(out)["throughput"]["tokens_per_s_per_gpu"] == tps["forced"]
    assert "--force-balance is --routing forced, not aux-loss" in bad(capsys, *QWEN30, "--routing", "aux-loss",
                                                                       "--force-balance")
    assert "--routing 'even': choose natural, aux-loss, forced" in bad(capsys, *QWEN30, "--routing", "even")
    rc, out, _ = run(capsys, "space", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--routing",
                     "aux-loss", "--top", "1", "--json")
    assert rc == 0 and any("has no experts, so routing changes nothing" in n for n in json.loads(out)["notes"])
    runs = tmp_path / "runs"
    err = bad(capsys, "search", "--model", "Qwen3-30B-A3B", "--gpu", "H100", "--count", "16", "--routing", "forced",
              "--runs-dir", str(runs))
    assert "even routing is a benchmark setting" in err and not runs.exists()
    seed = str(RECIPES / "qwen3.5-122b-a10b/h200/attune-tp1-pp4-ep8-rc2.yaml")  # trains with the loss off
    err = bad(capsys, "search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--routing",
              "aux-loss", "--reference", seed, "--runs-dir", str(runs))
    assert "trains with the load-balancing loss off, the search with it on" in err and not runs.exists()


def test_a_router_balanced_by_a_bias_suggests_aux_loss_routing(capsys):
    """DeepSeek-V3's router carries the bias its pretraining moves to even the experts' load: with the default
    natural routing the estimate says --routing aux-loss may be closer; not once that is given, and not for
    gpt-oss, whose router bias is a plain learned bias."""
    ds = ["estimate", "--model", "DeepSeek-V3", "--gpu", "H100", "--count", "256", "--layout", "TP1 PP8 EP32",
          "--layer-split", "auto", "--json"]
    notes = lambda *extra: " ".join(json.loads(run(capsys, *ds, *extra)[1]).get("notes") or [])  # noqa: E731
    assert "aux-loss-free balancing" in notes() and "aux-loss-free" not in notes("--routing", "aux-loss")
    rc, out, _ = run(capsys, "estimate", "--model", "gpt-oss-120b", "--gpu", "H100", "--count", "64", "--layout",
                     "TP1 PP1 EP8", "--json")
    assert rc == 0 and "aux-loss-free" not in " ".join(json.loads(out).get("notes") or [])


# --- the default rows of a model with learned positions ----------------------------------------------------------


def test_default_rows_shrink_to_a_learned_position_table_and_say_so(capsys):
    """The seed's 8,192-token rows do not fit GPT-3's 2,048 learned positions: with no --seq-len the rows are the
    table's length, with a note; the same --seq-len given explicitly is refused (test_bad_input)."""
    rc, out, err = run(capsys, "estimate", "--model", "NeMo-GPT3-5B", "--gpu", "H100", "--count", "8", "--layout", "TP1",
                       "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["workload"]["seq_len"] == 2048, doc["workload"]
    assert "--seq-len 2048 by default: NeMo-GPT3-5B has learned position embeddings for 2,048 positions" in err + out
    rc, out, err = run(capsys, "estimate", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--layout", "TP1",
                       "--json")
    assert rc == 0 and json.loads(out)["workload"]["seq_len"] == 8192  # rotary positions: the seed's rows
