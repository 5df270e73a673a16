"""The `autotune` entry point: builds the typer app from the command modules and maps known errors to
one-line messages (exit 2 for bad input, 1 for other failures). Set AUTOTUNE_DEBUG=1 for tracebacks
(0, false, no, off or empty: none)."""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import sys
import threading
from pathlib import Path

import typer

from ..errors import AutotuneError, BadInput
from .console import print_error

app = typer.Typer(
    name="autotune",
    help=(
        "Find the fastest correct parallel layout for training an LLM with Megatron-core.\n\n"
        "Start with `autotune estimate` (will this layout fit, how fast is it?), `autotune space` (what is "
        "legal and worth trying?), then `autotune search` (find the best layout and emit recipes)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module exposes register(app). Listed explicitly so a broken module fails loudly.
COMMANDS = ["catalog_cmds", "estimate", "space", "calibrate", "search", "recipes", "export", "trial", "check",
            "dashboard"]


def _register() -> None:
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{name}":
                continue  # command not built yet
            raise
        mod.register(app)


def reflow(text: str | None) -> str | None:
    """A command's help as rich shows it well at any width: each prose paragraph one line (rich wraps it to
    the terminal; typer keeps a docstring's own line breaks, which at 80 columns left ragged half-lines), an
    `Example` paragraph line by line (a command split with a trailing backslash pastes into a shell whole)."""
    if not text:
        return text
    paras = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("Example") else " ".join(p.split("\n")) for p in paras)


def _reflow_all(group: typer.Typer) -> None:
    for cmd in group.registered_commands:
        cmd.help = reflow(cmd.help or (cmd.callback.__doc__ if cmd.callback else None))
    for sub in group.registered_groups:
        _reflow_all(sub.typer_instance)


_register()
_reflow_all(app)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so that it stops like Ctrl-C: trials cancelled, files closed."""


_signalled: list[int] = []  # SIGTERM seen during this main() (typer turns the interrupt into exit 130)


def _on_sigterm(signum, frame):
    _signalled.append(signum)
    raise Terminated()


def _os_error(exc: OSError) -> str:
    path = exc.filename if exc.filename is not None else ""
    what = exc.strerror or type(exc).__name__
    hint = {IsADirectoryError: "give a file, not a directory", NotADirectoryError: "a part of the path is a file",
            PermissionError: "choose a writable location (e.g. --runs-dir or --out)",
            FileNotFoundError: "check the path"}.get(type(exc), "check the path and its permissions")
    return f"{path}: {what}; {hint}" if path else f"{what}; {hint}"


def _switched_on(value: str | None) -> bool:
    """An environment switch: unset, empty, 0, false, no and off (any case) are off, as a user means them."""
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


def _file_args(argv: list[str]):
    """(option or None, value) for each argument that may name a file: option values and positionals.
    Flags are told from value options by the command's own parameters, so `--json x.yaml` is not `--json`'s."""
    flags: set[str] = set()
    try:
        import click

        cmd = typer.main.get_command(app)
        for tok in argv:
            if isinstance(cmd, click.Group) and tok in cmd.commands:
                cmd = cmd.commands[tok]
            for p in cmd.params:
                if isinstance(p, click.Option) and (p.is_flag or p.count):
                    flags.update(p.opts + p.secondary_opts)
    except Exception:  # only a better message is at stake
        pass
    option = None
    for tok in argv:
        if option is not None:
            yield option, tok
            option = None
        elif tok.startswith("-") and len(tok) > 1:
            name, eq, value = tok.partition("=")
            if eq:
                yield name, value
            elif tok not in flags:
                option = tok
        else:
            yield None, tok


def _not_utf8(argv: list[str], exc: UnicodeDecodeError) -> str:
    """The one-line error for a binary file where text was expected. The exception carries the bytes it failed
    on, not the file: the file is the command-line argument whose contents hold those bytes and are not UTF-8."""
    failed = bytes(exc.object) if isinstance(exc.object, (bytes, bytearray, memoryview)) else b""
    for option, value in _file_args(argv):
        try:
            p = Path(value)
            if not failed or not p.is_file() or p.stat().st_size > 1 << 28:
                continue
            data = p.read_bytes()
        except (OSError, ValueError):
            continue
        if failed not in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            label = f"{option} {value}" if option else value
            return (f"{label}: not UTF-8 text (a binary file?); pass the text file "
                    f"{option or 'the command'} asks for")
    return "an input file is not UTF-8 text (a binary file?); pass the text file the option asks for"


def main(argv: list[str] | None = None) -> int:
    debug = _switched_on(os.environ.get("AUTOTUNE_DEBUG"))
    previous = None
    _signalled.clear()
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run(argv, debug)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(argv: list[str] | None, debug: bool) -> int:
    try:
        rc = app(args=argv, standalone_mode=False)  # non-standalone click returns typer.Exit's code
        rc = rc if isinstance(rc, int) else 0
        if rc == 130:  # typer's answer to an interrupt inside a command
            raise Terminated() if _signalled else KeyboardInterrupt()
        return rc
    except SystemExit as exc:  # typer/click exits (e.g. --help)
        return int(exc.code or 0)
    except BadInput as exc:
        if debug:
            raise
        print_error(exc)
        return 2
    except AutotuneError as exc:
        if debug:
            raise
        print_error(exc)
        return 1
    except Terminated:
        print_error("terminated (SIGTERM); running trials were stopped", prefix="")
        return 143
    except KeyboardInterrupt:
        print_error("interrupted", prefix="")
        return 130
    except OSError as exc:  # a path the user gave: a directory for a file, read-only, missing
        if debug:
            raise
        print_error(_os_error(exc))
        return 2
    except UnicodeDecodeError as exc:  # a binary file where text was expected; callers that know the path say so
        if debug:
            raise
        print_error(_not_utf8(list(sys.argv[1:] if argv is None else argv), exc))
        return 2
    except RecursionError:
        if debug:
            raise
        print_error("an input file is nested too deeply to read; check its structure")
        return 2
    except Exception as exc:  # click's (typer vendors its own copy) usage errors and the like
        name = type(exc).__name__
        if name == "NoArgsIsHelpError" and getattr(exc, "ctx", None) is not None:
            from .console import console

            console.print(exc.ctx.get_help())
            return 0
        if name == "Abort":
            return 130
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            if debug:
                raise
            print_error(f"{exc.format_message()} (see --help)")
            return 2 if "Usage" in name or "Parameter" in name or "Option" in name or exc.exit_code == 2 else exc.exit_code
        raise


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    entry()
