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
from dataclasses import dataclass, field, replace
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


@dataclass
class RolloutRequest:
    """Everything one `dphil-rollout` invocation asks for, independent of the command line.

    `grid` holds the models as given (scripted, API and hf: alike) and the table settings.
    """

    grid: Grid
    output: str | None = None
    resume: bool = False
    shard: tuple[int, int] | None = None
    # language models through litellm
    registries: tuple[str, ...] = ()
    prompt: str = "default"
    prompt_file: str | None = None
    memory: str = "full"
    talk: int = 0
    limits: dict[str, Any] = field(default_factory=dict)
    max_errors: int | None = None
    cost_limit: float | None = None
    check: bool = True  # keys set and servers answering, before the first episode (--no-check)
    # local models (hf:PATH, --checkpoints)
    adapter: str | None = None
    checkpoints: tuple[str, ...] = ()
    checkpoint_run: str | None = None
    local: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)  # --tag KEY=VALUE, on every episode


def run_request(req: RolloutRequest, console) -> int:
    """Play the requested grid into stdout or a resumable journal; return the exit status.

    Scripted policies run first (fast, in-process), then local models (loaded once
    per model and adapter), then API models (async, bounded concurrency), all into
    the same writer. Which of them a run needs decides what gets imported.
    """
    from dphil.core.policies import POLICIES
    from dphil.io.jsonl import RecordWriter
    from dphil.local.entries import LocalEntry, LocalSettings, checkpoint_entries, is_local

    models = req.grid.models
    for model in models:
        if is_scripted(model) and scripted_name(model) not in POLICIES:
            known = ", ".join(f"scripted:{p}" for p in POLICIES)
            raise UsageError(f"unknown scripted policy {model!r} (known: {known})")
        if is_local(model) and len(model) == 3:
            raise UsageError("-m hf:PATH needs a model directory after 'hf:'")
    if req.adapter is not None and not any(is_local(m) for m in models):
        raise UsageError("--adapter applies to local models: add -m hf:PATH")
    api_models = [m for m in dict.fromkeys(models) if not is_scripted(m) and not is_local(m)]
    plan = None
    if api_models:
        from dphil.agents.runner import plan_models

        plan = plan_models(
            api_models,
            registry_files=req.registries,
            prompt=req.prompt,
            prompt_file=req.prompt_file,
            memory=req.memory,
            talk=req.talk,
        )
    local_entries = [LocalEntry(m, adapter=req.adapter) for m in dict.fromkeys(models) if is_local(m)]
    if req.checkpoints:
        local_entries += checkpoint_entries(req.checkpoints, run=req.checkpoint_run)
    local_settings = (
        LocalSettings(prompt=req.prompt, prompt_file=req.prompt_file, memory=req.memory, **req.local)
        if local_entries
        else None
    )

    plain = [m for m in models if not is_local(m)]
    tags = req.tags
    own = [
        *(plan.variants.values() if plan else ()),
        *((local_settings.variant(), *(e.variant() for e in local_entries)) if local_settings else ()),
    ]
    for key in tags:
        if any(key in v for v in own):
            raise UsageError(f"--tag {key}: the run already records a field of that name")
    grid = replace(req.grid, models=plain, variants=plan.variants if plan else {}, variant={**req.grid.variant, **tags})
    local_grids = (
        [
            (
                entry,
                replace(
                    req.grid, models=[entry.model], variant={**tags, **local_settings.variant(), **entry.variant()}
                ),
            )
            for entry in local_entries
        ]
        if local_settings
        else []
    )

    done: set[str] = set()
    if req.output is not None and req.output != "-":
        if os.path.exists(req.output) and not req.resume:
            from dphil.io.errors import EX_CANTCREAT, OutputError

            raise OutputError(
                f"{req.output} exists: pass --resume to finish it, or choose another file", exit_code=EX_CANTCREAT
            )
        if req.resume:
            done = completed_ids(req.output, warn=console.warn)
    elif req.resume:
        raise UsageError("--resume needs -o FILE")

    if plan is not None and req.check:
        from dphil.agents.preflight import preflight

        preflight(plan.specs.values())  # a missing key or server fails here, before any record

    # One fixed order over the whole grid (scripted and API models, then local entries) so that
    # shards partition it; scripted episodes stream, the rest is collected as it goes by.
    def everything() -> Iterator[tuple[Any, EpisodeConfig]]:
        for config in grid.configs():
            yield None, config
        for entry, local_grid in local_grids:
            for config in local_grid.configs():
                yield entry, config

    api_configs: list[EpisodeConfig] = []
    local_configs: dict[Any, list[EpisodeConfig]] = {}

    def scripted_stream() -> Iterator[EpisodeConfig]:
        for entry, config in shard(everything(), req.shard):
            if entry is not None:
                local_configs.setdefault(entry, []).append(config)
            elif is_scripted(config.model):
                yield config
            else:
                api_configs.append(config)

    cells = (len(plain) + len(local_grids)) * len(grid.sizes) * len(grid.seeds)
    total = len(range(req.shard[0], cells, req.shard[1])) if req.shard else cells

    writer = RecordWriter(req.output, mode="append", line_buffered=bool(plan or local_grids))
    stats = RunStats()
    llm_stats = None
    bar = None
    try:
        if console.show_progress:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="ep", desc="episodes", file=console.stderr)
        progress = bar.update if bar is not None else None
        run_scripted(scripted_stream(), writer.write_line, done=done, stats=stats, progress=progress)
        if local_configs:
            from dphil.local.entries import run_local

            assert local_settings is not None  # local configs come only from local entries
            written, skipped = run_local(
                local_configs.items(), local_settings, writer.write, done=done, progress=progress
            )
            stats.written += written
            stats.skipped_done += skipped
        if plan is not None:
            from dphil.agents.llm import Limits
            from dphil.agents.runner import run_models

            llm_stats = run_models(
                api_configs,
                plan.specs,
                plan.settings,
                writer.write,
                done=done,
                max_errors=req.max_errors,
                cost_limit=req.cost_limit,
                limits=Limits(**req.limits),
                progress=_llm_progress(bar),
            )
    except BaseException:
        writer.close(success=False)
        raise
    finally:
        if bar is not None:
            bar.close()
    writer.close()
    if stats.skipped_done:
        console.warn(f"{stats.skipped_done} episode(s) already complete in {req.output}; wrote {stats.written}")
    if llm_stats is not None:
        return _llm_summary(console, llm_stats, req.output)
    return 0


def _llm_progress(bar):
    """Progress callback for model runs: the bar shows errors, tokens and cost as they grow."""
    if bar is None:
        return None

    def progress(record, stats):
        bar.update(1)
        bar.set_postfix(
            errors=stats.errors,
            tokens=stats.usage.prompt_tokens + stats.usage.completion_tokens,
            cost=f"${stats.usage.cost:.4f}",
            refresh=False,
        )

    return progress


def _llm_summary(console, stats, output):
    """Closing lines of a model run; exit 75 (try again) when episodes are left to do."""
    from dphil.io.errors import EX_TEMPFAIL

    u = stats.usage
    if stats.skipped_done:
        console.warn(f"{stats.skipped_done} model episode(s) already complete in {output}")
    console.warn(
        f"model episodes: {stats.written} written, {stats.errors} errored; "
        f"{u.calls} calls, {u.prompt_tokens + u.completion_tokens} tokens, "
        f"${u.cost:.4f}"
    )
    # --resume needs a journal (-o FILE): without one, the advice is to write one next time.
    again = "rerun with --resume" if output not in (None, "-") else "rerun with -o FILE (then --resume)"
    if stats.not_started:
        console.error(f"cost limit reached: {stats.not_started} episode(s) not started; {again} to continue")
    if stats.errors:
        console.error(f"{stats.errors} episode(s) ended in error (last: {stats.last_error}); {again} to retry them")
    return EX_TEMPFAIL if stats.errors or stats.not_started else 0
