"""The argument classes of skill/correctness/numerics_list.yaml, read and checked.

`load_rules(path=None)` returns a Rules mapping of argument -> (class, why). A rule file with an
unknown class, a missing why or a malformed entry is bad input (ConfigError, one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from ..errors import ConfigError

__all__ = ["CLASSES", "Rule", "Rules", "load_rules", "RULES_NAME"]

CLASSES = ("layout", "performance", "kernel", "numerics")
RULES_NAME = "skill/correctness/numerics_list.yaml"


@dataclass(frozen=True)
class Rule:
    cls: str
    why: str


class Rules(dict):
    """argument -> Rule; `source` names the file it came from."""

    source: str = RULES_NAME

    def cls_of(self, arg: str) -> str | None:
        rule = self.get(arg)
        return rule.cls if rule else None


def _parse(text: str, source: str) -> Rules:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"rule file {source}: not YAML ({str(exc).splitlines()[0]}); fix its syntax") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("arguments"), dict):
        raise ConfigError(f"rule file {source}: needs a mapping `arguments: {{ARG: {{class: ..., why: ...}}}}`")
    rules = Rules()
    rules.source = source
    for arg, entry in doc["arguments"].items():
        if not isinstance(entry, dict) or set(entry) != {"class", "why"}:
            raise ConfigError(f"rule file {source}: {arg}: give exactly `class` and `why`")
        if entry["class"] not in CLASSES:
            raise ConfigError(f"rule file {source}: {arg}: unknown class {entry['class']!r}; use one of {', '.join(CLASSES)}")
        if not isinstance(entry["why"], str) or not entry["why"].strip():
            raise ConfigError(f"rule file {source}: {arg}: `why` must be a non-empty line")
        rules[str(arg)] = Rule(entry["class"], entry["why"].strip())
    return rules


@lru_cache(maxsize=1)
def _packaged() -> Rules:
    ref = resources.files("autotune") / "skill" / "correctness" / "numerics_list.yaml"
    return _parse(ref.read_text(), RULES_NAME)


def load_rules(path: str | Path | None = None) -> Rules:
    """The packaged rules, or a rule file given by path."""
    if path is None:
        return _packaged()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"rule file {p}: cannot read it ({exc.strerror}); pass an existing YAML file") from None
    return _parse(text, str(p))
