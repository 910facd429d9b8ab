"""Playing many episodes at once with a local model, through the same agent prompts as the API path.

Every philosopher is an agent with its own conversation (the system prompt of
`dphil.agents.prompts`, one observation per round, its own replies), exactly
as `dphil-rollout` builds it for API models. The episodes advance in lockstep
so that every decision of a round, across all tables, goes to the model as one
batch: that is what makes a local model fast enough to train with.

Each played episode comes back as its record (the episode contract, with the
raw reply per turn) and the Decisions behind its turns, which the trainer
reweights. A turn's `latency_s` is the wall time of the batched model call that decided
it, shared by every turn of that batch (not a per-turn time as for API models).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dphil.agents.parsing import parse_reply
from dphil.agents.prompts import Prompt, observation_text
from dphil.agents.tools import tool_specs
from dphil.core.episode import new_table
from dphil.core.protocols import protocol_actions
from dphil.core.records import EpisodeConfig, episode_record
from dphil.core.table import Table
from dphil.local.model import Decision, LocalModel


@dataclass
class Played:
    """One finished episode: its record and, per turn in table order, the decision behind it."""

    config: EpisodeConfig
    record: dict[str, Any]
    decisions: list[Decision] = field(default_factory=list)
    # ART's backend keeps each philosopher's messages and Choices instead of Decisions.
    histories: list[list[Any]] | None = None


def parse_memory(text: str) -> int | None:
    """`--memory` as the number of past exchanges to keep: None for `full`, 0 for `none`, K for `window:K`.

    The text is checked by the API agents' own parser, so both paths accept exactly the same values.
    """
    from dphil.agents.agent import parse_memory as check_memory

    text = check_memory(text)
    if text == "full":
        return None
    if text == "none":
        return 0
    return int(text.partition(":")[2])


class _Seat:
    """One philosopher's conversation."""

    __slots__ = ("exchanges", "system")

    def __init__(self, system: str) -> None:
        self.system = system
        self.exchanges: list[tuple[str, str]] = []

    def messages(self, observation: str, memory: int | None) -> list[dict[str, str]]:
        past = self.exchanges if memory is None else self.exchanges[-memory:] if memory else []
        msgs = [{"role": "system", "content": self.system}]
        for user, assistant in past:
            msgs.append({"role": "user", "content": user})
            msgs.append({"role": "assistant", "content": assistant})
        msgs.append({"role": "user", "content": observation})
        return msgs


def play_episodes(
    configs: Sequence[EpisodeConfig],
    model: LocalModel,
    prompt: Prompt,
    *,
    decode: str = "constrained",
    memory: int | None = None,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    seed: int = 0,
    on_round: Callable[[int], None] | None = None,
) -> list[Played]:
    """Play every episode of `configs` to the end with `model`; return them in the same order.

    `seed` drives the model's sampling (the tables' conflict coins come from
    each config's own seed), so the same call gives the same episodes.
    """
    if not configs:
        return []
    if model.prompt_cache is not None:  # kept from other weights or other episodes: of no use here
        model.prompt_cache.clear()
    tools = decode == "free"
    tables: list[Table] = [new_table(c) for c in configs]
    seats = [
        [_Seat(prompt.system(c.protocol, c.n, i, schedule=c.schedule, tools=tools)) for i in range(c.n)]
        for c in configs
    ]
    decisions: list[list[Decision]] = [[] for _ in configs]
    specs = {c.protocol: tool_specs(c.protocol) for c in configs} if tools else {}
    calls = 0

    def decide(waiting: list[tuple[int, int]]) -> list[tuple[str, Decision, float]]:
        nonlocal calls
        by_protocol: dict[str, list[int]] = {}
        for k, (e, _) in enumerate(waiting):
            by_protocol.setdefault(configs[e].protocol, []).append(k)
        results: list[tuple[str, Decision, float] | None] = [None] * len(waiting)
        for protocol, ks in by_protocol.items():
            actions = protocol_actions(protocol)
            texts, prompts = [], []
            for k in ks:
                e, i = waiting[k]
                obs = observation_text(tables[e].observe(i), tools=tools)
                texts.append(obs)
                prompts.append(model.prompt_ids(seats[e][i].messages(obs, memory), specs.get(protocol)))
            start = time.monotonic()
            got = model.decide(
                prompts,
                actions,
                decode=decode,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                seed=seed * 1_000_003 + calls,
                parse=lambda text, p=protocol: parse_reply(text, None, p).action,
            )
            # Rounded as the API path rounds a call's latency (dphil.agents.llm).
            latency = round(time.monotonic() - start, 4)
            calls += 1
            for k, obs, d in zip(ks, texts, got, strict=True):
                results[k] = (obs, d, latency)
        return results  # type: ignore[return-value]

    def record_turn(e: int, i: int, obs: str, d: Decision, latency: float) -> dict[str, Any]:
        seats[e][i].exchanges.append((obs, d.text))
        decisions[e].append(d)
        # The same reading `parse` gave the action, kept as the API runner keeps it;
        # under constrained decoding the action was chosen, not read.
        parsed = parse_reply(d.text, None, configs[e].protocol)
        extra = {
            "raw": d.text,
            "parsed_via": "constrained" if decode == "constrained" else parsed.via,
            "ignored_tool_calls": [] if decode == "constrained" else parsed.ignored,
            "prompt_tokens": len(d.prompt_ids),
            "completion_tokens": len(d.completion_ids),
            # The wall time of the batched call that decided this turn, shared by all its turns.
            "latency_s": latency,
        }
        if "action_probs" in d.extras:
            extra["action_probs"] = d.extras["action_probs"]
        if d.extras.get("truncated"):
            extra["truncated"] = True
        return extra

    while True:
        live = [e for e, t in enumerate(tables) if not t.over]
        if not live:
            break
        sim = [e for e in live if configs[e].schedule == "simultaneous"]
        seq = [e for e in live if configs[e].schedule != "simultaneous"]
        if sim:
            waiting = [(e, i) for e in sim for i in range(configs[e].n)]
            chosen = decide(waiting)
            per_episode: dict[int, list[tuple[int, str, Decision, float]]] = {}
            for (e, i), (obs, d, latency) in zip(waiting, chosen, strict=True):
                per_episode.setdefault(e, []).append((i, obs, d, latency))
            for e, items in per_episode.items():
                extras = [record_turn(e, i, obs, d, latency) for i, obs, d, latency in items]
                # Turns are recorded in the order they take effect; keep decisions in that order too.
                before = len(tables[e].turns)
                tables[e].play_simultaneous([d.action for _, _, d, _ in items], extras)
                _reorder(decisions[e], tables[e].turns[before:], len(items))
        if seq:
            for i in range(max(configs[e].n for e in seq)):
                waiting = [(e, i) for e in seq if i < configs[e].n]
                for (e, _), (obs, d, latency) in zip(waiting, decide(waiting), strict=True):
                    tables[e].act(i, d.action, record_turn(e, i, obs, d, latency))
            for e in seq:
                tables[e].end_round()
        if on_round is not None:
            on_round(len(live))
    if model.prompt_cache is not None:
        model.prompt_cache.clear()
    return [Played(c, episode_record(c, t), ds) for c, t, ds in zip(configs, tables, decisions, strict=True)]


def _reorder(decisions: list[Decision], turns: list[dict], count: int) -> None:
    """Put the last `count` decisions (in seat order) into the order their turns were recorded."""
    block = decisions[-count:]
    del decisions[-count:]
    decisions.extend(block[t["philosopher"]] for t in turns)
