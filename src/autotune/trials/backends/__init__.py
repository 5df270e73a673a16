"""Trial backends and the factory that picks one by name.

Backends are imported lazily: `ray` (and, through it, the slime launcher) are optional extras, so
naming a backend must not import any of them until it is asked for. `get_backend("ray")` on a machine
without ray raises MissingExtra naming the extra to install.

To add a backend, add one line to `BACKENDS` ("name": "module:Class", module relative to this package).
"""

from __future__ import annotations

import importlib

from ...errors import BadInput, MissingExtra
from .base import Backend, Handle

__all__ = ["Backend", "Handle", "BACKENDS", "get_backend", "available_backends", "backend_class"]

# name -> "module:Class". Extend here; nothing else needs to change.
BACKENDS: dict[str, str] = {
    "local": "local:LocalBackend",
    "ray": "ray:RayBackend",
    "slime": "slime:SlimeBackend",
    "simulate": "simulate:SimulateBackend",  # cost-model predictions, no processes
}

# The optional module each backend needs, to tell "not installed" from "not usable here".
_NEEDS: dict[str, str] = {"ray": "ray", "slime": "ray"}


def backend_class(name: str) -> type[Backend]:
    """The Backend subclass registered under `name` (imports its module)."""
    key = name.strip().lower()
    if key not in BACKENDS:
        raise BadInput(f"unknown backend {name!r}: choose one of {', '.join(sorted(BACKENDS))}")
    module, _, cls = BACKENDS[key].partition(":")
    mod = importlib.import_module(f"{__name__}.{module}")
    return getattr(mod, cls)


def get_backend(name: str, **options) -> Backend:
    """A ready backend: `get_backend("ray", address="auto")`, `get_backend("local")`.

    Options are the backend constructor's keyword arguments; None values are dropped so that a CLI
    can pass every flag it has and let each backend keep its own defaults.
    """
    cls = backend_class(name)
    return cls(**{k: v for k, v in options.items() if v is not None})


def available_backends() -> list[str]:
    """Registered backends whose module and optional dependencies import on this machine."""
    out = []
    for name in BACKENDS:
        need = _NEEDS.get(name)
        try:
            if need:
                importlib.import_module(need)
            backend_class(name)
        except (ImportError, MissingExtra, AttributeError):
            continue
        out.append(name)
    return out
