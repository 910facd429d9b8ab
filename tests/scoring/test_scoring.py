"""`Scorer`, the line-level scoring dphil-score runs: the same records as `score_record`, input bytes kept."""

from __future__ import annotations

import copy
import json

import orjson
import pytest

from dphil.core import episode
from dphil.core.episode import clear_memo, play, replay
from dphil.core.policies import POLICIES, get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.errors import DataError
from dphil.io.jsonl import dumps
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import Scorer, score_record

SPECS = [RewardSpec(), RewardSpec(variant="shaped", beta=1.0, min_meals=2)]


def episodes():
    for k, policy in enumerate(sorted(POLICIES)):
        for protocol in ("paper", "dpbench"):
            for schedule in ("simultaneous", "sequential"):
                cfg = EpisodeConfig(model=f"scripted:{policy}", n=5, seed=k, protocol=protocol, schedule=schedule)
                yield play(cfg, get_policy(policy))


@pytest.mark.parametrize("spec", SPECS, ids=["paper", "shaped"])
def test_lines_equal_score_record_byte_for_byte(spec):
    scorer = Scorer(spec)
    for _ in range(2):  # the second pass comes from the memo and the cached tails
        for rec in episodes():
            raw = dumps(rec)
            assert scorer.line(orjson.loads(raw), raw) == dumps(score_record(orjson.loads(raw), spec))


def test_input_bytes_are_kept_and_the_reward_appended():
    rec = play(EpisodeConfig(model="scripted:naive", n=5), get_policy("naive"))
    raw = json.dumps(rec, indent=None, separators=(", ", ": ")).encode() + b" \r\n"  # another writer's style
    line = Scorer(RewardSpec()).line(json.loads(raw), raw)
    assert line.startswith(raw.rstrip()[:-1]) and line.endswith(b"}\n") and line.count(b"\n") == 1
    assert json.loads(line) == score_record(json.loads(raw), RewardSpec())


def test_rescoring_replaces_reward_and_metrics():
    rec = play(EpisodeConfig(model="scripted:hierarchy", n=5), get_policy("hierarchy"))
    first = Scorer(RewardSpec()).line(copy.deepcopy(rec), dumps(rec))
    second = Scorer(RewardSpec(variant="shaped")).line(orjson.loads(first), first)
    assert second.count(b'"reward"') == 1 and second.count(b'"metrics"') == 1
    assert orjson.loads(second)["reward"]["variant"] == "shaped"
    assert second == dumps(score_record(orjson.loads(first), RewardSpec(variant="shaped")))


def test_errored_episodes_pass_with_null_reward():
    rec = play(EpisodeConfig(model="scripted:random", n=3), get_policy("random"))
    rec.update(status="error", error="provider returned 500", turns=rec["turns"][:2])
    out = orjson.loads(Scorer(RewardSpec()).line(copy.deepcopy(rec), dumps(rec)))
    assert out["reward"] is None and out["metrics"] is None and out["error"] == "provider returned 500"


def test_trust_outcome_scores_recorded_numbers_and_memoises_per_outcome():
    rec = play(EpisodeConfig(model="scripted:hierarchy", n=5), get_policy("hierarchy"))
    rec["meals"] = [9, 0, 0, 0, 0]  # a lie the turns would expose
    scorer = Scorer(RewardSpec(), trust_outcome=True)
    out = orjson.loads(scorer.line(copy.deepcopy(rec), dumps(rec)))
    assert out["metrics"]["starvation"] == 4 and out["reward"]["components"]["throughput"] == 9 / 25
    with pytest.raises(DataError, match="recorded meals"):
        Scorer(RewardSpec()).line(copy.deepcopy(rec), dumps(rec))


def test_memo_is_skipped_for_a_model_whose_episodes_never_repeat():
    clear_memo()
    random_records = [
        play(EpisodeConfig(model="scripted:random", n=5, seed=s), get_policy("random"))
        for s in range(episode._JUDGE_AFTER + 200)
    ]
    for rec in random_records:
        replay(rec)
    size = len(episode._cache)
    assert size <= episode._JUDGE_AFTER + 1  # judged after _JUDGE_AFTER lookups, then replayed directly
    hierarchy = [
        play(EpisodeConfig(model="scripted:hierarchy", n=5, seed=s), get_policy("hierarchy"))
        for s in range(episode._JUDGE_AFTER + 200)
    ]
    for rec in hierarchy:
        assert replay(rec) == replay(copy.deepcopy(rec))
    hits, lookups = episode._usage["scripted:hierarchy"][1], episode._usage["scripted:hierarchy"][0]
    assert hits > 0.9 * lookups  # the same five episodes: memoised
    for rec in random_records:  # skipped or not, the outcomes are the replayed ones
        assert replay(rec).meals == tuple(rec["meals"])
    clear_memo()


def test_integer_like_outcomes_are_judged_the_same_whatever_else_the_round_carries():
    """`ok: 1` for true is read as JSON numbers compare, in plain rounds and in rounds with model fields."""
    rec = play(EpisodeConfig(model="scripted:hierarchy", n=3, rounds=2), get_policy("hierarchy"))
    rec["turns"][0]["ok"] = 1 if rec["turns"][0]["ok"] else 0
    plain = copy.deepcopy(rec)
    with_reply = copy.deepcopy(rec)
    with_reply["turns"][1]["reply"] = "I pick up my left fork."  # a model run's extra field
    spec = RewardSpec()
    assert score_record(plain, spec)["reward"] == score_record(with_reply, spec)["reward"]
