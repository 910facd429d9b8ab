"""The transformers + peft backend: GRPO with a LoRA adapter on one CPU or GPU, no vLLM.

It plays the step's episodes with the current adapter (batched, through the
agent prompts of `dphil-rollout`), reweights every reply by its turn's
advantage (the episode's group-relative one by default, see `advantages`) with the token-level clipped objective of
`dphil.train.grpo`, takes one optimiser step, and saves the adapter with
`save_pretrained` (plus the optimiser state, so a resumed run continues the
same optimisation rather than restarting Adam's moments).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from dphil.agents.prompts import Prompt
from dphil.core.records import EpisodeConfig
from dphil.io.atomic import disk_full_error, is_disk_full
from dphil.io.errors import MissingExtraError, OutputError
from dphil.local.fused_lora import fuse_lora
from dphil.local.loading import load_adapter
from dphil.local.model import LORA_TARGETS, Decision, LocalModel
from dphil.local.play import Played, play_episodes
from dphil.local.tree_logprobs import TreeScorer, can_share
from dphil.train.grpo import grpo_loss

OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class PeftSettings:
    """Everything the peft backend needs besides the episodes."""

    base_model: str
    prompt: Prompt
    lora_rank: int = 8
    lora_alpha: int = 16
    learning_rate: float = 1e-5
    clip_epsilon: float | None = 0.2
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    decode: str = "constrained"
    temperature: float = 1.0
    max_new_tokens: int = 48
    memory: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    micro_batch: int = 16
    # Decisions per backward pass: their activations are all kept until it runs, so this
    # bounds training memory (a real model's prompt costs far more than a forward pass's).
    train_micro_batch: int = 2
    # Recompute each decoder layer's activations in the backward pass instead of keeping them:
    # about a tenth more CPU for far less memory (the same gradient).
    gradient_checkpointing: bool = True
    # Positions per prefix-tree row (`dphil.local.prefix_tree`): every prefix the step's
    # replies share is computed once per row, and sampling keeps each conversation's keys and
    # values between rounds (`dphil.local.prefix_cache`). 0 scores each reply on its own
    # prompt, in batches of train_micro_batch, and samples from whole prompts (the plain
    # computation both are tested against).
    pack_width: int = 2048
    # On a model whose layers all attend fully: what several neighbouring rows hold (each
    # seat's system prompt) computed once for them, as keys and values the rows attend to
    # (`dphil.local.shared_prefix`; the same gradient).
    shared_prefix: bool = True
    # "bf16": matrix products in bfloat16 under torch.autocast (the LoRA weights, the
    # optimiser and the loss stay float32); None: the model's own dtype throughout.
    autocast: str | None = None
    init_seed: int = 0  # seeds the LoRA A matrices, drawn from torch's global generator


@dataclass
class Sample:
    """One reply to reweight and its episode's advantage."""

    decision: Decision
    advantage: float


class PeftBackend:
    """A trainable LoRA policy around a local causal LM."""

    name = "peft"

    def __init__(self, settings: PeftSettings, *, resume_from: str | None = None) -> None:
        try:
            import peft
            import torch
        except ImportError as e:
            raise MissingExtraError(
                f"--backend peft needs torch, transformers and peft ({e.name} is missing): pip install 'dphil[train]'"
            ) from None
        self.torch = torch
        self.settings = settings
        self.lm = LocalModel(
            settings.base_model,
            device=settings.device,
            dtype=settings.dtype,
            micro_batch=settings.micro_batch,
            pack_width=settings.pack_width,
            keep_prompts=settings.pack_width > 0,
        )
        if resume_from is not None:
            self.lm.model = load_adapter(self.lm.model, resume_from, trainable=True)
        else:
            config = peft.LoraConfig(
                r=settings.lora_rank,
                lora_alpha=settings.lora_alpha,
                lora_dropout=0.0,
                target_modules=list(LORA_TARGETS),
                task_type="CAUSAL_LM",
            )
            # peft initialises LoRA from torch's global generator: seed it, or two runs of the
            # same command start from different adapters.
            torch.manual_seed(settings.init_seed)
            self.lm.model = peft.get_peft_model(self.lm.model, config)
        fuse_lora(self.lm.model)  # the update summed inside one matrix product (dphil.local.fused_lora)
        if settings.gradient_checkpointing:
            # Non-reentrant: the LoRA weights get their gradients without inputs that require them.
            self.lm.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        params = [p for p in self.lm.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=0.0)
        if resume_from is not None and (Path(resume_from) / OPTIMIZER_FILE).is_file():
            state = torch.load(Path(resume_from) / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
            self.optimizer.load_state_dict(state)
            for group in self.optimizer.param_groups:
                group["lr"] = settings.learning_rate

    @property
    def model_name(self) -> str:
        return f"hf:{self.settings.base_model}"

    def policy_variant(self) -> dict[str, Any]:
        s = self.settings
        return {
            "decode": s.decode,
            "temperature": s.temperature,
            "prompt": s.prompt.name,
            "prompt_version": s.prompt.version,
            "memory": "full" if s.memory is None else ("none" if s.memory == 0 else f"window:{s.memory}"),
        }

    def arithmetic(self) -> dict[str, Any]:
        """How a step computes, for its checkpoint record: bfloat16 samples other episodes than float32."""
        s = self.settings
        return {
            "device": str(self.lm.device),
            "dtype": str(self.lm.dtype).removeprefix("torch."),
            "autocast": s.autocast,
            "gradient_checkpointing": s.gradient_checkpointing,
            "pack_width": s.pack_width,
            "shared_prefix": self._shares_prefix(),
        }

    def _shares_prefix(self) -> bool:
        """Whether training rows attend to the keys and values of what they share (see PeftSettings)."""
        s = self.settings
        return s.shared_prefix and s.pack_width > 0 and can_share(self.lm)

    def rollout(self, configs: Sequence[EpisodeConfig], *, seed: int) -> list[Played]:
        self.lm.model.eval()
        s = self.settings
        # Sampled under the same arithmetic as the loss reweights them with.
        with self._autocast():
            return play_episodes(
                configs,
                self.lm,
                s.prompt,
                decode=s.decode,
                memory=s.memory,
                temperature=s.temperature,
                max_new_tokens=s.max_new_tokens,
                seed=seed,
            )

    def train_groups(self, groups: Sequence[Any], *, step: int) -> dict[str, float]:
        """Every reply of every episode, weighted by its turn's advantage (see --advantage)."""
        samples = [
            Sample(d, adv)
            for g in groups
            for ep, advs in zip(g.episodes, g.turn_advantages, strict=True)
            for d, adv in zip(ep.decisions, advs, strict=True)
        ]
        return self.train(samples)

    def train(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimiser step on the samples; returns loss diagnostics."""
        torch = self.torch
        s = self.settings
        samples = [x for x in samples if x.advantage != 0.0 or s.kl_coef]
        stats = {
            "loss": 0.0,
            "pg_loss": 0.0,
            "kl": 0.0,
            "clip_fraction": 0.0,
            "tokens": 0.0,
            "grad_norm": 0.0,
            "trained_samples": float(len(samples)),
        }
        if not samples:
            return stats
        model = self.lm.model
        model.train()
        temperature = s.temperature or 1.0
        total_units = sum(1 if x.decision.candidate is not None else len(x.decision.completion_ids) for x in samples)
        self.optimizer.zero_grad(set_to_none=True)
        decisions = [x.decision for x in samples]
        # (the samples a chunk holds, its log-probabilities, what follows its backward pass)
        chunks: list[tuple[list[int], Callable[..., tuple[Any, Any]], Callable[[], None]]]
        if s.pack_width > 0:
            scorer = TreeScorer.of_decisions(
                self.lm, decisions, max_width=s.pack_width, shared_prefix=self._shares_prefix()
            )
            stats["positions"] = float(scorer.tokens)
            chunks = [
                (
                    row.groups,
                    lambda temperature, row=row: scorer.unit_logprobs(row, temperature=temperature)[1:],
                    partial(scorer.done, row),
                )
                for row in scorer.rows
            ]
        else:
            step = max(1, s.train_micro_batch)
            chunks = [
                (idx, partial(self.lm.unit_logprobs, [decisions[i] for i in idx]), lambda: None)
                for idx in (list(range(a, min(a + step, len(samples)))) for a in range(0, len(samples), step))
            ]
            stats["positions"] = float(
                sum(len(d.prompt_ids) + len(d.completion_ids) for d in decisions)
                if decisions[0].candidate is None
                else sum(len(d.prompt_ids) + sum(map(len, self.lm.candidate_ids(d.candidates))) for d in decisions)
            )
        for idx, unit_logprobs, done in chunks:
            with self._autocast():
                lp, mask = unit_logprobs(temperature=temperature)
                ref = None
                if s.kl_coef:
                    with torch.no_grad(), model.disable_adapter():
                        ref, _ = unit_logprobs(temperature=temperature)
            lp = lp.float()
            old = torch.zeros_like(lp)
            width = lp.shape[1]
            for b, i in enumerate(idx):
                d = decisions[i]
                if d.old_logprobs:
                    old[b, width - len(d.old_logprobs) :] = torch.tensor(d.old_logprobs, device=lp.device)
            adv = torch.tensor([samples[i].advantage for i in idx], device=lp.device)
            loss, part = grpo_loss(
                lp,
                old,
                adv,
                mask,
                ref_logprobs=None if ref is None else ref.float(),
                clip_epsilon=s.clip_epsilon,
                kl_coef=s.kl_coef,
                normaliser=total_units,
            )
            loss.backward()
            done()  # after a family's last row: its shared stem's backward pass
            for key in ("loss", "pg_loss", "kl", "clip_fraction", "tokens"):
                stats[key] += part[key]
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm if s.max_grad_norm > 0 else 1e9)
        stats["grad_norm"] = float(norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        model.eval()
        return stats

    def _autocast(self) -> Any:
        """bfloat16 matrix products when asked (`autocast`), else nothing.

        Under autocast the LoRA products run in bfloat16 whatever their weights' dtype, so
        peft's cast of each layer's input to the float32 LoRA weights (and autocast's cast of
        it back) changes no value and only costs time: about a tenth of sampling, measured.
        """
        if self.settings.autocast is None:
            return contextlib.nullcontext()
        from peft.helpers import disable_input_dtype_casting

        device = "cuda" if str(self.lm.device).startswith("cuda") else "cpu"
        stack = contextlib.ExitStack()
        stack.enter_context(self.torch.autocast(device, dtype=self.torch.bfloat16))
        stack.enter_context(disable_input_dtype_casting(self.lm.model))
        return stack

    def save(self, directory: Path, *, step: int = 0) -> str:
        """Write the adapter (save_pretrained) and the optimiser state to `directory`.

        A disk that fills up (safetensors' "No space left on device", ENOSPC) or a
        directory that cannot be written is one line naming it, exit 74.
        """
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.lm.model.save_pretrained(str(directory))
            # Serialised in memory, then written: torch's own file writer reports a full disk
            # as "unexpected pos", with no errno to tell it from a bug.
            buffer = io.BytesIO()
            self.torch.save(self.optimizer.state_dict(), buffer)
            (directory / OPTIMIZER_FILE).write_bytes(buffer.getbuffer())
        except Exception as e:
            if is_disk_full(e):
                raise disk_full_error(directory, e, "cannot save the checkpoint") from None
            if isinstance(e, OSError):
                raise OutputError(f"{directory}: cannot save the checkpoint: {e.strerror or e}") from None
            raise
        return str(directory)

    def close(self) -> None:
        return None
