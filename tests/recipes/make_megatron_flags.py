"""Write tests/recipes/megatron_flags.txt: every option string Megatron-LM's and slime's argument parsers accept.

Not a test (no test_ prefix): run it by hand when the audited Megatron-LM or slime commit changes.

    python tests/recipes/make_megatron_flags.py MEGATRON_GIT_DIR SLIME_GIT_DIR \
        [--megatron-commit SHA] [--slime-commit SHA] > tests/recipes/megatron_flags.txt

MEGATRON_GIT_DIR / SLIME_GIT_DIR are git directories (bare mirrors are fine) of NVIDIA/Megatron-LM and THUDM/slime.
The parser is built, not grepped: since megatron-core 0.15 most flags come from dataclass fields
(megatron/training/argument_utils.py ArgumentGroupFactory over TransformerConfig, LoggerConfig, ...), so the
script extracts megatron/ (and slime/, slime_plugins/) at the commits into a temporary folder, imports
megatron/training/arguments.py with the interpreter running it (torch must import; the CPU build is enough), calls
`add_megatron_arguments` and slime's `get_slime_extra_args_provider()` on one ArgumentParser, as slime's
`parse_args` does, and adds the flags slime parses before that (`_pre_parse_mode`: --debug-train-only, ...).
Optional packages missing here (regex, sglang, ray, a Triton kernel module, ...) are replaced by empty stand-ins:
only the parser is needed, no model code runs.
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import traceback
import typing
import warnings
from pathlib import Path
from unittest import mock

# the slime commit the seed recipes ran (slime 0.3.0: a897e1f), whose docker/Dockerfile pins Megatron-LM 1dcf0daf
DEFAULT_MEGATRON = "1dcf0dafa884ad52ffb243625717a3471643e087"
DEFAULT_SLIME = "a897e1f40357fdf3b148f1eb4ce26e1aeccfcd2c"
# packages torch itself may import: stub the project module that needs them, never the package
_TORCH_SENSITIVE = {"triton"}


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty stand-ins (MagicMock modules) for the named modules and their submodules."""

    def __init__(self):
        self.names: set[str] = set()

    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name)
        m.__path__, m.__spec__ = [], spec
        return m

    def exec_module(self, module):
        pass


def _git(git_dir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True).stdout


def _extract(git_dir: str, commit: str, paths: list[str], dest: Path) -> str:
    sha = _git(git_dir, "rev-parse", "--verify", f"{commit}^{{commit}}").decode().strip()
    with tarfile.open(fileobj=io.BytesIO(_git(git_dir, "archive", sha, *paths))) as tar:
        tar.extractall(dest)
    return sha


def _importing_module(exc: BaseException, root: Path) -> str | None:
    """Dotted name of the innermost project file in the traceback (the one whose import failed)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        p = Path(frame.filename)
        if root in p.parents and p.suffix == ".py":
            rel = p.relative_to(root).with_suffix("")
            parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
            return ".".join(parts)
    return None


def _build(root: Path, stubs: _Stubs, slime_args: Path):
    """The combined parser, retrying with a new stand-in for each missing optional module."""
    for _ in range(60):
        for name in [n for n in sys.modules if n.split(".")[0] in ("megatron", "slime", "slime_plugins")]:
            del sys.modules[name]
        try:
            from megatron.training import arguments as megatron_arguments  # noqa: PLC0415

            parser = megatron_arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
            spec = importlib.util.spec_from_file_location("_slime_arguments", slime_args)
            slime = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(slime)
            return slime.get_slime_extra_args_provider()(parser)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if not missing:
                raise
            owner = _importing_module(exc, root)
            if missing in _TORCH_SENSITIVE and owner:
                stubs.names.add(owner)
            elif missing in ("megatron", "slime", "slime_plugins"):
                raise
            else:
                stubs.names.add(missing)
    raise RuntimeError("too many missing modules; is torch installed?")


def _pre_parse_flags(slime_args: Path) -> list[str]:
    """Flags slime's `_pre_parse_mode` reads (and removes from its main parser)."""
    tree = ast.parse(slime_args.read_text())
    out: list[str] = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "_pre_parse_mode":
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
                    out += [a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("megatron_git_dir")
    ap.add_argument("slime_git_dir")
    ap.add_argument("--megatron-commit", default=DEFAULT_MEGATRON)
    ap.add_argument("--slime-commit", default=DEFAULT_SLIME)
    a = ap.parse_args(argv)
    if not hasattr(typing, "override"):  # Python < 3.12; newer Megatron-LM imports it
        typing.override = lambda f: f  # type: ignore[attr-defined]
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="megatron-flags-") as tmp:
        root = Path(tmp)
        msha = _extract(a.megatron_git_dir, a.megatron_commit, ["megatron"], root)
        ssha = _extract(a.slime_git_dir, a.slime_commit, ["slime", "slime_plugins"], root)
        slime_args = root / "slime" / "utils" / "arguments.py"
        stubs = _Stubs()
        # slime's own modules arguments.py imports at the top (sglang, logging, eval config): not needed for the parser
        for node in ast.parse(slime_args.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slime."):
                stubs.names.add(node.module)
        sys.meta_path.insert(0, stubs)
        sys.path.insert(0, str(root))
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
        with open(os.devnull, "w") as devnull, __import__("contextlib").redirect_stdout(devnull):
            parser = _build(root, stubs, slime_args)
        flags = {o for act in parser._actions for o in act.option_strings if o.startswith("--")}
        flags |= set(_pre_parse_flags(slime_args))
    flags.discard("--help")
    cmd = "python tests/recipes/make_megatron_flags.py MEGATRON_GIT_DIR SLIME_GIT_DIR " \
          f"--megatron-commit {msha} --slime-commit {ssha} > tests/recipes/megatron_flags.txt"
    print("# Option strings accepted by the Megatron-LM + slime argument parser (one per line, sorted).")
    print(f"# NVIDIA/Megatron-LM {msha} megatron/training/arguments.py (add_megatron_arguments, with the")
    print("#   dataclass-generated flags of megatron/training/argument_utils.py)")
    print(f"# THUDM/slime {ssha} slime/utils/arguments.py (get_slime_extra_args_provider and _pre_parse_mode)")
    print("# slime's docker/Dockerfile at that commit pins MEGATRON_COMMIT to the Megatron-LM commit above.")
    print(f"# Generated by: {cmd}")
    print(f"# Stand-ins for modules missing where it ran: {', '.join(sorted(stubs.names)) or 'none'}")
    print(f"# {len(flags)} flags")
    for f in sorted(flags):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
