"""Local models at the table for `dphil-rollout`: `-m hf:PATH [--adapter DIR]` and `--checkpoints`.

The same batched player that `dphil-train --backend peft` trains with (the
agent prompts of the API path, one model batch per round across tables), so
any saved adapter can be evaluated offline on held-out seeds and its episodes
tagged with the checkpoint they came from. torch and transformers are imported
only when such a model actually runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dphil.core.records import EpisodeConfig
from dphil.io.errors import UsageError

HF_PREFIX = "hf:"
DEFAULT_MAX_NEW_TOKENS = 48  # --max-new-tokens; episode ids leave it out at this value (`LocalSettings.variant`)


def is_local(model: str) -> bool:
    return model.startswith(HF_PREFIX)


@dataclass(frozen=True)
class LocalSettings:
    """How local models decide; what can change an episode enters its id through `variant()`."""

    prompt: str = "default"
    prompt_file: str | None = None
    memory: str = "full"
    decode: str = "constrained"
    temperature: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    device: str = "auto"
    dtype: str = "auto"
    batch: int = 8
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.decode not in ("constrained", "free"):
            raise UsageError(f"--decode: expected constrained or free, got {self.decode!r}")
        if self.temperature < 0:
            raise UsageError("--temperature must be >= 0")
        if self.max_new_tokens < 1:
            raise UsageError("--max-new-tokens must be >= 1")

    def prompt_obj(self) -> Any:
        from dphil.agents.prompts import get_prompt

        return get_prompt(self.prompt, self.prompt_file)

    def variant(self) -> dict[str, Any]:
        prompt = self.prompt_obj()
        out: dict[str, Any] = {
            "prompt": prompt.name,
            "prompt_version": prompt.version,
            "memory": self.memory,
            "decode": self.decode,
            "temperature": self.temperature,
        }
        # `max_new_tokens` joined the settings after episodes had been recorded without it: it
        # enters the variant (and so the id) only when it can change the episode, i.e. under
        # free decoding (constrained decoding generates no text) and away from the default 48
        # those episodes were played with. Their ids, and --resume into their files, stay valid.
        if self.decode == "free" and self.max_new_tokens != DEFAULT_MAX_NEW_TOKENS:
            out["max_new_tokens"] = self.max_new_tokens
        return out


@dataclass(frozen=True)
class LocalEntry:
    """One local policy to evaluate: a model directory plus an optional adapter and its tags."""

    model: str  # "hf:PATH", as recorded
    adapter: str | None = None  # as recorded in the episodes (`variant()`), so it enters their ids
    tags: tuple[tuple[str, Any], ...] = ()  # e.g. (("run", "q14"), ("checkpoint_step", 9))
    load_from: str | None = None  # where the adapter is loaded from, when not `adapter` (a moved run)

    @property
    def adapter_dir(self) -> str | None:
        return self.load_from or self.adapter

    @property
    def path(self) -> str:
        return self.model[len(HF_PREFIX) :]

    def variant(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.tags)
        if self.adapter is not None:
            out["adapter"] = self.adapter
        return out


def checkpoint_entries(sources: Sequence[str], *, run: str | None = None) -> list[LocalEntry]:
    """One entry per checkpoint record (adapter directories must exist: exit 66 otherwise).

    The adapter is loaded from where `dphil.checkpoints.record.adapter_path` finds it from
    the record's file (its run directory, wherever it has moved); the episodes record the
    checkpoint's `path` as written by training, so moving a run changes no episode id.
    """
    from dphil.checkpoints.export import adapter_dir
    from dphil.checkpoints.record import load_checkpoints
    from dphil.io.errors import DataError

    entries = []
    for ckpt in load_checkpoints(list(sources), run=run):
        base = ckpt.record.get("base_model")
        if not isinstance(base, str) or not base:
            raise DataError(f"{ckpt.where}: checkpoint {ckpt.label()} names no base_model")
        found = str(adapter_dir({**ckpt.record, "path": ckpt.adapter_path()}))
        adapter = ckpt.path or found
        tags: list[tuple[str, Any]] = [("checkpoint_step", ckpt.step)]
        if ckpt.run is not None:
            tags.insert(0, ("run", ckpt.run))
        entries.append(
            LocalEntry(
                model=f"{HF_PREFIX}{base}",
                adapter=adapter,
                tags=tuple(tags),
                load_from=None if found == adapter else found,
            )
        )
    if not entries:
        raise DataError(f"no checkpoint records in {', '.join(sources)}" + (f" for run {run!r}" if run else ""))
    return entries


def run_local(
    groups: Iterable[tuple[LocalEntry, list[EpisodeConfig]]],
    settings: LocalSettings,
    write: Callable[[dict[str, Any]], None],
    *,
    done: set[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Play every entry's episodes (model loaded once per entry), batch by batch; return (written, skipped)."""
    from dphil.local.model import LocalModel
    from dphil.local.play import parse_memory, play_episodes

    prompt = settings.prompt_obj()
    memory = parse_memory(settings.memory)
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    written = skipped = 0
    for entry, configs in groups:
        todo = [c for c in configs if not (done and c.episode_id in done)]
        skipped += len(configs) - len(todo)
        if progress is not None and len(configs) > len(todo):
            progress(len(configs) - len(todo))
        if not todo:
            continue
        model = LocalModel(entry.path, adapter=entry.adapter_dir, device=settings.device, dtype=settings.dtype)
        for start in range(0, len(todo), settings.batch):
            batch = todo[start : start + settings.batch]
            # Sampling is seeded by the batch's first episode, so a rerun of the same command
            # plays the same episodes.
            played = play_episodes(
                batch,
                model,
                prompt,
                decode=settings.decode,
                memory=memory,
                temperature=settings.temperature,
                max_new_tokens=settings.max_new_tokens,
                seed=batch[0].seed,
            )
            for p in played:
                write(p.record)
                written += 1
            if progress is not None:
                progress(len(batch))
    return written, skipped
