"""dphil-stats' reading in chunks: lines named right across chunks, the cap at its edge, the ids seen, the totals.

In-process, with chunks and blocks made tiny so a few episodes cross many chunk boundaries.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dphil.core.episode import play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.errors import DataError
from dphil.results import cells, chunks, frame
from dphil.results.tally import SeenIds, Totals
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import score_record


@pytest.fixture(scope="module")
def recs() -> list[dict]:
    out = []
    for policy in ("random", "naive", "hierarchy"):
        for seed in range(8):
            config = EpisodeConfig(model=f"scripted:{policy}", n=4, seed=seed)
            out.append(score_record(play(config, get_policy(policy)), RewardSpec()))
    return out


def lines(rs: list[dict]) -> list[bytes]:
    return [json.dumps(r).encode() + b"\n" for r in rs]


def same(a, b) -> bool:
    """Equal, floats to 1e-12: sums taken chunk by chunk round differently in the last bits."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of a few lines, read 100 bytes at a time."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 3000)
    monkeypatch.setattr(chunks, "_BLOCK", 100)


def test_tiny_chunks_give_the_same_cells(tmp_path, recs, monkeypatch):
    path = tmp_path / "ep.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines(recs)) + b"  \n")  # a BOM, blank lines
    want = cells.cell_records(frame.load([str(path)], ["model"]), ["model"])
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 3000)
    monkeypatch.setattr(chunks, "_BLOCK", 100)
    got = frame.load([str(path)], ["model"])
    assert got.count == len(recs)
    assert same(cells.cell_records(got, ["model"]), want)
    gz = tmp_path / "ep.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert same(cells.cell_records(frame.load([str(gz)], ["model"]), ["model"]), want)


def test_a_bad_line_in_a_later_chunk_is_named(tmp_path, recs, tiny_chunks):
    body = lines(recs)
    body[17] = b'{"model": "x", "n": \n'
    path = tmp_path / "ep.jsonl"
    path.write_bytes(b"".join(body[:5]) + b"\n\n" + b"".join(body[5:]))  # two blank lines shift the rest
    with pytest.raises(DataError) as err:
        frame.load([str(path)], ["model"])
    assert (err.value.source, err.value.line) == (str(path), 20)
    warned: list[str] = []
    skipping = frame.load([str(path)], ["model"], on_error="skip", warn=warned.append)
    assert skipping.skipped == 1 and skipping.count == len(recs) - 1
    assert warned[0].startswith(f"{path}:20: invalid JSON")


def test_a_repeat_in_a_later_chunk_names_both_lines(tmp_path, recs, tiny_chunks):
    body = lines(recs)
    path = tmp_path / "ep.jsonl"
    path.write_bytes(b"".join([*body, b"\n", body[2], body[20], body[2]]))
    with pytest.raises(DataError) as err:
        frame.load([str(path)], ["model"])
    first = recs[2]["episode_id"]
    assert err.value.message == f"{path}:{len(body) + 2}: episode {first} already read at {path}:3"
    kept = frame.load([str(path)], ["model"], dedupe="first")
    assert kept.count == len(recs) and kept.dropped == 3
    once = tmp_path / "once.jsonl"
    once.write_bytes(b"".join(body))
    assert same(cells.cell_records(kept, ["model"]), cells.cell_records(frame.load([str(once)], ["model"]), ["model"]))


def errored(rec: dict) -> dict:
    """An errored attempt of `rec`'s episode: what dphil-rollout journals before --resume retries it."""
    out = {k: v for k, v in rec.items() if k not in ("reward", "metrics")}
    return {**out, "status": "error", "error": "timeout after 300 s", "turns": [], "events": []}


@pytest.mark.parametrize("dedupe", ["fail", "first"])
def test_a_retried_error_counts_once_whichever_comes_first(tmp_path, recs, tiny_chunks, dedupe):
    """Errored attempts of episodes also read complete are left out, before or after the complete
    record, in this chunk or another; an error never completed is counted as an error, once."""
    body = lines(recs)
    path = tmp_path / "ep.jsonl"
    # recs[1]: error, then its retry far later (other chunks); recs[4]: error twice, then complete;
    # recs[7]: complete, then a late errored attempt; recs[9]: an error, retried and failing again.
    lone = errored(recs[9])
    order = [lines([errored(recs[1])])[0], lines([errored(recs[4])])[0], lines([errored(recs[4])])[0]]
    order += [b for i, b in enumerate(body) if i not in (1, 4, 9)]
    order += [body[1], body[4], lines([errored(recs[7])])[0], lines([lone])[0], lines([lone])[0]]
    path.write_bytes(b"".join(order))
    got = frame.load([str(path)], ["model"], dedupe=dedupe)
    assert got.superseded == 5 and got.dropped == 0
    assert got.count == len(recs)  # every episode once: 23 complete and recs[9] as one error
    want = [r for i, r in enumerate(recs) if i != 9]
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b"".join([*lines(want), lines([lone])[0]]))
    assert same(cells.cell_records(got, ["model"]), cells.cell_records(frame.load([str(clean)], ["model"]), ["model"]))
    naive = next(c for c in cells.cell_records(got, ["model"]) if c["model"] == recs[9]["model"])
    assert naive["errors"] == 1


def test_a_complete_episode_read_twice_after_its_retry_names_the_complete_line(tmp_path, recs):
    path = tmp_path / "ep.jsonl"
    path.write_bytes(b"".join([*lines([errored(recs[0]), recs[0], recs[1], recs[0]])]))
    with pytest.raises(DataError) as err:
        frame.load([str(path)], ["model"])
    assert err.value.message == f"{path}:4: episode {recs[0]['episode_id']} already read at {path}:2"
    kept = frame.load([str(path)], ["model"], dedupe="first")
    assert (kept.count, kept.superseded, kept.dropped) == (2, 1, 1)
    assert [c["errors"] for c in cells.cell_records(kept, ["model"])] == [0]


def test_the_line_cap_at_its_edge(tmp_path, recs, tiny_chunks, monkeypatch):
    cap = 8000
    monkeypatch.setattr(chunks, "MAX_LINE", cap)
    body = lines(recs[:6])
    assert max(map(len, body)) < cap
    fits = b'{"pad": "' + b"x" * (cap - 12) + b'"}\n'
    over = b'{"pad": "' + b"x" * (cap - 11) + b'"}\n'
    assert (len(fits), len(over)) == (cap, cap + 1)
    path = tmp_path / "ep.jsonl"
    path.write_bytes(body[0] + over + body[1] + body[2] + over[:-1] + b"yy" * cap + b"\n" + b"".join(body[3:]))
    with pytest.raises(DataError, match="line longer than") as err:
        frame.load([str(path)], ["model"])
    assert err.value.line == 2
    warned: list[str] = []
    skipping = frame.load([str(path)], ["model"], on_error="skip", warn=warned.append)
    assert skipping.skipped == 2 and skipping.count == 6
    assert [w.split(": ", 1)[0] for w in warned] == [f"{path}:2", f"{path}:5"]
    # A line of exactly the cap is read (and refused for what it is: not an episode).
    path.write_bytes(body[0] + fits)
    with pytest.raises(DataError, match="missing field 'status'") as err:
        frame.load([str(path)], ["model"])
    assert err.value.line == 2


def test_a_truncated_gzip_names_the_line_after_the_last_whole_one(tmp_path, recs):
    data = gzip.compress(b"".join(lines(recs)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(DataError, match="cannot read") as err:
        frame.load([str(path)], ["model"])
    assert err.value.source == str(path) and 1 <= err.value.line <= len(recs)


def test_seen_ids_across_runs_and_kinds():
    seen = SeenIds()
    a = seen.source("a.jsonl")
    total = 0
    for start in range(0, 5000, 700):  # several runs, merged as they grow
        ids = pl.Series([f"{i:016x}" for i in range(start, start + 700)])
        assert seen.add(ids, np.arange(start + 1, start + 701), a) == []
        total += 700
    b = seen.source("b.jsonl")
    ids = pl.Series(["0000000000000005", "not-hex", None, "not-hex", None, "0000000000001fff", "0000000000000005"])
    repeats = seen.add(ids, np.arange(1, 8), b)
    assert [(r.row, r.episode_id, r.first) for r in repeats] == [
        (0, "0000000000000005", "a.jsonl:6"),
        (3, "not-hex", "b.jsonl:2"),
        (6, "0000000000000005", "a.jsonl:6"),
    ]
    assert seen.add(pl.Series(["not-hex", "0000000000001fff"]), np.array([9, 10]), b)[0].first == "b.jsonl:2"


def test_totals_merged_chunk_by_chunk_equal_one_pass():
    rng = np.random.default_rng(7)
    n = 5000
    frame_all = pl.DataFrame(
        {
            "model": rng.choice(["a", "b", "c"], n),
            "_reward": rng.normal(0.3, 2.0, n),
            "_error": rng.random(n) < 0.05,
            "_variant": ["paper"] * n,
            "_deadlock": rng.random(n) < 0.4,
            "_meals": rng.integers(0, 5, n),
            "_throughput": rng.random(n),
            "_gini": rng.random(n),
            "_starvation": rng.integers(0, 3, n),
            "_ttd": [int(t) if rng.random() < 0.5 else None for t in rng.integers(1, 5, n)],
            "_consistency": [float(c) if rng.random() < 0.3 else None for c in rng.random(n)],
            **{c: rng.integers(0, 9, n) for c in ("_turns", "_null", "_acted", "_failed")},
            "_prompt_tokens": rng.integers(0, 100, n),
            "_completion_tokens": rng.integers(0, 100, n),
            "_cost": rng.random(n),
        }
    ).with_columns(pl.when(~pl.col("_error")).then(pl.col("_reward")).alias("_reward"))
    one, many = Totals(["model"]), Totals(["model"])
    one.add(frame_all)
    for start in range(0, n, 333):
        many.add(frame_all.slice(start, 333))
    schema = {"model": pl.String()}
    a, b = one.summary(schema).sort("model"), many.summary(schema).sort("model")
    assert a.select(pl.exclude(pl.Float64)).equals(b.select(pl.exclude(pl.Float64)))
    for column in a.select(pl.col(pl.Float64)).columns:
        assert np.allclose(a[column].to_numpy(), b[column].to_numpy(), rtol=1e-12, atol=1e-12), column
    direct = frame_all.filter(pl.col("model") == "a")["_reward"].drop_nulls()
    assert b["reward_std"][0] == pytest.approx(direct.std(), rel=1e-12)


def test_a_constant_reward_keeps_a_zero_spread(tmp_path, recs, tiny_chunks):
    configs = [EpisodeConfig(model="scripted:idle", n=3, seed=s) for s in range(30)]
    idle = [score_record(play(c, get_policy("idle")), RewardSpec()) for c in configs]
    path = tmp_path / "idle.jsonl"
    path.write_bytes(b"".join(lines(idle)))
    [cell] = cells.cell_records(frame.load([str(path)], ["model"]), ["model"])
    assert cell["episodes"] == 30 and cell["reward_std"] == 0.0 and cell["reward_ci"] == [1.0, 1.0]


def test_free_field_types_settle_after_every_chunk(tmp_path, recs, tiny_chunks):
    """A free field is a number only if every chunk's values are: a late text value keeps it text."""
    tagged = [dict(r, step=k) for k, r in enumerate(recs)]
    path = Path(tmp_path / "ep.jsonl")
    path.write_bytes(b"".join(lines(tagged)))
    assert frame.load([str(path)], ["step"]).types["step"] == pl.Int64
    tagged[-1]["step"] = "final"
    path.write_bytes(b"".join(lines(tagged)))
    ep = frame.load([str(path)], ["step"])
    assert ep.types["step"] == pl.String
    assert [c["step"] for c in cells.cell_records(ep, ["step"])][-1] == "final"
