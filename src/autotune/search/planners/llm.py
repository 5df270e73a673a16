"""The LLM planner: an OpenAI-compatible model reads the trials and proposes layouts, mixed with the
model-guided planner so that a weak, slow or hostile model cannot make the search worse.

Each round it builds the context (_llm_prompt.py), asks the endpoint (_llm_client.py: bounded, retried,
stored under runs/<study>/planner/ with the key redacted), validates every proposal (_llm_check.py:
exact dimension names, values the candidates take, Megatron's rules, screened, untried, not repeated)
and sends the reasons back once for invalid ones. Valid proposals take alternate slots of the batch
(every second slot; every fourth after four LLM trials in a row did not come within 5% of the best),
and only when their optimistic prediction (predicted x (1 + kappa x sigma), two sigma by default) could
still beat the best result so far; the other slots are the model-guided planner's. An LLM slot left
without a valid proposal goes to the skill's rules (heuristic.py). When the endpoint fails the whole
round is model-guided, the reason is recorded, and after repeated failures the endpoint rests for a few
rounds. Answers are data: nothing in one is executed, imported or used as a path.

`llm_available(options)` answers whether an endpoint is configured and answers; `choose_planner` is what
`--planner auto|llm` resolves to.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path

from ...errors import BadInput
from ...fsutil import write_text_atomic
from ...layout.dimensions import layout_key
from ._llm_check import _Space, check_answer, redact, sanitize
from ._llm_client import Endpoint, LLMFailure, api_key, check_url, client_missing, is_local, read_record, safe_url
from ._llm_prompt import listed_candidates, messages, repair_message
from .base import PlanContext, Planner, PlannerOptions, Proposal, TrialRecord
from .heuristic import HeuristicPlanner, assess
from .model import ModelPlanner

__all__ = ["LLMPlanner", "llm_available", "choose_planner"]


def _prices() -> tuple[float, float]:
    raw = os.environ.get("AUTOTUNE_LLM_USD_PER_M", "")
    try:
        a, _, b = raw.partition(",")
        return (float(a), float(b or a)) if raw else (0.0, 0.0)
    except ValueError:
        return 0.0, 0.0


class LLMPlanner(Planner):
    name = "llm"

    def __init__(self, options: PlannerOptions | None = None, *, n_candidates: int = 12, max_bytes: int = 256_000,
                 max_tokens: int = 800, attempts: int = 3, backoff_s: float = 0.5, kappa: float = 2.0):
        o = options or PlannerOptions()
        self.options, self.kappa, self.n_candidates = o, kappa, n_candidates
        self.out_dir = Path(o.out_dir) if o.out_dir else None
        self.model_planner = ModelPlanner(o)
        self.heuristic = HeuristicPlanner(o)
        self.endpoint: Endpoint | None = None
        self.disabled: str | None = None
        if o.llm_base_url:
            check_url(o.llm_base_url)  # malformed, or with a user:password: BadInput before anything is sent
        if not o.llm_base_url:
            self.disabled = "no LLM endpoint configured (--llm-base-url)"
        elif not api_key() and not is_local(o.llm_base_url):
            self.disabled = "OPENAI_API_KEY is not set for a remote endpoint"
        else:
            self.endpoint = Endpoint(o.llm_base_url, o.llm_model, o.llm_timeout_s, self.out_dir, max_bytes=max_bytes,
                                     max_tokens=max_tokens, attempts=attempts, backoff_s=backoff_s,
                                     usd_per_m=_prices())
        self.round = 0
        self.slot = 0
        self.fail_streak = 0
        self.rest = 0  # rounds left before asking a failing endpoint again
        self.llm_keys: set[str] = set()
        self.llm_good: list[bool] = []  # per LLM-proposed trial: within 5% of the best so far
        self.best = 0.0
        self.rounds: list[dict] = read_rounds(self.out_dir / "rounds.json") if self.out_dir is not None else []
        self.round = max((r["round"] for r in self.rounds), default=0)  # a resumed study's rounds go on
        self._space: tuple | None = None

    # --- the endpoint ------------------------------------------------------------------------------------
    def _ask(self, ctx: PlanContext, k: int) -> tuple[list[tuple[int, str]] | None, str]:
        """Valid (candidate, rationale) pairs, or None when the endpoint was not asked or failed; and why."""
        if self.endpoint is None:
            return None, self.disabled or "no endpoint"
        if self.rest > 0:
            self.rest -= 1
            return None, f"endpoint resting after {self.fail_streak} failed rounds"
        listed = listed_candidates(ctx, self.n_candidates)
        if not listed:
            return [], "no untried candidates to discuss"
        predict = self.heuristic.predict(ctx)  # one cache of breakdowns for the prompt and the rules
        msgs = messages(ctx, k, listed, assess(ctx, predict).findings, predict)
        try:
            text = self.endpoint.ask(msgs, tag=f"round {self.round}")
        except LLMFailure as exc:
            self.fail_streak += 1
            self.rest = min(2 ** (self.fail_streak - 1) - 1, 7)  # 0, 1, 3, 7 rounds
            return None, str(exc)
        self.fail_streak = 0
        if self._space is None or self._space[0] is not ctx.table:  # the candidates' values, once per table
            self._space = (ctx.table, _Space(ctx))
        space = self._space[1]
        checked = check_answer(ctx, text, listed, space)
        valid, invalid, parse_error = list(checked.valid), list(checked.invalid), checked.parse_error
        if (invalid or parse_error) and len(valid) < k:  # the reasons go back once
            follow = msgs + [{"role": "assistant", "content": text[:4000]}, repair_message(invalid, parse_error, k)]
            try:
                again = check_answer(ctx, self.endpoint.ask(follow, tag=f"round {self.round} repair"), listed, space)
                have = {i for i, _ in valid}
                valid += [(i, w) for i, w in again.valid if i not in have]
                invalid += again.invalid
                parse_error = again.parse_error if not again.valid else None
            except LLMFailure:
                pass
        u = self.endpoint.usage
        u.valid_proposals += len(valid)
        u.invalid_proposals += len(invalid) + (1 if parse_error and not valid else 0)
        reasons = [f"{w}: {y}" for w, y in invalid[:3]] + ([parse_error] if parse_error else [])
        return valid, "; ".join(reasons) if not valid else ""

    # --- the round -------------------------------------------------------------------------------------
    def propose(self, ctx: PlanContext, k: int) -> list[Proposal]:
        self.round += 1
        if not ctx.untried().any() or k <= 0:
            return []
        llm, why = self._ask(ctx, k)
        ucb = ctx.predicted * (1 + self.kappa * ctx.uncertainty())
        best = max([r.value for r in ctx.history if r.status == "ok" and r.value] or [0.0])
        gated = [(i, w) for i, w in (llm or []) if ucb[i] >= best]
        dropped = len(llm or []) - len(gated)
        period = 4 if len(self.llm_good) >= 4 and not any(self.llm_good[-4:]) else 2
        model = deque(self.model_planner.propose(ctx, k + len(gated)))
        fill: deque | None = None  # the skill's rules, only when an LLM slot has no valid proposal
        queue = deque(gated)
        out: list[Proposal] = []
        used: set[str] = set()
        key_ = api_key()

        def rules() -> deque:
            nonlocal fill
            if fill is None:
                fill = deque(self.heuristic.propose(ctx, k + len(gated)))
            return fill

        def take(q: deque) -> Proposal | None:
            while q:
                item = q.popleft()
                # the rationale may travel into trial files and recipes: no key in it, ever
                p = Proposal(ctx.table.row(item[0]), "llm: " + sanitize(redact(item[1], key_))) \
                    if isinstance(item, tuple) else item
                key = layout_key(p.layout)
                if key not in used:
                    used.add(key)
                    return p
            return None

        for _ in range(k):
            llm_slot = llm is not None and self.slot % period == 0
            self.slot += 1
            p = (take(queue) or take(rules()) or take(model)) if llm_slot else (take(model) or take(queue))
            if p is None:
                break
            if p.why.startswith("llm: "):
                self.llm_keys.add(layout_key(p.layout))
            elif llm is None:
                p = Proposal(p.layout, f"{p.why} (LLM fallback: {sanitize(why, 80)})")
            out.append(p)
        self._record(llm, why, gated, dropped, out)
        return out

    def _record(self, llm, why: str, gated, dropped: int, out: list[Proposal]) -> None:
        used = sum(p.why.startswith("llm: ") for p in out)
        entry = {"round": self.round, "asked": llm is not None, "valid": len(llm or []), "could_win": len(gated),
                 "dropped_cannot_win": dropped, "used": used,
                 "proposals": [{"layout": p.layout.label(), "why": p.why} for p in out]}
        if why:
            entry["note"] = sanitize(why, 300)
        self.rounds.append(entry)
        if self.endpoint is not None:
            u = self.endpoint.usage
            u.used_proposals += used
            if llm is None:
                u.fallbacks.append(f"round {self.round}: {sanitize(why, 200)}")
            self.endpoint.save_usage()
        if self.out_dir is not None:
            write_text_atomic(self.out_dir / "rounds.json", json.dumps(self.rounds[-500:], indent=2) + "\n")

    def observe(self, record: TrialRecord) -> None:
        value = record.value if record.status == "ok" and record.value else 0.0
        if layout_key(record.layout) in self.llm_keys:
            self.llm_good.append(value >= 0.95 * self.best)
        self.best = max(self.best, value)


def read_rounds(path: Path) -> list[dict]:
    """The rounds a previous run of the study recorded (rounds.json), checked: a list of objects, each with a
    round number; [] when there is none. Anything else is a one-line ConfigError naming the file (never silently
    replaced)."""
    doc, bad = read_record(Path(path), "record of rounds", "keeps its rounds there", 50_000_000)
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise bad(f"a JSON {type(doc).__name__}, not a list")
    for i, r in enumerate(doc):
        n = r.get("round") if isinstance(r, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise bad(f"entry {i + 1} has no round number")
    return doc[-500:]


# --- what the CLI asks ---------------------------------------------------------------------------------
def llm_available(options: PlannerOptions) -> tuple[bool, str]:
    """(True, which model at which endpoint) when an endpoint is configured and answers, else (False, why)."""
    url = options.llm_base_url
    if not url:
        return False, "no LLM endpoint configured (pass --llm-base-url, e.g. http://127.0.0.1:8080/v1)"
    check_url(url)  # BadInput: a malformed URL is the user's to fix, not "did not answer"
    missing = client_missing()
    if missing:
        return False, missing
    if not api_key() and not is_local(url):
        return False, f"OPENAI_API_KEY is not set for {safe_url(url)} (a local server on 127.0.0.1 needs none)"
    try:
        ep = Endpoint(url, options.llm_model, min(options.llm_timeout_s, 10.0), None, attempts=1)
        try:
            if options.llm_model:
                ep.client.models.list(timeout=min(options.llm_timeout_s, 10.0))
            model = ep.resolve_model()
        finally:
            ep.close()
    except LLMFailure as exc:
        return False, f"{safe_url(url)} did not answer: {exc}"
    except Exception as exc:  # any client or transport error means: not usable now
        return False, f"{safe_url(url)} did not answer: {sanitize(exc, 160)}"
    return True, f"{sanitize(model, 80)} at {safe_url(url)}"


def choose_planner(name: str, options: PlannerOptions) -> tuple[str, str | None]:
    """The planner `--planner auto|llm` runs, and a line saying which (None when there is nothing to say).
    auto: the LLM planner when an endpoint is configured and answers, else model-guided. llm: BadInput
    when it cannot run."""
    if name not in ("auto", "llm"):
        return name, None
    ok, why = llm_available(options)
    if name == "llm" and not ok:
        raise BadInput(f"--planner llm: {why}; or use --planner model")
    if ok:
        return "llm", f"planner: LLM ({why}), mixed with the model-guided planner"
    return "model", f"planner: model-guided ({why})"
