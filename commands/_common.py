"""What every dphil command shares on the click side: exit codes, common options.

The behaviour itself (messages, signals, reading and writing records) lives in
`dphil.io.console` and `dphil.io.jsonl`; this module only adapts click to it, so a
usage error exits 64 (not click's 2) under a terminal, a pipe and CliRunner alike.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from dphil import __version__
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
            # dphil's one-line style, not click's three-line usage block: "prog: what is wrong (see -h)"
            message = " ".join(line.strip() for line in e.format_message().splitlines() if line.strip())
            click.echo(f"{self.name}: {message} (see {self.name} --help)", err=True)
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
    """Declare a dphil command: `@command("dphil-score", help=...)`, with `--version` and `-h`."""
    kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"], "max_content_width": 100})

    def declare(f: Callable[..., Any]) -> click.Command:
        versioned = click.version_option(__version__, "--version", prog_name=name, message="%(prog)s %(version)s")(f)
        return click.command(name, cls=DphilCommand, **kwargs)(versioned)

    return declare


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


# -- option groups: each declared once, for every command that takes it ------------------


def options(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One decorator applying `decorators` as if stacked in this order (the first shows first in --help)."""

    def apply(f: Any) -> Any:
        for decorate in reversed(decorators):
            f = decorate(f)
        return f

    return apply


def table_options(sizes_help: str) -> Callable[[Any], Any]:
    """-n and the table's rules (dphil.core.protocols's names); `sizes_help` says what several sizes mean."""
    from dphil.core.protocols import CONFLICTS, DEADLOCK_MODES, PROTOCOLS, SCHEDULES

    return options(
        click.option(
            "-n", "--philosophers", "sizes", default="5", show_default=True, metavar="N[,N...]", help=sizes_help
        ),
        click.option(
            "--rounds",
            type=click.IntRange(min=1),
            default=5,
            show_default=True,
            help="Rounds per episode; every philosopher acts once per round.",
        ),
        click.option(
            "--protocol",
            type=click.Choice(list(PROTOCOLS)),
            default="paper",
            show_default=True,
            help="paper: the study's six tools. dpbench: DPBench's four actions.",
        ),
        click.option(
            "--schedule",
            type=click.Choice(SCHEDULES),
            default="simultaneous",
            show_default=True,
            help="simultaneous: all choose from one snapshot. sequential: one at a time.",
        ),
        click.option(
            "--conflict",
            type=click.Choice(CONFLICTS),
            default="random",
            show_default=True,
            help="Who gets a free fork two neighbours reach for in the same round.",
        ),
        click.option(
            "--deadlock",
            "deadlock_mode",
            type=click.Choice(DEADLOCK_MODES),
            default="terminal",
            show_default=True,
            help="terminal: a deadlock ends the episode. continue: play on.",
        ),
    )


def prompt_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """How a model agent is prompted: the built-in variant (dphil.agents.prompts), your own file, its memory."""
    from dphil.agents.prompts import BUILTIN_TEMPLATES

    return options(
        click.option(
            "--prompt",
            type=click.Choice(list(BUILTIN_TEMPLATES)),
            default="default",
            show_default=True,
            help="System prompt variant for models.",
        ),
        click.option(
            "--prompt-file",
            default=None,
            metavar="FILE",
            help="Your own system-prompt template ($seat, $n, $rules, $actions, $answer, ...).",
        ),
        click.option(
            "--memory",
            default="full",
            show_default=True,
            metavar="full|window:K|none",
            help="How much of its own past each model agent re-reads.",
        ),
    )(f)


def local_model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """How a local (transformers) model samples and where it runs."""
    return options(
        click.option(
            "--decode",
            type=click.Choice(["constrained", "free"]),
            default="constrained",
            show_default=True,
            help="Local (transformers) models: constrained samples among the protocol's replies; free "
            "generates text and parses it like an API reply.",
        ),
        click.option(
            "--temperature",
            type=click.FloatRange(min=0),
            default=1.0,
            show_default=True,
            help="Local models: sampling temperature (0 = greedy).",
        ),
        click.option(
            "--device",
            default="auto",
            show_default=True,
            help="Local (transformers) models: auto, cpu, cuda, cuda:1, ...",
        ),
        click.option(
            "--threads",
            type=click.IntRange(min=1),
            default=None,
            help="Local (transformers) models: CPU threads for torch [default: torch's choice]; 1 is fastest for tiny "
            "models on a busy machine.",
        ),
    )(f)


def max_new_tokens_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--max-new-tokens for dphil-rollout's local models (dphil-train declares its own)."""
    return click.option(
        "--max-new-tokens",
        type=click.IntRange(min=1),
        default=48,
        show_default=True,
        help="Local models, --decode free: most tokens generated per reply (a reply cut there is "
        "marked truncated); enters the episode id when not 48.",
    )(f)


def reward_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--reward/--shaped and one weight per reward term (dphil.scoring.reward.TERMS), passed on as `reward`.

    The command receives one `reward` argument, a `dphil.scoring.request.RewardRequest`
    (unchecked: the library checks it, once, when it makes the RewardSpec).
    """
    from dphil.scoring.reward import TERMS, VARIANTS

    names = ("variant", "shaped", *(t.weight for t in TERMS), "min_meals")

    @functools.wraps(f)
    def with_reward(*args: Any, **kwargs: Any) -> Any:
        from dphil.scoring.request import RewardRequest

        reward = RewardRequest(**{name: kwargs.pop(name) for name in names})
        return f(*args, reward=reward, **kwargs)

    weights = [
        click.option(
            f"--{t.weight}",
            type=float,
            default=t.default,
            show_default=True,
            help=f"Weight of {t.name}." if t.sign > 0 else f"Weight of the {t.name} penalty.",
        )
        for t in TERMS
    ]
    return options(
        click.option(
            "--reward", "variant", type=click.Choice(VARIANTS), default=None, help="Reward variant [default: paper]."
        ),
        click.option("--shaped", is_flag=True, help="Same as --reward shaped."),
        *weights,
        click.option(
            "--min-meals",
            type=click.IntRange(min=0),
            default=1,
            show_default=True,
            help="shaped: meals needed before no_deadlock pays.",
        ),
    )(with_reward)


def refuse_piped_stdin(prog: str, hint: str = "") -> None:
    """Exit 64 when records are piped into a command that reads no stdin (they would be lost)."""
    from dphil.io.console import stdin_has_data
    from dphil.io.errors import UsageError

    if stdin_has_data():
        raise UsageError(f"records are piped into stdin, but {prog} reads none{hint}")
