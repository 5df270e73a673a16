"""`autotune recipes list --html`: the seed page's leaderboard, from the repository's recipes."""

import json
import re

from autotune.cli.main import main


def test_leaderboard_page_matches_the_ranking(capsys, tmp_path):
    out = tmp_path / "lb.html"
    capsys.readouterr()
    assert main(["recipes", "list", "--json"]) == 0
    board = json.loads(capsys.readouterr()[0])
    assert main(["recipes", "list", "--html", str(out)]) == 0
    err = capsys.readouterr()[1]
    assert f"wrote {out} ({len(board)} recipes)" in err
    html = out.read_text()
    pairs = {(e["model"], e["gpu"]) for e in board}
    for model, gpu in pairs:
        assert f"<h1>Training {model} on {gpu}</h1>" in html
    assert "Ranked by tokens/s per GPU · 8,192-token rows · global batch 128 · BF16" in html
    rows = re.findall(r"<tr><td class=\"n\">#(\d+)</td><td class=\"n\">([\d,.]+)</td><td class=\"n\">\$([\d.]+)</td>"
                      r"<td class=\"n\">(\d+)</td>", html)
    assert [(int(r), float(t.replace(",", "")), float(u), int(g)) for r, t, u, g in rows] == [
        (e["rank"], round(e["tokens_per_s_per_gpu"], 1), round(e["usd_per_million_tokens"], 2), e["gpus"]) for e in board]
    for e in board:
        assert f'href="#{e["name"]}"' in html and f'id="{e["name"]}"' in html  # table row -> detail block
        assert e["highlights"] in html and e["author"] in html
    assert "Convergence check" in html and "correlation 0.999997" in html and "How to run" in html
    assert "recipes/qwen3.5-122b-a10b/h200/attune-tp1-pp4-ep8-rc2.yaml" in html
    assert not re.search(r'src\s*=\s*"https?:', html) and "<link" not in html and "<script" not in html


def test_leaderboard_filters_like_the_table(capsys, tmp_path):
    out = tmp_path / "lb.html"
    assert main(["recipes", "list", "--gpu", "H200", "--html", str(out)]) == 0
    assert "on H200</h1>" in out.read_text()
