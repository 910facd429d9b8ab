"""What every dphil command shares on the click side: exit codes, common options.

The behaviour itself (messages, signals, reading and writing records) lives in
`dphil.io.console` and `dphil.io.jsonl`; this module only adapts click to it, so a
usage error exits 64 (not click's 2) under a terminal, a pipe and CliRunner alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from dphil.io.console import Console, run
from dphil.io.errors import EX_INTERRUPTED, EX_USAGE


class DphilCommand(click.Command):
    """A click command whose failures follow the sysexits contract."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra: Any):
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help(), err=True)
            code = EX_USAGE
        except click.UsageError as e:
            e.show()
            code = EX_USAGE
        except click.exceptions.Exit as e:
            code = e.exit_code
        except click.Abort:
            click.echo(f"{self.name}: interrupted", err=True)
            code = EX_INTERRUPTED
        except click.ClickException as e:
            e.show()
            code = e.exit_code
        else:
            code = rv if isinstance(rv, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def command(name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """Declare a dphil command: `@command("dphil-score", help=...)`."""
    kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"], "max_content_width": 100})
    return click.command(name, cls=DphilCommand, **kwargs)


def execute(
    prog: str,
    quiet: bool,
    body: Callable[[Console], int | None],
    *,
    outputs: tuple[str | None, ...] = (),
    wait_lock: float = 0.0,
) -> int:
    """Run a command body with its Console; return the exit status for click to use.

    `outputs` are the files (or run directories) the body writes: it runs holding
    their locks (`dphil.io.lock`), so a second writer of the same output waits up to
    `wait_lock` seconds or exits 75.
    """
    console = Console(prog, quiet=quiet)
    if not any(o is not None and o != "-" for o in outputs):
        return run(console, lambda: body(console))

    def locked_body() -> int | None:
        from dphil.io.lock import locked

        def waiting(target: str, pid: int) -> None:
            who = f"pid {pid}" if pid else "another process"
            console.warn(f"{target}: waiting up to {wait_lock:g} s for {who} to finish writing it")

        with locked(outputs, wait_lock, on_wait=waiting):
            return body(console)

    return run(console, locked_body)


# -- options shared by several commands -------------------------------------------------


def output_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-o",
        "--output",
        metavar="FILE",
        default=None,
        help="Write records to FILE (atomically: a temporary file renamed on success) instead of stdout.",
    )(f)


def wait_lock_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--wait-lock",
        type=click.FloatRange(min=0),
        default=0.0,
        show_default=True,
        metavar="SECONDS",
        help="When another process is writing the same output (it holds OUTPUT.lock), wait "
        "up to SECONDS for it to finish instead of exiting 75 at once.",
    )(f)


def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-q", "--quiet", is_flag=True, help="No progress or warnings on stderr; errors still.")(f)


def on_error_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--on-error",
        type=click.Choice(["fail", "skip"]),
        default="fail",
        show_default=True,
        help="fail: stop at the first bad line (exit 65). skip: leave bad lines out and report how many on stderr.",
    )(f)


def inputs_argument(f: Callable[..., Any]) -> Callable[..., Any]:
    # Plain strings: missing files and directories are reported by the reader with exit 66.
    return click.argument("inputs", nargs=-1, metavar="[FILE]...")(f)
