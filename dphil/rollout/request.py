"""One `dphil-rollout` invocation: the typed request and running it into a journal or stdout.

The grid itself (seeds, shards, what a resume skips) is `dphil.rollout.grid`; this module
decides which kinds of player a run needs (scripted, local, API models), checks the API
models before the first episode, and reports what was written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

from dphil.core.records import EpisodeConfig
from dphil.io.console import output_name
from dphil.io.errors import UsageError
from dphil.rollout.grid import Grid, RunStats, completed_ids, is_scripted, run_scripted, scripted_name, shard


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
    embedded = [m for m, spec in plan.specs.items() if spec.embedded] if plan else []
    if req.adapter is not None and not embedded and not any(is_local(m) for m in models):
        raise UsageError("--adapter applies to local models: add -m hf:PATH or an embedded model (qwen2.5-0.5b)")
    if req.adapter is not None and plan is not None:
        for m in embedded:  # records say which policy played
            plan.variants[m] = {**plan.variants.get(m, {}), "adapter": req.adapter}
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

    servers = ExitStack()  # the model servers this run starts itself, stopped however it ends
    episodes_in_flight = None
    if plan is not None and any(spec.embedded for spec in plan.specs.values()):
        plan, episodes_in_flight = _embedded(plan, req, servers, console)
    with servers:
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
            from dphil.io.progress import make_progress

            bar = make_progress(console, total, unit="episodes")
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
                from dphil.agents.limits import Limits
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
                    episodes=episodes_in_flight,
                )
        except BaseException:
            writer.close(success=False)
            raise
        finally:
            if bar is not None:
                bar.close()
        writer.close()
        written = stats.written + (llm_stats.written if llm_stats is not None else 0)
        console.report(f"wrote {written} episode(s) to {output_name(req.output)}")
        if stats.skipped_done:
            console.warn(f"{stats.skipped_done} episode(s) already complete in {req.output}; wrote {stats.written}")
        if llm_stats is not None:
            return _llm_summary(console, llm_stats, req.output)
        return 0


def _embedded(plan, req: RolloutRequest, servers: ExitStack, console):
    """Start a server for every embedded model (`local` entries without a URL); return the plan
    pointed at them and how many episodes may run at once (each keeps its slots)."""
    from dphil.agents.limits import Limits
    from dphil.serving.embedded import embedded_servers, slots_for

    concurrency = Limits(**req.limits).concurrency
    slots, episodes = slots_for(list(req.grid.sizes), concurrency)
    specs = servers.enter_context(
        embedded_servers(plan.specs, slots=slots, stride=max(req.grid.sizes), warn=console.warn, adapter=req.adapter)
    )
    return replace(plan, specs=specs), episodes


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


def _cached(usage) -> str:
    """The cache hit rate, where the server reports what it took from its prompt cache."""
    rate = usage.cache_hit_rate
    return "" if rate is None else f"; {rate:.0%} of prompt tokens from the server's cache"


def _llm_summary(console, stats, output):
    """Closing lines of a model run; exit 75 (try again) when episodes are left to do."""
    from dphil.io.errors import EX_TEMPFAIL

    u = stats.usage
    if stats.skipped_done:
        console.warn(f"{stats.skipped_done} model episode(s) already complete in {output}")
    console.warn(
        f"model episodes: {stats.written} written, {stats.errors} errored; "
        f"{u.calls} calls, {u.prompt_tokens + u.completion_tokens} tokens, "
        f"${u.cost:.4f}" + _cached(u)
    )
    # --resume needs a journal (-o FILE): without one, the advice is to write one next time.
    again = "rerun with --resume" if output not in (None, "-") else "rerun with -o FILE (then --resume)"
    if stats.not_started:
        console.error(f"cost limit reached: {stats.not_started} episode(s) not started; {again} to continue")
    if stats.errors:
        console.error(f"{stats.errors} episode(s) ended in error (last: {stats.last_error}); {again} to retry them")
    return EX_TEMPFAIL if stats.errors or stats.not_started else 0
