"""The `autotune` entry point: builds the typer app from the command modules and maps known errors to
one-line messages (exit 2 for bad input, 1 for other failures). Set AUTOTUNE_DEBUG=1 for tracebacks."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from ..errors import AutotuneError, BadInput
from .console import err_console

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
COMMANDS = ["catalog_cmds", "estimate", "space", "calibrate", "search", "recipes", "export", "trial", "dashboard"]


def _register() -> None:
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{name}":
                continue  # command not built yet
            raise
        mod.register(app)


_register()


def main(argv: list[str] | None = None) -> int:
    debug = bool(os.environ.get("AUTOTUNE_DEBUG"))
    try:
        rc = app(args=argv, standalone_mode=False)  # non-standalone click returns typer.Exit's code
        return rc if isinstance(rc, int) else 0
    except SystemExit as exc:  # typer/click exits (e.g. --help)
        return int(exc.code or 0)
    except BadInput as exc:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
        return 2
    except AutotuneError as exc:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 1
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
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
            err_console.print(f"[bold red]error:[/] {exc.format_message()} (see --help)")
            return 2 if "Usage" in name or "Parameter" in name or "Option" in name or exc.exit_code == 2 else exc.exit_code
        raise


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    entry()
