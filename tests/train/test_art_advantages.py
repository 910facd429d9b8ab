"""Each --advantage mode through ART's own data path: ART's advantages equal dphil's.

ART computes GRPO advantages itself (reward minus the group mean, over the
standard deviation unless scale_rewards is off). The child process builds the
trajectory groups the ART backend would send for the hand-computed group of
tests/train/test_advantages.py, tokenizes them with ART's real
`tokenize_trajectory_groups` (the tiny test tokenizer stands in for Qwen's)
and checks that every trained reply carries exactly dphil's advantage. Only
`backend.train` on a GPU lies beyond this. `import art` patches transformers,
so it happens in a child Python.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("art") is None:
    pytest.skip("openpipe-art is not installed", allow_module_level=True)
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import pathlib, sys, tempfile
sys.path.insert(0, ".")
from tests.train.test_advantages import group
from tests.train.test_art import CHILD_BODY
exec(CHILD_BODY)  # make_choice: a real openai Choice with logprobs
from transformers import AutoTokenizer
from art.preprocessing.tokenize import tokenize_trajectory_groups
from dphil.core.records import EpisodeConfig
from dphil.train.advantages import AdvantageSpec, turn_advantages
from dphil.train.art_backend import art_groups, import_art
from dphil.train.loop import ScoredGroup
from dphil.local.play import Played
from tests.support.tinymodel import build_tiny_model

art = import_art("art-serverless")
eps = group()
played = []
for rec in eps:
    cfg = EpisodeConfig(model="art:tiny", n=2, rounds=3, seed=1, conflict="lowest-id")
    hist = [[{"role": "system", "content": f"seat {i}"}] for i in range(2)]
    for t in sorted(rec["turns"], key=lambda t: (t["round"], t["philosopher"])):
        h = hist[t["philosopher"]]
        h.append({"role": "user", "content": f"round {t['round']}"})
        h.append(make_choice(t["action"] or "think", tool=True))
        h.append({"role": "tool", "tool_call_id": "c", "content": "Action received."})
    played.append(Played(cfg, rec, histories=hist))
tok = AutoTokenizer.from_pretrained(build_tiny_model(pathlib.Path(tempfile.mkdtemp()) / "t"))
per_turn = ("step", "agent-turn", "counterfactual")  # a turn's advantage is its own
for mode, n_groups in (("episode", 1), ("philosopher", 2), *((m, 1) for m in per_turn)):
    adv = turn_advantages(eps, AdvantageSpec(mode, gamma=0.5))
    g = ScoredGroup(played, [e["reward"]["total"] for e in eps], adv.episode, adv.episode_tied,
                    adv.turns, adv.groups, adv.tied)
    tgroups = art_groups(art, [g], mode)
    assert len(tgroups) == n_groups, (mode, len(tgroups))
    if mode in per_turn:
        for t in tgroups[0].trajectories:
            choices = [m for m in t.messages_and_choices if not isinstance(m, dict)]
            assert len(choices) == (0 if t.metadata.get("padding") else 1), t.metadata
    got = sorted(r.advantage for r in tokenize_trajectory_groups(
        tok, tgroups, allow_training_without_logprobs=False, scale_rewards=mode not in per_turn,
        shuffle_group_trajectories=False))
    if mode in per_turn:  # ART, like peft, trains nothing on a zero advantage (agent-turn's singletons)
        want = sorted(a for turns in adv.turns for a in turns if a != 0.0)
    else:  # one trajectory per philosopher: its turns all share one advantage
        want = sorted({(e, t["philosopher"]): a for e, r in enumerate(eps)
                       for t, a in zip(r["turns"], adv.turns[e])}.values())
    assert len(got) == len(want), (mode, got, want)
    assert all(abs(a - b) < 1e-5 for a, b in zip(got, want)), (mode, got, want)
print("ok")
"""


def test_art_receives_exactly_dphils_advantages_in_every_mode():
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=900, check=False, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
