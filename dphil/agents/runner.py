"""Playing episodes with language-model philosophers, many at once.

Everything is async: under the `simultaneous` schedule the N calls of a round
go out together, under `sequential` one after another; across episodes the
shared `Gateway` bounds the calls in flight. A call that fails for good ends
its episode with `status: "error"` and the reason; `run_models` counts those,
stops the run after `max_errors` of them, and stops starting new episodes once
`cost_limit` is spent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dphil.agents.agent import Agent, AgentSettings
from dphil.agents.llm import Completion, Gateway, LLMCallError
from dphil.agents.prompts import followup_text, observation_text
from dphil.agents.registry import ModelSpec
from dphil.agents.tools import tool_specs
from dphil.core.episode import new_table
from dphil.core.records import EpisodeConfig, episode_record
from dphil.io.errors import EX_UNAVAILABLE, DphilError


@dataclass
class Usage:
    """Token, cost and call totals of an episode (or a run)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    calls: int = 0
    cached_tokens: int | None = None  # prompt tokens the server took from its cache, where it says

    def add(self, c: Completion) -> None:
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens
        self.cost += c.cost
        self.calls += 1
        self.add_cached(c.cached_tokens)

    def add_cached(self, tokens: int | None) -> None:
        if tokens is not None:
            self.cached_tokens = (self.cached_tokens or 0) + tokens

    @property
    def cache_hit_rate(self) -> float | None:
        """Cached prompt tokens / prompt tokens, over the calls whose server reports its cache."""
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": round(self.cost, 8),
            "calls": self.calls,
        }
        if self.cached_tokens is not None:
            out["cached_tokens"] = self.cached_tokens
        return out


def model_variant(spec: ModelSpec, settings: AgentSettings) -> dict[str, Any]:
    """The settings that enter an LLM episode's id and record, beyond the table's."""
    return {**spec.identity(), **settings.variant()}


# How much of a reply's text a record keeps (the whole reply, up to --max-reply-bytes, is parsed).
MAX_RAW_CHARS = 64 * 1024


def _kept(field: str, text: str | None) -> dict[str, Any]:
    """`{field: text}`, cut to MAX_RAW_CHARS with `{field}_truncated: true` when it was longer."""
    if text is not None and len(text) > MAX_RAW_CHARS:
        return {field: text[:MAX_RAW_CHARS], f"{field}_truncated": True}
    return {field: text}


def _call_extras(c: Completion) -> dict[str, Any]:
    extras: dict[str, Any] = {
        "usage": c.usage,
        "latency_s": c.latency_s,
        "retries": c.retries,
        "cost": round(c.cost, 8),
    }
    if c.server is not None:
        extras["server"] = c.server
    return extras


class Episode:
    """One episode in play: the table, its agents and what their calls used."""

    def __init__(
        self,
        config: EpisodeConfig,
        spec: ModelSpec,
        settings: AgentSettings,
        gateway: Gateway,
        *,
        first_slot: int | None = None,
    ) -> None:
        self.config = config
        # On a server dphil started, philosopher i always talks to slot first_slot + i, which
        # keeps its conversation's prompt cached from one round to the next.
        self.first_slot = first_slot
        self.spec = spec
        self.settings = settings
        self.gateway = gateway
        self.table = new_table(config)
        self.usage = Usage()
        self.tools = tool_specs(config.protocol) if spec.tools else None
        prompt = settings.prompt
        self.agents = [
            Agent(
                i,
                prompt.system(config.protocol, config.n, i, schedule=config.schedule, tools=spec.tools),
                config.protocol,
                memory=settings.memory,
                tools=spec.tools,
            )
            for i in range(config.n)
        ]
        # This round's messages in the order written, and how many each seat has read.
        self.board: list[dict[str, Any]] = []
        self.read = [0] * config.n
        self.talked: list[list[dict[str, Any]]] = [[] for _ in range(config.n)]

    async def _call(self, i: int, messages: list[dict[str, Any]], *, talk: bool) -> Completion:
        completion = await self.gateway.complete(
            self.spec,
            messages,
            tools=self.tools,
            tool_choice=("none" if talk else self.spec.tool_choice) if self.tools else None,
            slot=None if self.first_slot is None else self.first_slot + i,
        )
        self.usage.add(completion)
        return completion

    def _unread(self, i: int) -> list[dict[str, Any]]:
        n = self.config.n
        neighbours = {(i - 1) % n, (i + 1) % n}
        new = [m for m in self.board[self.read[i] :] if m["from"] in neighbours and m["text"]]
        self.read[i] = len(self.board)
        return new

    def _prompt(self, i: int, *, first: bool, talk: tuple[int, int] | None) -> str:
        """The round's first prompt shows the table; later ones (after talking) only news,
        except under `sequential`, where the table has moved since and is shown again."""
        messages = self._unread(i)
        if first or (talk is None and self.config.schedule == "sequential"):
            extras = {"messages": messages, "talk": talk}
            return observation_text(self.table.observe(i), extras, tools=self.spec.tools)
        return followup_text(i, self.config.n, messages, tools=self.spec.tools, talk=talk)

    async def _talk_one(self, i: int, k: int, first: bool) -> dict[str, Any]:
        agent = self.agents[i]
        text = self._prompt(i, first=first, talk=(k, self.settings.talk))
        completion = await self._call(i, agent.ask(text), talk=True)
        message = agent.heard(completion.content)
        entry = {"text": message, **_kept("raw", completion.content), **_call_extras(completion)}
        self.talked[i].append(entry)
        return {"from": i, "text": message}

    async def _talk(self) -> None:
        """K steps of messages to the neighbours before anyone acts, delivered in order."""
        n, steps = self.config.n, self.settings.talk
        for k in range(1, steps + 1):
            if self.config.schedule == "simultaneous":
                # Written at the same time: nobody sees another's message of the same step.
                written = await _all([self._talk_one(i, k, k == 1) for i in range(n)])
                self.board.extend(written)
            else:
                for i in range(n):
                    self.board.append(await self._talk_one(i, k, k == 1))

    async def _decide(self, i: int) -> tuple[str | None, dict[str, Any]]:
        agent = self.agents[i]
        text = self._prompt(i, first=not self.settings.talk, talk=None)
        completion = await self._call(i, agent.ask(text), talk=False)
        parsed = agent.answered(completion.content, completion.tool_calls)
        extra: dict[str, Any] = {
            **_kept("raw", parsed.raw),
            "tool_call": _public_call(parsed.tool_call),
            "ignored_tool_calls": [_public_call(c) for c in parsed.ignored],
            "parsed_via": parsed.via,
            **_call_extras(completion),
        }
        if completion.reasoning:
            extra.update(_kept("reasoning", completion.reasoning))
        if self.settings.talk:
            extra["talk"] = self.talked[i]
        return parsed.action, extra

    async def play(self) -> dict[str, Any]:
        """Play to the end and return the record (status `error` if a call failed for good)."""
        table = self.table
        n = self.config.n
        try:
            while not table.over:
                self.board = []
                self.read = [0] * n
                self.talked = [[] for _ in range(n)]
                if self.settings.talk:
                    await self._talk()
                if self.config.schedule == "simultaneous":
                    decided = await _all([self._decide(i) for i in range(n)])
                    table.play_simultaneous([a for a, _ in decided], [e for _, e in decided])
                    by_seat = {t["philosopher"]: t for t in table.turns[-n:]}
                    for i in range(n):
                        self.agents[i].outcome(by_seat[i])
                else:
                    for i in range(n):
                        action, extra = await self._decide(i)
                        self.agents[i].outcome(table.act(i, action, extra))
                    table.end_round()
        except LLMCallError as e:
            record = episode_record(self.config, table, status="error", error=e.reason)
        else:
            record = episode_record(self.config, table)
        record["usage"] = self.usage.as_dict()
        return record


def _public_call(call: dict[str, Any] | None) -> dict[str, Any] | None:
    if call is None:
        return None
    return {"name": call.get("name"), "arguments": call.get("arguments")}


async def _all(coros: list[Any]) -> list[Any]:
    """Run together; on the first failure cancel the rest (their calls would be wasted)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def play_episode(
    config: EpisodeConfig,
    spec: ModelSpec,
    settings: AgentSettings,
    gateway: Gateway,
    *,
    first_slot: int | None = None,
) -> dict[str, Any]:
    """Play one episode with model philosophers and return its record."""
    return await Episode(config, spec, settings, gateway, first_slot=first_slot).play()


# -- a whole run ----------------------------------------------------------------------------


class TooManyErrors(DphilError):
    """`--max-errors` reached: the provider keeps failing, so the run stops (exit 69)."""

    exit_code = EX_UNAVAILABLE


@dataclass
class ModelRunStats:
    """What a model run did: episodes written, errored, skipped, and what it used."""

    written: int = 0
    errors: int = 0
    skipped_done: int = 0
    not_started: int = 0
    usage: Usage = field(default_factory=Usage)
    last_error: str | None = None


async def run_models_async(
    configs: Iterable[EpisodeConfig],
    specs: dict[str, ModelSpec],
    settings: AgentSettings,
    write: Callable[[dict[str, Any]], None],
    *,
    gateway: Gateway,
    done: set[str] | None = None,
    max_errors: int | None = None,
    cost_limit: float | None = None,
    progress: Callable[[dict[str, Any] | None, ModelRunStats], None] | None = None,
    stats: ModelRunStats | None = None,
    episodes: int | None = None,
) -> ModelRunStats:
    """Play every config not in `done`, writing each record as it finishes.

    Episodes start in grid order; enough run at once to keep the gateway's
    concurrency busy (or `episodes` at once, when given). `progress(record, stats)`
    is called after each one (record None for a skipped one). An episode of a model
    whose server dphil started (`spec.lane_slots`) gets a lane of its own: seat i
    calls slot lane * lane_slots + i, which no other episode in flight uses.
    """
    stats = stats or ModelRunStats()
    limit = max(1, episodes or gateway.limits.concurrency)
    free_lanes = list(range(limit - 1, -1, -1))
    lanes: dict[asyncio.Task[dict[str, Any]], int] = {}
    running: set[asyncio.Task[dict[str, Any]]] = set()
    pending = iter(configs)
    exhausted = False

    def finish(task: asyncio.Task[dict[str, Any]]) -> None:
        free_lanes.append(lanes.pop(task))
        record = task.result()
        write(record)
        stats.written += 1
        u = record.get("usage", {})
        stats.usage.prompt_tokens += u.get("prompt_tokens", 0)
        stats.usage.completion_tokens += u.get("completion_tokens", 0)
        stats.usage.cost += u.get("cost", 0.0)
        stats.usage.calls += u.get("calls", 0)
        stats.usage.add_cached(u.get("cached_tokens"))
        if record["status"] == "error":
            stats.errors += 1
            stats.last_error = record.get("error")
        if progress is not None:
            progress(record, stats)

    try:
        while True:
            while not exhausted and len(running) < limit:
                if max_errors is not None and stats.errors >= max_errors:
                    break
                if cost_limit is not None and stats.usage.cost >= cost_limit:
                    break
                config = next(pending, None)
                if config is None:
                    exhausted = True
                    break
                if done and config.episode_id in done:
                    stats.skipped_done += 1
                    if progress is not None:
                        progress(None, stats)
                    continue
                spec = specs[config.model]
                lane = free_lanes.pop()
                first = lane * spec.lane_slots if spec.lane_slots else None
                task = asyncio.ensure_future(play_episode(config, spec, settings, gateway, first_slot=first))
                lanes[task] = lane
                running.add(task)
            if not running:
                break
            finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                finish(task)
            if max_errors is not None and stats.errors >= max_errors:
                raise TooManyErrors(
                    f"stopped after {stats.errors} errored episode(s) (--max-errors "
                    f"{max_errors}); last error: {stats.last_error}"
                )
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    if not exhausted:
        stats.not_started = sum(1 for c in pending if not (done and c.episode_id in done))
    return stats


def run_models(
    configs: Iterable[EpisodeConfig],
    specs: dict[str, ModelSpec],
    settings: AgentSettings,
    write: Callable[[dict[str, Any]], None],
    *,
    limits: Any = None,
    **kwargs: Any,
) -> ModelRunStats:
    """Synchronous entry point for commands: one event loop for the whole run."""
    from dphil.agents.limits import Limits

    async def main() -> ModelRunStats:
        gateway = Gateway(limits or Limits())
        return await run_models_async(configs, specs, settings, write, gateway=gateway, **kwargs)

    return asyncio.run(main())


@dataclass
class ModelPlan:
    """The model side of a rollout: a spec per model name, the agents' settings, and the
    per-model variant fields that enter each episode's id."""

    specs: dict[str, ModelSpec]
    settings: AgentSettings
    variants: dict[str, dict[str, Any]]


def plan_models(
    models: Iterable[str],
    *,
    registry_files: Iterable[str] = (),
    prompt: str = "default",
    prompt_file: str | None = None,
    memory: str = "full",
    talk: int = 0,
) -> ModelPlan:
    """Resolve model names through the registry and fix the prompt, memory and talk settings.

    Reads only TOML and the prompt file: litellm is not imported here.
    """
    from dphil.agents.agent import parse_memory
    from dphil.agents.prompts import get_prompt
    from dphil.agents.registry import Registry

    settings = AgentSettings(get_prompt(prompt, prompt_file), memory=parse_memory(memory), talk=talk)
    registry = Registry.load(registry_files)
    specs = {m: registry.resolve(m) for m in models}
    return ModelPlan(specs, settings, {m: model_variant(spec, settings) for m, spec in specs.items()})
