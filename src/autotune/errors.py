"""The exception tree. Domain failures subclass AutotuneError; bad input is a ValueError subclass.

Every message names the offending value and a way out, on one line: the CLI prints it as is and
exits 2 for bad input, 1 for other failures.
"""

from __future__ import annotations

__all__ = [
    "AutotuneError",
    "BadInput",
    "UnknownName",
    "ConfigError",
    "IllegalLayout",
    "MissingExtra",
    "StudyLocked",
    "Unwritable",
]


class AutotuneError(Exception):
    """A failure of autotune's own work (not the user's input)."""


class BadInput(AutotuneError, ValueError):
    """The user's input is wrong; the message says which value and what to do instead."""


class UnknownName(BadInput):
    """A model, GPU or other catalog name that does not exist; suggests close names."""


class ConfigError(BadInput):
    """A malformed or incomplete file (config.json, search space, recipe, TrialSpec)."""


class IllegalLayout(BadInput):
    """A parallel layout that breaks one or more of Megatron-core's rules."""

    def __init__(self, message: str, violations: list | None = None, nearest: object | None = None):
        super().__init__(message)
        self.violations = violations or []
        self.nearest = nearest


class MissingExtra(AutotuneError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class StudyLocked(BadInput):
    """Another driver holds the study directory."""


class Unwritable(BadInput, OSError):
    """A file cannot be written where asked (missing folder, a file in the way, no permission); the message names
    the user's path, not the temp file. Still an OSError, so code that catches failed writes keeps catching it.
    `problem`: what is wrong with the path, without "cannot write" or the way out (e.g. "out.json: it is a FIFO, not
    a regular file"), for a caller that words its own message around it (cli.common.regular_target)."""

    def __init__(self, message: str, filename: str | None = None, errno: int | None = None, problem: str | None = None):
        super().__init__(message)
        self.filename, self.errno, self.problem = filename, errno, problem

    def __str__(self) -> str:
        return self.args[0]


def require(module: str, extra: str):
    """Import an optional heavy dependency, or fail with the pip command that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtra(
            f"{module} is not installed: run `pip install 'autotune[{extra}]'` ({exc})"
        ) from exc
