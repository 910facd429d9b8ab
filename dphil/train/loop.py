"""The GRPO training loop: scenarios, groups, scoring, one update and one checkpoint per step.

Each step samples `groups` scenarios (a table size and a seed); each scenario
is played `group_size` times with the current adapter; every episode is scored
with the same code as `dphil-score`; advantages are relative to the group; the
backend takes one optimiser step and saves the adapter. A `kind: "checkpoint"`
record per step goes to stdout and to the run directory's journal.

The run directory (`dphil.train.run_dir`) makes a run resumable. Scenario
seeds and sampling seeds are derived from the base seed and the step, so a
resumed run plays exactly the scenarios an uninterrupted one would have.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dphil import __version__
from dphil.core.records import SCHEMA_VERSION, EpisodeConfig
from dphil.io.jsonl import RecordWriter
from dphil.local.play import Played
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import score_record
from dphil.train.advantages import AdvantageSpec, turn_advantages
from dphil.train.curriculum import Curriculum
from dphil.train.run_dir import (
    STEPS_DIR,
    _append_journal,
    check_settings,
    load_journal,
    path_in_run,
    resume_adapter,
    step_dir,
)


class Backend(Protocol):
    """What the loop needs from a training engine (peft, art, ...)."""

    name: str

    @property
    def model_name(self) -> str: ...

    def policy_variant(self) -> dict[str, Any]: ...

    def rollout(self, configs: Sequence[EpisodeConfig], *, seed: int) -> list[Played]: ...

    def train_groups(self, groups: list[ScoredGroup], *, step: int) -> dict[str, float]: ...

    def save(self, directory: Path, *, step: int) -> str: ...

    def close(self) -> None: ...


@dataclass
class ScoredGroup:
    """The episodes of one scenario, their rewards and advantages (per episode and per turn)."""

    episodes: list[Played]
    rewards: list[float]
    advantages: list[float]
    zero_std: bool
    # One advantage per turn of each episode (aligned with its record's turns and decisions),
    # from the run's --advantage mode; comparison groups and those whose returns all tied.
    turn_advantages: list[list[float]] = field(default_factory=list)
    advantage_groups: int = 0
    advantage_tied: int = 0


@dataclass
class TrainConfig:
    """The settings of one training run (the identity part is checked on resume)."""

    base_model: str
    run_dir: Path
    run: str
    backend: str = "peft"
    lora_rank: int = 8
    lora_alpha: int = 16
    learning_rate: float = 1e-5
    steps: int = 16
    groups: int = 2
    group_size: int = 3
    rounds: int = 5
    protocol: str = "paper"
    schedule: str = "simultaneous"
    conflict: str = "random"
    deadlock_mode: str = "terminal"
    reward: RewardSpec = field(default_factory=RewardSpec)
    curriculum: Curriculum = field(default_factory=lambda: Curriculum("fixed", (((5,), None),)))
    seed: int = 0
    scale_advantages: bool = True
    advantage: AdvantageSpec = field(default_factory=AdvantageSpec)
    val_every: int = 0
    val_seeds: tuple[int, ...] = ()
    val_sizes: tuple[int, ...] = ()
    policy: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """Settings that a resumed run must share with the run it continues."""
        return {
            "base_model": self.base_model,
            "backend": self.backend,
            "lora_rank": self.lora_rank,
            "lora_alpha": self.lora_alpha,
            "groups": self.groups,
            "group_size": self.group_size,
            "rounds": self.rounds,
            "protocol": self.protocol,
            "schedule": self.schedule,
            "conflict": self.conflict,
            "deadlock_mode": self.deadlock_mode,
            "reward": asdict(self.reward),
            "curriculum": _curriculum_json(self.curriculum),
            "seed": self.seed,
            "policy": self.policy,
            "advantage": self.advantage.as_record(),
        }


@dataclass
class Progress:
    """Where the loop reports: records out, episodes out, messages."""

    emit: Callable[[dict[str, Any]], None]
    episodes: RecordWriter | None = None
    say: Callable[[str], None] = lambda _m: None


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from a tuple of values, stable across Python versions and machines."""
    blob = json.dumps(parts, separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "big") & 0x7FFFFFFF


def default_val_seeds(base_seed: int, count: int) -> tuple[int, ...]:
    return tuple(derive_seed("val", base_seed, k) for k in range(count))


# -- the loop ---------------------------------------------------------------------------------


def run_training(cfg: TrainConfig, make_backend: Callable[[str | None], Backend], progress: Progress) -> int:
    """Train from the last committed step to `cfg.steps`; return how many steps were run."""
    run_id = check_settings(cfg)
    journal = load_journal(cfg.run_dir)
    last = journal[-1]["step"] if journal else 0
    if last >= cfg.steps:
        progress.say(f"{cfg.run}: already at step {last} of {cfg.steps}; nothing to do")
        return 0
    state = journal[-1]["curriculum_state"] if journal else cfg.curriculum.initial_state()
    # From this directory's own adapter, wherever the directory is now: never from the
    # path the journal recorded (relative to another working directory, or moved away).
    resume_from = resume_adapter(cfg.run_dir, journal[-1]) if journal else None
    # Anything saved after the last committed step is from an interrupted step: drop it.
    stale = cfg.run_dir / STEPS_DIR
    if stale.exists():
        for d in stale.iterdir():
            if d.is_dir() and d.name.isdigit() and int(d.name) > last:
                shutil.rmtree(d)
    if journal:
        progress.say(f"{cfg.run}: resuming after step {last} from {resume_from}")
    backend = make_backend(resume_from)
    val_set = set(cfg.val_seeds)
    ran = 0
    try:
        for step in range(last + 1, cfg.steps + 1):
            started = time.monotonic()
            sizes = cfg.curriculum.sizes(step, state)
            configs, seeds = _train_configs(cfg, backend, step, sizes, val_set)
            played = backend.rollout(configs, seed=derive_seed("sample", cfg.seed, step))
            phases = {"rollout": time.monotonic() - started}
            groups = _score_groups(cfg, played)
            stats = backend.train_groups(groups, step=step)
            phases["train"] = time.monotonic() - started - sum(phases.values())
            path = os.path.abspath(backend.save(step_dir(cfg.run_dir, step), step=step))
            phases["save"] = time.monotonic() - started - sum(phases.values())
            record = _checkpoint_record(cfg, backend, step, path, sizes, seeds, groups, stats, state, run_id)
            record["phase_seconds"] = {k: round(v, 3) for k, v in phases.items()}
            if hasattr(backend, "arithmetic"):  # peft: the dtype, autocast and layout of the step
                record["arithmetic"] = backend.arithmetic()
            episodes = [ep.record for g in groups for ep in g.episodes]
            if cfg.val_every and (step % cfg.val_every == 0 or step == cfg.steps):
                val_eps = _validate(cfg, backend, step, path)
                record.update(_summary("val", val_eps))
                record["val_n"] = list(cfg.val_sizes)
                record["val_reward_by_n"] = {
                    str(n): _mean([e["reward"]["total"] for e in val_eps if e["n"] == n]) for n in cfg.val_sizes
                }
                episodes.extend(val_eps)
            state = cfg.curriculum.advance(state, record["train_reward"])
            record["curriculum_state"] = state
            record["seconds"] = round(time.monotonic() - started, 3)
            if progress.episodes is not None:
                for e in episodes:
                    progress.episodes.write(e)
                progress.episodes.flush()
            _append_journal(cfg.run_dir, record)  # the step is now committed
            progress.emit(record)
            progress.say(_progress_line(record, cfg.steps))
            ran += 1
    finally:
        backend.close()
    return ran


def _train_configs(
    cfg: TrainConfig, backend: Backend, step: int, sizes: tuple[int, ...], val_set: set[int]
) -> tuple[list[EpisodeConfig], list[int]]:
    configs, seeds = [], []
    prev = step - 1
    adapter = os.path.abspath(step_dir(cfg.run_dir, prev)) if prev else None
    for g in range(cfg.groups):
        n = sizes[g % len(sizes)]
        k = 0
        seed = derive_seed("train", cfg.seed, step, g, k)
        while seed in val_set:  # held-out scenarios are never trained on
            k += 1
            seed = derive_seed("train", cfg.seed, step, g, k)
        seeds.append(seed)
        for j in range(cfg.group_size):
            configs.append(
                _episode_config(
                    cfg,
                    backend,
                    n,
                    seed,
                    {
                        "adapter": adapter,
                        "run": cfg.run,
                        "split": "train",
                        "train_step": step,
                        "checkpoint_step": prev,
                        "group": g,
                        "sample": j,
                    },
                )
            )
    return configs, seeds


def _episode_config(cfg: TrainConfig, backend: Backend, n: int, seed: int, tags: dict[str, Any]) -> EpisodeConfig:
    """An episode of this run on the table configured for it, tagged with where it belongs."""
    return EpisodeConfig(
        model=backend.model_name,
        n=n,
        rounds=cfg.rounds,
        seed=seed,
        protocol=cfg.protocol,
        schedule=cfg.schedule,
        conflict=cfg.conflict,
        deadlock_mode=cfg.deadlock_mode,
        variant={**backend.policy_variant(), **tags},
    )


def _score_groups(cfg: TrainConfig, played: list[Played]) -> list[ScoredGroup]:
    groups: list[ScoredGroup] = []
    for g in range(cfg.groups):
        members = played[g * cfg.group_size : (g + 1) * cfg.group_size]
        ok = []
        for ep in members:
            score_record(ep.record, cfg.reward)
            if ep.record["status"] == "complete":
                ok.append(ep)
        rewards = [ep.record["reward"]["total"] for ep in ok]
        if not ok:
            groups.append(ScoredGroup(members, [], [], True))
            continue
        adv = turn_advantages([ep.record for ep in ok], cfg.advantage, scale=cfg.scale_advantages)
        groups.append(
            ScoredGroup(
                ok,
                rewards,
                adv.episode,
                adv.episode_tied,
                adv.turns,
                adv.groups,
                adv.tied,
            )
        )
    return groups


def _validate(cfg: TrainConfig, backend: Backend, step: int, path: str) -> list[dict[str, Any]]:
    configs = [
        _episode_config(
            cfg, backend, n, seed, {"adapter": path, "run": cfg.run, "split": "val", "checkpoint_step": step}
        )
        for n in cfg.val_sizes
        for seed in cfg.val_seeds
    ]
    # The same sampling seed at every step: checkpoints are compared on common random numbers.
    played = backend.rollout(configs, seed=derive_seed("val-sample", cfg.seed))
    out = []
    for ep in played:
        out.append(score_record(ep.record, cfg.reward))
    return out


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _std(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _summary(prefix: str, episodes: list[dict[str, Any]]) -> dict[str, Any]:
    done = [e for e in episodes if e["status"] == "complete"]
    rewards = [e["reward"]["total"] for e in done]
    return {
        f"{prefix}_reward": _mean(rewards),
        f"{prefix}_reward_std": _std(rewards),
        f"{prefix}_deadlock_rate": _mean([1.0 if e["deadlock"] else 0.0 for e in done]),
        f"{prefix}_meals_mean": _mean([sum(e["meals"]) for e in done]),
        f"{prefix}_episodes": len(done),
        f"{prefix}_errors": len(episodes) - len(done),
    }


def _checkpoint_record(
    cfg: TrainConfig,
    backend: Backend,
    step: int,
    path: str,
    sizes: tuple[int, ...],
    seeds: list[int],
    groups: list[ScoredGroup],
    stats: dict[str, float],
    state: dict,
    run_id: str | None = None,
) -> dict[str, Any]:
    episodes = [ep.record for g in groups for ep in g.episodes]
    inner = path_in_run(cfg.run_dir, path)
    record: dict[str, Any] = {
        "kind": "checkpoint",
        "schema_version": SCHEMA_VERSION,
        "run": cfg.run,
        "step": step,
        # Where the adapter is: `path` absolute as saved; `path_in_run` inside the run
        # directory, which readers find from the record's file by `run_id` even after a move
        # (dphil.checkpoints.record.adapter_path).
        "path": path,
        **({"path_in_run": inner} if inner is not None else {}),
        "run_dir": os.path.abspath(cfg.run_dir),
        **({"run_id": run_id} if run_id is not None else {}),
        "base_model": cfg.base_model,
        "lora_rank": cfg.lora_rank,
        "lora_alpha": cfg.lora_alpha,
        "backend": backend.name,
        "n": list(sizes),
        "rounds": cfg.rounds,
        "protocol": cfg.protocol,
        "schedule": cfg.schedule,
        "reward_variant": cfg.reward.variant,
        "reward_weights": cfg.reward.weights,
        "learning_rate": cfg.learning_rate,
        "groups": cfg.groups,
        "group_size": cfg.group_size,
        "train_seeds": seeds,
        **_summary("train", episodes),
        "zero_std_groups": sum(1 for g in groups if g.zero_std),
        "advantage": cfg.advantage.as_record(),
        "advantage_groups": sum(g.advantage_groups for g in groups),
        "advantage_tied_groups": sum(g.advantage_tied for g in groups),
        **{k: v for k, v in stats.items()},
        "curriculum": cfg.curriculum.kind,
        "dphil_version": __version__,
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    record["curriculum_state_before"] = state
    return record


def _progress_line(r: dict[str, Any], steps: int) -> str:
    def f(x: float | None, spec: str = ".3f") -> str:
        return "n/a" if x is None else format(x, spec)

    line = (
        f"step {r['step']}/{steps} n={','.join(map(str, r['n']))} reward {f(r['train_reward'])}"
        f" ±{f(r['train_reward_std'])} deadlock {f(r['train_deadlock_rate'], '.0%')}"
        f" meals {f(r['train_meals_mean'], '.2f')} zero-std {r['zero_std_groups']}/{r['groups']}"
    )
    if "val_reward" in r:
        line += f" | val reward {f(r['val_reward'])} deadlock {f(r['val_deadlock_rate'], '.0%')}"
    return line + f" | {r['seconds']:.1f}s/step"


def _curriculum_json(c: Curriculum) -> dict[str, Any]:
    return {
        "kind": c.kind,
        "stages": [[list(s), n] for s, n in c.stages],
        "advance_at": c.advance_at,
        "smoothing": c.smoothing,
    }
