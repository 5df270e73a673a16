"""What the CLI says, word for word where it used to go wrong: plurals, statuses said once, a zero that is not
negative, numbers aligned, small budgets that do not read as 0.0, a resumed study that says so, and export's
--rank and source path."""

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.gates.section import run_gates

SEARCH = ["search", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8"]
SEEDS = Path(__file__).resolve().parents[1] / "src" / "autotune" / "data" / "recipes" / "qwen3.5-122b-a10b" / "h200"


def run(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def one_trial(tmp_path_factory):
    """A one-trial simulated study under a small GPU-hour budget, and what its first run printed (capsys is
    per test: the output is caught here by redirection)."""
    runs = tmp_path_factory.mktemp("runs")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*SEARCH, "--trials", "1", "--budget-gpu-hours", "0.01", "--runs-dir", str(runs), "--study", "w1"])
    assert rc == 0
    return runs, out.getvalue(), err.getvalue()


def test_counts_are_plural_only_when_more_than_one(one_trial):
    _, out, err = one_trial
    assert "trial budget reached (1 trial)" in out and "1 trial, " in out
    assert "(1 trials)" not in out + err and "(s)" not in out + err


def test_a_small_budget_is_not_printed_as_zero(one_trial):
    _, out, err = one_trial
    assert "more than the 0.01 left of --budget-gpu-hours 0.01" in err
    assert not re.search(r"\b0\.0 left", err)


def test_a_resumed_study_says_so(one_trial, capsys, tmp_path):
    runs, _, err = one_trial
    assert "resuming" not in err  # a new study
    rc, _, err = run(capsys, *SEARCH, "--trials", "1", "--runs-dir", str(runs), "--study", "w1")
    assert rc == 0 and err.splitlines()[0] == (
        "resuming study w1: 1 trial kept, which is already the --trials 1 budget: nothing more to run; raise --trials "
        "(e.g. --trials 11) to search further")
    shutil.copytree(runs / "w1", tmp_path / "w1", symlinks=True)  # the module's study stays one trial long
    rc, _, err = run(capsys, *SEARCH, "--trials", "3", "--runs-dir", str(tmp_path), "--resume", "--json")
    assert rc == 0 and err.splitlines()[0] == "resuming study w1: 1 trial kept, running up to 2 more (--trials 3)"


def test_estimate_of_its_recipe_never_prints_minus_zero(one_trial, capsys):
    runs, _, _ = one_trial
    recipe = next((runs / "w1" / "recipes").glob("rank-01-*.yaml"))
    rc, out, _ = run(capsys, "estimate", "--recipe", str(recipe))
    assert rc == 0 and "-0.0%" not in out and re.search(r"the recipe's prediction [\d,.]+ \(\+0\.0%\)", out)


def test_export_names_the_stable_path_and_refuses_rank_on_a_file(one_trial, capsys, tmp_path, monkeypatch):
    runs, _, _ = one_trial
    monkeypatch.chdir(tmp_path)
    rc, _, err = run(capsys, "export", str(runs / "w1"), "--out", "launch.sh")
    stable = next((runs / "w1" / "recipes").glob("rank-01-*.yaml"))
    assert rc == 0 and f"(from {stable})" in err and ".outputs-" not in err
    rc, out, err = run(capsys, "export", str(stable), "--rank", "3")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--rank 3" in err and "recipe file" in err and "without --rank" in err
    rc, out, _ = run(capsys, "export", str(stable))  # a recipe file without --rank: as before
    assert rc == 0 and out.startswith("# recipes/")


def test_gate_summaries_say_their_status_once(capsys):
    rc, out, _ = run(capsys, "check", "config", "--candidate", str(SEEDS / "attune-tp1-pp4-ep8-flex.yaml"),
                     "--reference", str(SEEDS / "attune-tp1-pp4-ep8.yaml"))
    line = out.splitlines()[0]
    assert rc == 0 and line.startswith("configuration: pass  2 performance, 1 kernel differences; 1 needs a "), line
    _, section = run_gates(["--moe-token-dispatcher-type", "flex"], [], predicted=True)
    assert section["summary"].startswith("not run: convergence: predicted (the simulator ran no training steps)")
    assert section["summary"].count("not run") == 1, section["summary"]


def test_recipes_show_says_not_run_once(one_trial, capsys):
    runs, _, _ = one_trial
    recipe = next((runs / "w1" / "recipes").glob("rank-01-*.yaml"))
    rc, out, _ = run(capsys, "recipes", "show", str(recipe))
    rows = {line[:18].strip(): line[19:] for line in out.splitlines() if len(line) > 19 and line[:1].isupper()}
    assert rc == 0 and rows["Convergence check"] == "not run"
    assert "not run: not run" not in out and "not run: convergence not run" not in out


def test_gpus_right_aligns_its_numbers(capsys):
    rc, out, _ = run(capsys, "gpus")
    rows = [line for line in out.splitlines() if line.startswith("│ H100 ") or line.startswith("│ B200 ")]
    cells = [[c for c in r.strip("│").split("│")] for r in rows]
    assert rc == 0 and len(cells) == 2
    for k in range(1, 7):  # memory ... per node: padded on the left, flush right
        for row in cells:
            assert row[k].endswith(" ") and not row[k].endswith("  "), (k, row[k])
    assert cells[0][1] == "  79.6 GiB "  # under B200's 178.4 GiB


def test_a_budget_cut_search_says_how_much_is_left_to_find(tmp_path, capsys):
    """A search the trial budget stopped says the stop rule's chance at the end, and (on the simulator) that only
    trials on a cluster settle it; its JSON carries the number."""
    rc, out, _ = run(capsys, *SEARCH, "--trials", "3", "--runs-dir", str(tmp_path), "--study", "cut")
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("stopped: "))
    assert re.fullmatch(r"stopped: trial budget reached \(3 trials\) \(on the model's predictions alone, the chance that "
                        r"an untried layout beats the best by > 2% is \d+%: trials on a cluster would settle it\)", line), line
    rc, out, _ = run(capsys, *SEARCH, "--trials", "3", "--runs-dir", str(tmp_path), "--study", "cut2", "--json")
    d = json.loads(out)
    assert rc == 0 and 0.05 <= d["chance_untried_beats"] <= 1 and d["noise"] == 0.02
