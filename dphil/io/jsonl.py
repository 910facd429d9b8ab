"""Reading and writing JSONL records the way every dphil command does.

Reading: files or `-` (stdin), plain or gzip (detected by magic bytes, so a
gzipped stream on stdin works too). Every problem is a DataError naming the
source and line. Blank lines and a leading byte-order mark are skipped; a last
line without its newline that does not parse is reported as truncated (an
interrupted writer), not as a generic syntax error; NaN and Infinity are not
JSON and are refused; lines over MAX_LINE bytes are refused without reading
them into memory whole.

Writing: whole lines only. Lines are buffered and written with os.write at
line boundaries, so a signal can never leave half a line behind; stdout is
flushed at least every FLUSH_SECONDS so records stream through pipes. `-o FILE`
goes to a temporary file in the same directory that is renamed over FILE only
when the command succeeds; `append` mode (resumable rollouts) appends whole
lines to FILE in place.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, cast

import orjson

from dphil.io.atomic import discard, is_disk_full, is_special, make_parents, publish, temp_beside
from dphil.io.errors import DataError, NoInputError, OutputError
from dphil.io.held_signals import HeldSignals

MAX_LINE = 64 * 1024 * 1024
FLUSH_SECONDS = 0.1
_BUFFER_BYTES = 1 << 16
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


def open_input(source: str, stdin: IO[bytes] | None = None) -> IO[bytes]:
    """Open a path or `-` for binary reading, unwrapping gzip by its magic bytes."""
    if source == "-":
        raw = stdin if stdin is not None else sys.stdin.buffer
        # Any binary stream with readinto() will do; typeshed's BufferedReader asks for a RawIOBase.
        stream: io.BufferedReader = (
            raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast(io.RawIOBase, raw))
        )
    else:
        try:
            stream = open(source, "rb")  # noqa: SIM115 - closed by the reader
        except FileNotFoundError:
            raise NoInputError(f"{source}: no such file") from None
        except IsADirectoryError:
            raise NoInputError(f"{source}: is a directory") from None
        except PermissionError:
            raise NoInputError(f"{source}: permission denied") from None
        except OSError as e:
            raise NoInputError(f"{source}: {e.strerror}") from None
    try:
        head = stream.peek(2)[:2]
    except (AttributeError, io.UnsupportedOperation):
        head = b""
    if head == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    return stream


def check_sources(sources: Iterable[str]) -> None:
    """Fail now, with the reader's own message, if a named input cannot be opened: before a
    command spends seconds importing polars or scipy to read it."""
    for source in sources:
        if source == "-":
            continue
        try:
            mode = os.stat(source).st_mode
        except FileNotFoundError:
            raise NoInputError(f"{source}: no such file") from None
        except OSError as e:
            raise NoInputError(f"{source}: {e.strerror}") from None
        if stat.S_ISDIR(mode):
            raise NoInputError(f"{source}: is a directory")
        if stat.S_ISREG(mode):  # a FIFO is not opened here: its writer would lose what it wrote
            open_input(source).close()


def source_name(source: str) -> str:
    return "<stdin>" if source == "-" else source


class RecordReader:
    """Iterate JSON objects from several sources, knowing where each came from.

    With `on_error="skip"`, malformed lines (and records a command rejects via
    `reject`) are counted in `skipped` instead of stopping the run. While a
    record is being handled, `source`, `line` and `raw` (its line's bytes,
    byte-order mark removed) say where it came from. `name` and `first_line`
    locate a piece of a larger input (dphil-stats reads its sources in chunks):
    lines are then named `name:first_line`, `name:first_line + 1`, ...
    """

    def __init__(
        self,
        sources: list[str] | tuple[str, ...],
        *,
        on_error: str = "fail",
        stdin: IO[bytes] | None = None,
        warn=None,
        name: str | None = None,
        first_line: int = 1,
    ) -> None:
        self.sources = list(sources) or ["-"]
        self._name = name
        self._first_line = first_line
        self.on_error = on_error
        self.stdin = stdin
        self.skipped = 0
        self.source = ""
        self.line = 0
        self.raw = b""
        self._warn = warn

    def __iter__(self) -> Iterator[dict[str, Any]]:
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        for src in self.sources:
            self.source = self._name or source_name(src)
            stream = open_input(src, self.stdin)
            try:
                readline = stream.readline
                lineno = self._first_line - 1
                while True:
                    try:
                        line = readline(MAX_LINE + 1)
                    except (OSError, EOFError, gzip.BadGzipFile) as e:
                        self.line = lineno + 1
                        self._fail(DataError(f"cannot read: {e}"))
                        break
                    if not line:
                        break
                    lineno += 1
                    self.line = lineno
                    if lineno == 1 and line.startswith(_BOM):
                        line = line[3:]
                    if len(line) > MAX_LINE:
                        self._skip_rest(readline, line)
                        self._fail(DataError(f"line longer than {_size(MAX_LINE)}"))
                        continue
                    try:
                        record = loads(line)
                    except decode_error as e:
                        if not line.strip():
                            continue
                        self._fail(DataError(_json_problem(line, e)))
                        continue
                    if type(record) is not dict:
                        self._fail(DataError(f"expected a JSON object, got {_json_type(record)}"))
                        continue
                    self.raw = line
                    yield record
            finally:
                if src != "-":
                    stream.close()

    def reject(self, error: DataError) -> None:
        """Report a record the command cannot use: raise it located, or count it when skipping."""
        self._fail(error)

    def _fail(self, error: DataError) -> None:
        located = error.at(self.source, self.line)
        if self.on_error != "skip":
            raise located
        self.skipped += 1
        if self._warn is not None:
            self._warn(located.message)

    @staticmethod
    def _skip_rest(readline, line: bytes) -> None:
        while line and not line.endswith(b"\n"):
            line = readline(_BUFFER_BYTES)


def _json_problem(line: bytes, error: Exception) -> str:
    if not line.endswith(b"\n"):
        return "truncated last line (no newline at the end: was the writer interrupted?)"
    for word in (b"NaN", b"Infinity"):
        if word in line:
            return f"invalid JSON: {word.decode()} is not a JSON number"
    msg = str(error).split(": line", 1)[0]
    return f"invalid JSON: {msg}"


def _json_type(value: Any) -> str:
    return {
        list: "an array",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):g} MiB"
    return f"{nbytes} bytes"


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def dumps(record: dict[str, Any]) -> bytes:
    """One record as one JSON line (with its newline)."""
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


class RecordWriter:
    """Write whole JSON lines to stdout or a file.

    mode `atomic` (the default for `-o FILE`): write to a temporary file next to
    FILE and rename it over FILE in `close(success=True)`; on failure FILE is left
    as it was. mode `append`: append whole lines to FILE and fsync on close, for
    journals that a later run resumes. `line_buffered` writes every line through
    at once (slow episodes from models); otherwise lines are batched, and stdout
    is flushed at the first write FLUSH_SECONDS after the last flush.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        mode: str = "atomic",
        stdout_fd: int | None = None,
        line_buffered: bool = False,
    ) -> None:
        self.path = path
        self.line_buffered = line_buffered
        self.mode = mode
        self.count = 0
        self._chunks: list[bytes] = []
        self._size = 0
        self._last_flush = time.monotonic()
        self._tmp: str | None = None
        self._closed = False
        self.broken_pipe = False
        if path is None or path == "-":
            self.path = None
            self._stream = True
            self._fd = stdout_fd if stdout_fd is not None else _fileno(sys.stdout)
            if self._fd is None:  # stdout replaced by an in-memory stream (tests, notebooks)
                self._buffer = cast(IO[bytes], getattr(sys.stdout, "buffer", sys.stdout))
            return
        self._stream = False
        self._sync = not is_special(path)  # a device or FIFO is written in place and not fsynced
        try:
            if not self._sync:
                self._fd = os.open(path, os.O_WRONLY)
            elif mode == "append":
                make_parents(path)
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            else:
                self._fd, self._tmp = temp_beside(path)
        except OSError as e:
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None

    def write(self, record: dict[str, Any]) -> None:
        self.write_line(dumps(record))

    def write_line(self, line: bytes) -> None:
        self._chunks.append(line)
        self._size += len(line)
        self.count += 1
        if (
            self.line_buffered
            or self._size >= _BUFFER_BYTES
            or (self._stream and time.monotonic() - self._last_flush >= FLUSH_SECONDS)
        ):
            self.flush()

    def flush(self) -> None:
        if not self._chunks:
            return
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        self._last_flush = time.monotonic()
        view = memoryview(data)
        try:
            if self._fd is None:
                self._buffer.write(data)
                self._buffer.flush()
                return
            # Ctrl-C or SIGTERM while a full pipe holds a write part-done: finish the line it is
            # in, then stop (a second signal stops at once), so no reader sees half a line.
            done, end = 0, len(data)
            with HeldSignals() as held:
                while done < end:
                    if held.pending is not None:
                        if done == 0 or data[done - 1] == 0x0A:
                            break
                        end = data.index(b"\n", done) + 1
                    done += os.write(self._fd, view[done:end])
        except BrokenPipeError:
            self.broken_pipe = True
            raise
        except OSError as e:
            raise OutputError(f"{self.path or '<stdout>'}: write failed: {e.strerror}") from None

    def close(self, success: bool = True) -> None:
        """Flush and finish: rename the temporary file into place only if `success`."""
        if self._closed:
            return
        self._closed = True
        try:
            if success:
                try:
                    self.flush()
                except BaseException:
                    success = False  # a full disk at the last flush: the target keeps its old contents
                    raise
            elif self.mode == "append" or self._stream:
                # Whole lines are still worth keeping in a journal or a pipe.
                with contextlib.suppress(OSError):
                    self.flush()
        finally:
            if not self._stream:
                assert self._fd is not None  # a file was opened in __init__
                try:
                    try:
                        if self._sync and (success or self.mode == "append"):
                            os.fsync(self._fd)
                    finally:
                        os.close(self._fd)
                except OSError as e:  # a disk that filled up shows at fsync or close on some file systems
                    if not is_disk_full(e):
                        raise
                    if self._tmp is not None:
                        discard(self._tmp)
                        self._tmp = None
                    raise OutputError(f"{self.path}: write failed: {e.strerror}") from None
                if self._tmp is not None:
                    if success:
                        assert self.path is not None  # a temporary file stands in for a path
                        publish(self._tmp, self.path)
                    else:
                        discard(self._tmp)

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(success=exc_type is None)
