"""What the LLM planner does with an answer: parse it as data, validate every proposal, clean its text.

An answer is untrusted JSON. Each proposal names a listed candidate ("c3") or gives the layout's study
parameters, with exactly the searched dimension names as keys and values the candidates take. A valid
proposal is a screened candidate (legal under Megatron's rules, predicted to fit) that is not tried yet
and not repeated in the same answer; everything else comes back with one reason per proposal, which the
planner sends to the model once. Rationale text is reduced to one line of plain characters so that no
terminal markup, HTML, shell syntax or control character reaches the live view, the dashboard or a
recipe. Nothing here executes, imports or opens anything named in an answer.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...errors import BadInput
from ...layout import violations
from ...layout.dimensions import PARAM_NAMES, layout_from_params, layout_key, table_params
from .base import PlanContext

__all__ = ["Answer", "Checked", "answer_schema", "check_answer", "sanitize", "redact", "MAX_RATIONALE"]

MAX_RATIONALE = 160
# the rationale the prompt's answer shape shows; a small model copies it word for word, which says nothing
RATIONALE_EXAMPLE = "one short sentence"
MAX_PROPOSALS = 16  # per answer: more is noise, and bounds the work of checking an answer


class ProposalIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    candidate: str | int | None = None
    params: dict[str, Any] | None = None
    rationale: str = ""


class Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    proposals: list[Any] = Field(default_factory=list)  # each checked on its own: one bad item spoils nothing


def answer_schema() -> dict:
    """The JSON schema sent as `response_format` (kept simple: small local servers compile it to a grammar)."""
    return {
        "type": "object",
        "properties": {"proposals": {"type": "array", "maxItems": MAX_PROPOSALS, "items": {
            "type": "object",
            "properties": {"candidate": {"type": "string"}, "rationale": {"type": "string"}},
            "required": ["candidate", "rationale"],
        }}},
        "required": ["proposals"],
    }


@dataclass
class Checked:
    valid: list[tuple[int, str]]  # (candidate index, sanitised rationale)
    invalid: list[tuple[str, str]]  # (what was proposed, one line; why it was rejected)
    parse_error: str | None = None


_PLAIN = re.compile(r"[^A-Za-z0-9 .,;:%+\-=/()'_#@&*~!?]")
_KEYISH = re.compile(r"(sk-[A-Za-z0-9_\-]{6,}|(?i:bearer)\s+[A-Za-z0-9._\-]+)")


def sanitize(text: object, limit: int = MAX_RATIONALE) -> str:
    """One line of plain ASCII: brackets become parentheses (no rich markup), shell and HTML syntax,
    quotes, backslashes and control characters are dropped, whitespace collapses, length is capped."""
    s = unicodedata.normalize("NFKC", str(text))[: 4 * limit]
    s = s.replace("[", "(").replace("]", ")").replace("{", "(").replace("}", ")")
    s = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in s)
    s = _PLAIN.sub("", s)
    s = re.sub(r"\s+", " ", s).strip()
    return s if len(s) <= limit else s[: limit - 3].rstrip() + "..."


_BASIC = re.compile(r"(?i:basic)(\s+|\\?\"?\s*:\s*\\?\"?)([A-Za-z0-9+/]{4,}={0,2})")
_USERINFO = re.compile(r"(?<=//)[^/\s@\"'<>]+@")  # scheme://user:password@host


def _basic(m: re.Match) -> str:
    """An HTTP Basic credential (base64 of user:password) becomes 'Basic <redacted>'; a plain word after
    'basic' (basic authentication) stays."""
    import base64
    import binascii

    token = m.group(2)
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return m.group(0)
    return m.group(0)[: m.start(2) - m.start(0)] + "<redacted>" if b":" in raw else m.group(0)


def redact(text: str, secret: str | None = None) -> str:
    """Remove anything that looks like an API key, an HTTP Basic credential or a user:password in a URL (and the
    configured key itself) before storing."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "<redacted>")
    text = _BASIC.sub(_basic, text)
    text = _USERINFO.sub("<redacted>@", text)
    return _KEYISH.sub("<redacted>", text)


def _json_object(text: str) -> Any:
    """The answer's JSON: the whole text, else its outermost {...} (small models wrap JSON in prose)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            return json.loads(text[start:end + 1])
        except (json.JSONDecodeError, RecursionError):
            pass
    raise ValueError("the answer is not JSON")


def _candidate_index(ref: str | int, listed: list[int]) -> int | None:
    s = str(ref).strip().lower()
    s = s[1:] if s.startswith("c") else s
    if not s.isdigit() or len(s) > 6:
        return None
    j = int(s)
    return listed[j] if j < len(listed) else None


class _Space:
    """The candidates' parameter values, for membership checks (built once per context)."""

    def __init__(self, ctx: PlanContext):
        cols = table_params(ctx.table)
        self.values = {n: {_scalar(v) for v in np.unique(cols[n].astype(object)).tolist()} for n in PARAM_NAMES}
        self.index = {k: i for i, k in enumerate(ctx.keys)}


def _scalar(v):
    return v.item() if hasattr(v, "item") else v


def _from_params(ctx: PlanContext, space: _Space, params: dict) -> tuple[int | None, str]:
    names = set(params)
    if names != set(PARAM_NAMES):
        missing, extra = sorted(set(PARAM_NAMES) - names), sorted(names - set(PARAM_NAMES))
        return None, "params must name exactly the dimensions" + (f"; missing {missing}" if missing else "") + \
            (f"; unknown {[sanitize(x, 40) for x in extra][:5]}" if extra else "")
    for n in PARAM_NAMES:
        v = params[n]
        if isinstance(v, (dict, list)) or not any(v == x and type(v) is type(x) or _same(v, x) for x in space.values[n]):
            return None, f"{n}={sanitize(v, 40)} is not a value the candidates take " \
                         f"(choose from {sorted(map(str, space.values[n]))[:12]})"
    try:
        lay = layout_from_params(ctx.cluster.count, params)
    except (BadInput, TypeError, ValueError) as exc:
        return None, sanitize(exc, 200)
    bad = violations(ctx.model, ctx.workload, lay)
    if bad:
        return None, "illegal: " + "; ".join(sanitize(v.message, 120) for v in bad[:3])
    i = space.index.get(layout_key(lay))
    if i is None:
        return None, "legal but not a screened candidate (predicted OOM, unsupported here, or cannot win)"
    return i, ""


def _same(v, x) -> bool:
    # JSON gives 4 for 4.0 and 1 for True; accept numerically equal numbers of compatible kinds
    if isinstance(x, bool) or isinstance(v, bool):
        return isinstance(v, bool) and isinstance(x, bool) and v == x
    if isinstance(x, (int, float)) and isinstance(v, (int, float)):
        return float(v) == float(x)
    return False


def check_answer(ctx: PlanContext, text: str, listed: list[int], space: _Space | None = None) -> Checked:
    """Validate an answer against the context: legal, screened, untried, not repeated."""
    try:
        ans = Answer.model_validate(_json_object(text))
    except (ValueError, ValidationError) as exc:
        msg = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        return Checked([], [], parse_error=sanitize(f"invalid answer: {msg}", 200))
    space = space or _Space(ctx)
    valid: list[tuple[int, str]] = []
    invalid: list[tuple[str, str]] = []
    seen: set[int] = set()
    for item in ans.proposals[:MAX_PROPOSALS]:
        try:
            p = ProposalIn.model_validate(item)
        except ValidationError as exc:
            invalid.append((sanitize(f"proposal {item}", 120), sanitize(f"not a proposal: {exc.errors()[0]['msg']}", 120)))
            continue
        what = sanitize(f"candidate {p.candidate}" if p.candidate is not None else f"params {p.params}", 120)
        if p.candidate is not None:
            i = _candidate_index(p.candidate, listed)
            why = "" if i is not None else f"no candidate {sanitize(p.candidate, 20)} in the list (c0..c{len(listed) - 1})"
        elif p.params is not None:
            i, why = _from_params(ctx, space, p.params)
        else:
            i, why = None, "names neither a candidate nor params"
        if i is not None and ctx.keys[i] in ctx.tried:
            i, why = None, "already tried"
        if i is not None and ctx.keys[i] in ctx.walled:
            i, why = None, "needs as much memory as a trial that ran out"
        if i is not None and i in seen:
            i, why = None, "proposed twice in this answer"
        if i is None:
            invalid.append((what, why))
            continue
        seen.add(i)
        valid.append((i, _rationale(p.rationale)))
    return Checked(valid, invalid)


def _rationale(text: str) -> str:
    """The sanitised rationale; none given, or the prompt's example copied, is said as such."""
    s = sanitize(text)
    if not s:
        return "no rationale given"
    if s.strip(" .!").casefold() == RATIONALE_EXAMPLE:
        return "no rationale given (it copied the prompt's example)"
    return s
