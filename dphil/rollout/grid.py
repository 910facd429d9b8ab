"""Running a grid of episodes: models x table sizes x seeds, sharded and resumable.

Seeds are shared across models and table sizes (episode k of every cell gets
seed `base + k`, or the k-th of an explicit `--seeds` list), so two models in
one grid face the same scenarios and can be compared pairwise. The episode id
hashes the model, the table configuration and the seed, so a rerun of the same
command knows which episodes are already done and sharded runs produce exactly
the ids of the unsharded one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from dphil.core.records import EpisodeConfig
from dphil.io.errors import DataError, UsageError

T = TypeVar("T")
SCRIPTED_PREFIX = "scripted:"
_INT_OR_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_int_list(text: str, what: str) -> list[int]:
    """`5`, `5,10,15` or inclusive ranges `1000-1029` into a list of non-negative ints, order kept."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        match = _INT_OR_RANGE.fullmatch(part)
        if match is None:
            raise UsageError(f"{what}: {part!r} is not a non-negative integer or a range like 1000-1029")
        lo = int(match[1])
        hi = int(match[2]) if match[2] is not None else lo
        if hi < lo:
            raise UsageError(f"{what}: range {part!r} runs backwards")
        values.extend(range(lo, hi + 1))
    if not values:
        raise UsageError(f"{what}: nothing given")
    return values


_TAG_KEY = re.compile(r"[a-z][a-z0-9_]*")
# Fields of the episode contract and of scoring: a tag may not shadow them.
_RESERVED = frozenset(
    {
        "kind",
        "schema_version",
        "episode_id",
        "model",
        "n",
        "rounds",
        "seed",
        "protocol",
        "schedule",
        "conflict",
        "deadlock_mode",
        "status",
        "error",
        "turns",
        "events",
        "meals",
        "deadlock",
        "deadlock_round",
        "deadlock_rounds",
        "rounds_played",
        "dphil_version",
        "usage",
        "reward",
        "metrics",
        "split",
    }
)


def parse_tags(items: Iterable[str]) -> dict[str, str]:
    """`--tag KEY=VALUE` pairs: labels written into every episode (and its id), e.g. recipe=dphil."""
    tags: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not _TAG_KEY.fullmatch(key) or not value:
            raise UsageError(f"--tag: expected KEY=VALUE with a lower-case KEY such as recipe=dphil, got {item!r}")
        if key in _RESERVED:
            raise UsageError(f"--tag {key}: that field is part of the episode record")
        if key in tags:
            raise UsageError(f"--tag {key} given twice")
        tags[key] = value
    return tags


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`i/k` with 0 <= i < k (0-based, like SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX)."""
    if text is None:
        return None
    try:
        i_text, k_text = text.split("/")
        i, k = int(i_text), int(k_text)
    except ValueError:
        raise UsageError(f"--shard: expected i/k such as 0/4, got {text!r}") from None
    if k < 1 or not 0 <= i < k:
        raise UsageError(f"--shard: need 0 <= i < k, got {text!r}")
    return i, k


@dataclass
class Grid:
    """The episodes one invocation asks for, in a fixed order."""

    models: list[str]
    sizes: list[int]
    seeds: list[int]
    rounds: int = 5
    protocol: str = "paper"
    schedule: str = "simultaneous"
    conflict: str = "random"
    deadlock_mode: str = "terminal"
    variant: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)

    def configs(self) -> Iterator[EpisodeConfig]:
        """Every episode of the grid: model-major, then table size, then seed.

        `variants` adds per-model settings (an adapter path, a checkpoint step)
        on top of the shared `variant`.
        """
        for model in self.models:
            variant = {**self.variant, **self.variants.get(model, {})}
            for n in self.sizes:
                cell = EpisodeConfig(
                    model=model,
                    n=n,
                    rounds=self.rounds,
                    seed=self.seeds[0],
                    protocol=self.protocol,
                    schedule=self.schedule,
                    conflict=self.conflict,
                    deadlock_mode=self.deadlock_mode,
                    variant=variant,
                )
                for seed in self.seeds:
                    yield cell.with_seed(seed)


def shard(configs: Iterable[T], which: tuple[int, int] | None) -> Iterator[T]:
    """Keep every k-th episode of the grid starting at i: balanced, and the k shards partition it."""
    if which is None:
        yield from configs
        return
    i, k = which
    for index, config in enumerate(configs):
        if index % k == i:
            yield config


def is_scripted(model: str) -> bool:
    return model.startswith(SCRIPTED_PREFIX)


def scripted_name(model: str) -> str:
    return model[len(SCRIPTED_PREFIX) :]


def completed_ids(path: str, warn=None) -> set[str]:
    """Episode ids already complete in an output journal, repairing a torn last line.

    Errored episodes are not counted, so a resumed run retries them. A last line
    without its newline (the writer was killed mid-line) is cut off, with a
    warning, so that appended lines start on a line of their own.
    """
    done: set[str] = set()
    if not os.path.exists(path):
        return done
    try:
        with open(path, "rb+") as fh:
            data = fh.read()
            if data and not data.endswith(b"\n"):
                cut = data.rfind(b"\n") + 1
                fh.truncate(cut)
                data = data[:cut]
                if warn is not None:
                    warn(f"{path}: removed a torn last line left by an interrupted run")
    except OSError as e:
        raise DataError(f"cannot read {path} to resume: {e.strerror}") from None
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise DataError("invalid JSON in the file being resumed", source=path, line=lineno) from None
        if isinstance(record, dict) and record.get("status") == "complete" and "episode_id" in record:
            done.add(record["episode_id"])
    return done


@dataclass
class RunStats:
    """What a rollout did, for the closing message and the exit status."""

    written: int = 0
    skipped_done: int = 0
    errors: int = 0


def run_scripted(
    configs: Iterable[EpisodeConfig],
    write_line,
    *,
    done: set[str] | None = None,
    progress=None,
    stats: RunStats | None = None,
) -> RunStats:
    """Play scripted episodes in grid order, handing each one's JSON line to `write_line` as it finishes."""
    from dphil.core.episode import play_line
    from dphil.core.policies import get_policy

    stats = stats or RunStats()
    policies: dict[str, Any] = {}
    for config in configs:
        if done and config.episode_id in done:
            stats.skipped_done += 1
            if progress is not None:
                progress(0)
            continue
        policy = policies.get(config.model)
        if policy is None:
            try:
                policy = policies[config.model] = get_policy(scripted_name(config.model))
            except KeyError as e:
                raise UsageError(str(e.args[0])) from None
        write_line(play_line(config, policy))
        stats.written += 1
        if progress is not None:
            progress(1)
    return stats
