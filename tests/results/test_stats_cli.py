"""dphil-stats as users run it: real files, real pipes from dphil-rollout | dphil-score."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = {k: json.loads((ROOT / "schemas" / f"{k}.schema.json").read_text()) for k in ("cell", "comparison")}


def cmd(name: str) -> list[str]:
    """The installed console script, or the same click entry point through this Python."""
    exe = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if exe:
        return [exe]
    module = name.removeprefix("dphil-").replace("-", "_")
    return [sys.executable, "-c", f"from dphil.commands.{module} import main; main()"]


def run(
    args: list[str], *, stdin: bytes | None = None, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run([*cmd("dphil-stats"), *args], input=stdin, capture_output=True, timeout=120, env=env, cwd=cwd)


def pipeline(*rollout_args: str) -> bytes:
    """dphil-rollout ... | dphil-score, through a real OS pipe."""
    roll = subprocess.Popen([*cmd("dphil-rollout"), "-q", *rollout_args], stdout=subprocess.PIPE)
    score = subprocess.run([*cmd("dphil-score"), "-q"], stdin=roll.stdout, capture_output=True, timeout=120)
    roll.stdout.close()
    assert roll.wait(timeout=60) == 0 and score.returncode == 0, score.stderr
    return score.stdout


@pytest.fixture(scope="module")
def episodes(tmp_path_factory) -> Path:
    data = pipeline(
        "-m", "scripted:hierarchy", "-m", "scripted:random", "-m", "scripted:idle", "-n", "5,10", "--episodes", "12"
    )
    path = tmp_path_factory.mktemp("stats") / "ep.jsonl"
    path.write_bytes(data)
    return path


def records(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def validate(recs: list[dict]) -> None:
    for r in recs:
        jsonschema.Draft202012Validator(SCHEMAS[r["kind"]]).validate(r)


def test_full_pipeline_through_pipes():
    roll = subprocess.Popen(
        [
            *cmd("dphil-rollout"),
            "-q",
            "-m",
            "scripted:naive",
            "-m",
            "scripted:hierarchy",
            "-n",
            "5",
            "--episodes",
            "10",
        ],
        stdout=subprocess.PIPE,
    )
    score = subprocess.Popen([*cmd("dphil-score"), "-q"], stdin=roll.stdout, stdout=subprocess.PIPE)
    stats = subprocess.run(
        [*cmd("dphil-stats"), "--compare", "model", "scripted:naive", "scripted:hierarchy"],
        stdin=score.stdout,
        capture_output=True,
        timeout=120,
    )
    roll.stdout.close()
    score.stdout.close()
    assert roll.wait(timeout=60) == 0 and score.wait(timeout=60) == 0
    assert stats.returncode == 0, stats.stderr
    recs = records(stats.stdout)
    validate(recs)
    assert [r["kind"] for r in recs] == ["cell", "cell", "comparison"]
    naive = next(r for r in recs if r.get("model") == "scripted:naive")
    assert naive["episodes"] == 10 and naive["deadlock_rate"] == 1.0
    comp = recs[-1]
    assert comp["n"] == 5 and comp["paired"] is True and comp["paired_tests"]["pairs"] == 10
    assert comp["deadlock"]["diff"] == -1.0 and comp["diff"] > 0


def test_cells_and_comparisons_from_a_file(episodes):
    res = run(
        [
            str(episodes),
            "--compare",
            "model",
            "scripted:random",
            "scripted:hierarchy",
            "--compare",
            "model",
            "scripted:idle",
            "scripted:hierarchy",
            "--power",
        ]
    )
    assert res.returncode == 0, res.stderr
    recs = records(res.stdout)
    validate(recs)
    cells = [r for r in recs if r["kind"] == "cell"]
    comps = [r for r in recs if r["kind"] == "comparison"]
    assert [(c["model"], c["n"]) for c in cells] == [
        (m, n) for m in ("scripted:hierarchy", "scripted:idle", "scripted:random") for n in (5, 10)
    ]
    assert len(comps) == 4 and all("power" in c for c in comps)
    # Holm over the four Welch p values.
    from dphil.core.maths import adjust

    assert [c["p_adjusted"] for c in comps] == adjust([c["p_value"] for c in comps], "holm")
    # The idle cells are all inaction: said on stderr, once per cell.
    err = res.stderr.decode()
    assert err.count("scripted:idle") >= 2 and "degenerate" in err


def test_quiet_silences_warnings(episodes):
    res = run([str(episodes), "-q"])
    assert res.returncode == 0 and res.stderr == b""


def test_markdown_table_and_csv(episodes):
    md = run(
        [str(episodes), "--format", "markdown", "--compare", "model", "scripted:random", "scripted:hierarchy", "-q"]
    )
    assert md.returncode == 0, md.stderr
    text = md.stdout.decode()
    assert text.startswith("| model | n | episodes |")
    # The tables name the reward they summarise (these episodes are scored with the paper reward).
    assert "| reward paper (95% CI) |" in text and "Δ reward paper (95% CI)" in text and "Hedges' g (95% CI)" in text
    assert "| scripted:hierarchy | 5 | 12 | 0 |" in text
    table = run([str(episodes), "--format", "table", "-q"]).stdout.decode()
    assert table.splitlines()[0].split()[:3] == ["model", "n", "episodes"]
    # Wider than 100 columns, the table wraps into blocks, each repeating the cell's fields.
    blocks = table.split("\n\n")
    assert len(blocks) >= 2 and all(len(line) <= 100 for line in table.splitlines())
    assert all(b.splitlines()[0].split()[:2] == ["model", "n"] and len(b.splitlines()) == 2 + 6 for b in blocks)
    wide = run([str(episodes), "--format", "table", "--wide", "-q"]).stdout.decode()
    assert len(wide.splitlines()) == 2 + 6 and "failed actions" in wide.splitlines()[0]
    out = run(
        [
            str(episodes),
            "--format",
            "csv",
            "--no-cells",
            "--compare",
            "model",
            "scripted:random",
            "scripted:hierarchy",
            "-q",
        ]
    )
    rows = list(csv.DictReader(io.StringIO(out.stdout.decode())))
    assert len(rows) == 2 and rows[0]["kind"] == "comparison"
    assert float(rows[0]["diff_ci_lo"]) < float(rows[0]["diff"]) < float(rows[0]["diff_ci_hi"])
    assert rows[0]["a_value"] == "scripted:random" and rows[0]["deadlock_test"] == "fisher"


def test_stdin_gzip_and_output_file(episodes, tmp_path):
    data = episodes.read_bytes()
    plain = run([str(episodes), "-q"]).stdout
    res = run(["-", "-q", "-o", str(tmp_path / "cells.jsonl")], stdin=gzip.compress(data))
    assert res.returncode == 0 and res.stdout == b""
    assert (tmp_path / "cells.jsonl").read_bytes() == plain


def test_malformed_line_reported_with_line_number_exit_65(episodes, tmp_path):
    lines = episodes.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(lines[:6]) + b'{"model": "x", "n": 5,\n' + b"".join(lines[6:]))
    target = tmp_path / "out.jsonl"
    target.write_text("previous\n")
    res = run([str(bad), "-o", str(target)])
    assert res.returncode == 65
    err = res.stderr.decode().strip()
    assert err.startswith(f"dphil-stats: {bad}:7: invalid JSON")
    assert len(err.splitlines()) == 1
    assert target.read_text() == "previous\n"  # -o is untouched on failure
    # The same line on stdin is named as <stdin>:7.
    res = run(["-"], stdin=bad.read_bytes())
    assert res.returncode == 65 and b"<stdin>:7:" in res.stderr
    # With --on-error skip the rest is summarised and the count reported.
    res = run([str(bad), "--on-error", "skip"])
    assert res.returncode == 0 and b"skipped 1 bad record(s)" in res.stderr
    assert records(res.stdout) == records(run([str(episodes), "-q"]).stdout)


def test_unscored_input_is_a_data_error(tmp_path):
    raw = subprocess.run(
        [*cmd("dphil-rollout"), "-q", "-m", "scripted:random", "--episodes", "2"], capture_output=True, timeout=60
    ).stdout
    res = run(["-"], stdin=raw)
    assert res.returncode == 65
    assert b"<stdin>:1: episode is not scored" in res.stderr


def test_errored_episodes_are_counted_and_excluded(episodes, tmp_path):
    recs = records(episodes.read_bytes())
    for r in recs[:3]:
        r.update(status="error", error="API call failed", reward=None, metrics=None)
    path = tmp_path / "err.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = run([str(path), "--by", "model"])
    assert res.returncode == 0
    hier = next(r for r in records(res.stdout) if r["model"] == "scripted:hierarchy")
    assert hier["errors"] == 3 and hier["episodes"] == 21
    assert b"3 errored episode(s) left out" in res.stderr


def test_usage_errors_exit_64_and_missing_input_66(episodes, tmp_path):
    for args, needle in [
        (["--by", "turns"], b"cannot group by 'turns'"),
        (["--compare", "model", "scripted:random", "gpt-x"], b"no episodes with model = 'gpt-x'"),
        (["--plot", str(tmp_path / "x.gif")], b"use a .png, .svg or .pdf"),
        (["--adjust", "bonferroni"], b"bonferroni"),
    ]:
        res = run([str(episodes), *args])
        assert res.returncode == 64, (args, res.stderr)
        assert needle in res.stderr
    res = run([str(tmp_path / "nope.jsonl")])
    assert res.returncode == 66 and b"nope.jsonl: no such file" in res.stderr


def test_empty_input_writes_nothing(tmp_path):
    res = run(["-"], stdin=b"")
    assert res.returncode == 0 and res.stdout == b"" and b"no episodes" in res.stderr


@pytest.mark.parametrize("ext,magic", [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_plot(episodes, tmp_path, ext, magic):
    target = tmp_path / f"reward.{ext}"
    res = run([str(episodes), "-q", "--plot", str(target)])
    assert res.returncode == 0, res.stderr
    assert target.read_bytes().startswith(magic)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_plot_without_matplotlib_says_what_to_install(episodes, tmp_path):
    # A `matplotlib` that cannot be imported, shadowing the real one: as on a machine without it.
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{ROOT}")
    res = run([str(episodes), "--plot", str(tmp_path / "r.png")], env=env)
    assert res.returncode == 69
    assert b"pip install 'dphil[plot]'" in res.stderr and res.stdout == b""


def test_help_does_not_import_the_heavy_libraries():
    heavy = "('polars', 'scipy', 'numpy', 'matplotlib', 'litellm', 'torch')"
    probe = f"import sys; from dphil.commands import stats; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == b"[]", out.stderr
    res = run(["--help"])
    assert res.returncode == 0 and b"--compare FIELD A B" in res.stdout


def test_named_pipe_input(episodes, tmp_path):
    # As with `dphil-stats <(zcat ep.jsonl.gz)`: a path that is a pipe, read exactly once.
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    data = episodes.read_bytes()

    def feed() -> None:
        with open(fifo, "wb") as fh:
            fh.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    res = run([str(fifo), "-q"])
    writer.join(timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout == run([str(episodes), "-q"]).stdout
