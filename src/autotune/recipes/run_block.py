"""What a recipe's `run:` block may hold: env exports, comments and one known launcher command.

A recipe is a file from someone else, and `export --format script` turns its run block into a script
the user executes. Anything else (`curl ... | sh`, `rm -rf`, a redirect, a command substitution outside
the seed's NVLink test) is reported line by line, so `recipes validate` flags it and export refuses it.
"""

from __future__ import annotations

import re
import shlex

__all__ = ["run_block_problems", "LAUNCHERS"]

LAUNCHERS = ("python3", "python")  # slime's entry: python3 -m <module> ... (or a .py script)
_EXPORT = re.compile(r"^export [A-Za-z_][A-Za-z0-9_]*=(?P<value>.*)$")
# The seed's one command substitution: NCCL_NVLS_ENABLE=$([ "$NVLINK_COUNT" -gt 0 ] && echo 1 || echo 0)
_NVLINK_TEST = re.compile(r'^\$\(\[ "\$[A-Z_][A-Z0-9_]*" -(?:gt|ge|eq|ne|lt|le) \d+ \] && echo \w+ \|\| echo \w+\)$')
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_.:,/=+@%-]*$|^\"[^\"`$\\]*\"$|^'[^']*'$")
_OPERATORS = {"|", "||", "&", "&&", ";", ";;", ">", ">>", "<", "<<", "(", ")", ">&", "<&", "|&"}


def _logical_lines(run: str) -> list[tuple[int, str]]:
    """(first line number, text) with backslash continuations joined."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(run.splitlines(), 1):
        if not buf:
            start = n
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, (buf + line).strip()))
        buf = ""
    if buf:
        out.append((start, buf.strip()))
    return out


def _launcher_problem(line: str) -> str | None:
    if "`" in line or "$(" in line:
        return "a command substitution in the launcher"
    try:
        lex = shlex.shlex(line.replace("<slime entry module>", "SLIME_ENTRY"), posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        tokens = list(lex)
    except ValueError as exc:
        return f"cannot be read as one command ({exc})"
    if not tokens or tokens[0] not in LAUNCHERS:
        return f"runs {tokens[0] if tokens else '?'!r}, not the launcher ({' or '.join(LAUNCHERS)})"
    ops = [t for t in tokens if t in _OPERATORS or set(t) <= set("|&;<>()")]
    if ops:
        return f"chains or redirects with {ops[0]!r}"
    return None


def run_block_problems(run: str) -> list[tuple[int, str]]:
    """(line number, message) for each line that is not a comment, an env export or the one launcher."""
    found: list[tuple[int, str]] = []
    launchers = 0
    for n, line in _logical_lines(run):
        if not line or line.startswith("#"):
            continue
        shown = line if len(line) <= 60 else line[:57] + "..."
        m = _EXPORT.match(line)
        if m:
            value = m.group("value")
            if not (_PLAIN_VALUE.match(value) or _NVLINK_TEST.match(value)):
                found.append((n, f"{shown!r}: an export whose value runs commands or chains them; "
                                 f"export plain values only"))
            continue
        why = _launcher_problem(line)
        if why is None:
            launchers += 1
            if launchers > 1:
                found.append((n, f"{shown!r}: a second launcher command; a recipe runs one"))
            continue
        found.append((n, f"{shown!r}: {why}; a run block holds env exports, comments and the launcher only"))
    return found
