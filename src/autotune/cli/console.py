"""The single output sink: a rich console for humans (stderr for progress), plain JSON for scripts.

Error and warning text is the user's own input as often as not (a model name, a path, a YAML value), so
`print_error` never interprets it as rich markup and cuts it to one line of sane length.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext

from rich.console import Console
from rich.text import Text

__all__ = ["console", "err_console", "print_json", "print_error", "one_line", "working", "MAX_LINE"]

MAX_LINE = 800  # characters of one error line; the middle of a longer one is cut (the way out is at the end)

# Off a terminal (a log, a pipe, CI) rich would fold tables to 80 columns, cutting every layout label to
# "TP2…"; a log is read by scrolling sideways, so tables get 160 unless COLUMNS says otherwise.
_WIDE = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(highlight=False, soft_wrap=False, width=_WIDE)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)  # errors stay on one line


def one_line(text: object, limit: int = MAX_LINE) -> str:
    """`text` with every run of whitespace (newlines included) as one space, at most about `limit`
    characters: a longer one keeps its head and tail (which says what to do) and names what was cut."""
    line = " ".join(str(text).split())
    if len(line) <= limit:
        return line
    head, tail = int(limit * 0.6), int(limit * 0.3)
    return f"{line[:head]} ... ({len(line) - head - tail:,} characters cut) ... {line[-tail:]}"


def print_error(text: object, prefix: str = "error: ") -> None:
    """One plain line on stderr: the prefix in red, the message exactly as given (no markup)."""
    line = Text(prefix, style="bold red")
    line.append(one_line(text))
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)


def working(text: str, enabled: bool = True):
    """A spinner on stderr while `text` is being done: a terminal's only (a log or pipe gets nothing) and gone
    when done, so what follows reads as if it was never there."""
    if enabled and err_console.is_terminal:
        return err_console.status(text, spinner="dots")
    return nullcontext()


def screening(model_name: str, count: int, gpu_name: str, enabled: bool = True):
    """The spinner shown while a search space is enumerated and screened (space, search)."""
    return working(f"screening the search space for {model_name} on {count} x {gpu_name}", enabled)


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
