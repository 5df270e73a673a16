"""optuna-dashboard on a study's study.db, bound to 127.0.0.1, as a child process that dies with us.

The child gets PR_SET_PDEATHSIG on Linux, so even a kill -9 of autotune takes the server down; Ctrl-C (or
any exit) terminates it and waits. `start` returns only once the server answers its /api/studies.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..errors import BadInput, MissingExtra

__all__ = ["OptunaDashboard", "dashboard_command"]

HOST = "127.0.0.1"


def dashboard_command() -> list[str]:
    """How to run optuna-dashboard here: the script beside this Python, on PATH, or its module."""
    here = Path(sys.executable).with_name("optuna-dashboard")
    if here.exists():
        return [str(here)]
    found = shutil.which("optuna-dashboard")
    if found:
        return [found]
    try:
        import optuna_dashboard  # noqa: F401
    except ImportError:
        raise MissingExtra("optuna-dashboard is not installed: run `pip install optuna-dashboard` "
                           "(or `pip install 'autotune[dashboard]'`)") from None
    return [sys.executable, "-c", "from optuna_dashboard._cli import main; main()"]


def _die_with_parent() -> None:  # runs in the child before exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


class OptunaDashboard:
    def __init__(self, db: Path, port: int):
        if not 0 < port < 65536:
            raise BadInput(f"--port {port}: choose a port between 1 and 65535")
        self.db, self.port, self.proc = Path(db), port, None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def start(self, timeout_s: float = 60.0) -> "OptunaDashboard":
        if not _port_free(self.port):
            raise BadInput(f"--port {self.port}: already in use on {HOST}; pass another --port")
        cmd = dashboard_command() + [f"sqlite:///{self.db.resolve()}", "--host", HOST, "--port", str(self.port), "--quiet"]
        # stderr to a file, not a pipe: a chatty server must never block on a pipe nobody reads
        self._err = tempfile.TemporaryFile()
        # its own session: a terminal Ctrl-C reaches autotune only, which then stops the server in order
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err, stdin=subprocess.DEVNULL,
                                     start_new_session=True,
                                     preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._err.seek(0)
                err = self._err.read().decode(errors="replace").strip().splitlines()
                raise BadInput(f"optuna-dashboard exited ({self.proc.returncode}) on {self.db}: "
                               f"{err[-1] if err else 'no message'}")
            try:
                self.studies()
                return self
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise BadInput(f"optuna-dashboard did not answer on {self.url} within {timeout_s:g} s; try another --port")

    def studies(self) -> list[str]:
        with urllib.request.urlopen(f"{self.url}api/studies", timeout=5) as r:
            return [s["study_name"] for s in json.loads(r.read())["study_summaries"]]

    def wait(self) -> int:
        return self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "OptunaDashboard":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
