"""The OpenPipe ART backend (0.5.x): the study's engine, on a local GPU or a hosted trainer.

Facts this follows (read from openpipe-art 0.5.18): `LocalBackend` lives in
`art.local` (`art.LocalBackend` does not import); a model is an
`art.TrainableModel` with LoRA settings in
`_internal_config=art.dev.InternalModelConfig(peft_args=art.dev.PeftArgs(...))`
and is registered with `await model.register(backend)`; sampling goes through
`model.openai_client()` under `model.get_inference_name()` (the bare name
silently hits the base model); training is `await backend.train(model, groups,
learning_rate=...)`; adapters land in
`<path>/<project>/models/<name>/checkpoints/<step:04d>/`. Only `Choice`
objects carrying logprobs are trained, so the returned choice itself is
appended to a trajectory, never a dict copy of it.

ART computes GRPO advantages itself, as reward minus the group mean (over the
standard deviation unless `scale_rewards=False`), so each `--advantage` mode is
handed to it as groups whose ART advantages are exactly dphil's:
* `episode` (the study's): one `art.Trajectory` per philosopher (its whole
  conversation, all with the episode's reward), one `art.TrajectoryGroup` per
  scenario.
* `philosopher`: the same trajectories with each philosopher's own return, one
  group per scenario and seat (ART's normalisation is dphil's per-seat one).
* `step`, `agent-turn`, `counterfactual` (a turn's advantage is its own): one
  trajectory per turn (the conversation up to that reply, earlier
  replies as plain messages so only this one is trained) with the turn's
  advantage as its reward, one group per scenario balanced to mean 0 by a
  trajectory with nothing to train, and `scale_rewards=False`. Episodes are
played through the same table, prompts and reply parser as `dphil-rollout`.
ART and its GPU stack are an optional extra; without them the command says
what to install (exit 69).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dphil.agents.parsing import parse_reply
from dphil.agents.prompts import Prompt, observation_text
from dphil.agents.tools import tool_specs
from dphil.core.episode import new_table
from dphil.core.records import EpisodeConfig, episode_record
from dphil.io.errors import ConfigError, DphilError, MissingExtraError
from dphil.local.play import Played
from dphil.train.advantages import philosopher_returns

FLAVOURS = ("art", "art-serverless", "art-tinker")
INSTALL = {
    "art": "a CUDA GPU and ART's backend extra: pip install 'dphil[art]' 'openpipe-art[backend]==0.5.18'",
    "art-serverless": "pip install 'dphil[art]' and W&B credentials in WANDB_API_KEY",
    "art-tinker": "pip install 'dphil[art]' 'openpipe-art[tinker]==0.5.18' and TINKER_API_KEY",
}
# What each flavour needs beyond `art` itself, checked before anything starts.
NEEDS = {
    "art": ("vllm", "unsloth", "torch"),
    "art-serverless": (),
    "art-tinker": ("tinker", "fastapi"),
}
CREDENTIALS = {"art-serverless": "WANDB_API_KEY", "art-tinker": "TINKER_API_KEY"}


@dataclass(frozen=True)
class ArtSettings:
    base_model: str
    prompt: Prompt
    flavour: str = "art"
    lora_rank: int = 8
    lora_alpha: int = 16
    learning_rate: float = 1e-5
    temperature: float = 1.0
    max_new_tokens: int = 256
    memory: int | None = None
    path: str = ".art"
    project: str = "dphil"
    run: str = "run"
    max_exceptions: int = 0
    advantage: str = "episode"  # --advantage: how train_groups hands credit to ART


def import_art(flavour: str) -> Any:
    """The `art` module, or MissingExtraError saying what `flavour` needs."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown ART backend {flavour!r}")
    # litellm (pulled in by ART) otherwise stalls fetching a price list on offline machines.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    missing = [m for m in ("art", *NEEDS[flavour]) if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtraError(f"--backend {flavour} needs {', '.join(missing)}: {INSTALL[flavour]}")
    import art

    return art


def episode_trajectories(
    art: Any, config: EpisodeConfig, histories: Sequence[list[Any]], reward: float, tools: Any
) -> list[Any]:
    """One Trajectory per philosopher: its messages and Choices, all with the episode's reward."""
    return [
        art.Trajectory(
            messages_and_choices=list(history),
            tools=tools,
            reward=reward,
            metadata={
                "episode_id": config.episode_id,
                "philosopher": i,
                "n": config.n,
                "seed": config.seed,
            },
        )
        for i, history in enumerate(histories)
    ]


def scenario_group(art: Any, trajectories_per_episode: Sequence[list[Any]], scenario: str) -> Any:
    """One TrajectoryGroup per scenario, holding every philosopher of every episode of it."""
    return art.TrajectoryGroup(
        [t for episode in trajectories_per_episode for t in episode],
        metadata={"scenario": scenario},
    )


def seat_groups(art: Any, trajectories_per_episode: Sequence[list[Any]], scenario: str) -> list[Any]:
    """One TrajectoryGroup per seat: philosopher i of every episode of the scenario."""
    seats = len(trajectories_per_episode[0])
    return [
        art.TrajectoryGroup(
            [episode[i] for episode in trajectories_per_episode],
            metadata={"scenario": scenario, "philosopher": i},
        )
        for i in range(seats)
    ]


def turn_trajectories(
    art: Any,
    config: EpisodeConfig,
    histories: Sequence[list[Any]],
    turns: Sequence[dict[str, Any]],
    advantages: Sequence[float],
    tools: Any,
) -> list[Any]:
    """One Trajectory per turn: the conversation up to its reply, rewarded with its advantage.

    Earlier replies of the philosopher become plain assistant messages, so the
    turn's own Choice is the only one ART trains on. Turn t of philosopher i is
    its t-th Choice (one reply per round).
    """
    out = []
    for turn, adv in zip(turns, advantages, strict=True):
        i, want = turn["philosopher"], turn["round"]
        messages: list[Any] = []
        seen = 0
        for m in histories[i]:
            if isinstance(m, dict):
                messages.append(m)
                continue
            seen += 1
            if seen == want:
                messages.append(m)
                break
            messages.append(choice_message(m))
        else:
            raise ValueError(f"philosopher {i} has no reply for round {want}")
        out.append(
            art.Trajectory(
                messages_and_choices=messages,
                tools=tools,
                reward=adv,
                metadata={
                    "episode_id": config.episode_id,
                    "philosopher": i,
                    "round": want,
                    "n": config.n,
                    "seed": config.seed,
                },
            )
        )
    return out


def balanced_group(art: Any, trajectories: list[Any], scenario: str) -> Any:
    """A group whose rewards are used as advantages: a trajectory with no reply makes the mean 0.

    ART subtracts the group mean from each reward; the extra trajectory (a lone
    user message, which ART does not train on) carries minus the sum, so with
    `scale_rewards=False` every trained trajectory's ART advantage is its reward.
    """
    pad = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "(balances the group mean)"}],
        reward=-sum(t.reward for t in trajectories),
        metadata={"scenario": scenario, "padding": True},
    )
    return art.TrajectoryGroup([*trajectories, pad], metadata={"scenario": scenario})


def art_groups(art: Any, groups: Sequence[Any], mode: str) -> list[Any]:
    """The step's TrajectoryGroups for ART, for one `--advantage` mode (see the module doc)."""
    try:
        build = ART_GROUPS[mode]
    except KeyError:
        raise ValueError(f"the ART backend has no trajectory groups for advantage mode {mode!r}") from None
    out: list[Any] = []
    for g in groups:
        if g.episodes:
            scenario = f"{g.episodes[0].config.seed}"
            out.extend(build(art, g, scenario, tool_specs(g.episodes[0].config.protocol)))
    return out


def _episode_groups(art: Any, g: Any, scenario: str, tools: Any) -> list[Any]:
    per_episode = [
        episode_trajectories(art, ep.config, ep.histories, r, tools)
        for ep, r in zip(g.episodes, g.rewards, strict=True)
    ]
    return [scenario_group(art, per_episode, scenario)]


def _philosopher_groups(art: Any, g: Any, scenario: str, tools: Any) -> list[Any]:
    per_episode = [
        [
            art.Trajectory(
                messages_and_choices=list(h),
                tools=tools,
                reward=ret,
                metadata={
                    "episode_id": ep.config.episode_id,
                    "philosopher": i,
                    "n": ep.config.n,
                    "seed": ep.config.seed,
                },
            )
            for i, (h, ret) in enumerate(zip(ep.histories, philosopher_returns(ep.record), strict=True))
        ]
        for ep in g.episodes
    ]
    return list(seat_groups(art, per_episode, scenario))


def _turn_groups(art: Any, g: Any, scenario: str, tools: Any) -> list[Any]:
    trajectories = [
        t
        for ep, advs in zip(g.episodes, g.turn_advantages, strict=True)
        for t in turn_trajectories(art, ep.config, ep.histories, ep.record["turns"], advs, tools)
    ]
    return [balanced_group(art, trajectories, scenario)]


# How each credit mode (`dphil.train.advantages.MODES`) becomes ART trajectory groups; a mode
# missing here fails loudly in `art_groups`, and a test holds the keys to MODES.
ART_GROUPS = {
    "episode": _episode_groups,
    "philosopher": _philosopher_groups,
    "step": _turn_groups,
    "agent-turn": _turn_groups,
    "counterfactual": _turn_groups,
}


def choice_message(choice: Any) -> dict[str, Any]:
    """The assistant message an API call must see for a past Choice (history sent back)."""
    msg = choice.message
    out: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in msg.tool_calls
        ]
    return out


class ArtBackend:
    """Training through ART: rollouts against its inference server, `backend.train` per step."""

    def __init__(self, settings: ArtSettings, *, resume_from: str | None = None) -> None:
        self.settings = settings
        self.name = settings.flavour
        var = CREDENTIALS.get(settings.flavour)
        if var and not os.environ.get(var):
            raise ConfigError(f"--backend {settings.flavour} needs {var} in the environment")
        # Importing art patches transformers process-wide, so it happens only here.
        self.art = import_art(settings.flavour)
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._start())

    async def _start(self) -> None:
        art, s = self.art, self.settings
        if s.flavour == "art":
            from art.local import LocalBackend

            self.backend = LocalBackend(path=s.path)
        elif s.flavour == "art-tinker":
            from art.tinker import TinkerBackend

            self.backend = TinkerBackend(path=s.path)  # key from TINKER_API_KEY, never passed
        else:
            self.backend = art.ServerlessBackend()
        self.model = art.TrainableModel(
            name=s.run,
            project=s.project,
            base_model=s.base_model,
            _internal_config=art.dev.InternalModelConfig(
                peft_args=art.dev.PeftArgs(r=s.lora_rank, lora_alpha=s.lora_alpha)
            ),
        )
        await self.model.register(self.backend)
        self.client = self.model.openai_client()

    @property
    def model_name(self) -> str:
        return f"art:{self.settings.base_model}"

    def policy_variant(self) -> dict[str, Any]:
        s = self.settings
        return {
            "decode": "free",
            "temperature": s.temperature,
            "prompt": s.prompt.name,
            "prompt_version": s.prompt.version,
        }

    # -- rollouts --------------------------------------------------------------------------
    def rollout(self, configs: Sequence[EpisodeConfig], *, seed: int) -> list[Played]:
        return self.loop.run_until_complete(self._rollout(configs))

    async def _rollout(self, configs: Sequence[EpisodeConfig]) -> list[Played]:
        results = await asyncio.gather(*(self._episode(c) for c in configs), return_exceptions=True)
        played = []
        failures = 0
        for c, r in zip(configs, results, strict=True):
            if isinstance(r, BaseException):
                if isinstance(r, (KeyboardInterrupt, asyncio.CancelledError)):
                    raise r
                failures += 1
                if failures > self.settings.max_exceptions:
                    raise DphilError(f"ART rollout failed: {type(r).__name__}: {r}") from r
                table = new_table(c)
                played.append(Played(c, episode_record(c, table, status="error", error=str(r))))
            else:
                played.append(r)
        return played

    async def _episode(self, config: EpisodeConfig) -> Played:
        s = self.settings
        table = new_table(config)
        tools = tool_specs(config.protocol)
        histories: list[list[Any]] = [
            [
                {
                    "role": "system",
                    "content": s.prompt.system(config.protocol, config.n, i, schedule=config.schedule, tools=True),
                }
            ]
            for i in range(config.n)
        ]
        name = self.model.get_inference_name()

        async def turn(i: int) -> tuple[str | None, dict[str, Any]]:
            obs = observation_text(table.observe(i), tools=True)
            histories[i].append({"role": "user", "content": obs})
            messages = [m if isinstance(m, dict) else choice_message(m) for m in histories[i]]
            if s.memory is not None:
                messages = messages[:1] + messages[1:][-(2 * s.memory + 1) :]
            response = await self.client.chat.completions.create(
                model=name,
                messages=messages,
                tools=tools,
                temperature=s.temperature,
                max_completion_tokens=s.max_new_tokens,
                logprobs=True,
            )
            choice = response.choices[0]
            histories[i].append(choice)  # the Choice itself: ART trains only on Choices
            parsed = parse_reply(choice.message.content, choice.message.tool_calls, config.protocol)
            for call in choice.message.tool_calls or []:
                histories[i].append({"role": "tool", "tool_call_id": call.id, "content": "Action received."})
            return parsed.action, {"raw": choice.message.content, "tool_call": parsed.tool_call}

        while not table.over:
            if config.schedule == "simultaneous":
                got = await asyncio.gather(*(turn(i) for i in range(config.n)))
                table.play_simultaneous([a for a, _ in got], [x for _, x in got])
            else:
                for i in range(config.n):
                    action, extra = await turn(i)
                    table.act(i, action, extra)
                table.end_round()
        return Played(config, episode_record(config, table), histories=histories)

    # -- training --------------------------------------------------------------------------
    def train_groups(self, groups: Sequence[Any], *, step: int) -> dict[str, float]:
        mode = self.settings.advantage
        tgroups = art_groups(self.art, groups, mode)
        # Per-turn groups carry dphil's advantages as rewards: ART must not rescale them.
        extra: dict[str, Any] = {"scale_rewards": False} if ART_GROUPS.get(mode) is _turn_groups else {}
        self.loop.run_until_complete(
            self.backend.train(self.model, tgroups, learning_rate=self.settings.learning_rate, **extra)
        )
        return {"trajectory_groups": float(len(tgroups))}

    def save(self, directory: Path, *, step: int) -> str:
        """ART saves its own checkpoints; report where this step's adapter is."""
        s = self.settings
        return str(Path(s.path) / s.project / "models" / s.run / "checkpoints" / f"{step:04d}")

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                self.loop.run_until_complete(result)
        self.loop.close()
