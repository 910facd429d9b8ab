"""Running dphil-show: choosing the episodes of a stream and writing them as text, SVG or HTML.

A viewer at the end of a pipe may be handed a 100,000-episode file to look at
one episode: records are read one at a time, each episode kept becomes a
timeline and is written out at once, and reading stops as soon as what was
asked for has been shown. Nothing but the episode being drawn is held.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from dphil.io.atomic import atomic_file
from dphil.io.console import Console
from dphil.io.errors import EX_CANTCREAT, DataError, OutputError, UsageError
from dphil.io.jsonl import RecordReader
from dphil.show.svg import episode_svg
from dphil.show.timeline import Timeline, render_text, timeline
from dphil.show.viewer import EpisodePage, source_label

_ID_LENGTH = 16  # episode ids are 16 hex digits; anything shorter made of digits is an index


def is_index(spec: str) -> bool:
    """`--episode 3` is the fourth episode; `--episode ac4635de5885a65c` is that id."""
    return spec.isdigit() and len(spec) < _ID_LENGTH


@dataclass
class Picker:
    """Yield (record, timeline) for the episodes wanted, in the order they come.

    `wanted`: episode ids or 0-based indexes among the episode records of the
    input; empty means every episode, up to `limit` (None: no limit). Records
    that are not episodes, and episodes whose turns the table contradicts, go to
    `reject` (which warns and counts them) and are not counted as shown. After
    the iteration, `missing` lists the wanted specs never found and `more` says
    whether `limit` cut the stream short.
    """

    wanted: list[str] = field(default_factory=list)
    limit: int | None = None
    reject: Callable[[DataError], None] = lambda e: None
    missing: list[str] = field(default_factory=list)
    more: bool = False

    def __call__(self, records: Iterable[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], Timeline]]:
        indexes = {int(s): s for s in self.wanted if is_index(s)}
        ids = {s: s for s in self.wanted if not is_index(s)}
        pending = set(self.wanted)
        count = 0
        position = -1
        for record in records:
            kind = record.get("kind", "episode")
            if kind != "episode":
                self.reject(DataError(f"not an episode record (kind {kind!r}): skipped"))
                continue
            position += 1
            if self.wanted:
                spec = indexes.get(position) or ids.get(record.get("episode_id"))  # type: ignore[arg-type]
                if spec is None or spec not in pending:
                    continue
                pending.discard(spec)
            elif self.limit is not None and count >= self.limit:
                self.more = True
                break
            try:
                tl = timeline(record)
            except DataError as e:
                self.reject(DataError(f"episode {record.get('episode_id', position)}: {e.reason}: skipped"))
            else:
                count += 1
                yield record, tl
            if self.wanted and not pending:
                break
        self.missing = [s for s in self.wanted if s in pending]


@dataclass
class ShowRequest:
    """What `dphil-show` was asked for (see commands/show.py for the meaning of each option)."""

    inputs: list[str] = field(default_factory=list)
    fmt: str | None = None
    episodes: list[str] = field(default_factory=list)
    every: bool = False
    limit: int | None = 1000
    color: str = "auto"
    output: str | None = None


def output_format(fmt: str | None, output: str | None) -> str:
    """The format asked for, else the one -o's name implies, else text."""
    if fmt:
        return fmt
    if output:
        if output.endswith(("/", os.sep)) or os.path.isdir(output):
            return "svg"
        suffix = Path(output).suffix.lower()
        if suffix in (".svg", ".png"):
            return suffix[1:]
        if suffix in (".html", ".htm"):
            return "html"
    return "text"


def use_color(choice: str, output: str | None, stream: IO[str]) -> bool:
    if choice != "auto":
        return choice == "always"
    if output or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return _is_terminal(stream)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def show(req: ShowRequest, console: Console) -> int:
    """Run one dphil-show request; return the exit status (DataError, exit 65, when nothing was shown)."""
    fmt = output_format(req.fmt, req.output)
    to_dir = (
        fmt == "svg" and req.output is not None and (req.output.endswith(("/", os.sep)) or os.path.isdir(req.output))
    )
    if req.every and req.episodes:
        raise UsageError("--all and --episode contradict each other")
    if fmt == "svg" and not to_dir and (req.every or len(req.episodes) > 1):
        raise UsageError("one SVG holds one episode: give -o DIR/ for several")
    if req.every and fmt != "text":
        raise UsageError(f"--all is for text: {fmt} with -o DIR/ or html shows every episode already")
    if fmt != "text" and req.output in (None, "-") and _is_terminal(sys.stdout):
        raise UsageError(f"not writing {fmt} to a terminal: give -o FILE or pipe it")
    many = req.every or fmt == "html" or to_dir
    reader = RecordReader(req.inputs, on_error="skip", warn=console.warn)
    records = iter(reader)
    first = next(records, None)
    if first is not None and first.get("kind") == "checkpoint" and fmt in ("svg", "png"):
        return _show_curve(req, to_dir, reader, first, records, console)
    if fmt == "png":
        raise UsageError(
            "png draws a training curve from checkpoint records (dphil-train or "
            "dphil-ckpt-select output); episodes are text, svg or html"
        )
    picker = Picker(list(req.episodes), limit=req.limit if many else 1, reject=reader.reject)
    chosen = picker(itertools.chain(() if first is None else (first,), records))
    try:
        if to_dir:
            _svg_dir(chosen, Path(req.output), picker)  # type: ignore[arg-type]
        else:
            color = fmt == "text" and use_color(req.color, req.output, sys.stdout)
            source = source_label(reader.sources)
            _to_output(req.output, lambda out: _write(fmt, chosen, out, picker, color, source))
    finally:
        if picker.more and many:
            console.warn(f"showed the first {req.limit} episodes; --limit 0 shows them all")
        if reader.skipped:
            console.error(f"skipped {reader.skipped} record(s)")
    if req.output not in (None, "-"):
        console.report(f"wrote {fmt} to {req.output}")
    return 0


def _show_curve(
    req: ShowRequest,
    to_dir: bool,
    reader: RecordReader,
    first: dict[str, Any],
    rest: Iterator[dict[str, Any]],
    console: Console,
) -> int:
    """Checkpoint records first, and a picture asked for: the run's training curve, one SVG or PNG.

    Records with a `selection` (dphil-ckpt-select output, e.g. a second input)
    mark the chosen step; records of other kinds are skipped with a warning.
    (Text and html show episodes, skipping checkpoint records like any other.)
    """
    fmt = output_format(req.fmt, req.output)
    if to_dir:
        raise UsageError("checkpoint records are drawn as one training curve: -o FILE.svg or FILE.png")
    if req.episodes or req.every:
        raise UsageError("--episode and --all pick episodes; checkpoint records make one curve")
    if fmt == "png" and req.output in (None, "-") and sys.stdout.isatty():
        raise UsageError("a PNG is not for a terminal: give -o FILE.png or redirect stdout")
    from dphil.checkpoints.curve import curve_image, run_curve

    def located() -> Iterator[tuple[str, int, dict[str, Any]]]:
        yield reader.source, reader.line, first
        for record in rest:
            if record.get("kind") != "checkpoint":
                reader.reject(DataError(f"not a checkpoint record (kind {record.get('kind', 'episode')!r}): skipped"))
                continue
            yield reader.source, reader.line, record

    try:
        image = curve_image(run_curve(located()), fmt)
        _to_output(req.output, lambda out: out.write(image))
    finally:
        if reader.skipped:
            console.error(f"skipped {reader.skipped} record(s)")
    return 0


def _finish(shown: int, picker: Picker) -> None:
    """Raise the data error that ends a run which missed a wanted episode or showed nothing.

    Called inside the output's `with`, so -o FILE is not published when it raises.
    """
    if picker.missing:
        names = ", ".join(picker.missing)
        raise DataError(f"no episode {names} in the input (an INDEX counts episode records from 0)")
    if not shown:
        raise DataError("no episode to show")


@contextlib.contextmanager
def _created(path: str) -> Iterator[IO[bytes]]:
    """atomic_file, with a target that cannot be created reported as exit 73."""
    with contextlib.ExitStack() as stack:
        try:
            fh = stack.enter_context(atomic_file(path))
        except OutputError as e:
            raise OutputError(e.message, exit_code=EX_CANTCREAT) from None
        yield fh


def _to_output(path: str | None, write: Callable[[IO[bytes]], object]) -> None:
    """Run `write` on -o FILE (published only if it succeeds) or on stdout."""
    if path is None or path == "-":
        out = sys.stdout.buffer
        try:
            write(out)
        finally:
            out.flush()
        return
    with _created(path) as fh:
        write(fh)


def _write(
    fmt: str,
    chosen: Iterable[tuple[dict[str, Any], Timeline]],
    out: IO[bytes],
    picker: Picker,
    color: bool,
    source: str,
) -> None:
    """Stream the chosen episodes to one output in one format."""
    shown = 0
    if fmt == "html":
        page = EpisodePage(out, source=source)
        for record, tl in chosen:
            page.add(record, tl)
            shown += 1
        _finish(shown, picker)
        more = f"Showing the first {shown} episodes; dphil-show --limit 0 shows them all." if picker.more else None
        page.close(more)
        return
    for record, tl in chosen:
        if fmt == "svg":
            out.write(episode_svg(record, tl=tl).encode() + b"\n")
        else:
            out.write((("\n" if shown else "") + render_text(record, color, legend=shown == 0, tl=tl)).encode())
        out.flush()  # each episode as soon as it is drawn: `| head` and `| less` see it at once
        shown += 1
    _finish(shown, picker)


def _svg_dir(chosen: Iterable[tuple[dict[str, Any], Timeline]], target: Path, picker: Picker) -> None:
    """One DIR/<episode_id>.svg per episode, each written atomically."""
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{target}: cannot create directory: {e.strerror}", exit_code=EX_CANTCREAT) from None
    shown = 0
    used: dict[str, int] = {}
    for record, tl in chosen:
        name = _file_name(record.get("episode_id"), shown)
        used[name] = used.get(name, 0) + 1
        if used[name] > 1:  # the same episode twice (concatenated files): keep both
            name = f"{name}-{used[name]}"
        with _created(str(target / f"{name}.svg")) as fh:
            fh.write(episode_svg(record, tl=tl).encode() + b"\n")
        shown += 1
    _finish(shown, picker)


def _file_name(episode_id: Any, position: int) -> str:
    text = str(episode_id) if episode_id is not None else f"episode-{position}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in text).lstrip(".")
    return safe or f"episode-{position}"
