"""Small wording helpers shared by the CLI and the reports: counts with the right plural, numbers that stay
readable when small."""

from __future__ import annotations

__all__ = ["count", "hours", "measured_text", "percent"]


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 trial', '3 trials', '0 trials' (the plural is noun + 's' unless given); `noun` may be several words
    ('finished trial'), only the last word takes the plural."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def hours(x: float) -> str:
    """GPU-hours (or any budget) with one decimal, or two significant digits below 0.1, so that a small
    budget never reads as 0.0: 12.3, 0.5, 0.01, 0.0042, 0."""
    x = float(x)
    if x == 0 or abs(x) >= 0.095:
        return f"{x:,.1f}"
    return f"{x:.2g}" if abs(x) >= 1e-4 else f"{x:.1e}"


def percent(p: float) -> str:
    """A chance as a user reads it: whole percent, one decimal under 10% (where the search's 5% stop rule sits):
    41%, 3.8%."""
    return f"{p:.0%}" if p >= 0.1 else f"{p:.1%}"


def measured_text(value: float | None, stderr: float | None = None) -> str:
    """A measured tokens/s/GPU with its standard error when its trial reported one ("2,451.4 +/-0.3%"), or "-"."""
    if not value:
        return "-"
    return f"{value:,.1f}" + (f" +/-{stderr:.1%}" if stderr else "")
