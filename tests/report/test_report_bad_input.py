"""Bad input to `autotune dashboard` and `recipes list --html`: one line on stderr naming the value, exit 2,
nothing written."""

import pytest

from autotune.cli.main import main
from autotune.search.study import StudyDir


def _err(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str, *words):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_a_folder_that_is_not_a_study(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    rc, out, err = _err(capsys, "dashboard", str(tmp_path))
    assert rc == 2 and out == ""
    _one_line(err, str(tmp_path), "not a study folder")


def test_a_path_that_does_not_exist(capsys, tmp_path):
    rc, _, err = _err(capsys, "dashboard", str(tmp_path / "nope"))
    assert rc == 2
    _one_line(err, "nope", "no such folder")


def test_a_study_with_no_trials(capsys, tmp_path):
    sd = StudyDir(tmp_path, "empty")
    sd.root.mkdir()
    sd.open()  # a real, empty Optuna study
    out_html = tmp_path / "r.html"
    rc, _, err = _err(capsys, "dashboard", str(sd.root), "--html", str(out_html))
    assert rc == 2 and not out_html.exists()
    _one_line(err, "empty", "no trials")


def test_a_corrupt_study_db(capsys, tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "study.db").write_text("not sqlite at all")
    rc, _, err = _err(capsys, "dashboard", str(d))
    assert rc == 2
    _one_line(err, "study.db")


def test_no_study_under_the_runs_folder(capsys, tmp_path):
    rc, _, err = _err(capsys, "dashboard", "--runs-dir", str(tmp_path))
    assert rc == 2
    _one_line(err, str(tmp_path), "no study")


def test_html_path_that_is_a_folder(capsys, sim_study, tmp_path):
    rc, _, err = _err(capsys, "dashboard", str(sim_study), "--html", str(tmp_path))
    assert rc == 2
    _one_line(err, "--html", "is a folder")


@pytest.mark.parametrize("port", ["0", "70000"])
def test_optuna_port_out_of_range(capsys, sim_study, port):
    rc, _, err = _err(capsys, "dashboard", "--optuna", str(sim_study), "--port", port)
    assert rc == 2
    _one_line(err, f"--port {port}")


def test_recipes_html_with_nothing_to_list(capsys, tmp_path):
    out = tmp_path / "lb.html"
    rc, _, err = _err(capsys, "recipes", "list", "--model", "Llama-3.1-70B", "--html", str(out))  # no recipes
    assert rc == 2 and not out.exists()
    _one_line(err, "Llama-3.1-70B", "nothing written")
    rc, _, err = _err(capsys, "recipes", "list", "--model", "No-Such-Model", "--html", str(out))  # unknown: refused
    assert rc == 2 and not out.exists()
    _one_line(err, "No-Such-Model")
