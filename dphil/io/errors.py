"""Errors that carry a sysexits code, so every command exits the same way.

The library raises these; the command layer turns them into one stderr line
and the matching exit status. Nothing here knows about click.
"""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    """Every status a dphil command exits with: sysexits.h codes, and the signal ones.

    The one list: docs/commands.md's exit-code table is checked against it.
    """

    OK = 0
    USAGE = 64  # the options make no sense (a usage error)
    DATAERR = 65  # a record, file or reply is malformed or inconsistent
    NOINPUT = 66  # an input file or directory does not exist or cannot be read
    UNAVAILABLE = 69  # a service (model server, provider) cannot be reached, or gave up
    SOFTWARE = 70  # a bug in dphil: please report it
    CANTCREAT = 73  # an output cannot be created (or is locked by another run)
    IOERR = 74  # writing failed (disk full, a closed device)
    TEMPFAIL = 75  # try again later: some episodes ended in errors, rerun with --resume
    CONFIG = 78  # a registry, prompt or configuration file is wrong
    INTERRUPTED = 130  # Ctrl-C (SIGINT)
    TERMINATED = 143  # SIGTERM (128 + 15)


# The names the library raises with (sysexits.h spelling).
EX_OK = ExitStatus.OK
EX_USAGE = ExitStatus.USAGE
EX_DATAERR = ExitStatus.DATAERR
EX_NOINPUT = ExitStatus.NOINPUT
EX_UNAVAILABLE = ExitStatus.UNAVAILABLE
EX_SOFTWARE = ExitStatus.SOFTWARE
EX_CANTCREAT = ExitStatus.CANTCREAT
EX_IOERR = ExitStatus.IOERR
EX_TEMPFAIL = ExitStatus.TEMPFAIL
EX_CONFIG = ExitStatus.CONFIG
EX_INTERRUPTED = ExitStatus.INTERRUPTED


class DphilError(Exception):
    """Base error: a message for the user and the exit status to leave with."""

    exit_code: int = EX_SOFTWARE  # an ExitStatus, or any status a caller passes

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class UsageError(DphilError):
    """The options make no sense together (exit 64)."""

    exit_code = EX_USAGE


class DataError(DphilError):
    """A record is malformed or inconsistent (exit 65).

    `source` and `line` locate the record so the message reads
    ``ep.jsonl:17: missing field 'turns'``.
    """

    exit_code = EX_DATAERR

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None) -> None:
        self.reason = message
        self.source = source
        self.line = line
        super().__init__(_locate(message, source, line))

    def at(self, source: str, line: int) -> DataError:
        """Return the same error located at `source:line`."""
        return DataError(self.reason, source=source, line=line)


class NoInputError(DphilError):
    """An input file or directory does not exist or cannot be opened (exit 66)."""

    exit_code = EX_NOINPUT


class OutputError(DphilError):
    """Writing the output failed (exit 74)."""

    exit_code = EX_IOERR


class ConfigError(DphilError):
    """A registry or configuration file is wrong (exit 78)."""

    exit_code = EX_CONFIG


class MissingExtraError(DphilError):
    """An optional dependency is needed for this run (exit 69) and says what to install."""

    exit_code = EX_UNAVAILABLE


def _locate(message: str, source: str | None, line: int | None) -> str:
    if source is None:
        return message
    if line is None:
        return f"{source}: {message}"
    return f"{source}:{line}: {message}"
