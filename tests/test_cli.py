"""The estimate, space, models and gpus commands as a user meets them: JSON shapes, errors, exit codes."""

import json
import re

import pytest

from autotune.cli.main import main

EST = ["estimate", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32"]


def run(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_json_has_the_contract(capsys):
    rc, out, _ = run(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8", "--recompute", "full:uniform:2", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["active_params"] == 9_008_136_192 and d["total_params"] == 122_111_526_912
    assert d["layout"] == "TP1 PP4 EP8 DP8"
    mem = d["memory"]
    assert mem["fits"] is True and len(mem["stages"]) == 4 and mem["peak_bytes"] < mem["capacity_bytes"]
    assert max(s["total"] for s in mem["stages"]) == mem["peak_bytes"]
    thr = d["throughput"]
    assert {"tokens_per_s_per_gpu", "mfu", "usd_per_million_tokens", "step_time_s", "breakdown"} <= set(thr)
    assert thr["mfu"] == pytest.approx(thr["tokens_per_s_per_gpu"] * 6 * 9_008_136_192 / 989.4e12)
    assert sum(thr["breakdown"].values()) == pytest.approx(thr["step_time_s"])


def test_estimate_names_a_bottleneck_and_what_shrinks_it(capsys):
    """A controllable term taking a fifth of the step or more is named with its lever (cost/advice.LEVER_OPTIONS): gpt-oss on
    64 B200 with 2 micro-batches per step spends most of it on data-parallel gradient traffic; the seed's recipe
    layout has no such term."""
    argv = ["estimate", "--model", "gpt-oss-120b", "--gpu", "B200", "--count", "64", "--layout", "TP1 PP1 EP8 DP64"]
    rc, out, _ = run(capsys, *argv, "--json")
    thr = json.loads(out)["throughput"]
    assert rc == 0 and thr["levers"][0]["term"] == "dp_comm" and thr["levers"][0]["share"] > 0.5
    assert thr["levers"][0]["share"] == pytest.approx(thr["breakdown"]["dp_comm"] / thr["step_time_s"], abs=1e-3)
    rc, out, _ = run(capsys, *argv)
    assert "bottleneck: dp_comm takes" in out and "--global-batch" in out
    assert out.strip().splitlines()[-1].startswith("predicted")
    rc, out, _ = run(capsys, *argv, "--global-batch", "2048", "--json")  # 32 micro-batches per rank amortise it
    assert "dp_comm" not in [lev["term"] for lev in json.loads(out)["throughput"]["levers"]]
    rc, out, _ = run(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8", "--recompute", "full:uniform:2", "--json")
    assert json.loads(out)["throughput"]["levers"] == []


def test_estimate_says_what_frees_the_largest_memory_term_when_a_layout_does_not_fit(capsys):
    """The seed's layout without recompute does not fit: its first stage's largest term is the activations, and the
    line names recompute; with recompute it fits and says nothing of the kind."""
    rc, out, _ = run(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8", "--json")
    mem = json.loads(out)["memory"]
    stage = mem["stages"][mem["peak_stage"]]
    assert rc == 0 and not mem["fits"] and mem["to_fit"]["term"] == "activations"
    assert mem["to_fit"]["bytes"] == stage["activations"] == max(stage[k] for k in ("weights", "grads", "optimizer",
                                                                                        "activations", "logits"))
    rc, out, _ = run(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8")
    assert "to fit: the largest term on stage 0 is activations" in out and "--recompute" in out
    rc, out, _ = run(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8", "--recompute", "full:uniform:2", "--json")
    assert json.loads(out)["memory"]["to_fit"] is None


def test_estimate_without_recompute_does_not_fit_and_says_so(capsys):
    rc, out, _ = run(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8")
    assert rc == 0 and "does not fit" in out
    last = out.strip().splitlines()[-1]  # the speed line says the layout would not run, not only the memory table
    assert last.startswith("predicted") and "would not run" in last
    rc, out, _ = run(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8", "--recompute", "full:uniform:1")
    assert rc == 0 and "would not run" not in out


def test_estimate_breakdown_says_what_each_term_is(capsys, monkeypatch):
    """Each term of the human breakdown carries its one-line meaning; terms the layout does not pay are left out."""
    from autotune.cli.console import console
    from autotune.cost import STEP_TERMS, TERM_MEANINGS

    assert set(TERM_MEANINGS) == set(STEP_TERMS) and all(TERM_MEANINGS.values())
    monkeypatch.setattr(console, "width", 200)  # whatever COLUMNS says: one table row per line
    rc, out, _ = run(capsys, *EST, "--layout", "TP1 PP4 EP8 DP8", "--recompute", "full:uniform:2")
    assert rc == 0 and "what it is" in out
    assert TERM_MEANINGS["bubble"] in out and TERM_MEANINGS["ep_comm"] in out
    assert TERM_MEANINGS["cp_comm"] not in out  # CP 1: no context-parallel exchange


def test_estimate_recipe_reports_measured(capsys):
    rc, out, _ = run(capsys, "estimate", "--recipe", "recipes/qwen3.5-122b-a10b/h200/attune-tp1-pp4-ep8-rc2.yaml", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["measured"]["tokens_per_s_per_gpu"] == 2451.44 and d["layout"] == "TP1 PP4 EP8 DP8"
    assert d["layout_detail"]["recompute"]["num_layers"] == 2


@pytest.mark.parametrize("argv,needle", [
    (["--layout", "TP3 PP4 EP8"], "nearest legal layout"),
    (["--layout", "TP1 PP4 EP8 DP4"], "--count is 32"),
    (["--layout", "TP1 PP4 EP8", "--recompute", "full:sideways:2"], "--recompute"),
])
def test_estimate_bad_layouts(capsys, argv, needle):
    rc, _, err = run(capsys, *EST, *argv)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_estimate_bad_model_and_count(capsys, tmp_path):
    rc, _, err = run(capsys, "estimate", "--model", "Qwen3.5-122B", "--gpu", "H200", "--count", "32", "--layout", "TP1 PP4 EP8")
    assert rc == 2 and "did you mean Qwen3.5-122B-A10B" in err
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4}))
    rc, _, err = run(capsys, "estimate", "--model", str(cfg), "--gpu", "H100", "--count", "8", "--layout", "TP1 PP1")
    assert rc == 2 and "intermediate_size" in err
    rc, _, err = run(capsys, *EST[:-1], "20", "--layout", "TP1 PP4 EP4")
    assert rc == 2 and "does not divide into nodes" in err


def test_space_json_funnel_and_top(capsys):
    rc, out, _ = run(capsys, "space", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--top", "5", "--json")
    assert rc == 0
    d = json.loads(out)
    counts = [f["count"] for f in d["funnel"]]
    assert counts == sorted(counts, reverse=True) and counts[-1] > 0
    assert [f["stage"] for f in d["funnel"]][:2] == ["enumerated", "legal"]
    tps = [t["throughput"]["tokens_per_s_per_gpu"] for t in d["top"]]
    assert tps == sorted(tps, reverse=True) and len(tps) == 5
    assert all(t["memory"]["fits"] for t in d["top"])
    assert any(k.startswith("illegal:") for k in d["reasons"]) and "predicted OOM" in d["reasons"]


def test_space_table_shows_a_dispatcher_only_for_an_moe_model(capsys, monkeypatch):
    """A dense model has no token dispatcher: its top table has no dispatcher column (it used to say alltoall)."""
    from autotune.cli.console import console

    monkeypatch.setattr(console, "width", 200)
    rc, out, _ = run(capsys, "space", "--model", "Llama-3.1-70B", "--gpu", "H100", "--count", "32", "--top", "2")
    assert rc == 0 and "tokens/s/GPU" in out and "disp." not in out and "alltoall" not in out
    rc, out, _ = run(capsys, "space", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--top", "2")
    assert rc == 0 and "disp." in out


def test_an_empty_space_is_exit_2_with_or_without_json(capsys):
    """--json kept exit 0 with an empty top list where the tables exit 2: a script must see the failure too."""
    argv = ["space", "--model", "Llama-3.1-70B", "--gpu", "H100", "--count", "1"]
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 2 and json.loads(out)["top"] == [] and err.count("\n") == 1 and "Add GPUs" in err
    rc, _, err2 = run(capsys, *argv)
    assert rc == 2 and err2 == err


def test_a_dense_space_enumerates_no_moe_or_mla_recompute_modules(capsys):
    """A dense model's space does not enumerate selective recompute of modules it lacks (moe_act, moe, mla_up_proj):
    they could only be counted as illegal, which read as if the search had tried them."""
    rc, out, _ = run(capsys, "space", "--model", "Llama-3.1-70B", "--gpu", "H100", "--count", "32", "--json")
    d = json.loads(out)
    modules = ("illegal: recompute_moe_act", "illegal: recompute_moe", "illegal: recompute_mla_up_proj")
    assert rc == 0 and not any(k in modules for k, v in d["reasons"].items() if v)
    from autotune.catalog import ClusterSpec, load_model
    from autotune.layout.axes import recompute_axis

    vals = ["none", "selective:layernorm", "selective:layernorm,moe_act", "selective:mla_up_proj", "full:uniform:1"]
    h100 = ClusterSpec.of("H100", 8)
    assert recompute_axis(vals, load_model("Llama-3.1-70B"), h100) == ["none", "selective:layernorm", "full:uniform:1"]
    assert recompute_axis(vals, load_model("Qwen3-30B-A3B"), h100) == vals[:3] + ["full:uniform:1"]
    assert recompute_axis(vals, load_model("DeepSeek-V3"), h100) == vals


def test_space_without_deepep_drops_flex(capsys):
    rc, out, _ = run(capsys, "space", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--no-deepep", "--json", "--top", "50")
    d = json.loads(out)
    assert rc == 0 and any("DeepEP" in k for k in d["reasons"])
    assert all(t["layout_detail"]["dispatcher"] != "flex" for t in d["top"])


@pytest.mark.parametrize("yaml_text,needle", [
    ("dimensions:\n  tpp: [1, 2]\n", "unknown dimension 'tpp'; allowed: tp, pp"),
    ("dimensions:\n  tp: one\n", "dimensions.tp"),
    ("dimensions:\n  tp: []\n", "dimensions.tp: is empty"),
    ("dimensions:\n  dispatcher: [alltoall, deepep]\n", "unknown dispatcher"),
    ("prune:\n  keep_within: lots\n", "prune.keep_within"),
    ("dimensions:\n  tp: [1, two]\n", "dimensions.tp: Input should be a valid integer, got 'two'"),
    ("dimensions:\n  optimizer_offload: [0.0, 1.5]\n", "dimensions.optimizer_offload: offload fraction(s) [1.5] outside [0, 1]"),
    ("dimensions:\n  optimizer_offload: [yes]\n", "dimensions.optimizer_offload: Input should be a valid number, got True"),
])
def test_space_yaml_errors_name_file_key_and_allowed(capsys, tmp_path, yaml_text, needle):
    f = tmp_path / "space.yaml"
    f.write_text(yaml_text)
    rc, _, err = run(capsys, "space", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--space", str(f))
    assert rc == 2 and needle in err and str(f) in err and len(err.strip().splitlines()) == 1


def test_models_and_gpus_json(capsys):
    rc, out, _ = run(capsys, "models", "--json")
    models = {m["name"]: m for m in json.loads(out)}
    assert rc == 0 and models["Qwen3.5-122B-A10B"]["active_params"] == 9_008_136_192 and "tiny-moe" in models
    rc, out, _ = run(capsys, "gpus", "--json")
    assert rc == 0 and {g["name"] for g in json.loads(out)} >= {"H100", "H200", "B200", "cpu"}


def test_usage_errors_are_one_line_exit_2_and_no_args_shows_help(capsys):
    rc, _, err = run(capsys, "search", "--gpu", "H200", "--count", "32")
    assert rc == 2 and "Missing" in err and "model" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run(capsys, "estimate", "--count", "many")
    assert rc == 2 and "--count" in err and "integer" in err and len(err.strip().splitlines()) == 1
    rc, out, _ = run(capsys)
    assert rc == 0 and "Usage" in out and "search" in out


def test_space_offloads_the_optimizer_only_where_nothing_else_fits(capsys):
    rc, out, _ = run(capsys, "space", "--model", "Qwen3.5-122B-A10B", "--gpu", "B200", "--count", "8", "--top", "5", "--json")
    assert rc == 0
    top = json.loads(out)["top"]
    assert top and all(t["layout_detail"]["optimizer_offload"] > 0 for t in top)  # 2.2 TB of state, 1.4 TiB of HBM
    assert all(0 < t["memory"]["host_bytes_per_node"] <= t["memory"]["host_capacity_bytes"] for t in top)
    assert all(t["throughput"]["breakdown"]["offload"] > 0 for t in top)
    assert all("--optimizer-cpu-offload" in t["args"] and "--overlap-cpu-optimizer-d2h-h2d" in t["args"] for t in top)
    # offload costs time, so the best layout on 32 H200 offloads only what it must: without it, it does not fit
    rc, out, _ = run(capsys, "space", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--top", "1", "--json")
    d = json.loads(out)["top"][0]["layout_detail"]
    rc_ = d["recompute"]
    recompute = rc_["granularity"] + (":" + ",".join(rc_["modules"]) if rc_["modules"] else "") + (
        f":{rc_['method']}:{rc_['num_layers']}" if rc_["granularity"] == "full" else "")
    flags = ["--ep-overlap"] * d["ep_overlap"] + ["--tp-comm-overlap"] * d["tp_comm_overlap"]
    flags += ["--precision-aware-optimizer"] * d["precision_aware_optimizer"]  # offload runs on its code path
    for offload, fits in ((d["optimizer_offload"], True), (0.0, d["optimizer_offload"] == 0)):
        rc, out, _ = run(capsys, "estimate", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32",
                         "--layout", d["label"], "--recompute", recompute, "--dispatcher", d["dispatcher"],
                         "--max-tokens-per-gpu", str(d["max_tokens_per_gpu"]), "--optimizer-offload", str(offload),
                         *flags, "--json")
        assert rc == 0 and json.loads(out)["memory"]["fits"] is fits


def test_estimate_bf16_gradients(capsys):
    """--grads bf16 halves the gradient buffers: NVIDIA's gpt-oss-120b B200 preset (EP8, 4 x 4,096-token rows,
    selective recompute, bf16 gradients) has 31 GiB to spare with them, and under 2 GiB with fp32 gradients."""
    args = ["estimate", "--model", "gpt-oss-120b", "--gpu", "B200", "--count", "64", "--layout", "TP1 PP1 EP8",
            "--seq-len", "4096", "--global-batch", "1280", "--micro-batch-size", "4",
            "--recompute", "selective:layernorm,moe_act", "--force-balance", "--json"]
    fp32, bf16 = (json.loads(run(capsys, *args, "--grads", g)[1])["memory"] for g in ("fp32", "bf16"))
    assert fp32["stages"][0]["grads"] == 2 * bf16["stages"][0]["grads"]
    assert fp32["peak_bytes"] - bf16["peak_bytes"] == bf16["stages"][0]["grads"]  # nothing else moves
    assert bf16["fits"] and fp32["headroom_bytes"] < 2 * 2**30 < 30 * 2**30 < bf16["headroom_bytes"]
    rc, _, err = run(capsys, *args, "--grads", "fp8")
    assert rc == 2 and "--grads 'fp8'" in err


def test_the_spinner_is_a_terminals_only(monkeypatch):
    """cli.console.working: on a terminal a spinner names the work and is erased when done; in a log, nothing."""
    import io

    from rich.console import Console

    from autotune.cli import console as con

    tty, log = io.StringIO(), io.StringIO()
    monkeypatch.setattr(con, "err_console", Console(file=tty, force_terminal=True))
    with con.working("screening the search space"):
        pass
    assert "screening the search space" in tty.getvalue()
    before = tty.getvalue()
    with con.working("screening the search space", enabled=False):
        pass
    assert tty.getvalue() == before  # disabled (--json): not drawn
    monkeypatch.setattr(con, "err_console", Console(file=log, force_terminal=False))
    with con.working("screening the search space"):
        pass
    assert log.getvalue() == ""


COMMANDS = [["estimate"], ["space"], ["search"], ["calibrate"], ["export"], ["dashboard"], ["recipes", "list"],
            ["trial", "run"], ["check", "convergence"], ["check", "config"], ["check", "component"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_help_at_80_columns_names_every_option_whole(cmd, capsys, monkeypatch):
    """At 80 columns an option's own name is never cut ('--max-tokens-per-g…' was, when a --x/--no-x pair
    widened the table), and an example split over lines ends each line but the last in a backslash, so it
    pastes into a shell whole."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    assert main(cmd + ["--help"]) == 0
    out = capsys.readouterr().out
    assert "Options" in out
    cut = [line for line in out.splitlines() if re.match(r"^│ (\*\s+)?-[-\w]*…", line)]
    assert not cut, cut
    lines = out.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip().startswith("autotune ") and lines[i + 1].strip().startswith("--"):
            assert line.rstrip().endswith("\\"), line


def test_reflow_joins_prose_and_keeps_examples():
    from autotune.cli.main import reflow

    doc = """First line
    goes on.

    A paragraph
    split in two.

    Example:
      autotune x --a 1 \\
        --b 2
    """
    assert reflow(doc) == "First line goes on.\n\nA paragraph split in two.\n\nExample:\n  autotune x --a 1 \\\n    --b 2"
    assert reflow(None) is None


def test_a_predicted_recipe_is_not_reported_as_measured(capsys, tmp_path):
    """estimate --recipe on a search's recipe (status: predicted): its number is the model's own, so it is shown
    as the recipe's prediction; a dense model's summary names no token dispatcher."""
    rc, out, _ = run(capsys, "search", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--trials", "1",
                     "--runs-dir", str(tmp_path), "--json")
    recipe = json.loads(out)["recipes"][0]
    rc, out, _ = run(capsys, "estimate", "--recipe", recipe, "--json")
    d = json.loads(out)
    assert rc == 0 and "measured" not in d and abs(d["recipe_predicted"]["error_percent"]) < 0.01
    assert "dispatcher" not in d["summary"]
    rc, out, _ = run(capsys, "estimate", "--recipe", recipe)
    assert "the recipe's prediction" in out and "measured" not in out


def test_a_recipe_of_a_config_json_model_reads_back(capsys, tmp_path, monkeypatch):
    """A search on a config.json model: its recipe records the file its parameters were counted from, and
    estimate --recipe finds the model there (it said the model was not in the catalog)."""
    import shutil

    from autotune.catalog.registry import _data_dir

    monkeypatch.chdir(tmp_path)
    shutil.copy(_data_dir() / "Llama-3.1-8B.json", tmp_path / "mine.json")
    rc, out, _ = run(capsys, "search", "--model", str(tmp_path / "mine.json"), "--gpu", "H100", "--count", "8",
                     "--trials", "1", "--json")
    assert rc == 0
    recipe = json.loads(out)["recipes"][0]
    rc, out, err = run(capsys, "estimate", "--recipe", recipe, "--json")
    assert rc == 0, err
    assert json.loads(out)["model"] == "mine"
    (tmp_path / "mine.json").unlink()  # gone: one line, exit 2
    rc, _, err = run(capsys, "estimate", "--recipe", recipe)
    assert rc == 2 and "mine" in err and len(err.strip().splitlines()) == 1


def test_json_layouts_report_tp_comm_overlap_as_it_takes_effect(capsys):
    """The default space asks for TP communication overlap everywhere; at TP 1 it cannot run (no sequence parallel),
    so the JSON a script reads says off there, and the flags built from it are ones `estimate` accepts."""
    rc, out, _ = run(capsys, "space", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--top", "40",
                     "--json")
    top = [t["layout_detail"] for t in json.loads(out)["top"]]
    assert rc == 0 and any(d["tp"] == 1 for d in top) and any(d["tp"] > 1 and d["tp_comm_overlap"] for d in top)
    assert not any(d["tp"] == 1 and d["tp_comm_overlap"] for d in top)
    assert all(("--tp-comm-overlap" in t["args"]) == t["layout_detail"]["tp_comm_overlap"] for t in json.loads(out)["top"])


def test_recipes_show_prints_the_notes(capsys, tmp_path):
    """`recipes show` prints a recipe's notes (the search's rationale and what the model needs beyond its MODEL_ARGS,
    here gpt-oss's YaRN), after the command; --json carries them too. A recipe without notes has no Notes section."""
    from autotune.catalog import ClusterSpec, Workload, load_model
    from autotune.launch import model_notes
    from autotune.layout import Layout
    from autotune.recipes.emit import recipe_from_candidate
    from autotune.recipes.io import write_recipe

    stack = {"framework": "x", "megatron_lm": "x", "pytorch": "x", "python": "x", "network": "x"}

    def recipe(model: str, notes: list[str] | None):
        return recipe_from_candidate(load_model(model), ClusterSpec.of("H100", 16),
                                     Layout(world=16, ep=8, max_tokens_per_gpu=8192), Workload(), status="predicted",
                                     tokens_per_s_per_gpu=1000.0, step_time_cv_percent=None, gpu_hours=None,
                                     window=(5, 19), steps_per_run=20, stack=stack, measured="2026-01-01", notes=notes)

    (yarn,) = model_notes(load_model("gpt-oss-20b"))
    path = write_recipe(recipe("gpt-oss-20b", ["why: a guess"]), tmp_path / "oss.yaml")
    rc, out, _ = run(capsys, "recipes", "show", str(path))
    lines = out.splitlines()
    assert rc == 0 and "Notes" in lines and lines.index("Notes") > lines.index("Command")
    assert lines[lines.index("Notes") + 1:] == ["  - why: a guess", f"  - {yarn}"]
    rc, out, _ = run(capsys, "recipes", "show", str(path), "--json")
    assert rc == 0 and json.loads(out)["notes"] == ["why: a guess", yarn]
    plain = write_recipe(recipe("Qwen3-30B-A3B", None), tmp_path / "qwen.yaml")
    rc, out, _ = run(capsys, "recipes", "show", str(plain))
    assert rc == 0 and "Notes" not in out.splitlines()
