"""Failure classes of a trial: ok, oom, timeout, nccl, nan, crash (infra is the backends' call).

Each runner rank that fails prints one marker line, `AUTOTUNE_FAILURE status=<class> rank=<r>
reason=<one line>`, classified in-process from the exception (`classify_exception`). Backends read all
ranks' logs and exit codes with `classify(returncodes, log_text)`: markers first, the root cause
winning over its echoes (one rank's OOM makes its peers fail in collectives: that is an oom, not an
nccl failure); without markers (a rank killed by a signal, a crash before the runner started) the
log's tracebacks and the exit codes decide. No torch here: exceptions are matched by name and text.
"""

from __future__ import annotations

import re
import signal

__all__ = ["classify", "classify_exception", "marker", "NonFiniteLoss", "PRIORITY", "MARKER"]

MARKER = "AUTOTUNE_FAILURE"
# Root causes first: a crash in one rank shows up as communication errors in the others.
PRIORITY = ("oom", "nan", "crash", "timeout", "nccl")
_MARKER_RE = re.compile(rf"{MARKER} status=(\w+) rank=(-?\d+) reason=(.*)$", re.MULTILINE)

_OOM = re.compile(
    r"OutOfMemoryError|CUDA out of memory|out of memory|Cannot allocate memory|MemoryError|"
    r"DefaultCPUAllocator: can't allocate memory|std::bad_alloc", re.IGNORECASE)
_NAN = re.compile(r"NonFiniteLoss|NaN or Inf found|found NaN|loss is nan|non-finite loss", re.IGNORECASE)
_COMM = re.compile(
    r"NCCL|DistBackendError|ProcessGroupGloo|gloo|Connection closed by peer|Connection reset by peer|"
    r"Broken pipe|c10d|TCPStore|ncclRemoteError|ncclSystemError|socket", re.IGNORECASE)
_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|timed out|Timeout", re.IGNORECASE)
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$", re.MULTILINE)


class NonFiniteLoss(FloatingPointError):
    """The loss (or gradient norm) of a step was NaN or infinite."""


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def marker(status: str, rank: int, reason: str) -> str:
    """The line a failing rank prints (to stderr, which the backend captures)."""
    return f"{MARKER} status={status} rank={rank} reason={_one_line(reason)}"


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """(status, one-line reason) for an exception raised inside a runner rank."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = f"{type(exc).__name__}: {exc}"
    if names & {"OutOfMemoryError", "MemoryError"} or _OOM.search(text):
        return "oom", _one_line(text)
    if "NonFiniteLoss" in names or _NAN.search(text):
        return "nan", _one_line(text)
    if names & {"DistBackendError", "DistNetworkError", "DistStoreError"} or _COMM.search(text):
        if _TIMEOUT.search(text):
            return "nccl", _one_line(f"collective timed out: {text}")
        return "nccl", _one_line(text)
    return "crash", _one_line(text)


def signal_name(rc: int) -> str:
    """'SIGKILL' for a process's return code -9 (Popen's negative codes), 'signal 99' for a number Python does not
    name."""
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def classify(returncodes: list[int], log_text: str) -> tuple[str, str]:
    """(status, reason) of a finished trial from every rank's exit code and the ranks' logs."""
    codes = [rc for rc in returncodes if rc is not None]
    found = [(m.group(1), int(m.group(2)), m.group(3).strip()) for m in _MARKER_RE.finditer(log_text or "")]
    found = [f for f in found if f[0] in PRIORITY]
    if found:
        status, rank, reason = min(found, key=lambda f: (PRIORITY.index(f[0]), f[1]))
        return status, _one_line(f"rank {rank}: {reason}")
    if codes and all(rc == 0 for rc in codes):
        return "ok", ""
    text = log_text or ""
    errors = _ERROR_LINE.findall(text)
    last_error = _one_line(errors[-1]) if errors else ""
    if _OOM.search(text):
        oom = next((e for e in errors if _OOM.search(e)), None) or _one_line(_OOM.search(text).group(0))
        return "oom", oom
    if any(rc in (124, -signal.SIGALRM) for rc in codes):
        return "timeout", "a rank ran past its time limit" + (f"; last error: {last_error}" if last_error else "")
    if _NAN.search(text):
        return "nan", next((e for e in errors if _NAN.search(e)), last_error or "non-finite loss")
    killed = [rc for rc in codes if rc < 0]
    if killed and not errors:
        name = signal_name(killed[0])
        hint = " (the kernel's OOM killer sends SIGKILL when host memory runs out)" if killed[0] == -signal.SIGKILL else ""
        return "crash", f"a rank was killed by {name}{hint}"
    if errors and _COMM.search(" ".join(errors)) and all(_COMM.search(e) for e in errors):
        return "nccl", last_error
    bad = [rc for rc in codes if rc != 0]
    return "crash", last_error or (f"a rank exited with code {bad[0]}" if bad else "the trial failed without an error message")
