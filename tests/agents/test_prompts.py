"""System prompts per protocol/seat/variant, observation text, user templates and versions."""

from __future__ import annotations

import pytest

from dphil.agents.prompts import (
    PROMPT_VARIANTS,
    builtin_prompt,
    get_prompt,
    load_prompt_file,
    observation_text,
    system_prompt,
    talk_text,
)
from dphil.agents.tools import tool_specs
from dphil.core.protocols import protocol_actions
from dphil.core.table import Table
from dphil.io.errors import ConfigError, NoInputError


@pytest.mark.parametrize("protocol", ["paper", "dpbench"])
@pytest.mark.parametrize("variant", PROMPT_VARIANTS)
def test_system_prompt_names_seat_forks_and_every_action(protocol, variant):
    text = system_prompt(protocol, 7, 6, variant)
    assert "philosopher 6" in text
    assert "$" not in text
    for action in protocol_actions(protocol):
        assert action in text
    assert "fork 0" in text  # philosopher 6's right fork at a table of 7


def test_variants_differ_and_have_distinct_versions():
    texts = {v: system_prompt("paper", 5, 2, v) for v in PROMPT_VARIANTS}
    assert len(set(texts.values())) == len(PROMPT_VARIANTS)
    assert len({builtin_prompt(v).version for v in PROMPT_VARIANTS}) == len(PROMPT_VARIANTS)
    assert len(texts["minimal"]) < len(texts["default"])


def test_resource_ordering_and_symmetry_breaking_are_seat_specific():
    last = system_prompt("paper", 5, 4, "resource-ordering")
    assert "lower fork is fork 0, your right fork" in last
    first = system_prompt("paper", 5, 0, "resource-ordering")
    assert "lower fork is fork 0, your left fork" in first
    assert "reach for your right fork first" in system_prompt("paper", 5, 3, "symmetry-breaking")
    assert "reach for your left fork first" in system_prompt("paper", 5, 2, "symmetry-breaking")


def test_without_tools_the_prompt_asks_for_an_action_line():
    text = system_prompt("dpbench", 5, 0, tools=False)
    assert "ACTION: <name>" in text and "grab-left, grab-right, release, wait" in text
    assert "tool" in system_prompt("dpbench", 5, 0, tools=True)


def test_schedule_is_described():
    assert "one after another" in system_prompt("paper", 5, 0, schedule="sequential")
    assert "same moment" in system_prompt("paper", 5, 0)


def test_unknown_variant_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown prompt 'polite'"):
        builtin_prompt("polite")


def test_prompt_file_template_version_depends_on_text_only(tmp_path):
    a = tmp_path / "a" / "mine.txt"
    b = tmp_path / "b" / "mine.txt"
    a.parent.mkdir()
    b.parent.mkdir()
    a.write_text("Seat $seat of $n; forks $left_fork/$right_fork. $$5 tip.\n$actions\n$answer")
    b.write_text(a.read_text())
    pa, pb = load_prompt_file(a), get_prompt("default", b)
    assert pa.name == "file:mine"
    assert pa.version == pb.version != builtin_prompt().version
    text = pa.system("paper", 5, 4)
    assert text.startswith("Seat 4 of 5; forks 4/0. $5 tip.")
    assert "- eat:" in text
    b.write_text(a.read_text() + " ")
    assert load_prompt_file(b).version != pa.version


def test_prompt_file_errors(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("You are $seat, $nonsense")
    with pytest.raises(ConfigError, match=r"bad.txt: unknown placeholder \$nonsense"):
        load_prompt_file(bad)
    bad.write_text("costs $5")
    with pytest.raises(ConfigError, match="malformed placeholder"):
        load_prompt_file(bad)
    bad.write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        load_prompt_file(bad)
    with pytest.raises(NoInputError, match="no such prompt file"):
        load_prompt_file(tmp_path / "missing.txt")


def test_observation_text_reports_what_the_seat_sees():
    t = Table(5, 5)
    assert "You have not acted yet." in observation_text(t.observe(0))
    t.play_simultaneous(["pick-up-left"] * 4 + ["pick-up-right"])  # 0 and 4 both want fork 0
    four = observation_text(t.observe(4), {"messages": [{"from": 0, "text": 'mine "first"'}]})
    assert four.startswith("Round 2 of 5.")
    assert "Your left fork (fork 4): free." in four
    assert "Your right fork (fork 0): held by your right neighbour (philosopher 0)." in four
    assert "pick-up-right, failed: your neighbour reached for the same fork" in four
    assert '- philosopher 0 (right neighbour): "mine \\"first\\""' in four
    zero = observation_text(t.observe(0), tools=False)
    assert "Your left fork (fork 0): you hold it." in zero
    assert "pick-up-left, worked" in zero
    assert zero.endswith("answer `ACTION: <name>`.")


def test_observation_after_no_action_and_while_eating():
    t = Table(3, 5, protocol="dpbench")
    t.play_simultaneous([None, "grab-left", "wait"])
    assert "no valid action could be read" in observation_text(t.observe(0))
    t.play_simultaneous([None, "grab-right", "wait"])  # philosopher 1 holds both: eats
    one = observation_text(t.observe(1))
    assert "Meals so far: 1." in one and "You are eating" in one


def test_talk_text_and_tool_specs():
    assert "message 2 of 3" in talk_text(2, 3)
    for protocol in ("paper", "dpbench"):
        specs = tool_specs(protocol)
        assert [s["function"]["name"] for s in specs] == list(protocol_actions(protocol))
        assert all(s["type"] == "function" and s["function"]["description"] for s in specs)


def test_seat_last_opens_every_seat_with_the_same_text_and_names_the_seat_at_the_end():
    """What lets a local model compute every seat's system prompt once: all but the last paragraph shared."""

    def opening(texts: list[str]) -> str:
        k = 0
        while all(len(t) > k and t[k] == texts[0][k] for t in texts):
            k += 1
        return texts[0][:k]

    texts = [system_prompt("paper", 5, i, "seat-last", tools=False) for i in range(5)]
    shared = opening(texts)
    assert shared.endswith("You are philosopher ") and "philosopher 0" not in shared
    assert all(len(t) - len(shared) < 200 for t in texts) and len(shared) > 1500
    assert texts[3].endswith("Your right fork is fork 4, shared with your right neighbour, philosopher 4.")
    # the default names the seat in its first sentence: its seats share almost nothing
    assert len(opening([system_prompt("paper", 5, i) for i in range(5)])) < 40


def test_built_in_wordings_are_pinned_by_the_versions_committed_episodes_record():
    """A change of wording must be a new variant: old episode ids and logs name these versions."""
    assert builtin_prompt("default").version == "2dd48a6d41"  # bench/results/recipes-real-t1.5/work
    assert builtin_prompt("seat-last").version == "a72b26e69c"  # bench/results/seat-last
