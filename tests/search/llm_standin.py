"""A scripted stand-in for a remote OpenAI-compatible model: standard-library http.server on 127.0.0.1.

Each POST to /v1/chat/completions takes the next step of the script (a `Reply`, or a function of the
request body returning one); the last step repeats. GET /v1/models lists one model. Every request body
and its Authorization header are kept, so tests can check what the planner sent. Bounded: a handler
sleeps at most `Reply.delay` seconds, and `close()` stops the server and its thread.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

__all__ = ["Reply", "StandIn", "chat", "answer", "planner_world"]


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    length: bool = True  # send Content-Length (False: stream until the connection closes)
    trickle: float = 0.0  # seconds between 16-byte pieces of the body (a slow-drip server), at most 10 s in all


def chat(content: str, prompt_tokens: int = 120, completion_tokens: int = 30) -> Reply:
    """A chat-completion reply whose message is `content`."""
    body = {"id": "standin-1", "object": "chat.completion", "created": 0, "model": "standin",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
    return Reply(body=json.dumps(body).encode())


def answer(*proposals: dict) -> Reply:
    return chat(json.dumps({"proposals": list(proposals)}))


class StandIn:
    def __init__(self, script: list[Reply | Callable[[dict], Reply]]):
        self.script = list(script)
        self.requests: list[dict] = []
        self.auth: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, r: Reply):
                if r.delay:
                    time.sleep(min(r.delay, 10.0))
                self.send_response(r.status)
                self.send_header("Content-Type", "application/json")
                for k, v in r.headers.items():
                    self.send_header(k, v)
                if r.length:
                    self.send_header("Content-Length", str(len(r.body)))
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                step = 16 if r.trickle else 65536
                t0 = time.monotonic()
                try:
                    for i in range(0, len(r.body), step):
                        self.wfile.write(r.body[i:i + step])
                        if r.trickle:
                            self.wfile.flush()
                            if time.monotonic() - t0 > 10:
                                break
                            time.sleep(r.trickle)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading (the planner's size cap)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    body = json.dumps({"object": "list", "data": [{"id": "standin", "object": "model",
                                                                   "created": 0, "owned_by": "test"}]}).encode()
                    self._send(Reply(body=body))
                else:
                    self._send(Reply(status=404, body=b'{"error": "not found"}'))

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(n) or b"{}")
                with outer.lock:
                    outer.requests.append(req)
                    outer.auth.append(self.headers.get("Authorization", ""))
                    step = outer.script[min(len(outer.requests) - 1, len(outer.script) - 1)]
                self._send(step(req) if callable(step) else step)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def planner_world(model: str, gpu: str, count: int):
    """A planner's world for tests: (model, cluster, workload, explore result, candidate table, predictions, keys)."""
    from autotune.catalog import ClusterSpec, Workload, load_model
    from autotune.layout.dimensions import table_keys
    from autotune.space import explore, load_space

    m, c, w = load_model(model), ClusterSpec.of(gpu, count), Workload()
    r = explore(load_space(None, m), m, w, c)
    table = r.table.take(r.kept)
    return m, c, w, r, table, r.evaluation.time.tokens_per_s_per_gpu[r.kept], table_keys(table)
