"""The single output sink: a rich console for humans (stderr for progress), plain JSON for scripts."""

from __future__ import annotations

import json
import sys

from rich.console import Console

__all__ = ["console", "err_console", "print_json"]

console = Console(highlight=False, soft_wrap=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)  # errors stay on one line


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_default) + "\n")
    sys.stdout.flush()


def _default(o):
    import numpy as np

    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
