"""Each extension point has one home; these tests fail when an entry is added there and not where it is used.

Reward terms live in `dphil.scoring.reward.TERMS`, credit modes in `dphil.train.advantages.MODES`,
local model servers in `dphil.serving.processes.SERVERS`, exit codes in `dphil.io.errors.ExitStatus`
(docs/contributing.md walks through adding each).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from dphil.core.episode import play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.errors import ExitStatus
from dphil.scoring.reward import TERMS, RewardSpec
from dphil.scoring.score import score_record
from dphil.serving.processes import SERVERS
from dphil.show.timeline import reward_terms
from dphil.train.advantages import MODES, SEAT_SHARES, AdvantageSpec, philosopher_returns
from dphil.train.art_backend import ART_GROUPS, art_groups
from tests.support.commands import ROOT, run


def scored(policy: str = "naive", variant: str = "paper") -> dict:
    record = play(EpisodeConfig(n=5, rounds=5, seed=3, model=f"scripted:{policy}"), get_policy(policy))
    return score_record(record, RewardSpec(variant))


def test_every_reward_term_has_a_weight_a_seat_share_and_a_schema_entry():
    names = [t.name for t in TERMS]
    weights = [t.weight for t in TERMS]
    assert len(set(names)) == len(names) and len(set(weights)) == len(weights)
    fields = {f.name: f.default for f in dataclasses.fields(RewardSpec)}
    assert all(fields[t.weight] == t.default for t in TERMS)
    assert list(RewardSpec().weights) == weights
    assert set(SEAT_SHARES) == set(names)
    schema = json.loads((ROOT / "schemas" / "episode.schema.json").read_text())["$defs"]["reward"]["properties"]
    assert schema["components"]["required"] == names and set(schema["components"]["properties"]) == set(names)
    assert schema["weights"]["required"] == weights and set(schema["weights"]["properties"]) == set(weights)


@pytest.mark.parametrize("variant", ["paper", "shaped"])
@pytest.mark.parametrize("policy", ["naive", "hierarchy", "random", "idle"])
def test_the_total_and_the_seat_shares_are_the_terms_summed(variant, policy):
    record = scored(policy, variant)
    reward = record["reward"]
    total = sum(t.sign * reward["weights"][t.weight] * reward["components"][t.name] for t in TERMS)
    assert reward["total"] == pytest.approx(total, abs=1e-12)
    assert sum(philosopher_returns(record)) / record["n"] == pytest.approx(reward["total"], abs=1e-9)
    shown = reward_terms(record)
    assert [(name, w, v) for name, w, v in shown] == [
        (t.name, t.sign * reward["weights"][t.weight], reward["components"][t.name]) for t in TERMS
    ]


def test_every_credit_mode_runs_on_both_backends_and_in_the_cli():
    assert set(ART_GROUPS) == set(MODES)
    for mode in MODES:
        AdvantageSpec(mode)
    with pytest.raises(ValueError, match="unknown advantage mode"):
        AdvantageSpec("team")
    with pytest.raises(ValueError, match="no trajectory groups"):
        art_groups(None, [], "team")
    help_text = run(["dphil-train", "--help"]).stdout.decode()
    for mode in MODES:
        assert mode in help_text


def test_every_local_server_has_a_launcher_and_a_bench_entry():
    import bench.bench_servers as bench

    assert set(SERVERS) >= {"llamacpp", "transformers"}
    for name, server in SERVERS.items():
        assert server.name == name and callable(server.start)
    assert set(bench.choices()) == set(SERVERS)


def test_exit_codes_are_one_enum_and_the_docs_list_every_one():
    values = [s.value for s in ExitStatus]
    assert len(set(values)) == len(values)
    docs = (ROOT / "docs" / "commands.md").read_text()
    for status in ExitStatus:
        assert f"| {status.value} |" in docs, f"docs/commands.md lacks exit code {status.value} ({status.name})"


def test_the_episode_schema_knows_the_versions_the_readers_accept():
    from dphil.core.records import SCHEMA_VERSIONS

    schema = json.loads((ROOT / "schemas" / "episode.schema.json").read_text())
    assert schema["properties"]["schema_version"]["enum"] == list(SCHEMA_VERSIONS)
