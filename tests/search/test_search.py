"""autotune search end to end on the simulator: study on disk, budgets, screening, resume, bad input."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cli.main import main
from autotune.cost import evaluate
from autotune.layout import Layout, LayoutTable, violations
from autotune.search.study import StudyDir

SEED_BEST = 2451.4
ARGS = ["search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32"]


def run_json(capsys, *args):
    capsys.readouterr()
    rc = main([*ARGS, *args, "--json"])
    out = capsys.readouterr().out
    return rc, (json.loads(out) if rc == 0 else None)


def test_readme_search_finds_a_legal_fitting_layout_at_least_as_fast_as_the_seed(tmp_path, capsys):
    rc, out = run_json(capsys, "--runs-dir", str(tmp_path), "--trials", "3")
    assert rc == 0
    assert {"study", "runs_dir", "backend", "stop_reason", "best", "trials"} <= set(out)
    assert out["backend"] == "simulate" and out["best"]["status"] == "predicted"
    # the seed's rows and routing
    assert out["workload"] == {"seq_len": 8192, "global_batch": 128, "precision": "bf16", "routing": "natural"}
    assert out["best"]["tokens_per_s_per_gpu"] >= SEED_BEST
    assert out["reference"]["name"] == "attune-tp1-pp4-ep8-rc2"  # the best published recipe for 32 x H200
    assert out["best"]["vs_reference"] == pytest.approx(out["best"]["tokens_per_s_per_gpu"] / 2451.44)
    model, w = load_model("Qwen3.5-122B-A10B"), Workload()
    best = next(t for t in out["trials"] if t["number"] == out["best"]["number"])
    study = optuna.load_study(study_name=out["study"], storage=f"sqlite:///{tmp_path / out['study'] / 'study.db'}")
    ft = study.trials[best["number"]]
    lay = Layout.from_dict(ft.user_attrs["layout"])
    assert lay.label() == out["best"]["layout"] and violations(model, w, lay) == []
    ev = evaluate(model, w, ClusterSpec.of("H200", 32), LayoutTable.from_layouts([lay]))
    assert bool(ev.memory.fits[0])
    assert {"tp", "pp", "ep", "recompute", "dispatcher"} <= set(ft.params)
    assert len(out["trials"]) == 3 and "trial budget" in out["stop_reason"]
    for t in out["trials"]:
        d = tmp_path / out["study"] / "trials" / str(t["number"])
        assert (d / "trial_spec.json").exists() and (d / "trial_result.json").exists()
        # a GPU trial runs in its recipe's environment (the allocator the memory model assumes), less the launch
        # script's shell expressions
        env = json.loads((d / "trial_spec.json").read_text())["env"]
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and "NCCL_NVLS_ENABLE" not in env
    assert len(out["recipes"]) == 3 and all(Path(p).exists() for p in out["recipes"])
    # where the best layout's step goes, by the model's terms at the study's calibration (the same as estimate's)
    step = out["best"]["step"]
    assert step["step_time_s"] == pytest.approx(float(ev.time.step_time[0]), rel=1e-6)
    shares = [d["share"] for d in step["shares"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0
    assert shares[0] == pytest.approx(max(ev.time.breakdown(0).values()) / step["step_time_s"], abs=1e-3)
    assert all(d["share"] >= 0.2 and d["lever"] for d in step["levers"])


def test_the_outcome_names_the_best_layouts_bottleneck(tmp_path, capsys):
    """A search whose best layout spends a fifth of its step or more on a term a setting controls says so, with the
    setting: gpt-oss-120b on 64 B200 with a global batch of 32 rows cannot amortise its per-step costs."""
    argv = ["search", "--model", "gpt-oss-120b", "--gpu", "B200", "--count", "64", "--global-batch", "32",
            "--seq-len", "4096", "--trials", "2"]
    capsys.readouterr()
    rc = main([*argv, "--runs-dir", str(tmp_path / "a"), "--json"])
    step = json.loads(capsys.readouterr().out)["best"]["step"]
    assert rc == 0 and step["levers"], step
    rc = main([*argv, "--runs-dir", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert rc == 0 and "where its step goes (the model's terms): " in out
    for lev in step["levers"]:
        assert f"bottleneck: {lev['term']} takes {lev['share']:.0%} of the step: {lev['lever']}" in out.replace("\n", " ")


@pytest.mark.parametrize("planner", ["model", "random"])
def test_parallel_trials_fill_every_slot_with_different_layouts(tmp_path, capsys, planner):
    """--parallel 3: each round dispatches three different layouts (the planner sees the running trials as
    taken; before, it proposed the running layout again for every free slot and the search stalled after one
    trial)."""
    rc, out = run_json(capsys, "--runs-dir", str(tmp_path), "--trials", "6", "--parallel", "3", "--planner", planner)
    assert rc == 0 and "trial budget" in out["stop_reason"], out["stop_reason"]
    assert out["dispatched"] == 6
    study = optuna.load_study(study_name=out["study"], storage=f"sqlite:///{tmp_path / out['study'] / 'study.db'}")
    keys = [json.dumps(t.user_attrs["layout"], sort_keys=True) for t in study.trials if t.user_attrs.get("layout")]
    assert len(keys) == 6 and len(set(keys)) == 6


def test_gpu_hour_budget_is_respected(tmp_path, capsys):
    rc, out = run_json(capsys, "--runs-dir", str(tmp_path), "--trials", "50", "--budget-gpu-hours", "10")
    assert rc == 0 and "GPU-hour budget" in out["stop_reason"]
    per_trial = out["gpu_hours"] / out["dispatched"]
    assert out["gpu_hours"] - per_trial < 10 <= out["gpu_hours"]  # stops at the first trial that crosses it
    # and says so when it dispatches that trial (it used to overspend without a word)
    assert any("more than the" in n and "--budget-gpu-hours 10" in n for n in out["notes"])


def test_optuna_planner_never_dispatches_predicted_oom_or_illegal(tmp_path, capsys):
    rc, out = run_json(capsys, "--runs-dir", str(tmp_path), "--trials", "4", "--planner", "optuna", "--seed", "3")
    assert rc == 0
    study = optuna.load_study(study_name=out["study"], storage=f"sqlite:///{tmp_path / out['study'] / 'study.db'}")
    model, w, cluster = load_model("Qwen3.5-122B-A10B"), Workload(), ClusterSpec.of("H200", 32)
    screened = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    dispatched = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(dispatched) == 4
    assert screened, "TPE proposes layouts the model rejects; they must be recorded, not run"
    for t in screened:
        assert t.user_attrs["status"] == "screened" and t.user_attrs["reason"]
        assert not (tmp_path / out["study"] / "trials" / str(t.number)).exists()
    lays = [Layout.from_dict(t.user_attrs["layout"]) for t in dispatched]
    assert all(violations(model, w, l) == [] for l in lays)
    assert evaluate(model, w, cluster, LayoutTable.from_layouts(lays)).memory.fits.all()


def _completed(db: Path, name: str):
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    return study, [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def _driver_at_trial(tmp_path, study: str, trials: int, delay: float, number: int):
    """A search driver in its own process group, once it has written trial `number`'s spec: (process, command)."""
    cmd = [sys.executable, "-m", "autotune.cli.main", *ARGS, "--runs-dir", str(tmp_path), "--study", study,
           "--trials", str(trials), "--sim-delay", str(delay), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    spec = tmp_path / study / "trials" / str(number) / "trial_spec.json"
    deadline = time.time() + 60
    while not spec.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert spec.exists(), f"the driver never reached trial {number}"
    return proc, cmd


@pytest.mark.slow
def test_resume_after_sigkill_loses_and_repeats_nothing(tmp_path):
    proc, cmd = _driver_at_trial(tmp_path, "k", 5, 0.6, 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _, before = _completed(tmp_path / "k" / "study.db", "k")
    assert 1 <= len(before) < 5
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    study, after = _completed(tmp_path / "k" / "study.db", "k")
    assert len(after) == 5 == out["dispatched"]
    assert {t.number for t in before} <= {t.number for t in after}  # nothing finished was lost
    labels = [json.dumps(t.params, sort_keys=True) for t in after]
    assert len(set(labels)) == 5  # nothing repeated
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert [t.user_attrs.get("status") for t in failed] == ["requeued"]
    assert json.dumps(failed[0].params, sort_keys=True) in labels  # the interrupted layout ran again


@pytest.mark.slow
def test_a_trial_stopped_with_the_driver_runs_again_on_resume(tmp_path):
    """SIGTERM (or Ctrl-C) stops the running trials with the driver: each is marked cancelled, not the layout's
    crash, so --resume runs it again instead of keeping it as a finished failure that used up the budget."""
    from autotune.trials.spec import TrialResult, read_model

    proc, cmd = _driver_at_trial(tmp_path, "t", 4, 1.5, 1)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    res = read_model(TrialResult, tmp_path / "t" / "trials" / "1" / "trial_result.json")
    assert res.cancelled and res.status == "crash"
    done = subprocess.run([*cmd[:-2], "0", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    study, after = _completed(tmp_path / "t" / "study.db", "t")
    assert len(after) == 4 and json.loads(done.stdout)["dispatched"] == 4
    requeued = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert [(t.number, t.user_attrs.get("status")) for t in requeued] == [(1, "requeued")]
    assert json.dumps(requeued[0].params, sort_keys=True) in [json.dumps(t.params, sort_keys=True) for t in after]


def test_second_driver_refuses(tmp_path, capsys, monkeypatch):
    """A study another driver holds is refused at once: before the space is screened (seconds for a space of
    millions), so the screen never runs."""
    import autotune.search.driver as drv

    def screened(*a, **k):
        raise AssertionError("the space was screened before the lock")

    monkeypatch.setattr(drv, "Candidates", screened)
    holder = StudyDir(tmp_path, "busy")
    holder.lock()
    try:
        rc = main([*ARGS, "--runs-dir", str(tmp_path), "--study", "busy", "--trials", "1"])
    finally:
        holder.unlock()
    assert rc == 2
    assert "in use by another autotune search" in capsys.readouterr().err


def test_resume_with_another_workload_is_refused(tmp_path, capsys):
    assert main([*ARGS, "--runs-dir", str(tmp_path), "--study", "w", "--trials", "1", "--json"]) == 0
    capsys.readouterr()
    rc = main([*ARGS, "--runs-dir", str(tmp_path), "--study", "w", "--trials", "2", "--grads", "bf16"])
    err = capsys.readouterr().err
    assert rc == 2 and "grads_fp32=True" in err and len(err.strip().splitlines()) == 1
    rc = main([*ARGS, "--runs-dir", str(tmp_path), "--study", "w", "--trials", "2", "--grads", "bf16",
               "--seq-len", "4096"])
    err = capsys.readouterr().err
    assert rc == 2 and "grads_fp32=True, seq_len=8192, not grads_fp32=False, seq_len=4096" in err  # each one named
    assert main([*ARGS, "--runs-dir", str(tmp_path), "--study", "w", "--trials", "2", "--json"]) == 0


def test_resume_keeps_the_studys_choices_and_refuses_new_values(tmp_path, capsys):
    """Optuna fixes a parameter's choices at the study's first trial: a study from before the default space gained
    hybridep resumes with its own values, a space that adds values is one line and exit 2, not a traceback."""
    default = (Path(__file__).parents[2] / "search_spaces" / "default.yaml").read_text()
    assert "[alltoall, allgather, flex, hybridep]" in default
    old, narrow = tmp_path / "old.yaml", tmp_path / "narrow.yaml"
    old.write_text(default.replace("[alltoall, allgather, flex, hybridep]", "[alltoall, allgather, flex]"))
    narrow.write_text(default.replace("[alltoall, allgather, flex, hybridep]", "[alltoall, flex]"))
    common = ["search", "--model", "Qwen3-30B-A3B", "--gpu", "H200", "--count", "16", "--runs-dir", str(tmp_path),
              "--study", "c"]  # a model with no space override of its own: default.yaml is its whole space
    assert main([*common, "--space", str(old), "--trials", "2", "--json"]) == 0
    capsys.readouterr()
    assert main([*common, "--trials", "4"]) == 2
    err = capsys.readouterr().err
    assert "['hybridep']" in err and "--space" in err and len(err.strip().splitlines()) == 1
    assert main([*common, "--space", str(narrow), "--trials", "3", "--json"]) == 0
    assert main([*common, "--space", str(old), "--trials", "4", "--json"]) == 0
    trials = optuna.load_study(study_name="c", storage=StudyDir(tmp_path, "c").storage_url).trials
    assert len(trials) >= 4 and {t.distributions["dispatcher"].choices for t in trials} == {
        ("allgather", "alltoall", "flex")}


def test_corrupt_study_db_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "study.db").write_bytes(b"this is not sqlite" * 10)
    rc = main([*ARGS, "--runs-dir", str(tmp_path), "--study", "bad", "--trials", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "not an SQLite database" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["--model", "Qwen3.5-122", "--gpu", "H200", "--count", "32"], "did you mean Qwen3.5-122B-A10B"),
    (["--model", "Qwen3.5-122B-A10B", "--gpu", "A100", "--count", "32"], "unknown GPU"),
    (["--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "3"], "survives pruning"),
    (["--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "12"], "does not divide into nodes"),
    (["--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--planner", "llm"], "--planner llm"),
    (["--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "32", "--grads", "fp16"], "--grads 'fp16'"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, needle):
    rc = main(["search", *args, "--runs-dir", str(tmp_path), "--trials", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_empty_space_names_the_rule(tmp_path, capsys):
    space = tmp_path / "tiny.yaml"
    space.write_text("dimensions:\n  tp: [1]\n  pp: [1]\n  ep: [8]\n  recompute: [none]\n")
    rc = main([*ARGS[:-2], "--count", "8", "--space", str(space), "--runs-dir", str(tmp_path / "r"), "--trials", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "predicted OOM" in err


def test_offload_is_a_searched_dimension_where_hbm_is_short(tmp_path, capsys):
    """On one B200 node Qwen3.5-122B fits only with the optimizer on the host: TPE must propose offload values
    (a study parameter), and every dispatched layout offloads and fits the node's host memory."""
    capsys.readouterr()
    rc = main(["search", "--model", "Qwen3.5-122B-A10B", "--gpu", "B200", "--count", "8", "--runs-dir", str(tmp_path),
               "--trials", "3", "--planner", "optuna", "--seed", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    study = optuna.load_study(study_name=out["study"], storage=f"sqlite:///{tmp_path / out['study'] / 'study.db'}")
    assert "optimizer_offload" in study.trials[0].params
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    lays = [Layout.from_dict(t.user_attrs["layout"]) for t in done]
    assert len(lays) == 3 and all(l.optimizer_offload > 0 for l in lays)
    ev = evaluate(load_model("Qwen3.5-122B-A10B"), Workload(), ClusterSpec.of("B200", 8), LayoutTable.from_layouts(lays))
    assert ev.memory.fits.all() and (ev.time.step_terms["offload"] > 0).all()


def test_the_human_output_says_what_the_space_screening_kept(tmp_path, capsys):
    """Off a terminal no spinner is drawn; a note gives the funnel the JSON carries, stage by stage."""
    capsys.readouterr()
    assert main([*ARGS, "--runs-dir", str(tmp_path), "--trials", "1"]) == 0
    err = capsys.readouterr().err
    assert "screening the search space" not in err  # the spinner is a terminal's only
    line = next(ln for ln in err.splitlines() if ln.startswith("note: search space "))
    rc, out = run_json(capsys, "--runs-dir", str(tmp_path), "--trials", "1")
    assert rc == 0 and line == "note: search space search_spaces/Qwen3.5-122B-A10B.yaml: " + " -> ".join(
        f"{f['count']:,} {f['stage']}" for f in out["funnel"])


def test_notes_shown_before_the_run_are_not_repeated_on_the_same_terminal(tmp_path, monkeypatch):
    """On one terminal the notes printed before the run are not printed again under the table; where the summary
    goes elsewhere (stdout to a file), it keeps them all."""
    import io

    from rich.console import Console

    from autotune.cli import report, search as search_cli

    def run_with(out_tty: bool):
        out, err = io.StringIO(), io.StringIO()
        monkeypatch.setattr(search_cli, "console", Console(file=out, force_terminal=out_tty, width=200))
        monkeypatch.setattr(report, "console", search_cli.console)
        monkeypatch.setattr(search_cli, "err_console", Console(file=err, force_terminal=True, width=200))
        assert main([*ARGS, "--runs-dir", str(tmp_path), "--trials", "1"]) == 0
        return out.getvalue(), err.getvalue()

    out, err = run_with(out_tty=True)
    assert "note: planner: model-guided" in err and "note: planner:" not in out
    assert "best: " in out
    out, err = run_with(out_tty=False)
    assert "note: planner: model-guided" in err and "note: planner: model-guided" in out


def test_local_backend_checks_this_machine_before_any_trial(tmp_path, capsys, monkeypatch):
    """--backend local runs megatron-core here: without torch it is one line and exit 2 before a study exists;
    with it, what this machine lacks (DeepEP, HybridEP, Transformer Engine) narrows the space with a note."""
    from autotune.trials import plan

    real = plan.has_module
    monkeypatch.setattr(plan, "has_module", lambda name: False if name == "torch" else real(name))
    capsys.readouterr()
    rc = main(["search", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--backend", "local",
               "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "torch is not installed" in err and "--backend simulate" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
    monkeypatch.setattr(plan, "has_module", lambda name: name in ("torch", "megatron.core"))
    monkeypatch.setattr(plan, "megatron_has_paged_stash", lambda: False)  # megatron-core 0.16.1's case
    assert plan.local_software() == {"has_te": False, "has_deepep": False, "has_hybridep": False,
                                     "has_paged_stash": False}
    monkeypatch.setattr(plan, "megatron_has_paged_stash", lambda: True)
    assert "has_paged_stash" not in plan.local_software()


def test_local_backend_refuses_gpu_ranks_this_machine_does_not_have(tmp_path, capsys, monkeypatch):
    """--backend local with 8 x H100 on a machine without 8 GPUs would start 8 CPU processes, each with its full
    shard of the model, until the OOM killer ends them: refused in one line, exit 2, before a study exists. CPU
    ranks, and GPU ranks the machine has, pass."""
    from autotune.trials import plan

    assert "no GPU" in plan.local_capacity_refusal("H100", True, 8, gpus=0)
    assert "has 4 GPUs" in plan.local_capacity_refusal("H100", True, 8, gpus=4)
    assert plan.local_capacity_refusal("H100", True, 8, gpus=8) is None
    assert plan.local_capacity_refusal("cpu", False, 8, gpus=0) is None
    monkeypatch.setattr(plan, "local_gpus", lambda: 0)
    capsys.readouterr()
    rc = main(["search", "--model", "tiny-moe", "--gpu", "H100", "--count", "8", "--backend", "local",
               "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2 and "8 x H100 needs 8" in err and "--backend ray" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_the_search_says_what_missing_software_took_out_of_the_space(tmp_path, capsys):
    """--no-deepep (or a machine without DeepEP under --backend local) narrows the space; the search's notes say
    so, as `autotune space` does (they were never shown by search)."""
    rc, out = run_json(capsys, "--runs-dir", str(tmp_path), "--trials", "1", "--no-deepep")
    assert rc == 0
    assert any("flex dispatcher dropped: DeepEP is not available" in n for n in out["notes"])
    assert any("hybridep dispatcher dropped" in n for n in out["notes"])


def test_commands_in_the_summary_are_not_broken_over_lines(tmp_path, capsys, monkeypatch):
    """On a narrow terminal the export and dashboard commands stay one line each (a copied command must run)."""
    from autotune.cli.console import console

    monkeypatch.setattr(console, "width", 60)
    capsys.readouterr()
    rc = main([*ARGS, "--runs-dir", str(tmp_path), "--trials", "1", "--study", "narrow"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"autotune export {tmp_path / 'narrow'} --rank 1" in out
    assert f"(optuna-dashboard sqlite:///{tmp_path / 'narrow'}/study.db)" in out


@pytest.mark.parametrize("precision, gpu, cls, flags", [
    ("mxfp8", "B200", "fp8", ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]),
    ("nvfp4", "B200", "fp4", ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]),
])
def test_a_low_precision_search_emits_recipes_that_keep_their_recipe(tmp_path, capsys, precision, gpu, cls, flags):
    """--precision mxfp8 / nvfp4 end to end: the gates and the recipes took the workload's precision for a recipe
    class (bf16, fp8, ...) and the search died after its trials. A recipe names the class (fp8, fp4); its run block
    the FP8 / FP4 recipe, which reading it back, `estimate --recipe` and the Megatron export keep."""
    from autotune.recipes.convert import workload_of
    from autotune.recipes.io import load_recipe

    capsys.readouterr()
    rc = main(["search", "--model", "Qwen3-30B-A3B", "--gpu", gpu, "--count", "16", "--precision", precision,
               "--trials", "2", "--runs-dir", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["recipes"]
    recipe = load_recipe(out["recipes"][0])
    assert recipe.workload.precision == cls
    assert " ".join(flags) in recipe.run.replace("\\\n", " ").replace("  ", " ")
    assert workload_of(recipe).precision == precision
    assert main(["estimate", "--recipe", out["recipes"][0]]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / out["study"]), "--format", "megatron"]) == 0
    argv = capsys.readouterr().out.split()
    assert "--bf16" in argv and argv[argv.index(flags[2]) + 1] == flags[3]


def test_a_gpu_from_a_file_runs_its_trials_on_its_own_figures(tmp_path, capsys):
    """--gpu FILE: the trials ran on the catalog GPU of the file's name (none: the search died after trial 0; a
    catalog name: the catalog's memory, every trial out of memory). The spec carries the whole GPU."""
    from autotune.trials.spec import TrialResult, TrialSpec, read_model

    text = ("name: {name}\nmemory_gb_nominal: 192\nbf16_tflops: 1300\nfp8_tflops: 2600\nhbm_gbps: 5300\n"
            "nvlink_gbps: 448\nusd_per_hour: 5\n")
    for name in ("MyGPU", "H100"):  # a name the catalog lacks, and a catalog name with other figures
        gpu = tmp_path / f"{name}.yaml"
        gpu.write_text(text.format(name=name))
        capsys.readouterr()
        rc = main(["search", "--model", "Llama-3.1-8B", "--gpu", str(gpu), "--count", "8", "--trials", "2",
                   "--runs-dir", str(tmp_path), "--study", name.lower(), "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0 and out["recipes"], name
        spec = read_model(TrialSpec, tmp_path / name.lower() / "trials" / "0" / "trial_spec.json")
        assert spec.gpu == name and spec.gpu_spec.memory_gb_nominal == 192
        res = read_model(TrialResult, tmp_path / name.lower() / "trials" / "0" / "trial_result.json")
        assert res.status == "ok" and res.prediction.capacity_bytes > 150 * 2**30  # the file's 192 GB, not 80
    assert main(["estimate", "--recipe", out["recipes"][0]]) == 0  # a catalog name reads back (as the catalog's)
    first = sorted((tmp_path / "mygpu" / "recipes").glob("rank-01-*.yaml"))[0]
    capsys.readouterr()
    assert main(["estimate", "--recipe", str(first)]) == 2
    err = capsys.readouterr().err
    assert "GPU 'MyGPU' is not in the catalog" in err and "--gpu FILE.yaml" in err and err.count("\n") == 1


def test_resume_finds_the_study_by_what_it_was_created_for(tmp_path, capsys):
    """--resume without --study: the latest study for this model, GPU and count, whatever its name (a prefix match
    took 'x16' studies for a count of 1 and missed studies named with --study)."""
    base = ["search", "--model", "Qwen3.5-0.8B", "--gpu", "H100", "--runs-dir", str(tmp_path), "--trials", "2"]
    assert main([*base, "--count", "16", "--json"]) == 0
    capsys.readouterr()
    rc = main([*base, "--count", "1", "--resume"])
    err = capsys.readouterr().err
    assert rc == 2 and "--resume: no study for Qwen3.5-0.8B on 1 x H100" in err
    assert main([*base, "--count", "8", "--study", "mine", "--json"]) == 0
    capsys.readouterr()
    assert main([*base[:-1], "3", "--count", "8", "--resume", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["study"] == "mine" and out["dispatched"] == 3
    # --resume with a --study that does not exist promised a study to continue: refused, nothing created
    rc = main([*base, "--count", "8", "--study", "mien", "--resume"])
    err = capsys.readouterr().err
    assert rc == 2 and "--resume --study mien: no such study" in err and err.count("\n") == 1
    assert not (tmp_path / "mien").exists()


def test_export_takes_the_newest_study_that_wrote_recipes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*ARGS, "--trials", "1", "--study", "done", "--json"]) == 0
    newer = tmp_path / "runs" / "broken"
    newer.mkdir()
    (newer / "study.db").write_bytes(b"")
    capsys.readouterr()
    assert main(["export"]) == 0
    assert "runs/done/" in capsys.readouterr().err
    (tmp_path / "runs" / "done").rename(tmp_path / "gone")
    assert main(["export"]) == 2
    err = capsys.readouterr().err
    assert "no study under ./runs has written recipes yet" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("timeout_s, warned", [(60.0, True), (3600.0, False)])
def test_a_trial_predicted_to_outlast_its_timeout_is_said_before_it_runs(tmp_path, timeout_s, warned):
    """A real trial whose predicted steps take longer than --trial-timeout would only end as a timeout, after
    the whole timeout (a CPU search's default trial: ~5,600 s of steps against 3,600 s): the note says so up front.
    The cluster is a test double: the simulator's numbers reported as measured."""
    from autotune.search.driver import SearchConfig, SearchDriver
    from autotune.space import load_space
    from autotune.trials.backends.simulate import SimulateBackend

    class Measured(SimulateBackend):
        measured = True

    model = load_model("Qwen3.5-122B-A10B")
    d = SearchDriver(model, ClusterSpec.of("H200", 32), Workload(), load_space(None, model), Measured(),
                     StudyDir(tmp_path, "slow"), SearchConfig(trials=1, timeout_s=timeout_s))
    events = []
    d.emit = lambda kind, data: events.append((kind, data))
    d.run()
    notes = [data["text"] for kind, data in events if kind == "note"]
    assert any(f"more than --trial-timeout {timeout_s:,.0f} s" in n for n in notes) == warned


def test_the_peak_shown_for_a_measured_trial_is_the_one_it_measured(tmp_path):
    """The ranked table's peak column showed the model's predicted peak on measured rows; it is the trial's own
    (the prediction stays beside it). The cluster is a test double reporting 90% of the predicted peak."""
    from autotune.search.driver import SearchConfig
    from autotune.search.session import SearchSession
    from autotune.space import load_space
    from autotune.trials.backends.simulate import SimulateBackend

    class Measured(SimulateBackend):
        measured = True

        def _simulate(self, spec):
            res = super()._simulate(spec)
            return res.model_copy(update={"source": "measured", "peak_memory_bytes": int(res.peak_memory_bytes * 0.9)})

    model = load_model("Qwen3.5-122B-A10B")
    s = SearchSession(model, ClusterSpec.of("H200", 32), Workload(), load_space(None, model), Measured(),
                      StudyDir(tmp_path, "peak"), SearchConfig(trials=2))
    s.prepare()
    rows = s.run().to_json()["trials"]
    assert rows and all(r["state"] == "measured" for r in rows)
    for r in rows:
        assert r["peak_memory_bytes"] == pytest.approx(0.9 * r["predicted_peak_memory_bytes"], rel=1e-6)


def test_a_measured_trials_standard_error_reaches_the_outcome_the_study_and_the_belief(tmp_path, capsys):
    """A trial's standard error (its window's CV / sqrt(steps)) is in the outcome's rows and the printed table, in the
    study (the dashboard reads it back) and in the residual model's row noise. The cluster is a test double whose
    trials report a 6% step-time CV over a 9-step window: 2% standard error."""
    from autotune.cli.report import render_outcome
    from autotune.report.study import load_study
    from autotune.search.driver import SearchConfig
    from autotune.search.session import SearchSession
    from autotune.space import load_space
    from autotune.trials.backends.simulate import SimulateBackend

    class Measured(SimulateBackend):
        measured = True

        def _simulate(self, spec):
            res = super()._simulate(spec)
            return res.model_copy(update={"source": "measured", "step_time_cv_percent": 6.0, "window": (5, 13)})

    model = load_model("Llama-3.1-8B")
    s = SearchSession(model, ClusterSpec.of("H100", 8), Workload(), load_space(None, model), Measured(),
                      StudyDir(tmp_path, "se"), SearchConfig(trials=2, noise=0.01))
    s.prepare()
    out = s.run().to_json()
    assert [r["stderr"] for r in out["trials"]] == pytest.approx([0.02, 0.02])
    assert list(s.driver.candidates.residual.row_noise) == pytest.approx([0.02, 0.02])  # above the 1% noise
    capsys.readouterr()
    render_outcome(out)
    assert "+/-2.0%" in capsys.readouterr().out
    assert [t.stderr for t in load_study(tmp_path / "se").trials] == pytest.approx([0.02, 0.02])


def test_a_close_call_between_the_two_best_is_said_when_their_trials_scattered():
    """The note names both trials when they are apart by less than twice their difference's standard error and one of
    them scattered more than --noise; it is silent when they are far apart, when both are as steady as the noise, and
    for trials that report no error (the simulator's)."""
    from autotune.search.planners import TrialRecord
    from autotune.search.session import close_call

    lay = Layout(tp=1, pp=4, ep=8, world=32)

    def rec(n, v, se, source="measured"):
        return TrialRecord(n, lay, "ok", source, v, v, stderr=se)

    note = close_call([rec(3, 3098.6, 0.061), rec(0, 2966.2, 0.046)], 0.02)
    assert "trial 3" in note and "3,098.6 +/-6.1%" in note and "trial 0" in note and "4.4% apart" in note
    # sqrt(0.061^2 + 0.046^2) = 7.6%: 2 x that is 15.3%, so 16% apart is settled
    assert close_call([rec(3, 3098.6, 0.061), rec(0, 3098.6 / 1.174, 0.046)], 0.02) is None
    assert close_call([rec(3, 3098.6, 0.015), rec(0, 2966.2, 0.01)], 0.02) is None  # as steady as the noise
    assert close_call([rec(3, 3098.6, None), rec(0, 2966.2, None)], 0.02) is None
    assert close_call([rec(3, 3098.6, 0.06, "predicted"), rec(0, 2966.2, 0.05)], 0.02) is None
    assert close_call([rec(3, 3098.6, 0.06)], 0.02) is None


def test_a_search_where_no_trial_succeeded_says_so(tmp_path, capsys):
    """Every trial timed out: the search printed no best line at all, and the dashboard said the recipes were
    'not written yet' for a search that had ended. The cluster is a test double whose trials all time out."""
    from autotune.cli.report import render_outcome
    from autotune.report.study import load_study
    from autotune.search.driver import SearchConfig
    from autotune.search.session import SearchSession
    from autotune.space import load_space
    from autotune.trials.backends.simulate import SimulateBackend
    from autotune.trials.spec import TrialResult

    class TimesOut(SimulateBackend):
        measured = True

        def _simulate(self, spec):
            return TrialResult(study=spec.study, number=spec.number, status="timeout", backend=self.name,
                               reason="no step within the timeout", wall_s=60.0)

    model = load_model("Llama-3.1-8B")
    s = SearchSession(model, ClusterSpec.of("H100", 8), Workload(), load_space(None, model), TimesOut(),
                      StudyDir(tmp_path, "tmo"), SearchConfig(trials=2))
    s.prepare()
    out = s.run().to_json()
    assert out["best"] is None and not out["recipes"] and out["dispatched"] == 2
    capsys.readouterr()
    render_outcome(out)
    assert "best: none: no trial succeeded" in capsys.readouterr().out
    view = load_study(tmp_path / "tmo")
    assert "recipes (none: no trial of this search succeeded)" in view.missing


def test_a_finished_trial_keeps_its_label_and_the_planners_rationale(tmp_path, capsys):
    """The record written when a trial finishes set every attribute it did not name to its default, so the
    label and the planner's 'why' written at dispatch were blanked: the dashboard lost the rationale column."""
    from autotune.report.study import load_study

    assert main(["search", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--trials", "2",
                 "--runs-dir", str(tmp_path), "--study", "why", "--json"]) == 0
    study, done = _completed(tmp_path / "why" / "study.db", "why")
    assert len(done) == 2
    for t in done:
        assert t.user_attrs["label"] and "EP" not in t.user_attrs["label"]  # a dense model's label
        assert t.user_attrs["why"] and t.user_attrs["status"] == "ok"
    view = load_study(tmp_path / "why")
    assert all(t.why for t in view.trials)


def test_a_study_from_before_uneven_splits_resumes_over_even_splits(tmp_path, capsys, monkeypatch):
    """A study made before the layer_split dimension stored no such parameter and none of the PP / VPP values only
    uneven splits make legal (Llama-3.1-8B's 32 layers over VPP 3); resumed, it keeps to even splits and says so,
    where it had refused ('this space adds [3]')."""
    from autotune.layout import dimensions
    from autotune.search import study as study_mod

    argv = ["search", "--model", "Llama-3.1-8B", "--gpu", "H200", "--count", "8", "--runs-dir", str(tmp_path),
            "--study", "old", "--json"]
    old_names = tuple(n for n in dimensions.PARAM_NAMES if n != "layer_split")
    monkeypatch.setattr(study_mod, "PARAM_NAMES", old_names)
    monkeypatch.setattr(study_mod, "layout_params",
                        lambda lay: {k: v for k, v in dimensions.layout_params(lay).items() if k != "layer_split"})
    old_space = tmp_path / "even.yaml"
    old_space.write_text("extends: default\ndimensions:\n  layer_split: [even]\n")
    assert main(argv + ["--trials", "3", "--space", str(old_space)]) == 0
    monkeypatch.undo()
    capsys.readouterr()
    assert main(argv + ["--trials", "5", "--resume"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dispatched"] == 5 and any("predates the search over uneven layer splits" in n for n in out["notes"])
    study = optuna.load_study(study_name="old", storage=f"sqlite:///{tmp_path / 'old' / 'study.db'}")
    assert all(not Layout.from_dict(t.user_attrs["layout"]).layer_split for t in study.trials)


def test_the_optuna_planner_samples_splits_that_fit_its_pp_and_vpp(tmp_path, capsys):
    """End to end on Qwen3-235B-A22B's 94 layers (most PP x VPP pairs run only with an uneven split): the Optuna
    planner dispatches until its budget or the stop rule ends the search (its 12 candidates: the rule may fire with half
    of them tried), never stalling, and uneven splits among its trials. (The stall this narrowed space is too small to
    show, a free categorical naming another pair's split, is tested on the mirror itself in test_planners.py.)"""
    space = tmp_path / "s.yaml"
    space.write_text("extends: default\ndimensions:\n  tp: [1, 2]\n  pp: [4, 8, 16]\n  vpp: [1, 2, 3, 4]\n  cp: [1]\n"
                     "  ep: [8]\n  etp: [1]\n  recompute: [full:uniform:1]\n  optimizer_offload: [0.0]\n")
    assert main(["search", "--model", "Qwen3-235B-A22B", "--gpu", "H100", "--count", "64", "--space", str(space),
                 "--planner", "optuna", "--seed", "3", "--trials", "8", "--runs-dir", str(tmp_path), "--study", "o",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dispatched"] == 8 or (out["dispatched"] >= 5 and out["stop_reason"].startswith("converged"))
    study = optuna.load_study(study_name="o", storage=f"sqlite:///{tmp_path / 'o' / 'study.db'}")
    done = [Layout.from_dict(t.user_attrs["layout"]) for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == out["dispatched"] and any(lay.layer_split for lay in done)
