"""Robustness of the CLI's edges, as a user on a shared cluster meets them: file modes of atomic writes, the
AUTOTUNE_DEBUG switch, binary and truncated input files, unwritable output paths, GPU files, small parameter counts.

The CLI runs in-process (as tests/test_cli.py does); each test takes well under a second.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from pathlib import Path

import pytest

from autotune.catalog import get_gpu
from autotune.cli.catalog_cmds import param_count
from autotune.cli.main import _not_utf8, _switched_on, main
from autotune.errors import BadInput, ConfigError, Unwritable
from autotune.fsutil import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
BINARY = b"\xff\xfe\x00bad"


def run(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it."""
    previous = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(previous)


# 1. file modes

def test_atomic_writes_get_the_mode_a_plain_open_would(tmp_path, umask):
    """mkstemp's 0600 hid recipes and trial results from the rest of a shared cluster."""
    for mask, want in ((0o022, 0o644), (0o027, 0o640), (0o077, 0o600)):
        umask(mask)
        p = write_text_atomic(tmp_path / f"r{mask:o}.yaml", "x: 1\n")
        assert p.stat().st_mode & 0o777 == want, (oct(mask), oct(p.stat().st_mode))
    umask(0o022)
    assert write_text_atomic(tmp_path / "run.sh", "#!/bin/sh\n", mode=0o755).stat().st_mode & 0o777 == 0o755
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert (tmp_path / "r22.yaml").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_a_written_recipe_is_readable_by_others(tmp_path, umask):
    from autotune.recipes import load_recipe, write_recipe

    recipe = load_recipe(ROOT / "recipes" / "qwen3.5-122b-a10b" / "h200" / "attune-tp1-pp4-ep8-rc2.yaml")
    p = write_recipe(recipe, tmp_path / "runs" / "s" / "recipes" / "rank-01-x.yaml")
    assert p.stat().st_mode & 0o777 == 0o644


# 2. AUTOTUNE_DEBUG

def test_autotune_debug_switch_values():
    for off in (None, "", "0", "false", "FALSE", "no", "No", "off", " Off "):
        assert not _switched_on(off), off
    for on in ("1", "true", "yes", "on", "2", "debug"):
        assert _switched_on(on), on


def test_autotune_debug_0_shows_no_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.yaml").write_bytes(BINARY)
    for off in ("0", "false", "No", "OFF", ""):
        monkeypatch.setenv("AUTOTUNE_DEBUG", off)
        rc, _, err = run(capsys, "recipes", "validate", "bin.yaml")
        assert rc == 2, off
        one_line_error(err)
    monkeypatch.setenv("AUTOTUNE_DEBUG", "1")
    with pytest.raises((UnicodeDecodeError, BadInput)):  # on: the exception goes up, with its traceback
        main(["recipes", "validate", "bin.yaml"])


# 3. binary input names the file

def test_a_binary_input_file_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.yaml").write_bytes(BINARY)
    (tmp_path / "other.yaml").write_bytes(b"\xfe\xfe unrelated binary")
    rc, _, err = run(capsys, "recipes", "validate", "bin.yaml")
    line = one_line_error(err)
    assert rc == 2 and "bin.yaml" in line and "not UTF-8" in line
    for argv in (["space", "--json", "--model", "tiny-moe", "--count", "8", "--gpu", "bin.yaml", "--space", "other.yaml"],
                 ["space", "--model", "tiny-moe", "--count", "8", "--gpu=bin.yaml"]):
        rc, _, err = run(capsys, *argv)
        line = one_line_error(err)
        assert rc == 2 and re.search(r"--gpu '?bin\.yaml'?: not UTF-8", line) and "other.yaml" not in line


def test_the_fallback_for_binary_input_finds_the_argument(tmp_path, monkeypatch):
    """Where a reader lets UnicodeDecodeError through, main finds the argument whose bytes failed: a flag before
    it is not taken for its option, and another binary argument that was not read is not blamed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.yaml").write_bytes(BINARY)
    (tmp_path / "other.yaml").write_bytes(b"\xfe\xfe unrelated binary")
    try:
        BINARY.decode("utf-8")
    except UnicodeDecodeError as e:
        exc = e
    argv = ["space", "--json", "--space", "other.yaml", "--model", "tiny-moe", "--gpu", "bin.yaml"]
    assert _not_utf8(argv, exc).startswith("--gpu bin.yaml: not UTF-8 text (a binary file?); pass the text file --gpu")
    assert _not_utf8(["recipes", "validate", "bin.yaml"], exc).startswith("bin.yaml: not UTF-8")
    assert _not_utf8(["space", "--gpu=bin.yaml"], exc).startswith("--gpu bin.yaml: not UTF-8")
    assert _not_utf8(["recipes", "validate", "other.yaml"], exc).startswith("an input file is not UTF-8")


# 4. unwritable targets name the user's path

def test_an_unwritable_target_names_the_path_not_the_temp_file(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(Unwritable, match=r"afile is a file, not a folder") as exc:
        write_text_atomic(tmp_path / "afile" / "sub" / "rep.html", "x")
    assert str(tmp_path / "afile" / "sub" / "rep.html") in str(exc.value) and ".tmp" not in str(exc.value)
    assert isinstance(exc.value, OSError) and isinstance(exc.value, BadInput)  # old `except OSError` still catch it

    missing = tmp_path / "nodir" / "sub"
    with pytest.raises(Unwritable, match=r"folder .*nodir/sub does not exist; create it first \(mkdir -p"):
        write_text_atomic(missing / "x.yaml", "x", make_parents=False)
    assert not (tmp_path / "nodir").exists()  # an explicit path's folders are not invented
    assert write_text_atomic(missing / "x.yaml", "x").read_text() == "x"  # autotune's own trees still are made

    with pytest.raises(Unwritable, match="is a folder; give a file name"):
        write_text_atomic(missing, "x")

    def refuse(code, text):
        def mkstemp(dir, prefix, suffix):
            raise OSError(code, text, os.path.join(dir, f"{prefix}ks2aqx1j{suffix}"))
        return mkstemp

    for code, text, needle in ((errno.EACCES, "Permission denied", "cannot write in .*: permission denied"),
                               (errno.ENOENT, "No such file or directory", "cannot create a file in"),
                               (errno.EROFS, "Read-only file system", "read-only file system")):
        monkeypatch.setattr(tempfile, "mkstemp", refuse(code, text))
        with pytest.raises(Unwritable, match=needle) as exc:
            write_text_atomic(tmp_path / "rep.html", "x")
        assert str(tmp_path / "rep.html") in str(exc.value) and "ks2aqx1j" not in str(exc.value)
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_the_cli_says_which_output_cannot_be_written(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    rc, _, err = run(capsys, "recipes", "list", "--html", "afile/rep.html")
    assert rc == 2 and one_line_error(err) == "error: cannot write afile/rep.html: afile is a file, not a folder; choose another path"
    if Path("/proc").is_dir():  # the folder exists but takes no files
        rc, _, err = run(capsys, "recipes", "list", "--html", "/proc/rep.html")
        line = one_line_error(err)
        assert rc == 2 and "cannot write /proc/rep.html" in line and ".tmp" not in line


def test_an_explicit_output_in_a_missing_folder_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seed = ROOT / "recipes" / "qwen3.5-122b-a10b" / "h200" / "attune-tp1-pp4-ep8-rc2.yaml"
    rc, _, err = run(capsys, "export", str(seed), "--out", "nodir/sub/x.yaml")
    assert rc == 2 and "nodir" in one_line_error(err) and not (tmp_path / "nodir").exists()


# 5. truncated JSON lines

def test_a_truncated_jsonl_names_the_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ref.jsonl").write_text('{"step": 1, "lm_loss": 2.0}\n{"step": 2, "lm_loss": 1.9}\n')
    (tmp_path / "trunc.jsonl").write_text('{"step": 1, "lm_loss": 2.0}\n{"step": 2, "lm_l')
    rc, _, err = run(capsys, "check", "convergence", "--candidate", "trunc.jsonl", "--reference", "ref.jsonl")
    line = one_line_error(err)
    assert rc == 2 and "at at" not in line
    assert re.search(r"trunc\.jsonl line 2: not valid JSON \(Unterminated string starting at column \d+\)", line)


# 6. GPU files

GPU = "name: MyGPU\nmemory_gb_nominal: 192\nbf16_tflops: 1300\nhbm_gbps: 5300\nnvlink_gbps: 448\n"


def gpu_error(tmp_path, body: str) -> str:
    p = tmp_path / "my.yaml"
    p.write_text(body)
    with pytest.raises(ConfigError) as exc:
        get_gpu(str(p))
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_a_misspelt_gpu_field_is_named_with_the_known_one(tmp_path):
    msg = gpu_error(tmp_path, GPU.replace("hbm_gbps", "hbm_gbs"))
    assert "unknown field 'hbm_gbs' (did you mean 'hbm_gbps'?); fields: name, " in msg
    assert "Field required" not in msg and "{" not in msg  # not the whole dict as the value
    msg = gpu_error(tmp_path, GPU + "colour: red\n")
    assert "unknown field 'colour'; fields:" in msg
    msg = gpu_error(tmp_path, GPU.replace("hbm_gbps: 5300\n", ""))
    assert "field hbm_gbps is required" in msg and "{" not in msg


def test_gpu_memory_fields_that_contradict_are_refused(tmp_path):
    msg = gpu_error(tmp_path, GPU + "memory_gib: 200\n")
    assert "memory_gib 200" in msg and "memory_gb_nominal 192" in msg
    p = tmp_path / "ok.yaml"
    p.write_text(GPU + "memory_gib: 180\n")  # the allocatable part: below the nominal
    assert get_gpu(str(p)).memory_bytes == 180 * 1024**3


def test_an_nvlink_domain_is_whole_nodes_or_part_of_one(tmp_path):
    for bad in ("0", "-8"):
        assert f"nvlink_domain {bad}: must be 1 or more" in gpu_error(tmp_path, GPU + f"nvlink_domain: {bad}\n")
    msg = gpu_error(tmp_path, GPU + "nvlink_domain: 5\n")
    assert "nvlink_domain 5 with gpus_per_node 8" in msg and "whole nodes or a part of one" in msg
    assert "nvlink_domain 8 with gpus_per_node 6" in gpu_error(tmp_path, GPU + "nvlink_domain: 8\ngpus_per_node: 6\n")
    for domain, per in ((2, 8), (8, 8), (16, 8), (72, 4)):
        p = tmp_path / f"d{domain}.yaml"
        p.write_text(GPU + f"nvlink_domain: {domain}\ngpus_per_node: {per}\n")
        assert get_gpu(str(p)).nvlink_domain == domain
    p = tmp_path / "node.yaml"
    p.write_text(GPU)
    assert get_gpu(str(p)).nvlink_domain == 8  # left out: the node


def test_the_readme_gpu_example_is_valid(tmp_path):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"A GPU the catalog lacks.*?```yaml\n(.*?)```", readme, re.S).group(1)
    p = tmp_path / "my_gpu.yaml"
    p.write_text(block)
    g = get_gpu(str(p))
    assert g.name == "MyGPU" and g.nvlink_domain == 8


def test_a_bad_gpu_file_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    (tmp_path / "my.yaml").write_text(GPU.replace("hbm_gbps", "hbm_gbs"))
    rc, _, err = run(capsys, "space", "--model", "tiny-moe", "--count", "8", "--gpu", str(tmp_path / "my.yaml"))
    assert rc == 2 and "did you mean 'hbm_gbps'?" in one_line_error(err)


def test_a_gpu_file_missing_fields_names_every_one_at_once(tmp_path, capsys, monkeypatch):
    """A file with only a name: one line naming all four missing required fields, so one edit fixes it."""
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    (tmp_path / "bare.yaml").write_text("name: X1\nbf16_tflops: 500\n")
    rc, _, err = run(capsys, "space", "--model", "tiny-moe", "--count", "8", "--gpu", str(tmp_path / "bare.yaml"))
    line = one_line_error(err)
    assert rc == 2 and "fields memory_gb_nominal, hbm_gbps, nvlink_gbps are required" in line, line
    assert "(optional: memory_gib" in line and "bf16_tflops are" not in line


# 7. small parameter counts

def test_parameter_counts_have_a_unit_that_shows_them():
    assert [param_count(n) for n in (0, 7, 999, 1000, 1500, 157_696, 338_624, 999_999, 752_393_024)] == [
        "0", "7", "999", "1K", "1.5K", "158K", "339K", "1M", "752M"]
    assert [param_count(n) for n in (999_999_999, 1_753_862_144, 671_026_419_712)] == ["1.00B", "1.75B", "671.03B"]


def test_models_shows_tiny_moe_in_thousands(capsys, monkeypatch):
    from autotune.cli.console import console

    monkeypatch.setattr(console, "width", 200)
    rc, out, _ = run(capsys, "models")
    from autotune.catalog import load_model, param_counts

    counts = param_counts(load_model("tiny-moe"))
    row = next(line for line in out.splitlines() if "tiny-moe" in line)
    assert rc == 0 and "0.00B" not in out
    assert param_count(counts.total) in row and param_count(counts.active) in row and "K " in row + " "
