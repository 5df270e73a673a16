"""The LLM planner's conversation with an OpenAI-compatible endpoint: one bounded exchange at a time.

`Endpoint.ask(messages)` sends a chat completion through the `openai` client and returns the answer's
text, or raises `LLMFailure` with a one-line reason. Bounded in every direction: a per-request timeout,
retries with exponential backoff for 429 and 5xx (Retry-After honoured up to a cap), a cap on the
response body enforced while it is read (a several-megabyte answer is cut off, not buffered), and a cap
on generated tokens. Structured output is asked for as a JSON schema first; a server that refuses it
gets a JSON object request (with the schema, as llama-cpp-python takes it, then without), then plain
text, and the working mode is remembered. Every exchange is
stored under the planner's folder with the key (and anything that looks like one) redacted, and the
study's tokens, cost and failures are kept in `usage.json` there.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ...fsutil import write_text_atomic
from ._llm_check import answer_schema, redact, sanitize

try:  # the openai client's HTTP library (httpx2 in openai 3.x, httpx before)
    import httpx2 as _http
except ImportError:  # pragma: no cover - depends on the installed openai
    try:
        import httpx as _http  # type: ignore[no-redef]
    except ImportError:  # no openai client (autotune[llm]) at all: client_missing() says so
        _http = None  # type: ignore[assignment]

__all__ = ["Endpoint", "LLMFailure", "Usage", "api_key", "check_url", "client_missing", "is_local", "safe_url",
           "shown_url"]

# structured output, most to least constrained; "json_object+schema" is llama-cpp-python's dialect
MODES = ("json_schema", "json_object+schema", "json_object", "text")
RETRY_STATUS = {429, 500, 502, 503, 504}
PLACEHOLDER_KEY = "not-needed"  # a local server takes any key; the client insists on one


class LLMFailure(Exception):
    """The endpoint did not give a usable answer; the message is one line naming why."""


class ResponseTooLarge(Exception):
    """The answer broke the size cap or the whole-response deadline."""


def client_missing() -> str | None:
    """Why the LLM planner cannot talk to an endpoint on this install, or None when it can."""
    try:
        import openai  # noqa: F401
    except ImportError:
        return "the openai client is not installed (pip install 'autotune[llm]')"
    return None if _http is not None else "the openai client's HTTP library is missing (pip install 'autotune[llm]')"


def api_key() -> str | None:
    return os.environ.get("OPENAI_API_KEY") or None


def is_local(url: str) -> bool:
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


def safe_url(url: str) -> str:
    """The URL without user:password and query (what may be printed and stored); never raises: a URL that does
    not parse is shown with anything before an '@' hidden (shown_url)."""
    try:
        p = urlsplit(url)
        netloc = p.hostname or ""
        if ":" in netloc:  # an IPv6 address keeps its brackets
            netloc = f"[{netloc}]"
        if p.port:
            netloc += f":{p.port}"
    except ValueError:
        return shown_url(url)
    out = urlunsplit((p.scheme, netloc, p.path, "", ""))
    return shown_url(url) if "@" in out else out  # no '://': the userinfo sits in what parsed as a path


def shown_url(url: str, limit: int = 120) -> str:
    """A URL as it may be printed whatever it holds: everything before its last '@' (a user name and password,
    with or without a scheme) and any query are hidden, control characters dropped, the length capped."""
    s = "".join(c for c in str(url) if c.isprintable())
    scheme, sep, rest = s.partition("://")
    if not sep:
        scheme, rest = "", s
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    if "@" in rest:
        rest = "<user:password>@" + rest.rsplit("@", 1)[1]
    if "@" in scheme:  # no '://', and what looked like a scheme holds the userinfo
        scheme, rest = "", "<user:password>@" + s.rsplit("@", 1)[1]
    out = f"{scheme}://{rest}" if sep else rest
    return out if len(out) <= limit else out[: limit - 3] + "..."


def check_url(url: str, name: str = "--llm-base-url") -> str:
    """`url` if it is a usable endpoint URL: http or https, a host, a port in 1..65535 when one is given, and no
    user name or password (the key goes in OPENAI_API_KEY: userinfo would be sent as HTTP Basic credentials and
    echoed into stored error messages). Else BadInput naming `name` (the flag or the environment variable) and
    the URL with any userinfo hidden."""
    from ...errors import BadInput

    shown = shown_url(url)
    example = "e.g. http://127.0.0.1:8080/v1"
    if not isinstance(url, str) or not url.strip():
        raise BadInput(f"{name} {shown!r}: give the endpoint's URL, {example}")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise BadInput(f"{name} {shown!r}: a URL holds no spaces or control characters; {example}")
    try:
        p = urlsplit(url)
        port = p.port
    except ValueError as exc:
        why = "its port is not a number from 1 to 65535" if "port" in str(exc).lower() else \
            f"it is not a valid URL ({str(exc).split(':')[0]})"
        raise BadInput(f"{name} {shown!r}: {why}; {example}") from None
    if "@" in p.netloc or p.username is not None or p.password is not None or \
            ("://" not in url and "@" in url):
        raise BadInput(f"{name} {shown!r}: a user name or password in the URL is not accepted (it would be sent "
                       f"and stored); put the key in OPENAI_API_KEY and give the URL without it, {example}")
    if p.scheme.lower() not in ("http", "https") or "://" not in url:
        raise BadInput(f"{name} {shown!r}: the URL must start with http:// or https://; {example}")
    if not p.hostname:
        raise BadInput(f"{name} {shown!r}: the URL names no host; {example}")
    if port is not None and not 1 <= port <= 65535:
        raise BadInput(f"{name} {shown!r}: its port is not a number from 1 to 65535; {example}")
    return url


class _CappedStream(_http.SyncByteStream if _http else object):
    def __init__(self, inner, cap: int, deadline: float, total_s: float):
        self.inner, self.cap, self.seen, self.deadline, self.total_s = inner, cap, 0, deadline, total_s

    def __iter__(self):
        for chunk in self.inner:
            self.seen += len(chunk)
            if self.seen > self.cap:
                raise ResponseTooLarge(f"response larger than {self.cap:,} bytes")
            if time.monotonic() > self.deadline:  # a trickle never trips the per-read timeout
                raise ResponseTooLarge(f"response still arriving after {self.total_s:g} s (too slow)")
            yield chunk

    def close(self):
        self.inner.close()


class _CappedTransport(_http.HTTPTransport if _http else object):
    """Refuses a response body over `cap` bytes while it is read (and up front when it says its length),
    and one still arriving `total_s` after the request went out."""

    def __init__(self, cap: int, total_s: float, **kw):
        super().__init__(**kw)
        self.cap, self.total_s = cap, total_s

    def handle_request(self, request):
        deadline = time.monotonic() + self.total_s
        resp = super().handle_request(request)
        n = resp.headers.get("content-length", "")
        if n.isdigit() and int(n) > self.cap:
            resp.close()
            raise ResponseTooLarge(f"response of {int(n):,} bytes is over the {self.cap:,}-byte cap")
        return _http.Response(resp.status_code, headers=resp.headers,
                              stream=_CappedStream(resp.stream, self.cap, deadline, self.total_s),
                              extensions=resp.extensions, request=request)


@dataclass
class Usage:
    """Per-study accounting, stored as planner/usage.json."""

    requests: int = 0
    answered: int = 0
    failures: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    latency_s: float = 0.0
    valid_proposals: int = 0
    invalid_proposals: int = 0
    used_proposals: int = 0
    fallbacks: list[str] = field(default_factory=list)  # "round N: why", newest last (capped)
    mode: str | None = None


MAX_TOKENS_PER_ANSWER = 10**8  # far above any context window; a count beyond it is the server's error


def _tokens(value) -> tuple[int, str | None]:
    """A token count the server reported: (the count, None) when it is a whole number from 0 to
    MAX_TOKENS_PER_ANSWER (or absent), else (0, the value as shown) so that usage.json never goes negative,
    fractional or astronomical."""
    if value is None:
        return 0, None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS_PER_ANSWER:
        return value, None
    if isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_TOKENS_PER_ANSWER:
        return int(value), None
    return 0, sanitize(repr(value), 40)


def last_exchange(out_dir: Path) -> int:
    """The highest number among the stored exchanges (out_dir/exchanges/NNNN.json), 0 when there are none."""
    folder = out_dir / "exchanges"
    try:
        names = [e.name for e in os.scandir(folder)]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    except OSError as exc:
        from ...errors import ConfigError

        raise ConfigError(f"cannot read {folder}: {exc.strerror}; move it away or use another --study") from None
    nums = [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit() and n[:-5].isascii()]
    return max(nums, default=0)


_COUNTS = ("requests", "answered", "failures", "retries", "prompt_tokens", "completion_tokens", "valid_proposals",
           "invalid_proposals", "used_proposals")


def read_record(path: Path, what: str, keeps: str, max_bytes: int):
    """(the JSON a previous run of the study stored at `path`, a maker of one-line ConfigErrors naming it); (None,
    ...) when there is none. A link, an oversized or unreadable file is refused, never silently replaced (what it
    holds would be lost)."""
    from ...errors import ConfigError

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{path} is not the planner's {what} ({why}); move it away (the planner then starts a new "
                           "one) or use another --study")

    if path.is_symlink():
        raise ConfigError(f"{path} is a symbolic link; remove it (the planner {keeps}) or use another --study")
    if not path.exists():
        return None, bad
    try:
        if path.stat().st_size > max_bytes:
            raise bad(f"larger than {max_bytes // 1_000_000} MB")
        return json.loads(path.read_text()), bad
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise bad(f"not readable JSON: {sanitize(exc, 80)}") from None


def read_usage(path: Path, endpoint: str | None = None) -> Usage:
    """The accounting a previous run of the study stored (usage.json), checked field by field; a fresh Usage
    when there is none. A file that is not one autotune wrote is a one-line ConfigError naming it (never
    silently replaced: its counts would be lost). The remembered output mode carries over only for the same
    endpoint."""
    import math

    path = Path(path)
    doc, bad = read_record(path, "usage record", "keeps its usage there", 4_000_000)
    if doc is None:
        return Usage()
    if not isinstance(doc, dict):
        raise bad(f"a JSON {type(doc).__name__}, not an object")
    u = Usage()
    for name in _COUNTS:
        v = doc.get(name, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(f"{name} {sanitize(repr(v), 40)} is not a count")
        setattr(u, name, v)
    for name in ("usd", "latency_s"):
        v = doc.get(name, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise bad(f"{name} {sanitize(repr(v), 40)} is not a finite number, 0 or more")
        setattr(u, name, float(v))
    fb = doc.get("fallbacks", [])
    if not isinstance(fb, list) or not all(isinstance(x, str) for x in fb):
        raise bad("fallbacks is not a list of lines")
    u.fallbacks = [sanitize(x, 300) for x in fb[-50:]]
    mode = doc.get("mode")
    if mode is not None and mode not in MODES:
        raise bad(f"mode {sanitize(repr(mode), 40)} is not one of {', '.join(MODES)}")
    if endpoint is not None and doc.get("endpoint") == endpoint:
        u.mode = mode
    return u


def _cause(exc: BaseException) -> BaseException:
    seen = exc
    for _ in range(8):  # the transport's own error may sit under the client's wrappers
        if isinstance(seen, ResponseTooLarge):
            return seen
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    return exc


class Endpoint:
    def __init__(self, base_url: str, model: str | None, timeout_s: float, out_dir: Path | None,
                 max_bytes: int = 256_000, max_tokens: int = 800, attempts: int = 3, backoff_s: float = 0.5,
                 max_wait_s: float = 8.0, usd_per_m: tuple[float, float] = (0.0, 0.0)):
        import openai  # lazily: only this planner needs the client

        self._openai = openai
        check_url(base_url)
        self.url, self.model, self.timeout_s, self.out_dir = base_url, model, float(timeout_s), out_dir
        self.max_bytes, self.max_tokens, self.attempts = max_bytes, max_tokens, attempts
        self.backoff_s, self.max_wait_s, self.usd_per_m = backoff_s, max_wait_s, usd_per_m
        self.key = api_key()
        self.usage = Usage()
        self._n = 0
        if out_dir is not None:  # a resumed study: numbering and accounting go on from what is stored
            self._n = last_exchange(Path(out_dir))
            self.usage = read_usage(Path(out_dir) / "usage.json", safe_url(base_url))
        # per-read timeouts come from the client; the transport adds a whole-response deadline (2 x timeout)
        http = _http.Client(transport=_CappedTransport(max_bytes, 2 * self.timeout_s), timeout=self.timeout_s,
                            follow_redirects=False)
        # retries are ours (counted and stored); the client's own are off
        self.client = openai.OpenAI(base_url=base_url, api_key=self.key or PLACEHOLDER_KEY, timeout=self.timeout_s,
                                    max_retries=0, http_client=http)

    # --- the model to ask ----------------------------------------------------------------------------
    def resolve_model(self) -> str:
        if not self.model:
            try:
                models = self.client.models.list(timeout=min(self.timeout_s, 10.0))
                ids = [m.id for m in models.data]
            except Exception as exc:
                raise LLMFailure(f"listing the endpoint's models failed: {self._why(exc)}") from None
            if not ids:
                raise LLMFailure("the endpoint serves no model; pass --llm-model")
            self.model = str(ids[0])
        return self.model

    # --- one exchange --------------------------------------------------------------------------------
    def ask(self, messages: list[dict], tag: str) -> str:
        model = self.resolve_model()
        modes = MODES[MODES.index(self.usage.mode):] if self.usage.mode else MODES
        record: dict = {"tag": tag, "endpoint": safe_url(self.url), "model": model, "messages": messages, "tries": []}
        try:
            for mode in modes:
                try:
                    text = self._ask_mode(model, messages, mode, record)
                except _Unsupported as exc:
                    record["tries"].append({"mode": mode, "error": str(exc)})
                    continue
                self.usage.mode = mode
                record["answer"] = text
                self.usage.answered += 1
                return text
            raise LLMFailure(f"the endpoint refused every output mode ({', '.join(MODES)})")
        except LLMFailure as exc:
            self.usage.failures += 1
            record["failure"] = str(exc)
            raise
        finally:
            self._store(record)

    def _ask_mode(self, model: str, messages: list[dict], mode: str, record: dict) -> str:
        kw: dict = {}
        if mode == "json_schema":
            kw["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "proposals", "schema": answer_schema()}}
        elif mode == "json_object+schema":
            kw["response_format"] = {"type": "json_object", "schema": answer_schema()}
        elif mode == "json_object":
            kw["response_format"] = {"type": "json_object"}
        for attempt in range(self.attempts):
            self.usage.requests += 1
            t0 = time.monotonic()
            try:
                out = self.client.chat.completions.create(model=model, messages=messages, max_tokens=self.max_tokens,
                                                          temperature=0.2, **kw)
            except Exception as exc:
                dt = time.monotonic() - t0
                self.usage.latency_s += dt
                status = getattr(exc, "status_code", None)
                try_rec = {"mode": mode, "attempt": attempt + 1, "latency_s": round(dt, 3), "status": status,
                           "error": self._why(exc)}
                record["tries"].append(try_rec)
                # a server that does not know this response_format: 400/415/422, or (llama-cpp-python) a 500
                # whose message names the field; either way the next mode, not a retry
                if mode != "text" and (status in (400, 415, 422) or (status and "response_format" in str(exc))):
                    raise _Unsupported(try_rec["error"]) from None
                if status in RETRY_STATUS or (status is None and self._is_conn(exc)):
                    if attempt + 1 < self.attempts:
                        self.usage.retries += 1
                        time.sleep(self._wait(exc, attempt))
                        continue
                raise LLMFailure(try_rec["error"]) from None
            dt = time.monotonic() - t0
            self.usage.latency_s += dt
            u = getattr(out, "usage", None)
            pt, pt_bad = _tokens(getattr(u, "prompt_tokens", 0))
            ct, ct_bad = _tokens(getattr(u, "completion_tokens", 0))
            self.usage.prompt_tokens += pt
            self.usage.completion_tokens += ct
            self.usage.usd += (pt * self.usd_per_m[0] + ct * self.usd_per_m[1]) / 1e6
            choice = out.choices[0] if getattr(out, "choices", None) else None
            text = getattr(getattr(choice, "message", None), "content", None) if choice else None
            try_ok = {"mode": mode, "attempt": attempt + 1, "latency_s": round(dt, 3), "status": 200,
                      "prompt_tokens": pt, "completion_tokens": ct,
                      "finish_reason": getattr(choice, "finish_reason", None)}
            bad = [f"{n} {v}" for n, v in (("prompt_tokens", pt_bad), ("completion_tokens", ct_bad)) if v is not None]
            if bad:  # a negative, fractional, huge or non-numeric count is not added up
                try_ok["usage_note"] = "the server's token counts were not counted: " + ", ".join(bad)
            record["tries"].append(try_ok)
            if not isinstance(text, str) or not text.strip():
                raise LLMFailure("the endpoint answered with no text")
            return text[: self.max_bytes]
        raise LLMFailure("no answer after retries")  # pragma: no cover - the loop returns or raises

    def _wait(self, exc: BaseException, attempt: int) -> float:
        wait = self.backoff_s * (2 ** attempt)
        resp = getattr(exc, "response", None)
        ra = resp.headers.get("retry-after", "") if resp is not None else ""
        try:
            wait = max(wait, float(ra))
        except ValueError:
            pass
        return min(wait, self.max_wait_s)

    def _is_conn(self, exc: BaseException) -> bool:
        return isinstance(exc, self._openai.APIConnectionError) and not isinstance(exc, self._openai.APITimeoutError) \
            and not isinstance(_cause(exc), ResponseTooLarge)

    def _why(self, exc: BaseException) -> str:
        root = _cause(exc)
        if isinstance(root, ResponseTooLarge):
            return sanitize(str(root), 200)
        if isinstance(exc, self._openai.APITimeoutError):
            return f"no answer within {self.timeout_s:g} s (timeout)"
        status = getattr(exc, "status_code", None)
        head = f"HTTP {status}" if status else type(exc).__name__
        return redact(sanitize(f"{head}: {exc}", 200), self.key)

    def close(self) -> None:
        self.client.close()

    # --- storage -------------------------------------------------------------------------------------
    def _store(self, record: dict) -> None:
        if self.out_dir is None:
            return
        self._n += 1
        text = redact(json.dumps(record, indent=2, default=str), self.key)
        write_text_atomic(Path(self.out_dir) / "exchanges" / f"{self._n:04d}.json", text + "\n")

    def save_usage(self) -> None:
        if self.out_dir is None:
            return
        data = asdict(self.usage)
        data["fallbacks"] = data["fallbacks"][-50:]
        data.update(endpoint=safe_url(self.url), model=self.model, usd_note="priced by AUTOTUNE_LLM_USD_PER_M "
                    "(input,output dollars per million tokens); 0 for a local server")
        write_text_atomic(Path(self.out_dir) / "usage.json", redact(json.dumps(data, indent=2), self.key) + "\n")


class _Unsupported(Exception):
    """The server refused this structured-output mode; try the next one."""
