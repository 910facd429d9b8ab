"""dphil-show as a real process: the text grid (golden), SVG marks, bad input, pipes, big files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dphil.show.timeline import STATES, render_text, timeline
from tests.support import episodes
from tests.support.commands import ROOT, command_path, run

GOLDEN = ROOT / "tests" / "golden" / "show.txt"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    return episodes.scripted(tmp_path_factory.mktemp("show") / "scripted.jsonl")


def records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def marks(svg_text: str) -> list[ET.Element]:
    root = ET.fromstring(svg_text)
    assert root.tag == f"{SVG}svg"
    return [g for g in root.iter(f"{SVG}g") if "mark" in g.get("class", "").split()]


def test_text_matches_the_golden_file(scripted):
    p = run(["dphil-show", "--all", str(scripted)])
    assert p.returncode == 0, p.stderr
    assert p.stderr == b""
    text = p.stdout.decode()
    if os.environ.get("DPHIL_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "run with DPHIL_UPDATE_GOLDEN=1 after a deliberate change"
    assert "\x1b[" not in text  # piped: plain


def test_the_grid_is_what_the_table_did(scripted):
    recs = records(scripted)
    greedy = timeline(recs[1])  # scripted:greedy seed 1: philosopher 3 eats three times
    assert [c.state for c in greedy.cells[3]] == ["right", "both", "eating", "eating", "eating"]
    assert greedy.meals[3] == 3 and not greedy.deadlock_rounds
    naive = timeline(recs[2])
    assert naive.deadlock_rounds == (1,) and naive.rounds_played == 1
    assert all(row[0].state == "left" for row in naive.cells)
    idle = timeline(recs[4])
    assert all(c.null and not c.failed for row in idle.cells for c in row)
    dpbench = timeline(recs[5])  # auto-eat events are meals: every eating cell is one
    assert sum(c.state == "eating" for row in dpbench.cells for c in row) == sum(recs[5]["meals"])


def test_colour_only_when_asked_or_on_a_terminal(scripted):
    piped = run(["dphil-show", str(scripted)]).stdout.decode()
    coloured = run(["dphil-show", "--color", "always", str(scripted)]).stdout.decode()
    assert "\x1b[" not in piped and "\x1b[" in coloured
    assert render_text(records(scripted)[0], False) == piped
    no_color = run(["dphil-show", "--color", "auto", str(scripted)], env={**os.environ, "NO_COLOR": "1"})
    assert "\x1b[" not in no_color.stdout.decode()


def on_a_terminal(args: list[str]) -> tuple[int, bytes, bytes]:
    """Run a command with stdout on a pseudo-terminal: (exit status, what the terminal got, stderr)."""
    import pty

    leader, follower = pty.openpty()
    try:
        p = subprocess.run([command_path(args[0]), *args[1:]], stdout=follower, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(follower)
    out = b""
    try:
        while chunk := os.read(leader, 65536):
            out += chunk
    except OSError:  # EIO: the terminal's other side is closed and drained
        pass
    finally:
        os.close(leader)
    return p.returncode, out, p.stderr


def test_colour_on_a_terminal(scripted):
    code, out, err = on_a_terminal(["dphil-show", str(scripted)])
    assert code == 0, err
    assert b"\x1b[1;32m" in out or b"\x1b[36m" in out


def test_pictures_are_not_written_to_a_terminal(scripted):
    for fmt in ("svg", "html"):
        code, out, err = on_a_terminal(["dphil-show", "-f", fmt, str(scripted)])
        assert code == 64 and b"not writing " + fmt.encode() + b" to a terminal" in err
        assert b"<svg" not in out


def test_episode_by_index_and_by_id(scripted):
    recs = records(scripted)
    by_index = run(["dphil-show", "-e", "3", str(scripted)]).stdout.decode()
    assert by_index.startswith(f"episode {recs[3]['episode_id']} ")
    both = run(["dphil-show", "-e", recs[5]["episode_id"], "-e", "0", str(scripted)])
    assert both.returncode == 0
    heads = [line.split()[1] for line in both.stdout.decode().splitlines() if line.startswith("episode ")]
    assert heads == [recs[0]["episode_id"], recs[5]["episode_id"]]  # input order


def test_svg_has_one_mark_per_philosopher_and_round(scripted):
    for k, rec in enumerate(records(scripted)):
        p = run(["dphil-show", "-f", "svg", "-e", str(k), str(scripted)])
        assert p.returncode == 0, p.stderr
        found = marks(p.stdout.decode())
        cells = {(int(g.get("data-p")), int(g.get("data-r"))) for g in found}
        assert len(found) == len(cells) == rec["n"] * rec["rounds_played"]
        assert cells == {(i, r) for i in range(rec["n"]) for r in range(1, rec["rounds_played"] + 1)}
        assert {g.get("data-state") for g in found} <= set(STATES)
        for g in found:  # each mark names its turn, and the turn is that philosopher's in that round
            turn = rec["turns"][int(g.get("data-t"))]
            assert (turn["philosopher"], turn["round"]) == (int(g.get("data-p")), int(g.get("data-r")))
            assert g.find(f"{SVG}title") is not None


def test_svg_to_a_directory_writes_one_file_per_episode(scripted, tmp_path):
    out = tmp_path / "pictures"
    p = run(["dphil-show", str(scripted), "-o", f"{out}/"])
    assert p.returncode == 0, p.stderr
    files = sorted(out.iterdir())
    assert sorted(f.stem for f in files) == sorted(r["episode_id"] for r in records(scripted))
    for f in files:
        assert marks(f.read_text())
    assert not list(out.glob(".*"))  # no temporary files left behind


def test_svg_to_stdout_takes_one_episode(scripted):
    p = run(["dphil-show", "-f", "svg", "-e", "0", "-e", "1", str(scripted)])
    assert p.returncode == 64 and b"-o DIR/" in p.stderr


def test_html_is_one_self_contained_page(scripted, tmp_path):
    page = tmp_path / "episodes.html"
    p = run(["dphil-show", str(scripted), "-o", str(page)])  # the format follows the suffix
    assert p.returncode == 0, p.stderr
    html = page.read_text()
    assert html.count('<section class="episode"') == len(records(scripted))
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html and "<link" not in html and " src=" not in html


def test_model_turns_are_escaped_in_the_page(tmp_path):
    path = episodes.model_run(tmp_path)
    page = tmp_path / "model.html"
    p = run(["dphil-show", str(path), "-o", str(page)])
    assert p.returncode == 0, p.stderr
    html = page.read_text()
    assert "window.pwned" in html  # the reply is there, as data
    assert html.count("<script") == 1 + html.count('<script type="application/json"')
    assert "<img" not in html
    errored = next(r for r in records(path) if r["status"] == "error")
    tl = timeline(errored)
    assert any(c.missing for row in tl.cells for c in row)  # the round the error cut short
    text = run(["dphil-show", "-e", errored["episode_id"], str(path)]).stdout.decode()
    assert "error: " in text and "-" in text


def test_every_sample_renders_in_every_format(tmp_path):
    for sample in sorted((ROOT / "samples").glob("*.jsonl")):
        n = len(sample.read_text().splitlines())
        text = run(["dphil-show", "--all", str(sample)])
        assert text.returncode == 0 and text.stderr == b"", (sample.name, text.stderr)
        assert text.stdout.decode().count("\nepisode ") + 1 == n
        svg = run(["dphil-show", "-f", "svg", str(sample)])
        assert svg.returncode == 0 and marks(svg.stdout.decode()), sample.name
        page = tmp_path / f"{sample.stem}.html"
        html = run(["dphil-show", "-f", "html", "-o", str(page), str(sample)])
        assert html.returncode == 0 and page.read_text().count('<section class="episode"') == n, sample.name


def test_records_that_are_not_episodes_are_skipped_with_their_line(scripted, tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    lines = scripted.read_text().splitlines()
    mixed.write_text(
        "\n".join(
            [
                json.dumps({"kind": "checkpoint", "run": "r", "step": 1}),
                lines[0],
                "not json",
                json.dumps({"kind": "cell", "model": "m"}),
            ]
        )
        + "\n"
    )
    p = run(["dphil-show", "--all", str(mixed)])
    assert p.returncode == 0
    err = p.stderr.decode()
    assert f"{mixed}:1: not an episode record (kind 'checkpoint')" in err
    assert f"{mixed}:3: invalid JSON" in err and f"{mixed}:4:" in err
    assert "skipped 3 record(s)" in err
    assert p.stdout.decode().count("episode ") == 1
    only = tmp_path / "only.jsonl"
    only.write_text(json.dumps({"kind": "cell"}) + "\n")
    p = run(["dphil-show", str(only)])
    assert p.returncode == 65 and b"no episode to show" in p.stderr and p.stdout == b""
    empty = run(["dphil-show"], input=b"")
    assert empty.returncode == 65


def test_a_record_the_table_contradicts_is_skipped(scripted, tmp_path):
    rec = records(scripted)[2]  # naive: everyone takes a free left fork, no conflict
    rec["turns"][0]["ok"] = False
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec) + "\n" + scripted.read_text().splitlines()[0] + "\n")
    p = run(["dphil-show", "--all", str(bad)])
    assert p.returncode == 0
    assert f"{bad}:1: episode {rec['episode_id']}: turns[0] disagrees with the table" in p.stderr.decode()


def test_unknown_episode_exits_65_naming_it(scripted, tmp_path):
    p = run(["dphil-show", "-e", "99", "-e", "0", str(scripted)])
    assert p.returncode == 65 and b"no episode 99 in the input" in p.stderr
    page = tmp_path / "p.html"
    p = run(["dphil-show", "-e", "ffffffffffffffff", "-o", str(page), str(scripted)])
    assert p.returncode == 65 and b"ffffffffffffffff" in p.stderr
    assert not page.exists()  # the page is published only when the run succeeds


def test_unwritable_output_exits_73(scripted, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = run(["dphil-show", str(scripted), "-o", str(blocker / "missing" / "page.html")])
    assert p.returncode == 73 and b"cannot " in p.stderr and b"page.html" in p.stderr
    p = run(["dphil-show", str(scripted), "-o", f"{blocker}/sub/"])
    assert p.returncode == 73


def test_usage_errors_exit_64(scripted):
    assert run(["dphil-show", "--all", "-e", "0", str(scripted)]).returncode == 64
    assert run(["dphil-show", "--all", "-f", "html", str(scripted)]).returncode == 64
    assert run(["dphil-show", "--format", "png", str(scripted)]).returncode == 64
    assert run(["dphil-show", str(scripted) + ".missing"]).returncode == 66


def test_head_closes_the_pipe_quietly(scripted):
    big = b"".join([scripted.read_bytes()] * 200)
    p = subprocess.run(
        f"{command_path('dphil-show')} --all --limit 0 | head -3",
        shell=True,
        input=big,
        capture_output=True,
        timeout=60,
        executable="/bin/bash",
    )
    assert p.returncode == 0
    assert len(p.stdout.decode().splitlines()) == 3
    assert p.stderr == b""


def test_does_not_import_heavy_libraries(scripted, tmp_path):
    page = tmp_path / "page.html"  # a file of the test's own: never a device such as /dev/null
    code = (
        "import sys\nfrom dphil.commands.show import main\n"
        f"rc = main([{str(scripted)!r}, '-f', 'html', '-o', {str(page)!r}], standalone_mode=False)\n"
        "heavy = [m for m in ('polars', 'litellm', 'torch', 'transformers', 'numpy', 'scipy', 'matplotlib')"
        " if m in sys.modules]\nassert rc == 0 and not heavy, (rc, heavy)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr


def peak_rss_kib(args: list[str], **kwargs) -> tuple[int, subprocess.CompletedProcess]:
    """Run a command as the only child of a fresh Python and return its peak resident memory."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
        "sys.stderr.buffer.write(p.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\nsys.exit(p.returncode)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", wrapper, command_path(args[0]), *args[1:]], capture_output=True, timeout=600, **kwargs
    )
    return int(p.stdout.decode().split()[-1]), p


@pytest.mark.slow
def test_a_100000_episode_file_streams_in_bounded_memory(tmp_path):
    big = tmp_path / "big.jsonl"
    with big.open("wb") as fh:
        p = subprocess.run(
            [
                command_path("dphil-rollout"),
                "-q",
                "-m",
                "scripted:naive",
                "-m",
                "scripted:hierarchy",
                "-n",
                "5",
                "--episodes",
                "50000",
            ],
            stdout=fh,
            timeout=600,
        )
    assert p.returncode == 0
    small = tmp_path / "small.jsonl"
    with big.open("rb") as src:
        small.write_bytes(b"".join(next(src) for _ in range(10)))
    with big.open("rb") as src:
        for line in src:
            last = line
    last_id = json.loads(last)["episode_id"]
    assert big.stat().st_size > 100 * 1024 * 1024
    base, _ = peak_rss_kib(["dphil-show", "-e", "0", str(small)])
    # The last episode: every record is read, one at a time.
    scan, p = peak_rss_kib(["dphil-show", "-e", last_id, str(big)])
    assert p.returncode == 0, p.stderr
    # 1,000 timelines into one page, written as they are drawn.
    page, p = peak_rss_kib(["dphil-show", "-f", "html", "-o", str(tmp_path / "big.html"), str(big)])
    assert p.returncode == 0 and b"showed the first 1000 episodes" in p.stderr
    assert (tmp_path / "big.html").read_text().count('<section class="episode"') == 1000
    # The file is over 100 MiB; holding it (or its parsed records) would cost far more than this.
    assert scan < base + 20 * 1024, (base, scan)
    assert page < base + 40 * 1024, (base, page)


@pytest.mark.parametrize(
    "change, shown",
    [
        (lambda r: r.update(deadlock_mode="sometimes"), False),
        (lambda r: r.update(n=10**9), False),  # claims a vast table: refused, not allocated
        (lambda r: r["turns"][0].pop("action"), False),
        (lambda r: r["turns"].__setitem__(0, "eat"), False),
        (lambda r: r.update(rounds=10**9), True),  # drawn with a few empty columns, not a billion
        (lambda r: r["reward"].update(components="high"), True),
        (lambda r: r.update(model=["a", "list"], prompt={"x": 1}), True),
        (lambda r: r.update(seed=None), False),
    ],
)
def test_malformed_records_are_refused_or_drawn_never_a_crash(scripted, tmp_path, change, shown):
    rec = records(scripted)[1]
    change(rec)
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    for fmt in ("text", "svg", "html"):
        p = run(["dphil-show", "-f", fmt, str(path), "-o", str(tmp_path / f"out.{fmt}")])
        assert p.returncode == (0 if shown else 65), (fmt, p.stderr)
        if not shown:
            assert f"{path}:1: " in p.stderr.decode()
    if shown:
        assert len(marks((tmp_path / "out.svg").read_text())) == 25
        assert (tmp_path / "out.svg").stat().st_size < 100_000
