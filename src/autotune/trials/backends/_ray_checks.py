"""Ray-free checks around a Ray cluster: is the address reachable, can the cluster ever hold a trial's
placement group, the SIGTERM handler to keep once ray.init has replaced it, and how a Ray-level failure
is classified (the memory monitor's kills are OOM, the rest infra).

Kept out of ray.py (which drives Ray) so they are plain functions tested without a cluster.
"""

from __future__ import annotations

import signal
import socket
import threading

from ...errors import BadInput

__all__ = ["probe_address", "demand_shortfall", "keep_sigterm", "all_ready", "last_line", "ray_failure",
           "CONNECT_TIMEOUT_S"]

CONNECT_TIMEOUT_S = 10.0


def probe_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A bounded TCP connect to a `host:port` or `ray://host:port` address; BadInput if nothing answers.
    `auto`, `local` and addresses without a port are Ray's to resolve."""
    rest = address.split("://", 1)[-1]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or address in ("auto", "local"):
        return
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return
    except OSError as exc:
        raise BadInput(f"--ray-address {address!r}: nothing answers there within {timeout_s:g} s "
                       f"({exc.strerror or exc}); start the cluster (`ray start --head`) or fix the address") from None


def demand_shortfall(bundles: list[dict], totals: dict, nodes: list[dict] | None = None) -> str | None:
    """Why the cluster can never hold these bundles (one line naming demand and resources), or None."""
    demand: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            demand[k] = demand.get(k, 0.0) + float(v)
    short = [k for k, v in demand.items() if v > float(totals.get(k, 0.0)) + 1e-9]
    if not short and nodes:  # the totals suffice; does each bundle fit on some one node?
        largest = {k: max((float(n.get(k, 0.0)) for n in nodes), default=0.0) for k in demand}
        short = [k for b in bundles for k, v in b.items() if float(v) > largest[k] + 1e-9][:1]
        if short:
            big = max(bundles, key=lambda b: b.get(short[0], 0.0))
            return (f"a bundle of {_fmt(big)} fits on no node (largest node: {_fmt(largest)}); "
                    f"use fewer ranks or GPUs per node")
    if not short:
        return None
    have = {k: float(totals.get(k, 0.0)) for k in demand}
    return (f"the trial needs {len(bundles)} bundle(s) = {_fmt(demand)} but the Ray cluster has {_fmt(have)} in "
            f"total; use fewer ranks (--count), add nodes, or set AUTOTUNE_RAY_AUTOSCALE=1 if an autoscaler adds them")


def _fmt(res: dict) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(res.items()))


def keep_sigterm(previous) -> None:
    """ray.init replaces the SIGTERM handler with one that exits mid-call (Ray's C++ side then dumps a
    stack); put back the CLI's (SIGTERM as an interrupt), or else one that exits through finally blocks."""
    if threading.current_thread() is not threading.main_thread():
        return
    if callable(previous) or previous == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, previous)
        return

    def stop(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, stop)


def all_ready(ray, refs: list) -> bool:
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
    return len(ready) == len(refs)


def last_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def ray_failure(exc: BaseException) -> tuple[str, str]:
    """A Ray-level failure: the memory monitor's kills are OOM (a result); everything else is infra."""
    text = str(exc)
    low = text.lower()
    if type(exc).__name__ == "OutOfMemoryError" or any(k in low for k in ("memory monitor", "low on memory", "outofmemory")):
        return "oom", f"host OOM: Ray's memory monitor killed a worker ({type(exc).__name__})"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return "infra", f"{type(exc).__name__}: {first[:240]}"
