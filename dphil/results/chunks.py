"""A byte stream as chunks of whole lines, each with the number of its first line.

dphil-stats parses a chunk at a time (`dphil.results.frame`), so what it holds follows the
chunk size, not the input: a line too long for any record is named and read past without
being kept, and a stream that breaks off (a truncated gzip) yields its whole lines first.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import IO

from dphil.io.errors import DataError
from dphil.io.jsonl import MAX_LINE

CHUNK_BYTES = 8 << 20  # the whole lines parsed at once: 8 MiB
_BLOCK = 1 << 20  # read at a time
_BOM = b"\xef\xbb\xbf"


def line_chunks(stream: IO[bytes], name: str, bad: Callable[[DataError], None]) -> Iterator[tuple[int, bytes]]:
    """Whole lines of `stream` in chunks of about CHUNK_BYTES, each with the number of its first line.

    A line longer than MAX_LINE goes to `bad` (located) and is read on to its end without
    being kept: no more than MAX_LINE + _BLOCK bytes of it are ever held. So does a stream
    that cannot be read on (a truncated gzip), after the whole lines before it.
    """
    read = getattr(stream, "read1", stream.read)
    line = 1  # the number of the first line in `whole`
    whole: list[bytes] = []  # whole lines read and not yet handed out
    size = 0
    tail: list[bytes] = []  # the start of the line being read
    tail_size = 0
    skipping = False  # inside a line too long to keep
    start = True
    while True:
        try:
            block = read(_BLOCK)
        except (OSError, EOFError, zlib.error) as e:
            if whole:
                yield line, b"".join(whole)
            bad(DataError(f"cannot read: {e}", source=name, line=line + sum(c.count(b"\n") for c in whole)))
            return
        if start and block:
            start = False
            while len(block) < 3 and block == _BOM[: len(block)]:  # a byte-order mark cut short
                more = read(3 - len(block))
                if not more:
                    break
                block += more
            if block.startswith(_BOM):
                block = block[3:]
        if not block:
            break
        if skipping:
            end = block.find(b"\n")
            if end < 0:
                continue
            skipping = False
            line += 1
            block = block[end + 1 :]
        end = block.find(b"\n")
        if end < 0:
            if block:
                tail.append(block)
                tail_size += len(block)
            if tail_size > MAX_LINE:
                if whole:
                    yield line, b"".join(whole)
                    line += sum(c.count(b"\n") for c in whole)
                    whole, size = [], 0
                tail, tail_size, skipping = [], 0, True
                bad(DataError(_too_long(), source=name, line=line))
            continue
        if tail_size + end + 1 > MAX_LINE:  # the line being read ends here, too long
            if whole:
                yield line, b"".join(whole)
                line += sum(c.count(b"\n") for c in whole)
                whole, size = [], 0
            bad(DataError(_too_long(), source=name, line=line))
            line += 1
        else:
            whole.extend(tail)
            whole.append(block[: end + 1])
            size += tail_size + end + 1
        last = block.rfind(b"\n")
        if last > end:
            whole.append(block[end + 1 : last + 1])
            size += last - end
        tail = [block[last + 1 :]] if last + 1 < len(block) else []
        tail_size = len(block) - last - 1
        if size >= CHUNK_BYTES:
            data = b"".join(whole)
            yield line, data
            line += data.count(b"\n")
            whole, size = [], 0
    if tail and not skipping:
        whole.extend(tail)
    if whole:
        yield line, b"".join(whole)


def _too_long() -> str:
    return f"line longer than {MAX_LINE >> 20} MiB" if MAX_LINE >= 1 << 20 else f"line longer than {MAX_LINE} bytes"
