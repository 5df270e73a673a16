"""Tables at any width: an 80-column terminal folds layouts and settings, never a number ('3,12…', '17.…');
the dashboard's text, --json and --html say the same about what was measured."""

import io
import json
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console
from rich.table import Table

from autotune.cli.main import main
from autotune.report import load_study
from autotune.report.fit import break_header, fit
from autotune.report.live import LiveView
from autotune.report.summary import render_summary, view_json

GiB = 1024**3


def _console(width: int, terminal: bool = True) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None, highlight=False)


def _numbers_whole(text: str, numbers: list[str], width: int) -> None:
    assert "…" not in text, text
    assert all(len(line) <= width for line in text.splitlines()), text
    for n in numbers:
        assert re.search(rf"(?<![\d,.]){re.escape(n)}(?![\d.%])", text), (n, text)


def test_fit_folds_text_never_numbers():
    t = Table(title="top")
    for c in ("#", "layout", "recompute", "disp.", "offload", "tok/GPU", "tokens/s/GPU", "MFU", "$/1M", "peak GiB",
              "top cost"):
        t.add_column(c, justify="left" if c in ("layout", "recompute", "disp.", "top cost") else "right")
    for k in range(3):
        t.add_row(str(k + 1), "TP2 PP4 VPP4 EP16 DP4", "selective", "hybridep+ovl", "50%", "8192", f"3,12{k}.4",
                  f"17.{k}%", "0.70", "126.8", "compute_experts 29%")
    for width in (80, 120, 200):
        c = _console(width)
        c.print(fit(t))
        _numbers_whole(c.file.getvalue(), ["3,120.4", "3,122.4", "17.1%", "126.8", "8192", "0.70", "50%"], width)
    wide = _console(200)
    wide.print(fit(t))
    assert "tokens/s/GPU" in wide.file.getvalue() and "TP2 PP4 VPP4 EP16 DP4" in wide.file.getvalue()  # nothing folds
    assert break_header("tokens/s/GPU", 7) == "tokens/\ns/GPU" and break_header("peak GiB", 5) == "peak\nGiB"


@pytest.mark.parametrize("width", [80, 200])
def test_space_table_keeps_its_numbers(capsys, monkeypatch, width):
    import autotune.cli.space as space_cmd

    argv = ["space", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--top", "3"]
    assert main([*argv, "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["top"]
    c = _console(width, terminal=False)  # a pipe with COLUMNS set: the same width rules
    monkeypatch.setattr(space_cmd, "console", c)
    assert main(argv) == 0
    text = c.file.getvalue()
    nums = [f"{b['throughput']['tokens_per_s_per_gpu']:,.1f}" for b in top] + [f"{b['throughput']['mfu']:.1%}" for b in top]
    _numbers_whole(text, nums + [f"{b['memory']['peak_bytes'] / GiB:.1f}" for b in top], width)


@pytest.mark.parametrize("width", [80, 200])
def test_dashboard_and_search_tables_keep_their_numbers(sim_study, monkeypatch, width):
    import autotune.cli.report as report_cmd

    view = load_study(sim_study)
    c = _console(width)
    render_summary(view, c)
    ranked = view.ranked()[:15]
    _numbers_whole(c.file.getvalue(), [f"{t.predicted:,.1f}" for t in ranked] + [f"{t.mfu:.1%}" for t in ranked], width)
    out = json.loads((sim_study / "summary.json").read_text())
    c = _console(width)
    monkeypatch.setattr(report_cmd, "console", c)
    report_cmd.render_outcome(out)
    table = c.file.getvalue().split("\nnote:", 1)[0]
    _numbers_whole(table, [f"{r['predicted']:,.1f}" for r in out["trials"] if r["predicted"]], width)


def test_a_piped_dashboard_takes_the_width_columns_asks_for(sim_study):
    """Piped (a log, `| less`), the console is 160 columns wide so a layout label never folds (cli/console.py),
    unless COLUMNS asks for a width: every line within it, every number whole. The real path: a child process."""
    view = load_study(sim_study)
    nums = [f"{t.predicted:,.1f}" for t in view.ranked()[:15]]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)

    def piped(**extra) -> str:
        return subprocess.run([sys.executable, "-m", "autotune.cli.main", "dashboard", str(sim_study)],
                              capture_output=True, text=True, env={**env, **extra}, check=True).stdout

    wide = piped()
    assert 80 < max(len(line) for line in wide.splitlines()) <= 160
    _numbers_whole(piped(COLUMNS="80"), nums, 80)


def test_live_view_keeps_its_numbers_at_80():
    v = LiveView("searching", 10, 0.01, enabled=False, console=_console(80))
    for n, pred in enumerate((3124.4, 31224.4)):
        v.on_event("dispatched", {"number": n, "layout": "TP2 PP4 VPP4 EP8 DP4", "predicted": pred})
    v.on_event("finished", {"number": 0, "layout": "TP2 PP4 VPP4 EP8 DP4", "status": "ok", "value": 3124.4,
                            "predicted": 3124.4, "source": "predicted", "peak_memory_bytes": 126.8 * GiB, "mfu": 0.171,
                            "wall_s": 12.3, "gpu_hours": 0.004})
    v.on_event("finished", {"number": 1, "layout": "TP2 PP4 VPP4 EP8 DP4", "status": "oom", "predicted": 31224.4,
                            "reason": "out of memory on stage 3 of 4: 150.2 GiB of 141 GiB", "wall_s": 1234.5})
    c = _console(80)
    c.print(v.render())
    text = c.file.getvalue()
    _numbers_whole(text, ["3,124.4", "31,224.4", "17.1%", "126.8", "1234.5", "12.3"], 80)
    assert "0.004/0.01" in text  # a small GPU-hour count is not 0.0 of a 0.01 budget


def test_unmeasured_results_read_alike_in_text_json_and_html(sim_study, tmp_path, capsys):
    """A simulated study measured nothing: the text's measured column, --json's `measured` and the HTML's say
    '-' / null; the predictions stay in the predicted column, and --json names what `value` is."""
    view = load_study(sim_study)
    c = _console(200)
    render_summary(view, c)
    table = [line for line in c.file.getvalue().splitlines() if line.startswith("│")]
    head = next(line for line in c.file.getvalue().splitlines() if line.startswith("┃"))
    assert "measured" in head and "result" not in head
    for t, line in zip(view.ranked(), table):
        cells = [x.strip() for x in line.strip("│").split("│")]
        assert cells[5] == f"{t.predicted:,.1f}" and cells[6] == "-", line
    d = view_json(view)
    ok = [t for t in d["trials"] if t["value"]]
    assert ok and all(t["measured"] is None and t["source"] == "predicted" for t in ok)
    html = tmp_path / "r.html"
    assert main(["dashboard", str(sim_study), "--html", str(html)]) == 0
    capsys.readouterr()
    page = html.read_text()
    heads = re.findall(r"<th>(.*?)</th>", page.split('<table id="trials"', 1)[1].split("</thead>", 1)[0])
    assert "measured" in heads and "result" not in heads
    best = view.ranked()[0]
    first = page.split('<table id="trials"', 1)[1].split("<tbody>", 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r'<td[^>]*>(.*?)</td>', first)
    assert cells[heads.index("predicted")] == f"{best.predicted:,.1f}" and cells[heads.index("measured")] == "-"


def test_the_html_report_shows_where_the_best_layouts_step_goes(sim_study, tmp_path, capsys):
    """The report repeats the search's reading of its best layout (summary.json's best.step): the model's largest
    terms and any bottleneck with its lever, as the terminal printed them."""
    summary = json.loads((sim_study / "summary.json").read_text())
    step = summary["best"]["step"]
    html = tmp_path / "r.html"
    assert main(["dashboard", str(sim_study), "--html", str(html)]) == 0
    capsys.readouterr()
    page = html.read_text()
    shares = ", ".join(f"{d['term']} {d['share']:.0%}" for d in step["shares"])
    assert f"Where its step goes (the model's terms): {shares}</p>" in page
    assert page.count("<p>Bottleneck: ") == len(step["levers"])
