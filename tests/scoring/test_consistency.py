"""Message-action consistency: reading an intention from a message, and the per-episode ratio."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dphil.core.protocols import protocol_actions
from dphil.scoring.consistency import actions_named, message_consistency, stated_intention
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import score_record


@pytest.mark.parametrize(
    ("text", "protocol", "named"),
    [
        ("I will grab-left now.", "dpbench", {"grab-left"}),
        ("Going to Grab Left, then WAIT.", "dpbench", {"grab-left", "wait"}),
        ("PICK_UP_LEFT please", "paper", {"pick-up-left"}),
        ("pick up left", "paper", {"pick-up-left"}),
        ("I'll take my left fork", "paper", set()),
        ("grab-left", "paper", set()),
        ("", "paper", set()),
        (None, "paper", set()),
    ],
)
def test_actions_named(text, protocol, named):
    assert actions_named(text, protocol) == named


def test_intention_is_the_last_message_naming_an_action_if_it_names_one():
    msgs = [{"text": "I will grab-left"}, {"text": "ok, release"}, {"text": "see you"}]
    assert stated_intention(msgs, "dpbench") == "release"
    assert stated_intention([{"text": "grab-left"}, {"text": "grab-right or wait"}], "dpbench") is None
    assert stated_intention([{"text": "hello"}], "dpbench") is None
    assert stated_intention(None, "dpbench") is None


def test_hand_computed_ratio():
    turns = [
        {"action": "grab-left", "talk": [{"text": "I grab-left"}]},  # consistent
        {"action": "wait", "talk": [{"text": "I will grab-right"}]},  # not
        {"action": "release", "talk": [{"text": "release!"}]},  # consistent
        {"action": "wait", "talk": [{"text": "hi"}]},  # no intention
        {"action": None, "talk": [{"text": "wait"}]},  # unparsed action: not consistent
        {"action": "wait"},  # no talk
    ]
    assert message_consistency(turns, "dpbench") == pytest.approx(2 / 4)
    assert message_consistency([{"action": "wait", "talk": [{"text": "hi"}]}], "dpbench") is None
    assert message_consistency([], "dpbench") is None


@given(
    st.sampled_from(["paper", "dpbench"]),
    st.data(),
)
def test_ratio_is_consistent_over_stated(protocol, data):
    actions = protocol_actions(protocol)
    pairs = data.draw(
        st.lists(st.tuples(st.sampled_from([*actions, None]), st.sampled_from([*actions, "hello"])), max_size=20)
    )
    turns = [{"action": a, "talk": [{"text": f"I will {m}"}]} for a, m in pairs]
    stated = [(a, m) for a, m in pairs if m != "hello"]
    got = message_consistency(turns, protocol)
    if not stated:
        assert got is None
    else:
        assert got == pytest.approx(sum(a == m for a, m in stated) / len(stated))
        assert 0 <= got <= 1


def test_score_adds_the_field_only_to_records_with_talk():
    import orjson

    from dphil.scoring.score import Scorer

    sample = Path(__file__).resolve().parents[2] / "samples" / "greedy.jsonl"
    line = sample.read_bytes().splitlines()[0] + b"\n"
    record = orjson.loads(line)
    plain = score_record(orjson.loads(line), RewardSpec())
    assert "message_consistency" not in plain["metrics"]
    for t in record["turns"]:
        t["talk"] = [{"text": f"I will {t['action']}"}]
    talked = score_record(orjson.loads(orjson.dumps(record)), RewardSpec())
    assert talked["metrics"]["message_consistency"] == 1.0
    assert {k: v for k, v in talked["metrics"].items() if k != "message_consistency"} == plain["metrics"]
    scorer = Scorer(RewardSpec())
    scorer.line(orjson.loads(line), line)
    out = orjson.loads(scorer.line(record, orjson.dumps(record)))
    assert out["metrics"]["message_consistency"] == 1.0
