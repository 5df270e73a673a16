"""The LLM endpoint's URL and what a study keeps of its conversation.

A malformed --llm-base-url / AUTOTUNE_LLM_BASE_URL (port out of range or not a number, a broken IPv6 host, no
scheme) is one line naming the flag or the variable, exit 2, even for the default --planner auto (it was a
traceback). A URL with user:password is refused (the client sent it as HTTP Basic credentials and servers echoed
it into stored files), and the password is never printed. A resumed study goes on numbering its exchanges and
adding to its usage and rounds instead of overwriting them; invalid token counts from a server are not added up.
"""

from __future__ import annotations

import base64
import json

import pytest
from llm_standin import Reply, StandIn, answer, chat, planner_world

from autotune.cli.main import main
from autotune.errors import BadInput, ConfigError
from autotune.search.planners import PlanContext, PlannerOptions, TrialRecord, resolve_planner
from autotune.search.planners._llm_check import redact
from autotune.search.planners._llm_client import check_url, safe_url, shown_url
from autotune.search.planners.llm import LLMPlanner, llm_available

BAD = ["http://127.0.0.1:99999/v1", "http://[::1/v1", "http://127.0.0.1:notaport/v1", "127.0.0.1:8080/v1",
       "ftp://127.0.0.1/v1", "http:///v1"]
SECRETS = ["alice:PASSWD99@127.0.0.1:18777", "http://alice:PASSWD99@127.0.0.1:18777/v1"]
SEARCH = ["search", "--model", "tiny-moe", "--gpu", "cpu", "--count", "2", "--backend", "simulate", "--trials", "2"]


@pytest.mark.parametrize("url", BAD + SECRETS)
def test_a_bad_url_is_bad_input_naming_the_flag(url):
    with pytest.raises(BadInput) as exc:
        check_url(url)
    msg = str(exc.value)
    assert msg.startswith("--llm-base-url ") and "\n" not in msg and "PASSWD99" not in msg
    with pytest.raises(BadInput):
        resolve_planner("auto", PlannerOptions(llm_base_url=url))
    with pytest.raises(BadInput):
        LLMPlanner(PlannerOptions(llm_base_url=url))
    with pytest.raises(BadInput):
        llm_available(PlannerOptions(llm_base_url=url))
    assert "PASSWD99" not in safe_url(url) and "PASSWD99" not in shown_url(url)


def test_good_urls_pass():
    for url in ("http://127.0.0.1:8080/v1", "https://api.example.com/v1", "http://[::1]:8080/v1", "http://localhost/v1"):
        assert check_url(url) == url


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/v1", "http://[::1/v1", SECRETS[0], SECRETS[1]])
def test_the_cli_refuses_a_bad_url_from_the_environment_in_one_line(url, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_LLM_BASE_URL", url)
    capsys.readouterr()
    rc = main([*SEARCH, "--runs-dir", str(tmp_path), "--study", "u"])  # the default --planner auto
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "AUTOTUNE_LLM_BASE_URL" in lines[0] and "PASSWD99" not in out + err
    monkeypatch.delenv("AUTOTUNE_LLM_BASE_URL")
    rc = main([*SEARCH, "--runs-dir", str(tmp_path), "--study", "u", "--llm-base-url", url, "--planner", "llm"])
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--llm-base-url" in err and "PASSWD99" not in out + err
    assert not (tmp_path / "u").exists()


def test_basic_credentials_and_url_passwords_are_redacted():
    b64 = base64.b64encode(b"alice:PASSWD99").decode()
    for text in (f"Authorization: Basic {b64}", json.dumps({"authorization": f"Basic {b64}"}),
                 "echo http://alice:PASSWD99@127.0.0.1:18777/v1"):
        out = redact(text)
        assert b64 not in out and "PASSWD99" not in out and "<redacted>" in out, out
    assert redact("basic authentication is off") == "basic authentication is off"


# --- a resumed study's planner records -------------------------------------------------------------------

@pytest.fixture(scope="module")
def world():
    return planner_world("tiny-moe", "cpu", 2)


def ctx_of(world, history=None) -> PlanContext:
    m, c, w, r, table, pred, keys = world
    return PlanContext(m, c, w, table, pred, keys, set(), list(history or []), sigma=0.10, funnel=r.funnel)


def one_round(p: LLMPlanner, ctx: PlanContext) -> None:
    for prop in p.propose(ctx, 1):
        from autotune.layout.dimensions import layout_key

        ctx.tried.add(layout_key(prop.layout))
        rec = TrialRecord(len(ctx.history), prop.layout, "ok", "predicted", 1.0, 1.0)
        ctx.history.append(rec)
        p.observe(rec)


def make(out_dir, url) -> LLMPlanner:
    return LLMPlanner(PlannerOptions(llm_base_url=url, llm_timeout_s=5, out_dir=out_dir), backoff_s=0.01,
                      n_candidates=3)


def test_a_resumed_study_keeps_its_exchanges_usage_and_rounds(world, tmp_path):
    out = tmp_path / "planner"
    with StandIn([answer({"candidate": "c0", "rationale": "first"})]) as s:
        p = make(out, s.url)
        ctx = ctx_of(world)
        one_round(p, ctx)
        one_round(p, ctx)
        p.endpoint.close()
        first = sorted(f.name for f in (out / "exchanges").iterdir())
        u1 = json.loads((out / "usage.json").read_text())
        r1 = json.loads((out / "rounds.json").read_text())
        before = {f: (out / "exchanges" / f).read_text() for f in first}
        q = make(out, s.url)  # the study resumed: a new planner on the same folder
        one_round(q, ctx)
        q.endpoint.close()
    names = sorted(f.name for f in (out / "exchanges").iterdir())
    assert names[: len(first)] == first and len(names) > len(first)
    assert all((out / "exchanges" / f).read_text() == t for f, t in before.items())  # nothing overwritten
    u2 = json.loads((out / "usage.json").read_text())
    assert u2["requests"] > u1["requests"] >= 1 and u2["answered"] > u1["answered"]
    assert u2["prompt_tokens"] > u1["prompt_tokens"]
    r2 = json.loads((out / "rounds.json").read_text())
    assert r2[: len(r1)] == r1 and [r["round"] for r in r2] == list(range(1, len(r2) + 1)) and len(r2) > len(r1)


@pytest.mark.parametrize("name,text", [("usage.json", "{not json"), ("usage.json", '{"requests": -3}'),
                                       ("usage.json", "[1, 2]"), ("rounds.json", '{"round": 1}'),
                                       ("rounds.json", '[{"x": 1}]')])
def test_a_corrupt_record_is_one_line_and_kept(tmp_path, name, text):
    out = tmp_path / "planner"
    out.mkdir()
    (out / name).write_text(text)
    with StandIn([]) as s:
        with pytest.raises(ConfigError, match=name.replace(".", r"\.")) as exc:
            make(out, s.url)
    assert "\n" not in str(exc.value) and (out / name).read_text() == text


def test_negative_or_absurd_token_counts_are_not_added_up(world, tmp_path):
    out = tmp_path / "planner"
    body = json.loads(chat(json.dumps({"proposals": [{"candidate": "c0", "rationale": "x"}]})).body)
    body["usage"] = {"prompt_tokens": 10**30, "completion_tokens": -5, "total_tokens": "NaN"}
    with StandIn([Reply(body=json.dumps(body).encode())]) as s:
        p = make(out, s.url)
        one_round(p, ctx_of(world))
        p.endpoint.close()
    u = json.loads((out / "usage.json").read_text())
    assert u["prompt_tokens"] == 0 and u["completion_tokens"] == 0 and u["answered"] >= 1
    ex = json.loads(sorted((out / "exchanges").iterdir())[0].read_text())
    assert "not counted" in ex["tries"][-1]["usage_note"]
