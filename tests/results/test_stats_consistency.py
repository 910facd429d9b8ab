"""dphil-stats summarises message_consistency: its mean over the episodes that have one, and how many.

Real records: the scripted samples with `talk` added to their turns (as a `--talk` run records
it), scored by dphil-score, then read by dphil-stats. An episode without a number (no talk, or
talk that states no intention) must be left out of the mean, never counted as 0.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from dphil.core.protocols import protocol_actions
from tests.results.test_stats_cli import ROOT, cmd, records, run, validate


def _talk(record: dict, said) -> dict:
    """`record` with each turn's messages `said(k, turn)` (None: the turn sent none)."""
    for k, t in enumerate(record["turns"]):
        text = said(k, t)
        if text is not None:
            t["talk"] = [{"text": text}]
    return record


def _other(action: str, protocol: str) -> str:
    return next(a for a in protocol_actions(protocol) if a != action)


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> Path:
    import subprocess

    greedy = [json.loads(x) for x in (ROOT / "samples" / "greedy.jsonl").read_text().splitlines()]
    naive = [json.loads(x) for x in (ROOT / "samples" / "naive.jsonl").read_text().splitlines()]
    assert len(greedy) == 3 and all(len(r["turns"]) >= 2 for r in greedy)
    a, b, c = greedy
    # a: every turn says what it does -> 1.0
    _talk(a, lambda k, t: f"I will {t['action']}")
    # b: turn 0 announces another action, turn 1 its own, the rest say nothing of actions -> 1/2
    _talk(
        b,
        lambda k, t: (
            f"Now {_other(t['action'], b['protocol'])}!" if k == 0 else f"I {t['action']}" if k == 1 else "hello"
        ),
    )
    # c: talk, but no intention stated -> null
    _talk(c, lambda k, t: "hello there")
    # naive: no talk at all -> no metric; a cell of its own under --by model
    lines = "".join(json.dumps(r) + "\n" for r in [a, b, c, *naive]).encode()
    proc = subprocess.run([*cmd("dphil-score"), "-q"], input=lines, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    out = tmp_path_factory.mktemp("consistency") / "scored.jsonl"
    out.write_bytes(proc.stdout)
    got = {r["episode_id"]: r["metrics"].get("message_consistency", "absent") for r in records(proc.stdout)}
    assert got == {
        a["episode_id"]: 1.0,
        b["episode_id"]: 0.5,
        c["episode_id"]: None,
        **{r["episode_id"]: "absent" for r in naive},
    }
    return out


def test_cells_average_only_the_episodes_that_have_a_consistency(scored):
    proc = run([str(scored), "--by", "model"])
    assert proc.returncode == 0, proc.stderr.decode()
    cells = {r["model"]: r for r in records(proc.stdout)}
    validate(list(cells.values()))
    talked, silent = cells["scripted:greedy"], cells["scripted:naive"]
    assert talked["episodes"] == 3
    assert talked["message_consistency_mean"] == pytest.approx((1.0 + 0.5) / 2)  # not (1.0 + 0.5 + 0) / 3
    assert talked["message_consistency_episodes"] == 2
    assert silent["episodes"] == 3
    assert silent["message_consistency_mean"] is None and silent["message_consistency_episodes"] == 0
    # One cell over all of them: the same two episodes, whatever else it holds.
    proc = run([str(scored), "--by", "protocol"])
    (whole,) = records(proc.stdout)
    assert whole["episodes"] == 6
    assert whole["message_consistency_mean"] == pytest.approx(0.75) and whole["message_consistency_episodes"] == 2


def test_tables_show_the_column_only_when_some_cell_has_it(scored, tmp_path):
    md = run([str(scored), "--by", "model", "--format", "markdown"])
    assert md.returncode == 0, md.stderr.decode()
    text = md.stdout.decode()
    assert "consistency (episodes)" in text and "0.750 (2)" in text
    header = next(line for line in text.splitlines() if "consistency" in line).strip("|").split("|")
    row = next(line for line in text.splitlines() if "scripted:naive" in line).strip("|").split("|")
    at = [h.strip() for h in header].index("consistency (episodes)")
    assert row[at].strip() == "n/a"  # no talk: not 0
    naive = tmp_path / "naive.jsonl"
    naive.write_text("".join(x + "\n" for x in scored.read_text().splitlines() if "scripted:naive" in x))
    plain = run([str(naive), "--format", "markdown"])
    assert plain.returncode == 0 and b"consistency" not in plain.stdout
    rows = list(csv.DictReader(io.StringIO(run([str(scored), "--by", "model", "--format", "csv"]).stdout.decode())))
    values = {r["model"]: r["message_consistency_mean"] for r in rows}
    assert float(values["scripted:greedy"]) == pytest.approx(0.75) and values["scripted:naive"] == ""


@pytest.mark.parametrize("value", [1.5, -0.1, "0.5", True])
def test_a_consistency_outside_0_to_1_is_refused_with_its_line(scored, tmp_path, value):
    lines = scored.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["metrics"]["message_consistency"] = value
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    proc = run([str(path)])
    err = proc.stderr.decode()
    assert proc.returncode == 65, err
    assert f"{path.name}:2:" in err and "message_consistency" in err
