"""dphil-stats on hostile inputs: files read twice, lines over the cap, a million episodes, foreign versions.

Each test runs the installed command as a real process. Memory is the command's own peak
resident set (measured by a small launcher, `tests/support/memory.py`, so the test runner's
size does not count), asserted under a bound; nothing here is timed.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import tempfile
import threading
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from dphil.io.jsonl import MAX_LINE
from tests.support.commands import command_path, run
from tests.support.memory import measured, peak_mib

NAIVE, HIER = "scripted:naive", "scripted:hierarchy"
COMPARE = ["--compare", "model", NAIVE, HIER]


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> Path:
    """Both policies on the same 6 seeds (n = 3), scored: the arms pair by seed."""
    roll = run(["dphil-rollout", "-q", "-m", NAIVE, "-m", HIER, "-n", "3", "--episodes", "6"])
    assert roll.returncode == 0, roll.stderr
    score = run(["dphil-score", "-q"], input=roll.stdout)
    assert score.returncode == 0, score.stderr
    path = tmp_path_factory.mktemp("hostile") / "ep.jsonl"
    path.write_bytes(score.stdout)
    return path


def records(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def peak(args: list[str], feed: Iterable[bytes] = ()) -> tuple[subprocess.CompletedProcess, int]:
    """Run a command with `feed` streamed to its stdin; its result and its own peak RSS in MiB."""
    peak_file = Path(tempfile.mkdtemp()) / "peak_rss_kb"
    proc = subprocess.Popen(
        measured(peak_file, [command_path(args[0]), *args[1:]]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out: dict[str, bytes] = {}

    def write() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it stopped reading: what it said is in its stderr
            try:
                for block in feed:
                    proc.stdin.write(block)
            finally:
                proc.stdin.close()

    def drain(name: str, stream) -> None:
        out[name] = stream.read()

    threads = [
        threading.Thread(target=write),
        threading.Thread(target=drain, args=("out", proc.stdout)),
        threading.Thread(target=drain, args=("err", proc.stderr)),
    ]
    for t in threads:
        t.start()
    proc.wait()
    for t in threads:
        t.join(timeout=60)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out.get("out", b""), out.get("err", b""))
    return result, peak_mib(peak_file)  # the command's own peak, not the test runner's (tests/support/memory.py)


# -- item 2: an episode_id read twice -----------------------------------------------------


def test_a_file_read_twice_is_refused_naming_the_first_repeat(scored):
    data = scored.read_bytes()
    lines = data.count(b"\n")
    first_id = json.loads(data.splitlines()[0])["episode_id"]
    p = run(["dphil-stats", "-", *COMPARE], input=data + data)
    assert p.returncode == 65 and p.stdout == b""
    assert p.stderr.decode().strip() == (
        f"dphil-stats: <stdin>:{lines + 1}: episode {first_id} already read at <stdin>:1"
    )
    # Two files: the repeat names the other file's line.
    copy = scored.with_name("copy.jsonl")
    copy.write_bytes(data)
    p = run(["dphil-stats", str(scored), str(copy)])
    assert p.returncode == 65
    assert f"{copy}:1: episode {first_id} already read at {scored}:1" in p.stderr.decode()


def test_dedupe_first_counts_each_episode_once(scored):
    data = scored.read_bytes()
    once = run(["dphil-stats", str(scored), *COMPARE, "-q"])
    assert once.returncode == 0, once.stderr
    twice = run(["dphil-stats", "-", *COMPARE, "--dedupe", "first"], input=data + data)
    assert twice.returncode == 0, twice.stderr
    assert twice.stdout == once.stdout  # same n, intervals, p values; still paired
    comp = records(twice.stdout)[-1]
    assert comp["paired"] is True and comp["a"]["episodes"] == 6
    repeats = data.count(b"\n")
    assert f"dropped {repeats} repeated episode(s)" in twice.stderr.decode()


# -- item 3: pairing that cannot be done says so on stderr --------------------------------


def test_arms_that_cannot_be_paired_warn_on_stderr(scored):
    recs = records(scored.read_bytes())
    # A second run of the naive arm on the same seeds, under other ids: seeds repeat within an arm.
    again = [dict(r, episode_id=f"{k:016x}") for k, r in enumerate(recs) if r["model"] == NAIVE]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in recs + again)
    p = run(["dphil-stats", "-", *COMPARE], input=data)
    assert p.returncode == 0, p.stderr
    comp = records(p.stdout)[-1]
    assert comp["paired"] is False
    reason = "seeds repeat within an arm: episodes cannot be paired by seed"
    assert reason in comp["notes"]
    warned = [line for line in p.stderr.decode().splitlines() if reason in line]
    assert warned == [f"dphil-stats: --compare model {NAIVE} {HIER} (n=3): {reason}; unpaired tests only"]


def test_arms_without_shared_seeds_are_unpaired_without_a_warning(scored):
    recs = records(scored.read_bytes())
    for r in recs:
        if r["model"] == HIER:
            r["seed"] += 100
    p = run(["dphil-stats", "-", *COMPARE], input=b"".join(json.dumps(r).encode() + b"\n" for r in recs))
    assert p.returncode == 0 and records(p.stdout)[-1]["paired"] is False
    assert b"paired" not in p.stderr


# -- item 1: the line cap and memory bounded by the cells ---------------------------------


def _long_line_gz(megabytes: int, before: bytes, after: bytes) -> Iterator[bytes]:
    """A gzip stream (made as it is sent) of `before`, one line of `megabytes` MiB, `after`."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    yield z.compress(before + b'{"x": "')
    block = b"a" * (1 << 20)
    for _ in range(megabytes):
        yield z.compress(block)
    yield z.compress(b'"}\n' + after)
    yield z.flush()


def test_a_line_over_the_cap_is_refused_without_being_read_into_memory(scored):
    lines = scored.read_bytes().splitlines(keepends=True)
    size = 4 * (MAX_LINE >> 20)  # 256 MiB in one line, from a gzip stream of about 250 KB
    p, mib = peak(["dphil-stats", "-"], _long_line_gz(size, lines[0], b"".join(lines[1:])))
    assert p.returncode == 65, p.stderr
    assert p.stderr.decode().strip() == f"dphil-stats: <stdin>:2: line longer than {MAX_LINE >> 20} MiB"
    assert mib < 400, f"peak {mib} MiB: the line was read into memory (the cap is {MAX_LINE >> 20} MiB)"
    # Skipping it, the rest is summarised as if it were not there.
    p, mib = peak(["dphil-stats", "-", "--on-error", "skip"], _long_line_gz(size, lines[0], b"".join(lines[1:])))
    assert p.returncode == 0 and b"skipped 1 bad record(s)" in p.stderr
    assert p.stdout == run(["dphil-stats", str(scored), "-q"]).stdout
    assert mib < 400


def _million(template_lines: list[bytes], total: int) -> Iterator[bytes]:
    """`total` scored episodes made from a few real ones: new ids, and seed k for the k-th of each model."""
    templates = []
    for line in template_lines:
        rec = json.loads(line)
        text = line.replace(b"%", b"%%")
        text = text.replace(f'"episode_id":"{rec["episode_id"]}"'.encode(), b'"episode_id":"%016x"', 1)
        text = text.replace(f'"seed":{rec["seed"]}'.encode(), b'"seed":%d', 1)
        assert text.count(b"%016x") == 1 and text.count(b"%d") == 1
        templates.append(text)
    k = len(templates)
    batch = 20_000
    for start in range(0, total, batch):
        yield b"".join(templates[i % k] % (i, i // k) for i in range(start, min(total, start + batch)))


@pytest.mark.slow
def test_a_million_episodes_in_memory_bounded_by_the_cells():
    """1,000,000 episodes (about 800 MB) through stdin: the peak follows the cells and the
    compared arms' per-seed values, not the input (the whole-source reading took 3.4 GB)."""
    roll = run(["dphil-rollout", "-q", "-m", NAIVE, "-m", HIER, "-n", "2", "--rounds", "1", "--episodes", "1"])
    score = run(["dphil-score", "-q"], input=roll.stdout)
    assert score.returncode == 0, score.stderr
    total = 1_000_000
    p, mib = peak(["dphil-stats", "-", "--by", "model", *COMPARE], _million(score.stdout.splitlines(True), total))
    assert p.returncode == 0, p.stderr[-2000:]
    cells = {r["model"]: r for r in records(p.stdout) if r["kind"] == "cell"}
    assert {m: c["episodes"] for m, c in cells.items()} == {NAIVE: total // 2, HIER: total // 2}
    comp = records(p.stdout)[-1]
    assert comp["paired"] is True and comp["paired_tests"]["pairs"] == total // 2
    assert mib < 700, f"peak {mib} MiB for {total} episodes"


def test_memory_bound_holds_for_a_gzip_source_too(scored, tmp_path):
    """A gzip file is read in chunks like any other (it was decompressed whole into memory)."""
    lines = scored.read_bytes().splitlines(keepends=True)
    path = tmp_path / "many.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:
        for block in _million(lines, 100_000):
            fh.write(block)
    p, mib = peak(["dphil-stats", str(path), "-q"])
    assert p.returncode == 0, p.stderr
    assert sum(r["episodes"] for r in records(p.stdout)) == 100_000
    assert mib < 450, f"peak {mib} MiB"


# -- item 4: foreign schema versions and the numeric bounds --------------------------------


def _with(scored: Path, line: int, **changes) -> bytes:
    recs = records(scored.read_bytes())
    recs[line - 1].update(changes)
    return b"".join(json.dumps(r).encode() + b"\n" for r in recs)


@pytest.mark.parametrize("version", [99, "2", None, True, 2.0, 0, [2]])
def test_unknown_schema_versions_are_refused_with_the_line(scored, version):
    p = run(["dphil-stats", "-"], input=_with(scored, 3, schema_version=version))
    assert p.returncode == 65, p.stderr
    shown = json.dumps(version).replace(", ", ",")
    assert p.stderr.decode().strip() == (
        f"dphil-stats: <stdin>:3: unknown schema_version {shown}: this dphil reads versions 1 and 2 "
        "(a newer dphil, or another tool, wrote this record)"
    )


def test_known_and_absent_schema_versions_are_read(scored):
    want = run(["dphil-stats", str(scored), "-q"]).stdout
    assert run(["dphil-stats", "-", "-q"], input=_with(scored, 3, schema_version=1)).stdout == want
    recs = records(scored.read_bytes())
    del recs[2]["schema_version"]  # written by hand: read as the current version
    p = run(["dphil-stats", "-", "-q"], input=b"".join(json.dumps(r).encode() + b"\n" for r in recs))
    assert p.returncode == 0 and p.stdout == want


@pytest.mark.parametrize(
    "seed,reason",
    [
        (2**64, "field 'seed' should be an integer from -2**63 to 2**64-1, got 1.8446744073709552e+19"),
        (-(2**63) - 1, "field 'seed' should be an integer from -2**63 to 2**64-1"),
        (1.0, "field 'seed' should be an integer from -2**63 to 2**64-1, got 1.0"),
        ("3", "field 'seed' should be an integer from -2**63 to 2**64-1, got \"3\""),
    ],
)
def test_seeds_dphil_score_refuses_are_refused(scored, seed, reason):
    p = run(["dphil-stats", "-"], input=_with(scored, 2, seed=seed))
    assert p.returncode == 65
    assert p.stderr.decode().startswith(f"dphil-stats: <stdin>:2: {reason}")


def test_the_largest_seeds_are_read(scored):
    recs = records(scored.read_bytes())
    recs[0]["seed"], recs[1]["seed"] = 2**64 - 1, -(2**63)
    p = run(["dphil-stats", "-", "-q"], input=b"".join(json.dumps(r).encode() + b"\n" for r in recs))
    assert p.returncode == 0, p.stderr
    assert sum(r["episodes"] for r in records(p.stdout)) == len(recs)


@pytest.mark.parametrize("total", [1e308, -1e101, 1e200])
def test_totals_beyond_the_bound_are_refused(scored, total):
    recs = records(scored.read_bytes())
    recs[3]["reward"]["total"] = total
    p = run(["dphil-stats", "-"], input=b"".join(json.dumps(r).encode() + b"\n" for r in recs))
    assert p.returncode == 65
    assert p.stderr.decode().startswith("dphil-stats: <stdin>:4: field 'reward.total' is out of range")
    # Read line by line (the record lacks the field polars needs) the verdict is the same.
    del recs[3]["schema_version"]
    p = run(["dphil-stats", "-"], input=b"".join(json.dumps(r).encode() + b"\n" for r in recs))
    assert p.returncode == 65 and b"<stdin>:4: field 'reward.total' is out of range" in p.stderr
