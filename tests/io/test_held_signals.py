"""Signals held back while a write is part-done, and the writer that stops at a line's end."""

import os
import signal
import threading
import time

import pytest

from dphil.io.held_signals import HeldSignals
from dphil.io.jsonl import RecordWriter


def test_the_first_signal_waits_for_the_end_of_the_block():
    reached_end = False
    with pytest.raises(KeyboardInterrupt), HeldSignals() as held:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler has run by now: it only noted the signal
        assert held.pending == signal.SIGINT
        reached_end = True
    assert reached_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_signal_stops_at_once():
    after_second = False
    with pytest.raises(KeyboardInterrupt), HeldSignals():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        after_second = True
    assert not after_second


def test_sigterm_goes_through_the_handler_that_was_in_place():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with HeldSignals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            assert seen == []
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with HeldSignals() as held:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        assert held.pending is None
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_writer_stopped_mid_line_on_a_full_pipe_finishes_that_line():
    """One 4 MiB write into a 64 KiB pipe read slowly; Ctrl-C lands while it is part-done."""
    read_fd, write_fd = os.pipe()
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(read_fd, 4096):
            got.extend(chunk)
            time.sleep(0.0005)

    reader = threading.Thread(target=drain)
    reader.start()
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    line = b'{"k":"' + b"x" * (1 << 20) + b'"}\n'  # a megabyte a line, so the signal lands mid-line
    writer = RecordWriter(None, stdout_fd=write_fd)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            for _ in range(4):
                writer.write_line(line)
            writer.flush()
            time.sleep(5)  # not reached when the signal arrived during the write
    finally:
        os.close(write_fd)
        reader.join()
        os.close(read_fd)
    assert 0 < len(got) < 4 * len(line)
    assert got.endswith(b"\n") and len(got) % len(line) == 0
