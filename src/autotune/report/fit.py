"""Tables whose numbers are never cut: a rich table fitted to the width it is printed at.

Rich shrinks a table that is too wide for the terminal by cutting every column alike ("3,12…", "17.…"). A
number cut is a wrong number, so `fit` marks the numeric columns (those justified right, unless named) as
never wrapped and at least as wide as their widest cell, and lets the text columns (layouts, settings,
reasons) fold instead. When the table is still wider than the screen, the numeric columns' headers break
between words and after a "/" ("tokens/" over "s/GPU"), then the space between columns halves, so what
width there is goes to the text columns.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

__all__ = ["fit", "FitTable", "break_header"]

TEXT_MIN = 6  # the narrowest a text column may be squeezed to before the numeric headers give up their width


def _plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def break_header(head: str, width: int) -> str:
    """`head` broken into lines of at most `width` cells, between words or after a "/" (a longer piece is
    left whole, for the column to fold)."""
    lines: list[str] = []
    for word in head.split():
        pieces = re.findall(r"[^/]+/?|/", word)
        for k, p in enumerate(pieces):
            glue = " " if k == 0 else ""
            if lines and cell_len(lines[-1] + glue + p) <= width and not (k == 0 and not lines[-1]):
                lines[-1] += glue + p
            else:
                lines.append(p)
    return "\n".join(lines) or head


def _pieces(head: str) -> list[str]:
    return [p for w in head.split() for p in re.findall(r"[^/]+/?|/", w)] or [head]


class FitTable:
    """A renderable around `table` that sizes its columns for the width it is rendered at."""

    def __init__(self, table: Table, numeric: set[str] | None = None):
        self.table = table
        self.numeric = [c for c in table.columns
                        if (_plain(c.header) in numeric if numeric is not None else c.justify == "right")]
        # the table's own header and padding, kept on it: a table fitted once (and so changed) may be fitted again
        for c in table.columns:
            c._fit_header = getattr(c, "_fit_header", c.header)
        self._head = {id(c): _plain(c._fit_header) for c in self.numeric}
        self._data: dict[int, int] = {}
        self._padding = table._fit_padding = getattr(table, "_fit_padding", table.padding)
        for c in table.columns:
            if any(c is n for n in self.numeric):
                w = max((cell_len(line) for x in c.cells for line in _plain(x).splitlines() or [""]), default=1)
                self._data[id(c)] = max(1, w)
                c.no_wrap, c.overflow, c.min_width = True, "fold", max(1, w)
            else:
                c.no_wrap, c.overflow = False, "fold"

    def _cap(self, c: Column, wrap: bool) -> None:
        head, data = self._head[id(c)], self._data[id(c)]
        if not wrap or cell_len(head) <= data:
            c.header, c.max_width = head, None
            return
        width = max(data, max(cell_len(p) for p in _pieces(head)))
        c.header = Text(break_header(head, width), no_wrap=False, overflow="fold")
        c.max_width = width

    def _needed(self, console: Console, options: ConsoleOptions) -> int:
        """The width the table needs with its numbers whole and its text columns squeezed to TEXT_MIN. Rich has
        no public per-column measure, so this reads the three helpers Table renders with (_extra_width,
        _measure_column, _get_padding_width: rich 13 to 15; tests/report/test_report_fit.py prints through them)."""
        t = self.table
        total = t._extra_width
        for i, c in enumerate(t.columns):
            m = t._measure_column(console, options, c)
            if any(c is n for n in self.numeric):
                total += m.maximum
            else:
                total += min(m.maximum, TEXT_MIN + t._get_padding_width(i))
        return total

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for step in (0, 1, 2):
            for c in self.numeric:
                self._cap(c, step > 0)
            top, right, bottom, left = self._padding
            self.table.padding = (top, right, bottom, 0 if step > 1 and right else left)  # one space, not two
            if self._needed(console, options) <= options.max_width:
                break
        yield self.table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)


def fit(table: Table, numeric: set[str] | None = None) -> FitTable:
    """`table` (rows added) ready to print at any width: numbers whole, text folded. `numeric`: the numeric
    columns' headers (default: the columns justified right)."""
    return FitTable(table, numeric)
