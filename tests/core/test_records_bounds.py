"""One definition of what a reader accepts (dphil.core.records): schema versions, seeds, totals.

dphil-score and dphil-show check episodes with `check_episode`; dphil-stats reads with polars
and, for a chunk polars cannot take, line by line. All three hold the same values to the same
bounds, and each names the line it refuses.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from dphil.core import records
from dphil.core.episode import play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.errors import DataError
from dphil.results import frame
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import score_record
from tests.support.commands import run


def scored_record(seed: int = 3) -> dict:
    config = EpisodeConfig(model="scripted:random", n=4, seed=seed)
    return score_record(play(config, get_policy("random")), RewardSpec())


def lines(*recs: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in recs)


VERSIONS_REFUSED = [99, 0, -1, 3, "2", None, True, 2.0, [2], {"v": 2}]


def test_the_known_versions_are_the_ones_written_and_the_one_turn_raw_reads():
    assert records.SCHEMA_VERSION in records.SCHEMA_VERSIONS
    assert records.SCHEMA_VERSIONS == (1, 2)  # 1: local models' turns call the reply `reply`


@pytest.mark.parametrize("version", VERSIONS_REFUSED)
def test_check_schema_version_refuses_what_it_does_not_know(version):
    with pytest.raises(DataError, match="unknown schema_version"):
        records.check_schema_version({"schema_version": version})


def test_check_schema_version_reads_known_and_absent():
    for rec in ({"schema_version": 1}, {"schema_version": 2}, {}):
        records.check_schema_version(rec)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 1.0, float(2**64), "3", None, True, 10**30])
def test_check_seed_bounds(seed):
    with pytest.raises(DataError, match=r"field 'seed' should be an integer from -2\*\*63 to 2\*\*64-1"):
        records.check_seed(seed)


def test_check_seed_takes_every_int64_and_uint64():
    for seed in (0, -(2**63), 2**63, 2**64 - 1):
        assert records.check_seed(seed) == seed


@pytest.mark.parametrize("value", [1e308, -1e101, float("inf"), float("nan"), 10**400, "1", None, True])
def test_check_number_bounds(value):
    with pytest.raises(DataError, match=r"field 'reward\.total'"):
        records.check_number(value, "reward.total")
    assert records.check_number(records.MAX_MAGNITUDE, "x") == records.MAX_MAGNITUDE
    assert records.check_number(-3, "x") == -3.0


# -- every reader, one verdict -------------------------------------------------------------


def _stats_verdict(tmp_path: Path, rec: dict) -> str | None:
    """dphil-stats' verdict on `rec` (line 2 of a file) by both of its paths: None, or the reason."""
    path = tmp_path / "ep.jsonl"
    data = lines(scored_record(1), rec)
    path.write_bytes(data)
    reasons = []
    try:
        frame.load([str(path)], ["model"])
        reasons.append(None)
    except DataError as e:
        assert (e.source, e.line) == (str(path), 2)
        reasons.append(e.reason)
    try:
        frame._load_slowly(str(path), data, 1, ["model"], "fail", lambda _: None)
        reasons.append(None)
    except DataError as e:
        assert (e.source, e.line) == (str(path), 2)
        reasons.append(e.reason)
    assert reasons[0] == reasons[1], reasons  # the polars path and the line-by-line path agree
    return reasons[0]


def _episode_verdict(rec: dict) -> str | None:
    try:
        records.check_episode(rec)
    except DataError as e:
        return e.reason
    return None


@pytest.mark.parametrize(
    "change",
    [{"schema_version": v} for v in [1, 2, *VERSIONS_REFUSED]] + [{"seed": s} for s in (2**64 - 1, -(2**63), 2**64)],
    ids=repr,
)
def test_score_show_and_stats_judge_alike(tmp_path, change):
    rec = {**scored_record(), **change}
    # What the readers see is the file parsed by orjson, as they parse it (2**64 is a float there).
    rec = orjson.loads(json.dumps(rec))
    stats, episode = _stats_verdict(tmp_path, rec), _episode_verdict(rec)
    assert (stats is None) == (episode is None), (stats, episode)
    if stats is not None:
        assert stats == episode


def test_a_record_without_a_version_is_read_by_all(tmp_path):
    rec = scored_record()
    del rec["schema_version"]
    assert _stats_verdict(tmp_path, rec) is None and _episode_verdict(rec) is None


# -- the commands ---------------------------------------------------------------------------


def test_dphil_score_refuses_an_unknown_version_naming_the_line(tmp_path):
    raw = run(["dphil-rollout", "-q", "-m", "scripted:random", "--episodes", "3"]).stdout.splitlines(True)
    bad = json.loads(raw[1]) | {"schema_version": 99}
    path = tmp_path / "ep.jsonl"
    path.write_bytes(raw[0] + lines(bad) + raw[2])
    p = run(["dphil-score", str(path)])
    assert p.returncode == 65
    assert p.stderr.decode().startswith(f"dphil-score: {path}:2: unknown schema_version 99")


def test_dphil_score_refuses_weights_whose_total_no_reader_accepts(tmp_path):
    raw = run(["dphil-rollout", "-q", "-m", "scripted:hierarchy", "--episodes", "1"]).stdout
    p = run(["dphil-score", "--alpha", "1e300"], input=raw)
    assert p.returncode == 65
    assert b"<stdin>:1: field 'reward.total' is out of range" in p.stderr
    assert run(["dphil-score", "--alpha", "1e50"], input=raw).returncode == 0


def test_dphil_show_refuses_an_unknown_version_naming_the_line(tmp_path):
    good, bad = scored_record(1), scored_record(2) | {"schema_version": "2"}
    path = tmp_path / "ep.jsonl"
    path.write_bytes(lines(bad))
    p = run(["dphil-show", str(path)])
    assert p.returncode == 65 and p.stdout == b""
    assert f'{path}:1: episode {bad["episode_id"]}: unknown schema_version "2"' in p.stderr.decode()
    # Among good episodes, dphil-show skips it as it skips any bad record: named, and counted.
    path.write_bytes(lines(bad, good))
    p = run(["dphil-show", str(path), "--all"])
    assert p.returncode == 0 and good["episode_id"] in p.stdout.decode()
    assert f"{path}:1: episode {bad['episode_id']}: unknown schema_version" in p.stderr.decode()
    assert b"skipped 1 record(s)" in p.stderr
