"""`autotune dashboard --html` on a real simulator study: every section is there, built from the study's own
numbers, and the file stands alone (no external resource). Optional pieces missing degrade, not crash."""

import json
import re
import sqlite3
from html import escape

from autotune.cli.main import main
from autotune.report import load_study, render_html
from autotune.report.bars import TERM_ORDER
from autotune.report.study import TrialView
from autotune.trials.spec import Prediction

PLOTS = ["best-vs-trials", "best-vs-gpu-hours", "predicted-vs-measured", "memory-vs-throughput", "step-breakdown",
         "map-tp-pp", "map-ep-recompute", "funnel"]


def _html(capsys, study, tmp_path):
    out = tmp_path / "report.html"
    capsys.readouterr()
    assert main(["dashboard", str(study), "--html", str(out)]) == 0
    text, _ = capsys.readouterr()
    assert f"wrote {out}" in text
    return out.read_text()


def _rows(html: str) -> list[str]:
    body = html.split('<table id="trials"', 1)[1].split("</tbody>", 1)[0]
    return re.findall(r"<tr[^>]*>(.*?)</tr>", body.split("<tbody>", 1)[1])


def test_report_holds_every_section_from_the_study(capsys, sim_study, summary, tmp_path):
    html = _html(capsys, sim_study, tmp_path)
    for name in PLOTS:
        assert f'class="plot" data-plot="{name}"' in html, name  # drawn, not an empty placeholder
    assert 'class="plot empty"' not in html
    rows = _rows(html)
    assert len(rows) == len(summary["trials"]) == 20
    best = summary["best"]
    first = re.findall(r'data-v="([^"]*)"', rows[0])
    assert first[1] == str(best["number"]) and first[2] == best["layout"]
    assert f'{best["tokens_per_s_per_gpu"]:,.1f}' in rows[0]
    # the planner's rationale per trial comes from study.db's user attributes
    con = sqlite3.connect(sim_study / "study.db")
    whys = [json.loads(v) for (v,) in con.execute("SELECT value_json FROM trial_user_attributes WHERE key = 'why'")]
    assert len(whys) == 20 and all(escape(w) in html for w in whys)
    for stage in summary["funnel"]:
        assert f'{stage["stage"]}: {stage["count"]:,}' in html
    for path in summary["recipes"]:
        assert path.rsplit("/", 1)[1].split("-", 2)[2].removesuffix(".yaml") in html
    assert "Simulator study" in html and "not run" in html  # the gates have not run on predicted recipes
    assert "on 32 x H200 (8,192-token rows, 128 a step, bf16)" in html
    # self-contained: no URL is ever loaded
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "<link" not in html and "<script src" not in html and "@import" not in html


def test_step_breakdown_is_the_top_layouts_time_terms(sim_study):
    view = load_study(sim_study)
    top = view.ranked()[0]
    res = json.loads((sim_study / "trials" / str(top.number) / "trial_result.json").read_text())
    terms = res["prediction"]["time_terms"]
    html = render_html(view)
    seg = html.split('data-plot="step-breakdown"', 1)[1].split("</svg>", 1)[0]
    assert f"#1 trial {top.number}: {top.label}" in seg
    assert f"{sum(terms.values()):.2f} s" in seg
    shown = [t for t in TERM_ORDER if terms.get(t, 0) > 0]
    assert shown and all(f"{t}: {terms[t]:.3f} s" in seg for t in shown)


def test_layout_map_cells_hold_the_best_value_per_cell(sim_study):
    view = load_study(sim_study)
    best = {}
    for t in view.ranked():
        key = (t.layout["tp"], t.layout["pp"])
        best[key] = max(best.get(key, 0), t.value)
    seg = render_html(view).split('data-plot="map-tp-pp"', 1)[1].split("</svg>", 1)[0]
    for (tp, pp), v in best.items():
        assert f"tp {tp}, pp {pp}:" in seg and f"best {v:,.1f} tokens/s/GPU" in seg


def test_missing_optional_pieces_degrade_to_not_available(study_copy):
    (study_copy / "summary.json").unlink()
    for p in (study_copy / "recipes").glob("*.yaml"):
        p.unlink()
    for d in (study_copy / "trials").iterdir():
        (d / "trial_result.json").unlink()
        spec = d / "trial_spec.json"  # a study from before predictions carried breakdowns
        doc = json.loads(spec.read_text())
        doc.pop("predicted", None)
        spec.write_text(json.dumps(doc))
    view = load_study(study_copy)
    assert len(view.trials) == 20 and view.stop_reason  # still read from study.db
    html = render_html(view)
    assert "summary.json (the search has not finished)" in html and "recipes (none written yet" in html
    assert "the pruning funnel (summary.json has none)" in html
    funnel = html.split('data-plot="funnel"', 1)[1].split("</svg>", 1)[0]
    assert "enumerated" not in funnel and "dispatched: 20" in funnel  # what the trials themselves tell
    # no trial file carries a prediction: no time terms to break down
    assert 'class="plot empty" data-plot="step-breakdown"' in html
    assert "predictions (breakdowns) for 20 trials" in html
    for name in PLOTS:
        assert f'data-plot="{name}"' in html


def test_dashboard_json_and_terminal_summary(capsys, sim_study, summary):
    capsys.readouterr()
    assert main(["dashboard", str(sim_study), "--json"]) == 0
    d = json.loads(capsys.readouterr()[0])
    assert d["study"] == "sim" and d["dispatched"] == 20 and d["backend"] == "simulate"
    assert d["workload"] == {"seq_len": 8192, "global_batch": 128, "precision": "bf16",  # the study's own attrs
                             "routing": "natural"}
    ranked = sorted((t for t in d["trials"] if t["rank"]), key=lambda t: t["rank"])
    assert ranked[0]["number"] == summary["best"]["number"]
    peaks = [t["peak_memory_bytes"] for t in ranked]
    assert all(type(p) is int and p > 0 for p in peaks)  # bytes are whole numbers (Optuna stores floats)
    assert [f["stage"] for f in d["funnel"]][:len(summary["funnel"])] == [f["stage"] for f in summary["funnel"]]
    assert main(["dashboard", str(sim_study)]) == 0
    out = capsys.readouterr()[0]
    assert "study sim" in out and summary["best"]["layout"] in out and "funnel: enumerated" in out
    assert "Qwen3.5-122B-A10B on 32 x H200 (8,192-token rows, 128 a step, bf16)" in out


def test_a_studys_routing_is_stated_with_its_rows(sim_study):
    """A study searched with --routing aux-loss says so wherever its rows are stated (terminal, HTML, JSON)."""
    from autotune.report.summary import view_json

    view = load_study(sim_study)
    assert view.rows_text() == "8,192-token rows, 128 a step, bf16"
    view.workload = {**view.workload, "load_balancing_loss": True}
    assert view.rows_text().endswith("bf16, load-balancing loss on")
    assert view_json(view)["workload"]["routing"] == "aux-loss"


def test_dashboard_defaults_to_the_newest_study(capsys, sim_study):
    capsys.readouterr()
    assert main(["dashboard", "--runs-dir", str(sim_study.parent), "--json"]) == 0
    assert json.loads(capsys.readouterr()[0])["study"] == "sim"


def test_memory_chart_marks_oom_trials_and_the_capacity(sim_study):
    view = load_study(sim_study)
    ok = view.ranked()[0]
    view.trials.append(TrialView(number=99, state="COMPLETE", status="oom", source="measured", label="TP1 PP1 EP8 DP32",
                                 layout={"tp": 1, "pp": 1, "ep": 8}, peak_bytes=160 * 1024**3,
                                 reason="CUDA out of memory on rank 3"))
    from autotune.report.plots import memory_vs_throughput

    svg = memory_vs_throughput(view)
    assert "OOM (1)" in svg and "trial 99: TP1 PP1 EP8 DP32" in svg and "CUDA out of memory on rank 3" in svg
    assert f"usable HBM {view.capacity_bytes / 1024**3:,.1f} GiB" in svg
    assert f"trial {ok.number}: {ok.label}" in svg
    assert isinstance(ok.prediction, Prediction) and ok.mfu == ok.prediction.mfu
    row = [r for r in _rows(render_html(view)) if "TP1 PP1 EP8 DP32" in r][0]
    assert 'class="st-oom" data-v="oom"' in row and "CUDA out of memory on rank 3" in row
    assert "no training step was run" not in _rows(render_html(view))[0]  # a simulated result's stock note


def test_a_running_study_shows_its_running_trial(study_copy):
    """Mid-search: no summary.json yet, one trial dispatched and not finished (written with Optuna itself)."""
    import optuna

    (study_copy / "summary.json").unlink()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="sim", storage=f"sqlite:///{study_copy / 'study.db'}")
    lay = study.trials[0].user_attrs["layout"]
    trial = study.ask()
    for k, v in {"layout": lay, "label": "TP9 RUNNING", "predicted": 1234.5, "why": "still out there"}.items():
        trial.set_user_attr(k, v)
    view = load_study(study_copy)
    running = [t for t in view.trials if t.label == "TP9 RUNNING"]
    assert len(running) == 1 and running[0].display_state == "running" and not running[0].ok
    assert view.stop_reason == study.user_attrs["stop_reason"]  # the last run's, from study.db
    html = render_html(view)
    assert f"running, or killed mid-trial: 1 trial in flight; last stop: {view.stop_reason}" in html
    row = [r for r in _rows(html) if "TP9 RUNNING" in r]
    assert len(row) == 1 and "running" in row[0] and "1,234.5" in row[0] and "still out there" in row[0]


def test_gate_results_of_a_verified_recipe(study_copy):
    """A recipe whose gates ran (the repository's verified seed recipe) shows them, and counts as verified."""
    import shutil

    from autotune.recipes.io import shipped_recipes

    src = shipped_recipes() / "qwen3.5-122b-a10b" / "h200" / "attune-tp1-pp4-ep8-rc2.yaml"
    shutil.copy(src, study_copy / "recipes" / "rank-00-attune-tp1-pp4-ep8-rc2.yaml")
    view = load_study(study_copy)
    html = render_html(view)
    gates = html.split("<h2>Recipes and their correctness gates</h2>", 1)[1].split("</table>", 1)[0]
    row = [r for r in re.findall(r"<tr>(.*?)</tr>", gates) if "attune-tp1-pp4-ep8-rc2" in r][0]
    assert 'class="pass" data-v="pass">pass' in row and "correlation 0.999997" in row and "verified" in row
    assert sum('class="notrun" data-v="not run">not run' in r for r in re.findall(r"<tr>(.*?)</tr>", gates)) == 5
    funnel = html.split('data-plot="funnel"', 1)[1].split("</svg>", 1)[0]
    assert "verified: 1" in funnel


def _add_measured(view) -> None:
    """Three measured trials, predicted at dispatch 11.1% high, 4.8% low and exactly (median error 4.8%)."""
    view.trials += [TrialView(number=90 + i, state="COMPLETE", status="ok", source="measured", label=f"M{i}",
                              layout={}, predicted=p, value=v)
                    for i, (p, v) in enumerate([(3000, 2700), (2000, 2100), (1000, 1000)])]


def test_model_error_of_measured_trials(sim_study):
    from autotune.report.plots import predicted_vs_measured

    view = load_study(sim_study)
    _add_measured(view)
    svg = predicted_vs_measured(view)
    # |3000/2700 - 1| = 11.1%, |2000/2100 - 1| = 4.8%, 0%: the median is 4.8%
    assert "the model&#x27;s median error 4.8% over 3 measured trials" in svg
    assert "trial 90: M0" in svg and "model error +11.1%" in svg and "model error -4.8%" in svg


def test_the_terminal_summary_gives_the_model_error_and_the_calibrate_command_once_trials_are_measured(sim_study):
    """A simulated study's summary has no model error to state; with measured trials it states the median error and
    the command that keeps what they taught (autotune calibrate --measurements <study>)."""
    from rich.console import Console

    from autotune.report.summary import render_summary

    def text(view) -> str:
        con = Console(record=True, width=400)
        render_summary(view, con)
        return con.export_text()

    view = load_study(sim_study)
    assert "median error at dispatch" not in text(view) and "autotune calibrate" not in text(view)
    _add_measured(view)
    line = next(x for x in text(view).splitlines() if "median error at dispatch" in x)
    assert "4.8% over 3 measured trials" in line
    assert f"autotune calibrate --measurements {view.root} --out {view.root}/calibration.json" in line


def test_a_summary_without_its_database(capsys, study_copy, summary, tmp_path):
    (study_copy / "study.db").unlink()
    view = load_study(study_copy)
    assert len(view.trials) == len(summary["trials"]) and view.ranked()[0].number == summary["best"]["number"]
    html = _html(capsys, study_copy, tmp_path)
    assert len(_rows(html)) == len(summary["trials"])


def test_a_measured_trials_standard_error_shows_beside_its_value(sim_study):
    """The terminal table, the HTML table and --json show a measured value's standard error when its trial reported
    one (TrialResult.stderr), and nothing extra when it did not."""
    from rich.console import Console

    from autotune.report.summary import render_summary, view_json

    view = load_study(sim_study)
    _add_measured(view)
    view.trials[-3].stderr = 0.026  # M0, 2,700 measured
    con = Console(record=True, width=400)
    render_summary(view, con, top=100)
    text = con.export_text()
    assert "2,700.0 +/-2.6%" in text and "2,100.0 " in text and "2,100.0 +/-" not in text
    assert 'data-v="2700">2,700.0 +/-2.6%</td>' in render_html(view)
    rows = {t["number"]: t for t in view_json(view)["trials"]}
    assert rows[90]["stderr"] == 0.026 and rows[91]["stderr"] is None
