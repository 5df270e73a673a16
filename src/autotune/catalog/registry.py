"""The shipped model catalog and name lookup.

`load_model(name_or_path)` takes a catalog name (case-insensitive; close names suggested on a miss), a
path to a config.json, or a directory holding one. The shipped configs come from ../shared/models/
(see its README for provenance) plus `tiny-moe`, a small MoE for CPU trials and tests.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..errors import ConfigError, UnknownName
from .model import ModelSpec, from_hf_config

__all__ = ["load_model", "model_names"]

MAX_CONFIG_BYTES = 16 * 2**20  # the largest HF config.json is a few hundred KiB


def _data_dir():
    return resources.files("autotune.catalog") / "data" / "models"


@lru_cache(maxsize=None)
def model_names() -> tuple[str, ...]:
    return tuple(sorted(p.name[: -len(".json")] for p in _data_dir().iterdir() if p.name.endswith(".json")))


def _read_json(path: Path, label: str) -> dict:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{label}: {path.stat().st_size:,} bytes, more than a config.json's "
                              f"{MAX_CONFIG_BYTES:,}; pass the model's config.json")
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{label}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}); fix the file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: not UTF-8 text (a binary file?); pass the model's config.json") from None
    except RecursionError:
        raise ConfigError(f"{label}: nested too deeply to read; fix the file") from None
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read ({exc.strerror}); check the path") from None


def suggest(name: str, choices: tuple[str, ...] | list[str]) -> str:
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.5)
    prefixed = [lc for lc in lowered if lc.startswith(name.lower())]
    close = prefixed[:3] + [c for c in close if c not in prefixed]
    return ", ".join(lowered[c] for c in close[:3])


@lru_cache(maxsize=64)
def _load_named(name: str) -> ModelSpec:
    path = _data_dir() / f"{name}.json"
    return from_hf_config(json.loads(path.read_text()), name, source=f"catalog:{name}")


def load_model(name_or_path: str) -> ModelSpec:
    """A ModelSpec from a catalog name or a config.json path."""
    names = model_names()
    exact = {n.lower(): n for n in names}
    if name_or_path.lower() in exact:
        return _load_named(exact[name_or_path.lower()])
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise ConfigError(f"model config {str(p)!r} does not exist; pass a config.json path or a catalog name")
        cfg = _read_json(p, f"config.json {str(p)!r}")
        name = p.parent.name if p.name == "config.json" else p.stem
        return from_hf_config(cfg, name, source=str(p))
    hint = suggest(name_or_path, names)
    hint = f"did you mean {hint}? " if hint else ""
    raise UnknownName(
        f"unknown model {name_or_path!r}: {hint}run `autotune models` for the catalog, or pass a path to a config.json"
    )
